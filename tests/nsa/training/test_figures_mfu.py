"""MFU's denominator: the device peak looked up from the device's name (nsa.training.metrics), and the FLOPs/token
it is divided into, checked against counts made here (torch's FlopCounterMode, the model's own Linear layers)."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from train_utils import TINY

from nsa.attention.geometry import mean_reads
from nsa.config import ModelConfig
from nsa.model import NSAModel, flops_per_token
from nsa.training import metrics
from nsa.training.metrics import peak_flops, roofline_peaks

CUDA = torch.device("cuda")


def _peak(monkeypatch, name: str, precision: str = "bf16") -> float | None:
    monkeypatch.setattr(metrics, "device_name", lambda device: name)
    return peak_flops(CUDA, precision)


@pytest.mark.parametrize("name", [
    "NVIDIA L40",  # an L4's 121 TFLOP/s would make its MFU 1.5x too high (the L40's dense bf16 peak is 181)
    "NVIDIA RTX A1000 Laptop GPU",  # not an A100: neither its 312 TFLOP/s nor its 2 TB/s HBM
    "NVIDIA RTX A1000 6GB",
])
def test_another_model_whose_name_extends_a_listed_one_is_unknown_not_that_one(monkeypatch, name):
    assert _peak(monkeypatch, name) is None
    assert _peak(monkeypatch, name, "fp32") is None
    assert roofline_peaks(name) is None


@pytest.mark.parametrize("name,bf16", [
    ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.1), ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA GH200 480GB", 989.4), ("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100-SXM4-40GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA B200", 2250.0),
    ("NVIDIA H100 NVL", 835.5), ("NVIDIA H200 NVL", 835.5),  # power-limited parts, not the SXM peak
])
def test_listed_devices_keep_their_peaks(monkeypatch, name, bf16):
    assert _peak(monkeypatch, name) == pytest.approx(bf16 * 1e12)


@pytest.mark.parametrize("name,fp16,fp32", [
    ("Tesla V100-SXM2-16GB", 125.0, 15.7), ("Tesla V100-SXM2-32GB", 125.0, 15.7),  # the V100 data sheet
    ("Tesla V100-PCIE-16GB", 112.0, 14.0), ("Tesla V100-PCIE-32GB", 112.0, 14.0),  # not the SXM2's 125
])
def test_volta_has_fp16_tensor_peaks_and_no_bf16_one(monkeypatch, name, fp16, fp32):
    # Volta's tensor cores take fp16, not bf16: a bf16 run there has no tensor-core peak, so MFU is unknown rather
    # than a figure against the fp16 peak
    assert _peak(monkeypatch, name, "fp16") == pytest.approx(fp16 * 1e12)
    assert _peak(monkeypatch, name, "fp32") == pytest.approx(fp32 * 1e12)
    assert _peak(monkeypatch, name, "bf16") is None
    assert roofline_peaks(name, "bf16") is None


def test_a_part_without_a_data_sheet_has_no_peak_but_keeps_its_link(monkeypatch):
    # the A10G (AWS's part): no NVIDIA data sheet, published bf16 figures from 62.5 to 125 TFLOP/s: unknown
    from nsa.devices import link_gbps
    for precision in ("bf16", "fp16", "fp32"):
        assert _peak(monkeypatch, "NVIDIA A10G", precision) is None
    assert roofline_peaks("NVIDIA A10G") is None
    assert link_gbps("NVIDIA A10G") == 32.0  # PCIe 4.0 x16, each way


def test_nvl_parts_have_their_own_bandwidth_and_exp_rate():
    # data sheets: H100 NVL 3.9 TB/s, H200 NVL 4.8 TB/s; exponentials at the clock the dense peak implies
    # (835.5e12 / (132 SMs x 4,096 tensor FLOPs a clock) = 1.545 GHz, 16 a clock per SM)
    for name, hbm in [("NVIDIA H100 NVL", 3.9e12), ("NVIDIA H200 NVL", 4.8e12)]:
        peaks = roofline_peaks(name)
        assert peaks.bytes == pytest.approx(hbm), name
        assert peaks.exps == pytest.approx(132 * 16 * 835.5e12 / (132 * 4096), rel=1e-3), name
        assert peaks.flops == pytest.approx(835.5e12), name


def _tiny(**changes) -> ModelConfig:
    raw = yaml.safe_load(TINY.read_text())["model"]
    return ModelConfig.from_flat({**raw, **changes})


@pytest.mark.parametrize("seq_len", [64, 256])
def test_dense_part_of_flops_per_token_is_three_times_every_matmul_a_token_goes_through(seq_len):
    """The dense twin's count against torch's own FLOP counter over one forward + backward (its matmuls; the SDPA
    call is not counted on CPU) plus the causal attention term counted here: QK and PV over t + 1 keys at t."""
    cfg = _tiny(attention="dense")
    torch.manual_seed(0)
    net = NSAModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len))
    counter = FlopCounterMode(display=False)
    with counter:
        net(ids, ids).backward()
    attention_fwd = cfg.n_layers * cfg.n_heads * sum(2 * (16 + 16) * (t + 1) for t in range(seq_len)) / seq_len
    assert flops_per_token(cfg, seq_len) == pytest.approx(counter.get_total_flops() / seq_len + 3 * attention_fwd)


@pytest.mark.parametrize("seq_len", [64, 256])
def test_nsa_projections_gate_mlp_head_and_compression_mlp_are_counted_once_each(seq_len):
    """NSA's count minus its attention terms = 3 x (2 x every Linear's weights per token, the compression MLP per
    block of d tokens), against torch's counter on the forward's addmm/mm (every Linear, the compressors included)."""
    cfg = _tiny()
    torch.manual_seed(0)
    net = NSAModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        net(ids)
    linear_fwd = sum(v for op, v in counter.get_flop_counts()["Global"].items() if "mm" in str(op)
                     and "bmm" not in str(op)) / seq_len
    reads, cmp_reads = mean_reads(cfg.nsa, seq_len)
    attention = cfg.n_layers * cfg.n_heads * 2.0 * (cfg.nsa.d_k + cfg.nsa.d_v) * reads
    importance = cfg.n_layers * cfg.n_heads * 2.0 * cfg.nsa.d_k * cmp_reads
    assert flops_per_token(cfg, seq_len) - 3 * attention - importance == pytest.approx(3 * linear_fwd)
