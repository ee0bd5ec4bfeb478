"""The selected branch's dQ choices side by side (nsa.attention.kernels.selected_attn.host.DQ_CHOICES): "atomic"
(the KV-block-outer _sel_bwd_kv adds each pair's dQ term with fp32 atomics) and "query" (_sel_bwd_kv computes dK/dV
only; _sel_bwd_dq_query walks each query's listed blocks and stores its dQ once). Every choice's o, dq, dk, dv
against an independent float64 dense reference with an explicit mask: the keys p <= t of the listed blocks, a block
counted as often as it is listed (a repeated block weighs twice in the softmax, which is what both choices compute,
see host.py's docstring), a block past the query masked whole. Also the kv forward's output choices (host.OUT_CHOICES:
fp32 atomics into one output, or per-pair partial outputs summed after) and the host glue choices (host.HOST_CHOICES:
the lse reduction and the atomics' zero fills in torch, or folded into _sel_fwd_lse and _sel_bwd_delta_zero).

Without a GPU the kernels run in Triton's interpreter (fp32, small shapes, tight tolerances); with one, natively in
bf16, each tensor judged by triton_test_utils.assert_within_torch_error with the same reference evaluated in bf16
as the scale of the rule.
"""

import math
import re

import pytest
import torch

from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, assert_within_torch_error, needs_triton
from triton_test_utils import choice_inputs as _inputs, choice_blocks as _blocks, listed_reference

from op_counting import count_choices

if HAVE_TRITON:
    from nsa.attention.kernels.selected_attn import host as ts

# a block past its query has no key: the kv forward's per-block log-sum-exp is log2(0) = -inf there, by design
pytestmark = [needs_triton, pytest.mark.filterwarnings("ignore:divide by zero encountered in log2")]

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
TOL = 3e-2 if ON_GPU else 2e-5  # |got - want| <= TOL * max|want| + TOL per tensor (the interpreter's fp32)
CHOICES = ("atomic", "query")


def _grads(fn, q, k, v, do, dtype=None):
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return out, leaves


def _close(what, got, want, low):
    assert torch.isfinite(got).all(), f"{what}: not finite"
    if ON_GPU:
        assert_within_torch_error(what, got, want, low)
        return
    got, want = got.double(), want.double()
    err = (got - want).abs().max().item()
    bound = TOL * want.abs().max().item() + TOL
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def _check(b, h, g, s, d, l_sel, n_sel, seed, edits=(), loop="kv", bwd_tiles=2):
    q, k, v, do = _inputs(b, h, g, s, d, seed)
    blocks = _blocks(b, g, s, l_sel, n_sel, seed + 1, edits)
    refs = {}
    for dtype in (torch.float64, DTYPE):
        out, leaves = _grads(lambda *x: listed_reference(*x, blocks, l_sel, x[0].dtype), q, k, v, do, dtype)
        refs[dtype] = (out, torch.autograd.grad(out, leaves, do.to(dtype)))
    (want, want_grads), (low, low_grads) = refs[torch.float64], refs[DTYPE]
    # one forward; each backward reads the dQ choice when it launches
    out, leaves = _grads(lambda *x: ts.selected_attention(*x, blocks, l_sel, loop=loop, bwd_tiles=bwd_tiles), q, k,
                         v, do)
    _close(f"{loop}: o", out, want, low)
    got = {}
    for choice in CHOICES:
        ts.DQ_CHOICE = choice
        got[choice] = torch.autograd.grad(out, leaves, do, retain_graph=True)
        for name, x, w, lo in zip(("dq", "dk", "dv"), got[choice], want_grads, low_grads):
            assert x.shape == w.shape and x.dtype == DTYPE
            _close(f"{loop}, {choice}: {name}", x, w, lo)
    if not ON_GPU:  # the same terms summed in another order: the choices agree to fp32 rounding
        for name, a, c in zip(("dq", "dk", "dv"), got["atomic"], got["query"]):
            assert (a - c).abs().max().item() <= 1e-5 * (1.0 + a.abs().max().item()), name


@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    ts.DQ_CHOICE = "auto"
    ts.OUT_CHOICE = "auto"
    ts.HOST_CHOICE = "auto"


