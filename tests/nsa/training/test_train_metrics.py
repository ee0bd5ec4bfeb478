"""nsa.training.metrics: model FLOPs utilization (MFU), device peaks, memory figures."""

from __future__ import annotations

import pytest
import torch

from nsa.training import metrics
from nsa.devices import DEVICE_PEAKS
from nsa.training.metrics import mfu, peak_flops


def test_mfu_is_achieved_flops_over_every_devices_peak():
    # 6 GFLOP per token at 10,000 tokens/s on 2 devices of 100 TFLOP/s: 60 TFLOP/s of 200
    assert mfu(6e9, 10_000, 2, 100e12) == pytest.approx(0.3)
    assert mfu(6e9, 10_000, 1, 100e12) == pytest.approx(0.6)


def test_mfu_is_unknown_without_a_peak_or_throughput():
    assert mfu(6e9, 10_000, 1, None) is None
    assert mfu(6e9, 0.0, 1, 100e12) is None
    assert mfu(6e9, -1.0, 1, 100e12) is None


def test_mfu_of_a_known_run():
    # the 125M model's count (6N + attention) at 100,000 tokens/s on one A100 in bf16
    flops_per_token = 6 * 124.9e6
    peak = peak_flops(torch.device("cpu"), "bf16", override_tflops=312.0)
    assert mfu(flops_per_token, 100_000, 1, peak) == pytest.approx(6 * 124.9e6 * 1e5 / 312e12)


def test_peak_flops_per_device_and_precision(monkeypatch):
    cuda = torch.device("cuda")
    for name, expected_low, expected_fp32 in [("NVIDIA H100 80GB HBM3", 989.4, 66.9), ("NVIDIA H100 PCIe", 756.0, 51.0),
                                              ("NVIDIA A100-SXM4-80GB", 312.0, 19.5), ("NVIDIA L4", 121.0, 30.3)]:
        monkeypatch.setattr(metrics, "device_name", lambda device, name=name: name)
        assert peak_flops(cuda, "bf16") == pytest.approx(expected_low * 1e12), name
        assert peak_flops(cuda, "fp16") == pytest.approx(expected_low * 1e12), name
        assert peak_flops(cuda, "fp32") == pytest.approx(expected_fp32 * 1e12), name
    monkeypatch.setattr(metrics, "device_name", lambda device: "Some Future GPU")
    assert peak_flops(cuda, "bf16") is None  # unlisted: no MFU rather than a wrong one


def test_first_match_gives_each_listed_device_its_own_peaks():
    # the table is searched by substring, first match wins: an entry an earlier one shadows (GH200 by H200) must
    # have the same figures, else the more specific name has to come first (H100 PCIe before H100)
    for name, *peaks in DEVICE_PEAKS:
        first = next(entry for entry in DEVICE_PEAKS if entry[0] in name)
        assert list(first[1:]) == peaks, f"{name} gets {first[0]}'s peaks"


def test_cpu_has_no_peak_unless_given():
    cpu = torch.device("cpu")
    assert peak_flops(cpu, "fp32") is None
    assert peak_flops(cpu, "fp32", override_tflops=1.5) == pytest.approx(1.5e12)


def test_cpu_memory_is_resident_set_now_and_at_peak():
    now, peak = metrics.memory_gb(torch.device("cpu"))
    assert 0 < now <= peak < 1024  # GiB
