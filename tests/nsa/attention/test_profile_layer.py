"""benchmarks/profile_layer.py's roofline on a hand-made profile (no GPU): per-kernel floors and efficiency, the
layer's efficiency over kernels of at least 1% of its time, the floor ratio against dense beside the measured
one, "peak unknown", and the JSON's kernel table."""

from __future__ import annotations

import pytest

from nsa.attention import cost_model as cm
from nsa.config import NSAConfig
from nsa.training.metrics import roofline_peaks

from benchmark_scripts import load

pl = load("profile_layer")

SHAPE = dict(dim=768, n_heads=12, n_kv_groups=2, d_k=64, d_v=64)
H100 = "NVIDIA H100 80GB HBM3"
SORT = "void at::native::radixSortKVInPlace<2, -1, 32, 32, float, long, unsigned int>(at::cuda::detail::TensorInfo"
# {pass: {kernel: [ms per pass, launches per pass]}}, shaped like the H100 profile of reports/gpu/2026-11-26-h100
NSA = {"fwd": {"_range_fwd_kernel": [2.0, 2], "_blocksel_importance_kernel": [4.0, 8], SORT: [3.0, 8],
               "void at::native::elementwise_kernel<128, 2, where": [1.0, 16], "tiny_glue": [0.1, 1]},
       "bwd": {"_range_bwd_dkdv_kernel": [13.0, 2], "_range_bwd_dq_kernel": [2.0, 2], "nvjet_sm90_tst": [0.5, 2]}}
DENSE = {"fwd": {"void pytorch_flash::flash_fwd_kernel<": [8.0, 1]},
         "bwd": {"void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<": [20.0, 1]}}


def test_kernel_floors_and_the_layers_efficiency():
    r = pl.roofline(NSA, "nsa-triton", 65536, 1, H100, SHAPE)
    rows = {k["name"]: k for k in r["kernels"]}
    costs = cm.kernel_costs(NSAConfig(**SHAPE), 65536, 1)
    peaks = roofline_peaks(H100)
    rng = rows["_range_fwd_kernel"]
    assert rng["family"] == "range_fwd" and rng["pass"] == "fwd"
    assert rng["floor_ms"] == pytest.approx(costs["range_fwd"].floor_s(peaks) * 1e3)
    assert rng["efficiency"] == pytest.approx(rng["floor_ms"] / 2.0)
    assert rows[SORT]["bound"] == "bytes" and rows[SORT]["family"] == "selection_sort"
    assert rows["nvjet_sm90_tst"]["floor_ms"] is None  # a GEMM: time without a floor
    total = 2.0 + 4.0 + 3.0 + 1.0 + 0.1 + 13.0 + 2.0 + 0.5
    assert rows["tiny_glue"]["share"] == pytest.approx(0.1 / total)
    floors_fwd = sum(rows[k]["floor_ms"] for k in ("_range_fwd_kernel", "_blocksel_importance_kernel", SORT))
    assert r["efficiency_fwd"] == pytest.approx(floors_fwd / 10.0)  # tiny_glue (< 1%) left out, `where` counted
    floors_bwd = rows["_range_bwd_dkdv_kernel"]["floor_ms"] + rows["_range_bwd_dq_kernel"]["floor_ms"]
    assert r["efficiency_bwd"] == pytest.approx(floors_bwd / 15.5)
    assert r["efficiency"] == pytest.approx((floors_fwd + floors_bwd) / 25.5)
    assert r["fwd_gpu_ms"] == pytest.approx(10.1) and r["bwd_kernel_launches"] == 6
    assert r["floor_fwd_ms"] == pytest.approx(1.34, rel=0.05)
    assert r["floor_ratio_fwd"] == pytest.approx(r["dense_floor_fwd_ms"] / r["floor_fwd_ms"])


def test_measured_ratio_sits_beside_the_floor_ratio():
    nsa = {"path": "nsa-triton", "seq_len": 65536, "batch": 1, "gpu_ms": 25.6,
           **pl.roofline(NSA, "nsa-triton", 65536, 1, H100, SHAPE)}
    dense = {"path": "dense", "seq_len": 65536, "batch": 1, "gpu_ms": 28.0,
             **pl.roofline(DENSE, "dense", 65536, 1, H100, SHAPE)}
    pl.measured_ratios([nsa, dense])
    assert nsa["measured_ratio_fwd"] == pytest.approx(8.0 / 10.1)
    assert nsa["measured_ratio"] == pytest.approx(28.0 / 25.6)
    assert "measured_ratio" not in dense
    assert dense["efficiency_fwd"] == pytest.approx(dense["dense_floor_fwd_ms"] / 8.0)
    table = pl.as_json([nsa, dense])
    assert [r["path"] for r in table["results"]] == ["nsa-triton", "dense"]
    assert all("kernels" not in r for r in table["results"])
    names = [k["name"] for k in table["kernels"] if k["path"] == "nsa-triton"]
    assert "tiny_glue" not in names and "(1 kernels under 1% each)" in names
    assert any("floor ratio" in line for line in pl.describe(nsa))


def test_an_unknown_device_gets_the_counts_only():
    r = pl.roofline(NSA, "nsa-triton", 65536, 1, "Some Future GPU", SHAPE)
    assert r["peak"] == "unknown" and "efficiency" not in r and "floor_fwd_ms" not in r
    rng = next(k for k in r["kernels"] if k["name"] == "_range_fwd_kernel")
    assert rng["flops"] > 0 and rng["floor_ms"] is None
    assert any("peak unknown" in line for line in pl.describe({**r, "device_name": "Some Future GPU"}))


def test_a_profile_of_the_query_dq_choice_counts_sel_bwd_kv_as_dkdv_only():
    """The query dQ choice launches _sel_bwd_kv without dQ under the same name: beside _sel_bwd_dq_query it gets the
    dK/dV-only family's floor, and the partial output's kernels get theirs."""
    prof = {"fwd": {"_sel_fwd_kv_stats": [1.0, 1], "_sel_fwd_kv_part": [2.0, 1], "_sel_fwd_reduce": [0.5, 1]},
            "bwd": {"_sel_bwd_kv": [3.0, 1], "_sel_bwd_dq_query": [2.0, 1]}}
    r = pl.roofline(prof, "nsa-triton", 65536, 1, H100, SHAPE)
    rows = {k["name"]: k for k in r["kernels"]}
    costs = cm.kernel_costs(NSAConfig(**SHAPE), 65536, 1)
    for name, fam in {"_sel_bwd_kv": "sel_bwd_kv_dkdv", "_sel_bwd_dq_query": "sel_bwd_dq_query",
                      "_sel_fwd_kv_part": "sel_fwd_kv_part", "_sel_fwd_reduce": "sel_fwd_reduce"}.items():
        assert rows[name]["family"] == fam and rows[name]["flops"] == costs[fam].flops, name
    shipped = pl.roofline({"bwd": {"_sel_bwd_kv": [3.0, 1]}}, "nsa-triton", 65536, 1, H100, SHAPE)
    assert shipped["kernels"][0]["family"] == "sel_bwd_kv"
