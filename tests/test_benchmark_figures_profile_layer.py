"""benchmarks/profile_layer.py's roofline figures from hand-made profiles: a kernel's floor is the slowest of its
FLOPs, exps and bytes at the device's peaks; the layer's efficiency is the sum of the floors over the time of the
kernels of at least 1% of the layer's time; a kernel measured under its floor (efficiency above 100%: the model or
the peaks are wrong) gets no efficiency and neither does a sum over it; a ratio needs positive times on both sides;
a case that failed makes the run exit 1."""

from __future__ import annotations

import json
import subprocess

import pytest

from nsa.attention import cost_model as cm
from nsa.config import NSAConfig

from benchmark_scripts import load

pl = load("profile_layer")

SHAPE = dict(dim=768, n_heads=12, n_kv_groups=2, d_k=64, d_v=64)
H200 = "NVIDIA H200"
PEAKS = cm.Peaks(flops=989.4e12, exps=132 * 16 * 1.83e9, bytes=4.8e12)  # nsa.training.metrics' H200 row, by hand


def _floor_ms(family: str, s: int = 65536, b: int = 1) -> float:
    cost = cm.all_costs(NSAConfig(**SHAPE), s, b)[family]
    return max(cost.flops / PEAKS.flops, cost.exps / PEAKS.exps, cost.bytes / PEAKS.bytes) * 1e3


def test_floor_is_the_slowest_resource_and_the_layer_efficiency_sums_kernels_of_one_percent():
    prof = {"fwd": {"_range_fwd_kernel": [2.0, 2], "glue_a": [1.0, 4], "glue_tiny": [0.05, 1]},
            "bwd": {"_range_bwd_dq_kernel": [3.0, 2], "nvjet_gemm": [0.95, 2]}}
    r = pl.roofline(prof, "nsa-triton", 65536, 1, H200, SHAPE)
    rows = {k["name"]: k for k in r["kernels"]}
    fwd, dq = _floor_ms("range_fwd"), _floor_ms("range_bwd_dq")
    assert rows["_range_fwd_kernel"]["floor_ms"] == pytest.approx(fwd)
    assert rows["_range_fwd_kernel"]["efficiency"] == pytest.approx(fwd / 2.0)
    assert rows["_range_bwd_dq_kernel"]["efficiency"] == pytest.approx(dq / 3.0)
    assert 0 < fwd < 2.0 and 0 < dq < 3.0
    # total 7.0 ms: glue_tiny (0.05 ms, 0.7%) is left out; glue_a and the GEMM count as time without a floor
    assert rows["glue_tiny"]["share"] == pytest.approx(0.05 / 7.0)
    assert r["efficiency_fwd"] == pytest.approx(fwd / 3.0)
    assert r["efficiency_bwd"] == pytest.approx(dq / 3.95)
    assert r["efficiency"] == pytest.approx((fwd + dq) / 6.95)
    assert r["fwd_gpu_ms"] == pytest.approx(3.05) and r["bwd_kernel_launches"] == 4
    assert r["peaks"] == pytest.approx({"tflops": 989.4, "texp_per_s": PEAKS.exps / 1e12, "tb_per_s": 4.8})
    assert "under_floor" not in r


def test_a_kernel_under_its_floor_is_no_efficiency_above_100_percent():
    fwd = _floor_ms("range_fwd")
    prof = {"fwd": {"_range_fwd_kernel": [fwd / 2, 2]}, "bwd": {"_range_bwd_dq_kernel": [10.0, 2]}}
    r = pl.roofline(prof, "nsa-triton", 65536, 1, H200, SHAPE)
    rows = {k["name"]: k for k in r["kernels"]}
    assert rows["_range_fwd_kernel"]["efficiency"] is None and rows["_range_fwd_kernel"]["under_floor"]
    assert r["efficiency_fwd"] is None and r["efficiency"] is None  # sums holding that floor
    assert r["efficiency_bwd"] == pytest.approx(_floor_ms("range_bwd_dq") / 10.0)
    assert len(r["under_floor"]) == 1 and r["under_floor"][0].startswith("fwd _range_fwd_kernel")
    text = "\n".join(pl.describe({**r, "path": "nsa-triton", "seq_len": 65536, "batch": 1}))
    assert "efficiency fwd n/a" in text and "layer n/a" in text and "measured under its floor" in text
    assert "<floor" in text and "200.0%" not in text
    assert all(v is None or v <= 1 for k in r["kernels"] for v in [k["efficiency"]])


