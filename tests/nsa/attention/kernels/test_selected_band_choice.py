"""The selected branch's forced-block choice "band" (nsa.attention.kernels.selected_attn.host.FORCED_CHOICES): the
forced blocks (block 0, the previous and the own block) through range attention's band kernel, the other listed
blocks through the selected kernels (_sel_band_rest packs them), the two merged through their log-sum-exp
(_sel_band_merge) and each part's backward run from the merged O and lse.

o, dq, dk, dv against an independent float64 dense reference with an explicit mask: the keys p <= t whose block is
forced for t or listed for t, each counted once (a forced block listed again, or listed twice, is one block). With
choose_blocks' lists (which hold every forced block once) that is also what the shipped "sparse" choice computes,
and the two choices agree to rounding. Without a GPU the kernels run in Triton's interpreter (fp32, small shapes,
tight tolerances); with one, natively in bf16, each tensor judged by assert_within_torch_error against the same
reference in bf16.
"""

import math
import re

import pytest
import torch

from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, needs_triton
from triton_test_utils import choice_inputs as _inputs, choice_blocks as _blocks, assert_choice_close as _close

from op_counting import count_choices

if HAVE_TRITON:
    from nsa.attention.kernels.selected_attn import host as ts

pytestmark = [needs_triton, pytest.mark.filterwarnings("ignore:divide by zero encountered in log2")]

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
TOL = 3e-2 if ON_GPU else 2e-5  # |got - want| <= TOL * max|want| + TOL per tensor (the interpreter's fp32)


@pytest.fixture(autouse=True)
def _restore_choices():
    yield
    ts.FORCED_CHOICE = ts.DQ_CHOICE = ts.OUT_CHOICE = ts.HOST_CHOICE = "auto"