# (b, h, g, s, d, l_sel, n_sel, seed, edits): S not a multiple of l_sel; edits put a repeated block (the own one,
# partly masked, or block 0) and a block past the query (masked whole) into -1 slots of some queries' lists.
CI_CASES = [
    pytest.param(1, 3, 1, 40, 32, 16, 4, 0, ((36, 3, 2), (20, 3, 2), (9, 2, 0)), id="hpg3-S40-dup-past"),
    pytest.param(1, 2, 2, 37, 32, 8, 3, 3, ((12, 2, 0), (5, 1, 3)), id="hpg1-G2-S37-dup0-past"),
]


@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,seed,edits", CI_CASES)
def test_every_dq_choice_matches_float64(b, h, g, s, d, l_sel, n_sel, seed, edits):
    _check(b, h, g, s, d, l_sel, n_sel, seed, edits)


def test_query_dq_after_the_query_outer_forward():
    """The query-outer forward writes lse itself (_sel_fwd_query); the dQ pass reads it in the same layout."""
    _check(1, 6, 1, 24, 16, 8, 3, 7, ((10, 2, 2),), loop="query")


SLOW_CASES = [
    pytest.param(2, 12, 2, 70, 64, 16, 5, 11, ((33, 3, 2), (33, 4, 3)), 1, id="hpg6-B2-d64-chunk1"),
    pytest.param(1, 16, 1, 90, 32, 64, 3, 12, ((10, 1, 0), (10, 2, 1)), 3, id="hpg16-l_sel64"),
    pytest.param(1, 2, 1, 150, 16, 128, 2, 13, (), 8, id="hpg2-l_sel128-stepped"),
    pytest.param(1, 4, 2, 40, 128, 8, 6, 14, ((39, 5, 4),), 2, id="hpg2-d128"),
]


@pytest.mark.slow
@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,seed,edits,bwd_tiles", SLOW_CASES)
def test_every_dq_choice_matches_float64_more_shapes(b, h, g, s, d, l_sel, n_sel, seed, edits, bwd_tiles):
    _check(b, h, g, s, d, l_sel, n_sel, seed, edits, bwd_tiles=bwd_tiles)


# ------------------------------------------------------------------------------------------------ the choice itself
def test_auto_is_the_qualified_choice_and_an_unknown_name_is_refused():
    assert ts.DQ_CHOICES == CHOICES and ts.QUALIFIED_DQ in CHOICES
    assert ts.DQ_CHOICE == "auto" and ts.dq_choice() == ts.QUALIFIED_DQ
    ts.DQ_CHOICE = "query"
    assert ts.dq_choice() == "query"
    ts.DQ_CHOICE = "rows"
    with pytest.raises(ValueError, match=re.escape("DQ_CHOICE must be one of auto | atomic | query, got 'rows'")):
        ts.dq_choice()
    q, k, v, _ = _inputs(1, 2, 1, 16, 16, 0)
    with pytest.raises(ValueError, match="DQ_CHOICE"):  # before the forward runs
        ts.selected_attention(q, k, v, _blocks(1, 1, 16, 8, 2, 1), 8)


class _Recorder:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **kwargs) records its name and keyword arguments."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, kwargs))


