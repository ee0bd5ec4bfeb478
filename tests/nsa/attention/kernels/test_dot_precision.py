"""The attention kernels' tl.dot precision (nsa.attention.kernels.common.dot_precision) and that every launch of the
range and selected kernels passes it.

Triton multiplies fp32 operands in TF32 unless told otherwise; on an H100 the fp32 Triton layer was ~2,700x less
accurate than the PyTorch path at fp32 (test_triton_glue's layer test, 2026-11-26), most likely from that: a TF32
emulation in the interpreter reproduces it (test_triton_glue). fp32 now follows PyTorch's fp32 matmul setting, as
FlexAttention does. Here the mapping and the wiring, with the kernels replaced by recorders (nothing is launched);
that DOT_PREC reaches the compiled code (no tensor-core instruction for fp32 under "ieee") is test_aot_compile's.
"""

from __future__ import annotations

import pytest
import torch

from triton_test_utils import needs_triton

pytestmark = needs_triton


@pytest.fixture
def matmul_precision():
    """Restores PyTorch's fp32 matmul setting after the test changes it."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def test_fp32_follows_pytorchs_fp32_matmul_setting_and_low_precision_takes_the_tensor_cores(matmul_precision):
    from nsa.attention.kernels.common import dot_precision

    matmul_precision("highest")
    assert dot_precision(torch.float32) == "ieee"
    assert dot_precision(torch.bfloat16) == dot_precision(torch.float16) == "tf32"  # Triton's default: unchanged
    matmul_precision("high")
    assert dot_precision(torch.float32) == "tf32"
    assert dot_precision(torch.bfloat16) == "tf32"


class _Recorder:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **kwargs) records the keyword arguments."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.name, kwargs))
        return launch


def _record(monkeypatch, module, names):
    calls = []
    for name in names:
        monkeypatch.setattr(module, name, _Recorder(name, calls))
    return calls


@pytest.mark.parametrize("dtype, setting, want", [(torch.float32, "highest", "ieee"), (torch.float32, "high", "tf32"),
                                                  (torch.bfloat16, "highest", "tf32")])
def test_every_range_kernel_launch_passes_the_precision(monkeypatch, matmul_precision, dtype, setting, want):
    from nsa.attention.kernels.range_attn import host as triton_range

    matmul_precision(setting)
    calls = _record(monkeypatch, triton_range, ["_range_fwd_kernel", "_range_bwd_dq_kernel", "_range_bwd_dkdv_kernel"])
    b, h, g, s, d = 1, 2, 1, 40, 32
    q, k, v = (torch.randn(b, s, n, d, dtype=dtype).transpose(1, 2) for n in (h, g, g))
    o, lse = triton_range._forward(q, k, v, 0, 16, 0)
    triton_range._backward(torch.randn_like(o), q, k, v, lse.zero_(), o.zero_(), None, 0, 16, 0)
    assert [name for name, _ in calls] == ["_range_fwd_kernel", "_range_bwd_dq_kernel", "_range_bwd_dkdv_kernel"]
    assert all(kw.get("DOT_PREC") == want for _, kw in calls), calls


@pytest.mark.parametrize("loop", ["kv", "query"])
@pytest.mark.parametrize("dtype, want", [(torch.float32, "ieee"), (torch.bfloat16, "tf32")])
def test_every_selected_kernel_launch_with_a_dot_passes_the_precision(monkeypatch, matmul_precision, loop, dtype,
                                                                       want):
    from nsa.attention.kernels.selected_attn import host as triton_selected

    matmul_precision("highest")
    dots = ["_sel_fwd_query", "_sel_fwd_kv_stats", "_sel_fwd_kv_out", "_sel_bwd_kv"]
    calls = _record(monkeypatch, triton_selected, [*dots, "_sel_bwd_delta"])
    b, h, g, s, d, l_sel, n_sel = 1, 2, 1, 64, 32, 16, 2
    q, k, v = (torch.randn(b, s, n, d, dtype=dtype).transpose(1, 2) for n in (h, g, g))
    blocks = torch.stack([torch.arange(n_sel).expand(s, n_sel)] * g).unsqueeze(0).to(torch.int32).contiguous()
    o, lse, pair_t, tiles = triton_selected._fwd_op(q, k, v, blocks, l_sel, loop, 1, "torch")
    triton_selected._bwd_op(torch.randn_like(o), q, k, v, o, lse, pair_t, tiles, l_sel, 1)
    launched = [name for name, _ in calls]
    assert launched == (["_sel_fwd_query"] if loop == "query" else ["_sel_fwd_kv_stats", "_sel_fwd_kv_out"]) + \
        ["_sel_bwd_delta", "_sel_bwd_kv"]
    assert all(kw.get("DOT_PREC") == want for name, kw in calls if name in dots), calls