def _reference(q, k, v, blocks, l_sel, dtype):
    """softmax over the keys p <= t of the blocks forced or listed for t (each once) in `dtype`."""
    h, s, d = q.shape[1], q.shape[2], q.shape[3]
    hpg = h // k.shape[1]
    pos = torch.arange(s, device=q.device)
    blk = pos // l_sel
    listed = (blocks.long()[..., :, None] == blk).any(-2)  # [B, G, t, p]
    cur = blk[:, None]
    forced = (blk[None, :] == 0) | (blk[None, :] == cur) | (blk[None, :] == cur - 1)  # [t, p]
    allowed = (listed | forced) & (pos[None, :] <= pos[:, None])
    allowed = allowed.repeat_interleave(hpg, dim=1)
    q, k, v = q.to(dtype), k.to(dtype).repeat_interleave(hpg, dim=1), v.to(dtype).repeat_interleave(hpg, dim=1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _run(choice, q, k, v, do, blocks, l_sel, loop="kv", bwd_tiles=2):
    ts.FORCED_CHOICE = choice
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = ts.selected_attention(*leaves, blocks, l_sel, loop=loop, bwd_tiles=bwd_tiles, index_build="torch")
    return (out, *torch.autograd.grad(out, leaves, do))


def _check(b, h, g, s, d, l_sel, n_sel, seed, edits=(), loop="kv", against_sparse=True):
    q, k, v, do = _inputs(b, h, g, s, d, seed)
    blocks = _blocks(b, g, s, l_sel, n_sel, seed + 1, edits)
    refs = {}
    for dtype in (torch.float64, DTYPE):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = _reference(*leaves, blocks, l_sel, dtype)
        refs[dtype] = (out, *torch.autograd.grad(out, leaves, do.to(dtype)))
    got = _run("band", q, k, v, do, blocks, l_sel, loop)
    for name, x, want, low in zip(("o", "dq", "dk", "dv"), got, refs[torch.float64], refs[DTYPE]):
        assert x.shape == want.shape and x.dtype == DTYPE, name
        _close(f"band, {loop}: {name}", x, want, low)
    if against_sparse and not ON_GPU:  # the shipped choice on the same lists: the same function to fp32 rounding
        for name, x, y in zip(("o", "dq", "dk", "dv"), got, _run("sparse", q, k, v, do, blocks, l_sel, loop)):
            assert (x - y).abs().max().item() <= 1e-5 * (1.0 + y.abs().max().item()), name


# (b, h, g, s, d, l_sel, n_sel, seed): S not a multiple of l_sel everywhere.
CI_CASES = [
    pytest.param(1, 6, 1, 45, 32, 8, 5, 0, id="hpg6-S45-l8-n5"),
    pytest.param(1, 4, 2, 37, 32, 8, 4, 3, id="hpg2-G2-S37-n4"),
]


@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,seed", CI_CASES)
def test_band_choice_matches_float64_and_the_shipped_choice(b, h, g, s, d, l_sel, n_sel, seed):
    _check(b, h, g, s, d, l_sel, n_sel, seed)


def test_a_forced_block_listed_twice_counts_once():
    """Query 40's own block (5) and block 0 written into its empty slots again: the band choice counts each once
    (its sparse list drops them), as the reference does. (The shipped choice would weigh them twice.)"""
    _check(1, 2, 1, 45, 32, 8, 9, 5, edits=((40, 7, 5), (40, 8, 0)), against_sparse=False)


def test_every_block_forced_runs_the_band_alone(monkeypatch):
    """n_sel = 3, and S within 3 blocks (S shorter than 2 blocks included): no block can be other than forced, so
    the band kernel alone runs (no selected launch), equal to the float64 reference."""
    launched = []
    real = ts._forward
    monkeypatch.setattr(ts, "_forward", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    _check(1, 2, 2, 29, 32, 8, 3, 7, against_sparse=False)  # hpg 1, n_sel 3
    _check(1, 6, 1, 13, 32, 8, 16, 8, against_sparse=False)  # S < 2 blocks
    _check(1, 2, 1, 24, 32, 8, 16, 9, against_sparse=False)  # S = 3 blocks exactly
    assert not launched


def test_rest_kernel_packs_the_unforced_blocks():
    """_sel_band_rest on lists in any order, with -1 gaps, forced blocks anywhere and a forced block listed twice:
    the unforced blocks in their listed order, then -1."""
    b, g, s, l_sel, n_sel = 2, 2, 50, 4, 9
    nb = -(-s // l_sel)
    gen = torch.Generator().manual_seed(3)
    cur = torch.arange(s) // l_sel
    rows = []
    for t in range(s):  # every forced block, some others, shuffled, gaps of -1
        forced = sorted({0, int(cur[t]), max(int(cur[t]) - 1, 0)})
        others = [j for j in torch.randperm(nb, generator=gen).tolist() if j not in forced and j <= cur[t]]
        row = forced + others[: n_sel - len(forced) - 2] + [-1, int(cur[t])]
        row = row + [-1] * (n_sel - len(row))
        rows.append([row[i] for i in torch.randperm(n_sel, generator=gen).tolist()])
    blocks = torch.tensor(rows, dtype=torch.int32).expand(b, g, s, n_sel).contiguous()
    n_rest = ts._n_rest(n_sel, s, l_sel)
    got = ts._rest_blocks(blocks.to(KERNEL_DEVICE), l_sel, n_rest).cpu()
    assert got.shape == (b, g, s, n_rest) and got.dtype == torch.int32
    for t, row in enumerate(rows):
        keep = [j for j in row if j > 0 and j not in (cur[t], cur[t] - 1)]
        assert got[1, 1, t].tolist() == keep + [-1] * (n_rest - len(keep)), t
        assert torch.equal(got[0, 0, t], got[1, 1, t])


# ------------------------------------------------------------------------------------------------ the choice itself
def test_auto_is_the_shipped_choice_and_bad_uses_are_refused():
    assert ts.FORCED_CHOICES == ("sparse", "band") and ts.QUALIFIED_FORCED == "sparse"
    assert ts.FORCED_CHOICE == "auto" and ts.forced_choice() == "sparse"
    q, k, v, _ = _inputs(1, 2, 1, 16, 32, 0)
    ts.FORCED_CHOICE = "dense"
    with pytest.raises(ValueError, match=re.escape("FORCED_CHOICE must be one of auto | sparse | band, got 'dense'")):
        ts.selected_attention(q, k, v, _blocks(1, 1, 16, 8, 3, 1), 8)
    ts.FORCED_CHOICE = "band"
    with pytest.raises(ValueError, match="needs n_sel >= 3"):
        ts.selected_attention(q, k, v, _blocks(1, 1, 16, 8, 2, 1), 8)
    q16, k16, v16, _ = _inputs(1, 2, 1, 16, 16, 0)
    with pytest.raises(ValueError, match="range kernels' band"):
        ts.selected_attention(q16, k16, v16, _blocks(1, 1, 16, 8, 3, 1), 8)


def test_band_ops_opcheck():
    """The band choice's custom ops: schema and fake registrations (shapes, strides, dtypes)."""
    ts.FORCED_CHOICE = "band"
    q, k, v, do = _inputs(1, 4, 2, 40, 32, seed=1)
    blocks = _blocks(1, 2, 40, 8, 5, 2).to(torch.int32)
    args = (q, k, v, blocks, 8, "kv", 2, "torch")
    torch.library.opcheck(torch.ops.nsa.selected_band_attention_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    o, lse_h, lse_g, rest, pair_t, tiles = torch.ops.nsa.selected_band_attention_fwd(*args)
    assert rest.shape == (1, 2, 40, 2)
    torch.library.opcheck(torch.ops.nsa.selected_band_attention_bwd.default,
                          (do, q, k, v, o, lse_h, lse_g, rest, pair_t, tiles, 8, 2),
                          test_utils=("test_schema", "test_faketensor"))


# ------------------------------------------------------------------------------------------------ other choices
@pytest.mark.slow
@pytest.mark.parametrize("dq,out,host,tile,loop", [
    ("query", "atomic", "torch", "shipped", "kv"),
    ("atomic", "partial", "fused", "shipped", "kv"),
    ("query", "atomic", "fused", "shipped", "query"),
    ("atomic", "atomic", "torch", "m64_w4", "kv"),
])
def test_band_choice_with_the_other_choices(dq, out, host, tile, loop):
    """The sparse part runs under whichever dQ, output, host-glue and tile choices are in effect."""
    ts.DQ_CHOICE, ts.OUT_CHOICE, ts.HOST_CHOICE, ts.FWD_TILE_CHOICE = dq, out, host, tile
    try:
        _check(1, 6, 2, 70, 64, 16, 6, 11, loop=loop)
    finally:
        ts.FWD_TILE_CHOICE = "auto"


@pytest.mark.slow
@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,seed", [
    pytest.param(2, 12, 2, 150, 64, 16, 8, 21, id="hpg6-B2-d64-S150"),
    pytest.param(1, 16, 1, 90, 32, 16, 4, 22, id="hpg16"),
    pytest.param(1, 2, 1, 200, 128, 64, 3, 23, id="hpg2-d128-l64-n3"),
    pytest.param(1, 2, 1, 300, 32, 64, 5, 24, id="hpg2-l64-S300"),
])
def test_band_choice_matches_float64_more_shapes(b, h, g, s, d, l_sel, n_sel, seed):
    _check(b, h, g, s, d, l_sel, n_sel, seed)


@pytest.mark.skipif(ON_GPU, reason="counts under the interpreter (CPU)")
def test_band_choice_launches_five_kernels_more_and_no_zero_fills():
    """benchmarks/bench_ops.py's counter over the selected branch's forward + backward: the band choice launches
    _sel_band_rest, _sel_band_merge and the band's three range kernels besides the shipped choice's kernels; its
    backward's atomics add onto the band's gradients, so the shipped backward's 3 zero fills go, and its only other
    aten ops are the band's dK/dV split partials' sums."""
    q, k, v, do = _inputs(1, 4, 2, 40, 32, 3)
    blocks = _blocks(1, 2, 40, 8, 5, 4)

    def call():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.autograd.grad(ts.selected_attention(*leaves, blocks, 8, index_build="torch"), leaves, do)

    counts = count_choices(ts, "FORCED_CHOICE", ts.FORCED_CHOICES, call)
    sparse, band = (dict(counts[c].launches) for c in ts.FORCED_CHOICES)
    new = {"_sel_band_rest": 1, "_sel_band_merge": 1, "_range_fwd_kernel": 1, "_range_bwd_dq_kernel": 1,
           "_range_bwd_dkdv_kernel": 1}
    assert band == {**sparse, **new}, (sparse, band)
    more = dict(counts["band"].ops)
    for name, n in counts["sparse"].ops.items():
        assert more.pop(name, 0) == n - 3 * (name == "zeros"), name
    assert set(more) <= {"sum"}, more
