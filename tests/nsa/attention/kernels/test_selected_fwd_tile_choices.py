"""The selected kv forward's tile choices side by side (nsa.attention.kernels.selected_attn.host.FWD_TILE_CHOICES:
"shipped", _config's 128-row tile and _sel_fwd_kv_out on 8 warps, beside "m64_w4", a 64-row tile table for the
three forward passes and _sel_fwd_kv_out on 4 warps). Every choice's output against an independent float64 dense
reference with an explicit mask (the keys p <= t of the listed blocks, a repeated block counted twice, a block past
the query masked whole, a query with no block 0), the lse it leaves for the backward, rows that are not 16-byte
aligned, the launches, and the choice's plumbing.

Without a GPU the kernels run in Triton's interpreter (fp32, small shapes, tight tolerances; it ignores warps and
alignment, so it checks the lean tile's tiling and masks); with one, natively in bf16, each tensor judged by
triton_test_utils.assert_within_torch_error with the same reference evaluated in bf16 as the scale of the rule.
reports/aot/selected_fwd_occupancy.md holds the ahead-of-time registers and CTAs per SM.
"""

import re

import pytest
import torch

from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, needs_triton
from triton_test_utils import assert_choice_close as _close, choice_blocks, listed_reference


if HAVE_TRITON:
    from nsa.attention.kernels.selected_attn import host as ts

# a block past its query has no key: the kv forward's per-block log-sum-exp is log2(0) = -inf there, by design
pytestmark = [needs_triton, pytest.mark.filterwarnings("ignore:divide by zero encountered in log2")]

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
TOL = 3e-2 if ON_GPU else 2e-5  # |got - want| <= TOL * max|want| + TOL per tensor (the interpreter's fp32)
CHOICES = ("shipped", "m64_w4")


@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    ts.FWD_TILE_CHOICE = "auto"
    ts.OUT_CHOICE = "auto"