@pytest.mark.parametrize("choice", CHOICES)
def test_each_choice_launches_its_kernels(monkeypatch, choice):
    """"atomic": _sel_bwd_kv with WITH_DQ; "query": _sel_bwd_dq_query, then _sel_bwd_kv without dQ; every product
    at the launch's precision. The query choice needs the forward's blocks (nothing launched here)."""
    calls = []
    for name in ("_sel_bwd_delta", "_sel_bwd_kv", "_sel_bwd_dq_query"):
        monkeypatch.setattr(ts, name, _Recorder(name, calls))
    ts.DQ_CHOICE = choice
    b, h, g, s, d, l_sel = 1, 4, 2, 32, 16, 8
    q, k, v, do = (torch.randn(b, s, n, d).transpose(1, 2) for n in (h, g, g, h))
    blocks = _blocks(b, g, s, l_sel, 3, 0).cpu()
    lse = torch.zeros(b, g, s, h // g)
    _, _, pair_t, tiles = ts._build_index(blocks.to(torch.int32).contiguous(), l_sel, 4, 8, "torch")
    dq, dk, dv = ts._bwd_op(do, q, k, v, do, lse, pair_t, tiles, l_sel, 2, blocks)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    names = [n for n, _ in calls]
    kw = dict(calls)
    if choice == "query":
        assert names == ["_sel_bwd_delta", "_sel_bwd_dq_query", "_sel_bwd_kv"]
        assert kw["_sel_bwd_dq_query"]["N_SEL"] == 3 and kw["_sel_bwd_dq_query"]["HPG_PAD"] == 16
        assert kw["_sel_bwd_kv"]["WITH_DQ"] is False
        with pytest.raises(ValueError, match="needs the forward's blocks"):
            ts._bwd_op(do, q, k, v, do, lse, pair_t, tiles, l_sel, 2)
    else:
        assert names == ["_sel_bwd_delta", "_sel_bwd_kv"] and kw["_sel_bwd_kv"]["WITH_DQ"] is True
    assert all(kw[n]["DOT_PREC"] for n in names if n != "_sel_bwd_delta")


def test_backward_op_with_blocks_opcheck():
    """The backward op's schema and fake registration with the blocks argument, under the query choice."""
    ts.DQ_CHOICE = "query"
    q, k, v, do = _inputs(1, 4, 2, 24, 16, seed=1)
    blocks = _blocks(1, 2, 24, 8, 3, 2)
    o, lse, pair_t, tiles = torch.ops.nsa.selected_attention_fwd(q, k, v, blocks, 8, "kv", 2, "torch")
    torch.library.opcheck(torch.ops.nsa.selected_attention_bwd.default,
                          (do, q, k, v, o, lse, pair_t, tiles, 8, 2, blocks), test_utils=("test_schema",
                                                                                          "test_faketensor"))


# ------------------------------------------------------------------------------------------------ the kv forward's output
@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,seed,edits", [
    pytest.param(1, 3, 1, 28, 16, 8, 3, 0, ((10, 2, 2), (5, 1, 0)), id="hpg3-S28-dup-past"),
    pytest.param(1, 3, 1, 40, 32, 16, 4, 0, ((36, 3, 2), (20, 3, 2), (9, 2, 0)), id="hpg3-S40-dup-past",
                 marks=pytest.mark.slow),
    pytest.param(2, 2, 2, 37, 16, 8, 3, 3, ((12, 2, 0), (5, 1, 3)), id="hpg1-B2-G2-S37-dup0-past",
                 marks=pytest.mark.slow),
])
def test_every_output_choice_matches_float64(b, h, g, s, d, l_sel, n_sel, seed, edits):
    """The kv forward's output choices (host.OUT_CHOICES): "atomic" (fp32 atomics into one output) and "partial"
    (each pair's p V stored at its place, _sel_fwd_reduce sums a query's slots); a query with no block gets 0."""
    q, k, v, _ = _inputs(b, h, g, s, d, seed)
    blocks = _blocks(b, g, s, l_sel, n_sel, seed + 1, edits)
    blocks[:, :, 2] = -1  # no block at all
    want, low = (listed_reference(q, k, v, blocks, l_sel, dtype) for dtype in (torch.float64, DTYPE))
    got = {}
    for choice in ts.OUT_CHOICES:
        ts.OUT_CHOICE = choice
        got[choice] = ts.selected_attention(q, k, v, blocks, l_sel, loop="kv")
        assert got[choice].shape == want.shape and got[choice].dtype == DTYPE
        assert (got[choice][:, :, 2] == 0).all()
        _close(f"{choice}: o", got[choice], want, low)
    if not ON_GPU:
        assert (got["atomic"] - got["partial"]).abs().max().item() <= 1e-5


def test_partial_output_choice_backward_and_unknown_name():
    """The backward reads the forward's lse, which both output choices compute alike; an unknown name is refused."""
    ts.OUT_CHOICE = "partial"
    _check(1, 2, 1, 24, 16, 8, 3, 7, ((10, 2, 2),))
    ts.OUT_CHOICE = "sum"
    with pytest.raises(ValueError, match=re.escape("OUT_CHOICE must be one of auto | atomic | partial, got 'sum'")):
        ts.out_choice()
    assert ts.QUALIFIED_OUT in ts.OUT_CHOICES