def test_an_unknown_device_has_no_floors_and_says_so():
    r = pl.roofline({"fwd": {"_range_fwd_kernel": [1.0, 2]}}, "nsa-triton", 2048, 8, "NVIDIA L40", SHAPE)
    assert r["peak"] == "unknown" and "efficiency" not in r and "peaks" not in r
    assert r["kernels"][0]["floor_ms"] is None and r["kernels"][0]["efficiency"] is None
    lines = pl.describe({**r, "device_name": "NVIDIA L40"})
    assert any("peak unknown for 'NVIDIA L40'" in line for line in lines)


def test_measured_ratio_is_dense_over_nsa_and_needs_positive_times():
    nsa = {"path": "nsa-triton", "seq_len": 2048, "batch": 8, "fwd_gpu_ms": 2.0, "gpu_ms": 5.0}
    dense = {"path": "dense", "seq_len": 2048, "batch": 8, "fwd_gpu_ms": 1.0, "gpu_ms": 10.0}
    pl.measured_ratios([nsa, dense])
    assert nsa["measured_ratio_fwd"] == pytest.approx(0.5) and nsa["measured_ratio"] == pytest.approx(2.0)
    nsa0 = {"path": "nsa-triton", "seq_len": 2048, "batch": 8, "fwd_gpu_ms": 2.0, "gpu_ms": 5.0}
    dense0 = {"path": "dense", "seq_len": 2048, "batch": 8, "fwd_gpu_ms": 0.0, "gpu_ms": 10.0}
    pl.measured_ratios([nsa0, dense0])
    assert "measured_ratio" not in nsa0 and "measured_ratio_fwd" not in nsa0  # never a 0.00x from a zero time


def test_a_failed_case_is_recorded_and_the_run_exits_1(monkeypatch, tmp_path, capsys):
    def run(cmd, **kwargs):
        path = cmd[cmd.index("--case") + 1]
        if path == "dense":
            return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory")
        record = {"path": path, "seq_len": 2048, "batch": 8, "kernel_launches": 80.0, "copies_per_pass": 2.0,
                  "host_issue_ms": 1.0, "wall_ms": 2.0, "gpu_ms": 1.5, "peak": "unknown", "kernels": []}
        return subprocess.CompletedProcess(cmd, 0, json.dumps(record) + "\n", "")

    monkeypatch.setattr(pl.subprocess, "run", run)
    out = tmp_path / "p" / "profile.json"
    assert pl.main(["--seq-lens", "2048", "--batch", "8", "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert [r["path"] for r in data["results"]] == ["nsa-triton", "dense"]
    assert data["results"][1]["error"].startswith("exit 1: torch.OutOfMemoryError")
    assert "gpu_ms" not in data["results"][1]  # no figure for the failed case
    assert "80 kernel launches/pass" in capsys.readouterr().out


def test_dry_run_lists_the_cases(capsys):
    assert pl.main(["--seq-lens", "2048,65536", "--batch", "8,1", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "nsa-triton at S 2,048 x B 8: one subprocess, 3 warm-up and 3 profiled passes",
        "dense at S 2,048 x B 8: one subprocess, 3 warm-up and 3 profiled passes",
        "nsa-triton at S 65,536 x B 1: one subprocess, 3 warm-up and 3 profiled passes",
        "dense at S 65,536 x B 1: one subprocess, 3 warm-up and 3 profiled passes"]