def _inputs(b, h, g, s, d, seed, pad=0):
    """q, k, v, do as transposed views of [B, S, heads, d + pad] storage (pad > 0: rows 4(d + pad) bytes apart,
    not 16-byte aligned for an odd pad, the last `pad` columns unused)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d + pad, generator=gen)[..., :d].transpose(1, 2) for n in (h, g, g))
    do = torch.randn(b, h, s, d, generator=gen)
    return [t.to(KERNEL_DEVICE, DTYPE) if pad == 0 else t.to(DTYPE) for t in (q, k, v, do)]


def _blocks(b, g, s, l_sel, n_sel, seed, edits=()):
    """choice_blocks (random importance, then `edits`), and query 2 with no block at all."""
    blocks = choice_blocks(b, g, s, l_sel, n_sel, seed, edits)
    blocks[:, :, 2] = -1
    return blocks


def _forward_each_choice(q, k, v, blocks, l_sel):
    """{choice: (o, lse)} of the kv forward (the fwd op, the torch index build)."""
    got = {}
    for choice in CHOICES:
        ts.FWD_TILE_CHOICE = choice
        o, lse = torch.ops.nsa.selected_attention_fwd(q, k, v, blocks, l_sel, "kv", 2, "torch")[:2]
        got[choice] = (o, lse)
    return got


def _check_forward(b, h, g, s, d, l_sel, n_sel, seed, edits):
    q, k, v, _ = _inputs(b, h, g, s, d, seed)
    blocks = _blocks(b, g, s, l_sel, n_sel, seed + 1, edits)
    want, low = (listed_reference(q, k, v, blocks, l_sel, dtype) for dtype in (torch.float64, DTYPE))
    got = _forward_each_choice(q, k, v, blocks, l_sel)
    lse_ref = got["shipped"][1]
    for choice, (o, lse) in got.items():
        assert o.shape == want.shape and o.dtype == DTYPE
        assert (o[:, :, 2] == 0).all(), choice
        _close(f"{choice}: o", o, want, low)
        # the lse the backward reads: the same statistics whatever the forward's tiles
        assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), choice
        fin = torch.isfinite(lse_ref)
        assert (lse[fin] - lse_ref[fin]).abs().max().item() <= (3e-2 if ON_GPU else 1e-5), choice
    if not ON_GPU:  # the same pairs summed in another order: fp32 rounding only
        assert (got["shipped"][0] - got["m64_w4"][0]).abs().max().item() <= 1e-5


def test_every_tile_choice_matches_float64():
    """hpg 6, d 64 (the choices' head dim; the model's hpg): S 40 not a multiple of l_sel 16, a repeated block (the
    own one, partly masked; block 0) and a block past its query in -1 slots, a query with no block. 64-row tiles
    hold 10 queries of 6 heads (60 of 64 rows), 128-row tiles 21."""
    _check_forward(1, 6, 1, 40, 64, 16, 4, 0, ((36, 3, 2), (20, 3, 2), (9, 2, 0)))


@pytest.mark.slow
@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,seed,edits", [
    pytest.param(2, 12, 2, 70, 64, 16, 5, 11, ((33, 4, 2),), id="hpg6-B2-G2"),
    pytest.param(1, 16, 1, 90, 64, 64, 3, 12, ((10, 1, 0),), id="hpg16-l_sel64"),
    pytest.param(1, 2, 1, 150, 64, 128, 2, 13, (), id="hpg2-l_sel128-stepped"),
])
def test_every_tile_choice_matches_float64_more_shapes(b, h, g, s, d, l_sel, n_sel, seed, edits):
    _check_forward(b, h, g, s, d, l_sel, n_sel, seed, edits)


@pytest.mark.slow
def test_backward_after_the_lean_forward():
    """The backward (its own tile table, the shipped kernels) reads the lean forward's lse and o: q, k, v gradients
    against float64."""
    b, h, g, s, d, l_sel = 1, 6, 2, 36, 64, 8
    q, k, v, do = _inputs(b, h, g, s, d, 5)
    blocks = _blocks(b, g, s, l_sel, 3, 6, ((5, 1, 0), (5, 2, 3)))
    grads = {}
    for dtype in (torch.float64, DTYPE):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        grads[dtype] = torch.autograd.grad(listed_reference(*leaves, blocks, l_sel, dtype), leaves, do.to(dtype))
    ts.FWD_TILE_CHOICE = "m64_w4"
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    got = torch.autograd.grad(ts.selected_attention(*leaves, blocks, l_sel, bwd_tiles=2), leaves, do)
    for name, x, w, lo in zip(("dq", "dk", "dv"), got, grads[torch.float64], grads[DTYPE]):
        _close(f"m64_w4: {name}", x, w, lo)


@pytest.mark.skipif(ON_GPU, reason="strided views of host memory (the interpreter's CPU tensors)")
def test_rows_that_are_not_16_byte_aligned_compute_what_contiguous_ones_do():
    """Rows 4 * 65 bytes apart (strides no multiple of 16, so a launch's JIT specialises nothing): the lean tile
    computes what it does on contiguous inputs."""
    q, k, v, _ = _inputs(1, 6, 1, 24, 64, 3, pad=1)
    assert q.stride(2) == 6 * 65
    blocks = _blocks(1, 1, 24, 8, 3, 4).cpu()
    ts.FWD_TILE_CHOICE = "m64_w4"
    o = ts.selected_attention(q, k, v, blocks, 8)
    o_contiguous = ts.selected_attention(q.contiguous(), k.contiguous(), v.contiguous(), blocks, 8)
    assert torch.equal(o, o_contiguous)


class _Recorder:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **kwargs) records its name and keyword arguments."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, kwargs))


@pytest.mark.parametrize("choice,d,out,want", [
    ("shipped", 64, "atomic", [("_sel_fwd_kv_stats", 128, 4), ("_sel_fwd_kv_out", 128, 8)]),
    ("m64_w4", 64, "atomic", [("_sel_fwd_kv_stats", 64, 4), ("_sel_fwd_kv_out", 64, 4)]),
    ("m64_w4", 32, "atomic", [("_sel_fwd_kv_stats", 128, 4), ("_sel_fwd_kv_out", 128, 8)]),  # d 64 only
    ("m64_w4", 64, "partial", [("_sel_fwd_kv_stats", 64, 4), ("_sel_fwd_kv_part", 64, 8),
                               ("_sel_fwd_reduce", None, 4)]),
])
def test_each_choice_launches_its_kernels(monkeypatch, choice, d, out, want):
    """The tile choice sets the rows of all the forward's passes (one tile table: queries per tile = rows // hpg)
    and, with the atomic output, the output pass's kernel and warps; other head dims keep the shipped tile."""
    calls = []
    for name in ("_sel_fwd_kv_stats", "_sel_fwd_kv_out", "_sel_fwd_kv_part",
                 "_sel_fwd_reduce"):
        monkeypatch.setattr(ts, name, _Recorder(name, calls))
    ts.FWD_TILE_CHOICE, ts.OUT_CHOICE = choice, out
    b, h, g, s, l_sel = 1, 6, 1, 32, 8
    q, k, v = (torch.randn(b, s, n, d).transpose(1, 2) for n in (h, g, g))
    ts._fwd_op(q, k, v, _blocks(b, g, s, l_sel, 3, 0).cpu(), l_sel, "kv", 2, "torch")
    assert [(n, kw.get("BLOCK_R"), kw["num_warps"]) for n, kw in calls] == want
    assert ts._per_tile(h // g, d, d, 2)[0] == want[0][1] // (h // g)


def test_auto_is_the_qualified_choice_and_an_unknown_name_is_refused():
    assert tuple(ts.FWD_TILE_CHOICES) == CHOICES and ts.QUALIFIED_FWD_TILE == "shipped"
    assert ts.FWD_TILE_CHOICE == "auto" and ts.fwd_tile_choice() == "shipped"
    ts.FWD_TILE_CHOICE = "m64_w4"
    assert ts.fwd_tile_choice() == "m64_w4" and ts._lean_tile(6, 64, 64).block_m == 64
    assert ts._lean_tile(6, 32, 32) is None and ts._lean_tile(128, 64, 64).block_m == 128  # rows hold all heads
    ts.FWD_TILE_CHOICE = "wide"
    with pytest.raises(ValueError, match=re.escape("FWD_TILE_CHOICE must be one of auto | shipped | m64_w4, got "
                                                   "'wide'")):
        ts.fwd_tile_choice()
    q, k, v, _ = _inputs(1, 2, 1, 16, 16, 0)
    with pytest.raises(ValueError, match="FWD_TILE_CHOICE"):  # before the forward runs
        ts.selected_attention(q, k, v, _blocks(1, 1, 16, 8, 2, 1), 8)