# ------------------------------------------------------------------------------------------------ the host glue
def test_fused_host_choice_matches_float64_and_the_torch_glue():
    """"fused" (host.HOST_CHOICES): lse reduced by _sel_fwd_lse over the listed slots (part unfilled), the atomic
    output zeroed there, dQ/dK/dV zeroed by _sel_bwd_delta_zero; with each output choice and (in _check) each dQ
    choice (the backward after the atomic output); a query with no block gets 0 and lse -inf, as with the torch
    glue."""
    q, k, v, _ = _inputs(1, 3, 1, 28, 16, 0)
    blocks = _blocks(1, 1, 28, 8, 3, 1, ((10, 2, 2), (5, 1, 0)))
    blocks[:, :, 2] = -1  # no block at all
    got = {}
    for host in ts.HOST_CHOICES:
        ts.HOST_CHOICE = host
        for out in ts.OUT_CHOICES:
            ts.OUT_CHOICE = out
            got[host, out] = torch.ops.nsa.selected_attention_fwd(q, k, v, blocks, 8, "kv", 2, "torch")[:2]
    o_ref, lse_ref = got["torch", "atomic"]
    assert torch.isinf(lse_ref[:, :, 2]).all() and (o_ref[:, :, 2] == 0).all()
    want, low = (listed_reference(q, k, v, blocks, 8, dtype) for dtype in (torch.float64, DTYPE))
    for (host, out), (o, lse) in got.items():
        assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), (host, out)
        fin = torch.isfinite(lse_ref)
        assert (lse[fin] - lse_ref[fin]).abs().max().item() <= (3e-2 if ON_GPU else 1e-5), (host, out)
        _close(f"{host}, {out}: o", o, want, low)
        if not ON_GPU:  # fp32 in the interpreter: the torch glue's output to fp32 rounding (on a GPU both are bf16
            # roundings of fp32 sums that differ in their last bits, and the atomics' order varies: not comparable)
            _close(f"{host}, {out}: o against the torch glue", o, o_ref.double(), o_ref)
    ts.HOST_CHOICE, ts.OUT_CHOICE = "fused", "auto"
    _check(1, 3, 1, 28, 16, 8, 3, 0, ((10, 2, 2), (5, 1, 0)))


def test_fused_kernels_read_the_listed_slots_only_and_zero_every_row():
    """_sel_fwd_lse and _sel_bwd_delta_zero on buffers poisoned with NaN: lse is the log2-sum-exp2 of the listed
    slots alone (an unlisted slot is never read, a listed block past its query is -inf), and every row of the fp32
    output, dQ, dK and dV the atomics will add into is zeroed (dQ only under ZERO_DQ)."""
    b, h, g, s, n_sel, d = 2, 6, 2, 21, 4, 16  # hpg 3: rows padded to 4 heads
    hpg, dev = h // g, KERNEL_DEVICE
    gen = torch.Generator().manual_seed(5)
    blocks = torch.randint(-1, 3, (b, g, s, n_sel), generator=gen, dtype=torch.int32)
    blocks[0, 0, 4] = -1  # a query with no block
    listed = (blocks >= 0)[..., None].expand(b, g, s, n_sel, hpg)
    part = torch.randn(b, g, s, n_sel, hpg, generator=gen) * 4
    part[0, 1, 7, 1] = float("-inf")  # a listed block past its query
    blocks[0, 1, 7, 1] = 2
    listed = (blocks >= 0)[..., None].expand(b, g, s, n_sel, hpg)
    want = torch.logsumexp(torch.where(listed, part, float("-inf")).double() * math.log(2), 3) / math.log(2)
    part = torch.where(listed, part, float("nan")).to(dev)
    blocks = blocks.to(dev)
    lse = torch.full((b, g, s, hpg), float("nan"), device=dev)
    o32 = torch.full((b, s, h, d), float("nan"), device=dev).transpose(1, 2)
    hpg_pad, block_t = ts._reduce_tile(hpg)
    ts._sel_fwd_lse[(ts._cdiv(s, block_t), b * g)](
        part, blocks, lse, o32, *o32.stride()[:3], s, g, N_SEL=n_sel, HPG=hpg, HPG_PAD=hpg_pad, BLOCK_T=block_t,
        D_V=d, ZERO_O=True, num_warps=4)
    lse = lse.cpu().double()
    assert torch.equal(torch.isinf(lse), torch.isinf(want)) and torch.isinf(lse[0, 0, 4]).all()
    assert torch.isinf(want[0, 0, 4]).all() and not torch.isnan(lse).any()
    fin = torch.isfinite(want)
    assert (lse[fin] - want[fin]).abs().max().item() <= 1e-5
    assert (o32 == 0).all()
    o, do = (torch.randn(b, s, h, d, generator=gen).to(dev).transpose(1, 2) for _ in range(2))
    delta_want = (o.double() * do.double()).sum(-1).view(b, g, hpg, s).transpose(2, 3)
    for zero_dq in (True, False):
        delta = torch.empty(b, g, s, hpg, device=dev)
        dq = torch.full((b, s, h, d), float("nan"), device=dev).transpose(1, 2)
        dk, dv = (torch.full((b, s, g, d), float("nan"), device=dev).transpose(1, 2) for _ in range(2))
        ts._sel_bwd_delta_zero[(ts._cdiv(s, 8), b * h)](
            o, do, delta, dq, dk, dv, *o.stride()[:3], *do.stride()[:3], *dq.stride()[:3], *dk.stride()[:3],
            *dv.stride()[:3], s, h, hpg, BLOCK_T=8, D_K=d, D_V=d, ZERO_DQ=zero_dq, num_warps=4)
        assert (delta.double() - delta_want).abs().max().item() <= 1e-5
        assert (dk == 0).all() and (dv == 0).all()
        assert (dq == 0).all() if zero_dq else torch.isnan(dq).all()


