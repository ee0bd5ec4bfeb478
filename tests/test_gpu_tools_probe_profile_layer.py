"""benchmarks/profile_layer.py read from profiler events: the kernels of a hand-built trace (chrome-trace events as
torch writes them, with the kernel names of the committed H200 profile) turned into profile_layer's events, summed
per name with copies counted apart, and the roofline over them against a hand computation; a profile without any
GPU kernel (a CPU-only profile, or CUPTI unavailable) is no figure: it raises, so that its case is an error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.autograd.profiler_util import Interval

from nsa.attention import cost_model as cm
from nsa.config import NSAConfig

from benchmark_scripts import load

pl = load("profile_layer")

SHAPE = dict(dim=768, n_heads=12, n_kv_groups=2, d_k=64, d_v=64)
H100 = "NVIDIA H100 80GB HBM3"
GLUE = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor>"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1> >"
GEMM = "nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_TNN"
# one forward and one backward, as chrome-trace "X" events (ts and dur in us); the GEMM runs on a second stream
# and overlaps the first _range_fwd_kernel launch
FWD_TRACE = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 40, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 4, "tid": 1},
    {"ph": "X", "cat": "kernel", "name": "_range_fwd_kernel", "ts": 100, "dur": 300, "tid": 7},
    {"ph": "X", "cat": "kernel", "name": GEMM, "ts": 150, "dur": 50, "tid": 13},
    {"ph": "X", "cat": "kernel", "name": "_range_fwd_kernel", "ts": 400, "dur": 200, "tid": 7},
    {"ph": "X", "cat": "kernel", "name": GLUE, "ts": 600, "dur": 100, "tid": 7},
    {"ph": "X", "cat": "kernel", "name": FILL, "ts": 700, "dur": 2, "tid": 7},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 702, "dur": 30, "tid": 7},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 732, "dur": 3, "tid": 7},
]
BWD_TRACE = [
    {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function", "ts": 0, "dur": 90, "tid": 1},
    {"ph": "X", "cat": "kernel", "name": "_range_bwd_dq_kernel", "ts": 100, "dur": 400, "tid": 7},
    {"ph": "X", "cat": "kernel", "name": "_range_bwd_dkdv_kernel", "ts": 500, "dur": 600, "tid": 7},
    {"ph": "X", "cat": "kernel", "name": "_range_bwd_dkdv_kernel", "ts": 1100, "dur": 500, "tid": 7},
]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _profile(trace: list[dict]) -> SimpleNamespace:
    """A profile whose events() are the trace's, as torch's FunctionEvent shows them to profile_layer: a name, a
    device type (CUDA for the GPU's kernels, copies and sets) and a time range in us."""
    events = [SimpleNamespace(name=e["name"], kernels=[], time_range=Interval(e["ts"], e["ts"] + e["dur"]),
                              device_type=torch.autograd.DeviceType.CUDA if e["cat"] in GPU_CATS
                              else torch.autograd.DeviceType.CPU) for e in trace]
    return SimpleNamespace(events=lambda: events)


def test_a_trace_s_kernels_and_their_roofline_by_hand():
    fwd, copies_fwd = pl._kernels(_profile(FWD_TRACE), torch)
    bwd, copies_bwd = pl._kernels(_profile(BWD_TRACE), torch)
    # every launch kept with its own duration, the overlapping GEMM included (GPU time is the sum of durations)
    assert fwd == {"_range_fwd_kernel": [300, 200], GEMM: [50], GLUE: [100], FILL: [2]}
    assert bwd == {"_range_bwd_dq_kernel": [400], "_range_bwd_dkdv_kernel": [600, 500]}
    assert (copies_fwd, copies_bwd) == (2, 0)
    # one pass each: {name: [ms, launches]}, written out by hand
    by_pass = {"fwd": {"_range_fwd_kernel": [0.5, 2], GEMM: [0.05, 1], GLUE: [0.1, 1], FILL: [0.002, 1]},
               "bwd": {"_range_bwd_dq_kernel": [0.4, 1], "_range_bwd_dkdv_kernel": [1.1, 2]}}
    r = pl.roofline(by_pass, "nsa-triton", 2048, 8, H100, SHAPE)
    costs = cm.all_costs(NSAConfig(**SHAPE), 2048, 8)
    flops, exps, hbm = 989.4e12, 132 * 16 * 1.83e9, 3.35e12  # the H100 SXM row, by hand

    def floor_ms(fam):
        c = costs[fam]
        return max(c.flops / flops, c.exps / exps, c.bytes / hbm) * 1e3

    f_fwd, f_dq, f_dkdv = floor_ms("range_fwd"), floor_ms("range_bwd_dq"), floor_ms("range_bwd_dkdv")
    assert 0 < f_fwd < 0.5 and 0 < f_dq < 0.4 and 0 < f_dkdv < 1.1
    rows = {(k["pass"], k["name"]): k for k in r["kernels"]}
    assert rows[("fwd", "_range_fwd_kernel")]["floor_ms"] == pytest.approx(f_fwd)
    assert rows[("fwd", GLUE)]["floor_ms"] is None and rows[("fwd", GEMM)]["family"] == "gemm"
    # layer 2.152 ms: the fill (0.002 ms, 0.09%) is under 1% and left out; the glue and the GEMM count, floorless
    assert rows[("fwd", FILL)]["share"] == pytest.approx(0.002 / 2.152)
    assert r["efficiency_fwd"] == pytest.approx(f_fwd / 0.65)
    assert r["efficiency_bwd"] == pytest.approx((f_dq + f_dkdv) / 1.5)
    assert r["efficiency"] == pytest.approx((f_fwd + f_dq + f_dkdv) / 2.15)
    assert (r["fwd_gpu_ms"], r["fwd_kernel_launches"]) == (pytest.approx(0.652), 5)
    assert (r["bwd_gpu_ms"], r["bwd_kernel_launches"]) == (pytest.approx(1.5), 3)


def test_a_profile_without_gpu_kernels_is_an_error_not_zero_launches():
    """A CPU run's trace (CPU ops and runtime calls, no GPU event) and a trace whose GPU side holds copies only: no
    kernel was recorded, so there is no launch count and no GPU time; 0 launches would read as a layer within the
    launch cap and 0 ms as no time."""
    cpu_only = [e for e in FWD_TRACE + BWD_TRACE if e["cat"] not in GPU_CATS]
    with pytest.raises(RuntimeError, match="no GPU kernel"):
        pl._kernels(_profile(cpu_only), torch)
    copies_only = [e for e in FWD_TRACE if e["cat"] != "kernel"]
    with pytest.raises(RuntimeError, match="no GPU kernel"):
        pl._kernels(_profile(copies_only), torch)
