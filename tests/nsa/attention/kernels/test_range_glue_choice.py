"""The range backward's glue choices (nsa.attention.kernels.range_attn.host.GLUE_CHOICES, issue 31 item 2.6):
"torch" sums dK/dV's fp32 partials with torch (the cmp branch's split) and casts them with torch; "fused" does both
in one _range_dkdv_sum launch.

Checked here on CPU, in Triton's interpreter: _sum_cast gives torch's sum(0) then .to(dtype) bit for bit in fp32,
bf16 (the rounding written out on the bits, as the interpreter's own bf16 cast does not round to nearest; NaN stays
NaN) and fp16, with one split and several; the cmp and window backwards give the "torch" choice's gradients bit for
bit (fp32), which test_range_dkdv_choices / test_triton_range hold against float64, and so does the fp32 backward
the selected band choice runs (its split summed in the same launch); the op count of the cmp backward drops its two
sums. On a GPU (written for reports/gpu/next_run.sh PART=choices, never run yet): the cmp backward in
bf16 under both choices, equal to one bf16 rounding step (torch's own sum there may add in another order). The AOT
compile is in reports/aot/triton-<version>.md.
"""

import pytest
import torch

from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, needs_triton
from op_counting import count_choices

if HAVE_TRITON:
    from nsa.attention.kernels.range_attn import host as tr

pytestmark = needs_triton
cpu_only = pytest.mark.skipif(ON_GPU, reason="interpreter comparisons (CPU tensors)")


@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    tr.GLUE_CHOICE = "auto"


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_split", [1, 3])
def test_sum_cast_is_torchs_sum_and_cast_bit_for_bit(dtype, n_split):
    gen = torch.Generator().manual_seed(n_split)
    dk_part = torch.randn(n_split, 1, 2, 37, 32, generator=gen) * 100
    dv_part = torch.randn(n_split, 1, 2, 37, 64, generator=gen)  # more elements than dK: the grid covers both
    dk_part[0, 0, 0, 0, :4] = torch.tensor([float("inf"), float("nan"), 1e-40, 3.4e38])
    dk, dv = tr._sum_cast(dk_part, dv_part, dtype)
    for got, part in ((dk, dk_part), (dv, dv_part)):
        want = part.sum(0).to(dtype)
        assert got.dtype == dtype and got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got.isnan(), want.isnan())
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(got[~got.isnan()].view(bits), want[~want.isnan()].view(bits))


def _grads(fn, s, t, seed):
    gen = torch.Generator().manual_seed(seed)
    # two heads of one group, [B, n, length, d] seen through [B, length, n, d] storage as the layer passes them
    q, k, v = (torch.randn(1, length, n, 32, generator=gen).transpose(1, 2) for n, length in ((2, s), (1, t), (1, t)))
    upstream = torch.randn(1, 2, s, 32, generator=gen)
    out = {}
    for choice in tr.GLUE_CHOICES:
        tr.GLUE_CHOICE = choice
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out[choice] = torch.autograd.grad(fn(*leaves), leaves, upstream)
    return out


@cpu_only
@pytest.mark.parametrize("mode", ["cmp", "window"])
def test_fused_glue_gives_the_torch_glues_gradients(mode, monkeypatch):
    """cmp with its dK/dV split (several partials: the split forced finer here so that the sum has work) and the
    window (one partial: nothing launches in fp32 under either choice)."""
    calls = []
    real = tr._range_dkdv_sum

    class Recorder:
        def __getitem__(self, grid):
            calls.append(grid)
            return real[grid]

    monkeypatch.setattr(tr, "_range_dkdv_sum", Recorder())
    if mode == "cmp":
        monkeypatch.setattr(tr, "dkdv_splits", lambda *a, **kw: 3)
        got = _grads(lambda q, k, v: tr.compressed_attention(q, k, v, 8, 4), 40, 9, 0)
    else:
        got = _grads(lambda q, k, v: tr.window_attention(q, k, v, 12), 40, 40, 1)
    for name, x, w in zip(("dq", "dk", "dv"), got["fused"], got["torch"]):
        assert torch.equal(x, w), name
    assert len(calls) == (1 if mode == "cmp" else 0)


@cpu_only
def test_fp32_backward_sums_its_split_in_one_launch(monkeypatch):
    """The fp32 backward (the selected band choice's band: fp32=True) with a split: the same dk, dv in fp32 as
    torch's sum(0), through one _range_dkdv_sum launch."""
    monkeypatch.setattr(tr, "dkdv_splits", lambda *a, **kw: 3)
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 40, n, 32, generator=gen).transpose(1, 2) for n in (2, 1, 1))
    do = torch.randn(1, 2, 40, 32, generator=gen)
    o, lse = tr._forward(q, k, v, tr.BAND, 8, 8)
    got = {}
    for choice in tr.GLUE_CHOICES:
        tr.GLUE_CHOICE = choice
        got[choice] = tr._backward(do, q, k, v, lse, o, None, tr.BAND, 8, 8, fp32=True)
    for name, x, w in zip(("dq", "dk", "dv"), got["fused"], got["torch"]):
        assert x.dtype == torch.float32 and torch.equal(x, w), name


@cpu_only
def test_fused_glue_drops_the_cmp_backwards_sums(monkeypatch):
    """benchmarks/bench_ops.py's counter over the cmp backward with a split: sum x2 gone, one launch more."""
    monkeypatch.setattr(tr, "dkdv_splits", lambda *a, **kw: 2)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 32, generator=gen) for n in (24, 5, 5))

    def call():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        torch.autograd.grad(tr.compressed_attention(*leaves, 8, 4), leaves, torch.ones(1, 2, 24, 32))

    counts = count_choices(tr, "GLUE_CHOICE", tr.GLUE_CHOICES, call)
    assert counts["torch"].ops["sum"] - counts["fused"].ops["sum"] == 2
    assert counts["torch"].total - counts["fused"].total == 2
    assert counts["fused"].launches["_range_dkdv_sum"] == 1
    assert sum(counts["fused"].launches.values()) == sum(counts["torch"].launches.values()) + 1


@pytest.mark.skipif(not ON_GPU, reason="the compiled kernel in bf16 (the CPU tests above cover the interpreter)")
def test_fused_glue_on_the_gpu_is_the_torch_glue_to_bf16_rounding():
    """On a GPU in bf16: the cmp backward (its real split) under both choices; torch's sum on the GPU may add in
    another order, so dK and dV may differ by the rounding of one bf16 step, dQ not at all."""
    gen = torch.Generator().manual_seed(4)
    s, n_cmp = 4096, (4096 - 32) // 16 + 1
    q, k, v = (torch.randn(1, length, n, 64, generator=gen).to(KERNEL_DEVICE, torch.bfloat16).transpose(1, 2)
               for n, length in ((12, s), (2, n_cmp), (2, n_cmp)))
    upstream = torch.randn(1, 12, s, 64, generator=gen).to(KERNEL_DEVICE, torch.bfloat16)
    got = {}
    for choice in tr.GLUE_CHOICES:
        tr.GLUE_CHOICE = choice
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        got[choice] = torch.autograd.grad(tr.compressed_attention(*leaves, 32, 16), leaves, upstream)
    for name, x, w in zip(("dq", "dk", "dv"), got["fused"], got["torch"]):
        assert x.dtype == w.dtype == torch.bfloat16 and x.shape == w.shape, name
        x, w = x.float(), w.float()
        assert torch.isfinite(x).all(), name
        assert ((x - w).abs() <= w.abs() * 2.0 ** -7 + 1e-6).all(), name