@pytest.mark.parametrize("choice", CHOICES)
def test_fused_host_choice_launches_the_zeroing_delta(monkeypatch, choice):
    """The fused backward launches _sel_bwd_delta_zero (ZERO_DQ with the atomic dQ choice) instead of
    _sel_bwd_delta, then the dQ choice's kernels; an unknown name is refused before the forward runs."""
    calls = []
    for name in ("_sel_bwd_delta", "_sel_bwd_delta_zero", "_sel_bwd_kv", "_sel_bwd_dq_query"):
        monkeypatch.setattr(ts, name, _Recorder(name, calls))
    ts.DQ_CHOICE, ts.HOST_CHOICE = choice, "fused"
    b, h, g, s, d, l_sel = 1, 4, 2, 32, 16, 8
    q, k, v, do = (torch.randn(b, s, n, d).transpose(1, 2) for n in (h, g, g, h))
    blocks = _blocks(b, g, s, l_sel, 3, 0).cpu()
    _, _, pair_t, tiles = ts._build_index(blocks.to(torch.int32).contiguous(), l_sel, 4, 8, "torch")
    ts._bwd_op(do, q, k, v, do, torch.zeros(b, g, s, h // g), pair_t, tiles, l_sel, 2, blocks)
    names = [n for n, _ in calls]
    assert names == ["_sel_bwd_delta_zero"] + (["_sel_bwd_kv"] if choice == "atomic" else
                                               ["_sel_bwd_dq_query", "_sel_bwd_kv"])
    assert dict(calls)["_sel_bwd_delta_zero"]["ZERO_DQ"] is (choice == "atomic")
    ts.HOST_CHOICE = "aten"
    with pytest.raises(ValueError, match=re.escape("HOST_CHOICE must be one of auto | torch | fused, got 'aten'")):
        ts.selected_attention(q, k, v, blocks, l_sel)
    assert ts.QUALIFIED_HOST in ts.HOST_CHOICES


@pytest.mark.skipif(ON_GPU, reason="counts under the interpreter (CPU)")
def test_fused_host_choice_issues_ten_aten_ops_fewer():
    """benchmarks/bench_ops.py's counter over the selected op's forward + backward (atomic output and dQ, the torch
    index build): the fused glue drops full, mul_ x2, logsumexp and zeros (forward), zeros x3 (backward) and the
    blocks' int32 copy (_to_copy: the kernels read choose_blocks' int64 lists; this torch build's key.long() goes
    too, its keys being int64 then), and launches _sel_fwd_lse and _sel_bwd_delta_zero (for _sel_bwd_delta)."""
    q, k, v, do = _inputs(1, 2, 1, 24, 16, 3)
    blocks = _blocks(1, 1, 24, 8, 3, 4)

    def call():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.autograd.grad(ts.selected_attention(*leaves, blocks, 8, index_build="torch"), leaves, do)

    counts = count_choices(ts, "HOST_CHOICE", ts.HOST_CHOICES, call)
    torch_ops, fused_ops = (dict(counts[h].ops) for h in ("torch", "fused"))
    assert counts["torch"].total - counts["fused"].total == 10, (torch_ops, fused_ops)
    for name, n in {"full": 1, "mul_": 2, "logsumexp": 1, "zeros": 4, "_to_copy": 2}.items():
        assert torch_ops.get(name, 0) - fused_ops.get(name, 0) == n, name
    assert not {"logsumexp", "mul_"} & set(fused_ops)
    launches = {h: dict(counts[h].launches) for h in counts}
    assert launches["fused"]["_sel_fwd_lse"] == 1 and launches["fused"]["_sel_bwd_delta_zero"] == 1
    assert "_sel_bwd_delta" not in launches["fused"] and launches["torch"]["_sel_bwd_delta"] == 1
    assert sum(launches["fused"].values()) == sum(launches["torch"].values()) + 1
