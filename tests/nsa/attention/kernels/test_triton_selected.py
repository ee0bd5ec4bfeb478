"""The Triton selected-branch kernels (nsa.attention.kernels.selected_attn.host) against the PyTorch reference path and
an independent dense reference (explicit [S, S] mask from the block lists, float64 softmax), outputs and gradients.

Without a GPU the kernels run through Triton's interpreter in fp32 (small shapes, tight tolerances); with one, the
same tests run natively in bf16, each tensor judged against the float64 dense reference by the rule of
triton_test_utils.assert_within_torch_error (at most 2 x the PyTorch path's own bf16 error + 1e-3 x max|ref|; on
CPU that rule holds as well as the tight tolerances). Both forward loop orders ("kv", "query") are checked.
"""

import math

import pytest
import torch
from reference import expand_groups, masked_attention, selection_mask_from_blocks
from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, assert_within_torch_error, needs_triton

from nsa.attention.kernels import index_build
from nsa.attention import kernels as torch_kernels
from nsa.attention.selection import choose_blocks, selection_ranges_v2

if HAVE_TRITON:
    from nsa.attention.kernels.selected_attn import host as ts

pytestmark = needs_triton

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
# |got - want| <= TOL * max|want| + TOL, per tensor (bf16 inputs round to 3 significant digits)
TOL = 3e-2 if ON_GPU else 2e-5


# ------------------------------------------------------------------------------------------------ selections
def _selection(kind, b, g, s, l_sel, n_sel, seed):
    """[B, G, S, n_sel] int64 block lists.

    model:    choose_blocks on random importance (forced block 0, own, previous; random others; -1 padding)
    popular:  as model, but blocks 1 and 2 outrank everything: every query that has them picks them
    shuffled: model lists with their slots permuted (-1 anywhere, not ascending): beyond the API's promise
    """
    gen = torch.Generator().manual_seed(seed)
    nb = -(-s // l_sel)
    importance = torch.rand(b, g, s, nb, generator=gen)
    if kind == "popular":
        importance[..., 1:3] += 10.0
    blocks = choose_blocks(importance, torch.arange(s), n_sel, l_sel)
    if kind == "shuffled":
        perm = torch.argsort(torch.rand(b, g, s, n_sel, generator=gen), dim=-1)
        blocks = torch.gather(blocks, -1, perm)
    return blocks


def _inputs(b, h, g, s, d_k, d_v, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    # transposed views of [B, S, heads, d] storage, as the model's projections produce them
    q = (torch.randn(b, s, h, d_k, generator=gen) * scale).transpose(1, 2)
    k = (torch.randn(b, s, g, d_k, generator=gen) * scale).transpose(1, 2)
    v = torch.randn(b, s, g, d_v, generator=gen).transpose(1, 2)
    do = torch.randn(b, h, s, d_v, generator=gen)
    return [t.to(KERNEL_DEVICE, DTYPE) for t in (q, k, v, do)]


def _dense(q, k, v, blocks, l_sel):
    """Float64 masked softmax over the keys p <= t of the listed blocks (tests/nsa/reference.py)."""
    h, s = q.shape[1], q.shape[2]
    mask = expand_groups(selection_mask_from_blocks(blocks, s, l_sel), h)
    return masked_attention(q, expand_groups(k, h), expand_groups(v, h), mask)


def _ascending(blocks):
    """The same block sets as ascending lists, -1 last (what the PyTorch path takes; "shuffled" lists are not)."""
    ordered = torch.sort(torch.where(blocks < 0, 1 << 40, blocks), dim=-1).values
    return torch.where(ordered == 1 << 40, -1, ordered)


def _torch_path(q, k, v, blocks, l_sel):
    s = q.shape[2]
    return torch_kernels.selected_attention(q, k, v, selection_ranges_v2(blocks, torch.arange(s, device=q.device),
                                                                         l_sel), l_sel)


def _close(got, want, what, tol=TOL):
    got, want = got.double(), want.double()
    err = (got - want).abs().max().item()
    bound = tol * want.abs().max().item() + tol
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def _with_grads(fn, q, k, v, do, dtype=None):
    """fn's output and its (dq, dk, dv) for upstream gradient do, on leaf copies (cast to dtype if given)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, do.to(out.dtype))


def _check_against_references(b, h, g, s, d_k, d_v, l_sel, n_sel, kind, loops=ts.LOOPS if HAVE_TRITON else (),
                              bwd_tiles=ts.BWD_TILES if HAVE_TRITON else 1, seed=0, scale=1.0, tol=TOL,
                              index_build="auto"):
    q, k, v, do = _inputs(b, h, g, s, d_k, d_v, seed, scale)
    blocks = _selection(kind, b, g, s, l_sel, n_sel, seed + 1).to(KERNEL_DEVICE)
    dense, dense_grads = _with_grads(lambda *x: _dense(*x, blocks, l_sel), q, k, v, do, torch.float64)
    # the PyTorch path at the kernels' dtype: its own error sets the scale of the rule
    lowp, lowp_grads = _with_grads(lambda *x: _torch_path(*x, _ascending(blocks), l_sel), q, k, v, do)
    # on CPU also the PyTorch path in float64 (ascending whole-block lists with the own block: not "shuffled")
    path = None
    if kind != "shuffled" and not ON_GPU:
        path, path_grads = _with_grads(lambda *x: _torch_path(*x, blocks, l_sel), q, k, v, do, torch.float64)
        _close(path, dense, "torch path vs dense (sanity)", 1e-9)
    for loop in loops:
        def kernel(*x, loop=loop):
            return ts.selected_attention(*x, blocks, l_sel, loop=loop, bwd_tiles=bwd_tiles, index_build=index_build)

        out, grads = _with_grads(kernel, q, k, v, do)
        assert out.shape == (b, h, s, d_v) and out.dtype == DTYPE
        assert torch.isfinite(out).all()
        assert_within_torch_error(f"{loop}: o", out, dense, lowp)
        for name, got, want, torch_got in zip(("dq", "dk", "dv"), grads, dense_grads, lowp_grads):
            assert got.shape == want.shape and got.dtype == DTYPE
            assert_within_torch_error(f"{loop}: {name}", got, want, torch_got)
        if ON_GPU:
            continue
        _close(out, dense, f"{loop}: o vs dense", tol)
        for name, got, want in zip(("dq", "dk", "dv"), grads, dense_grads):
            _close(got, want, f"{loop}: {name} vs dense", tol)
        if path is not None:
            _close(out, path, f"{loop}: o vs torch path", tol)
            for name, got, want in zip(("dq", "dk", "dv"), grads, path_grads):
                _close(got, want, f"{loop}: {name} vs torch path", tol)


# (b, h, g, s, d, l_sel, n_sel, selection, bwd_tiles, loops): every hpg in {1, 3, 6, 8, 16}, G in {1, 2, 4},
# d in {32, 64, 128} at least once for each loop order; S not a multiple of l_sel, S < l_sel, n_sel > blocks (-1
# padding), l_sel < 16 and > 64 (masked / stepped key tiles), popular blocks split over many backward programs.
# The interpreter runs the query-outer forward one program per query: it skips two of the longer cases.
BOTH, KV = ("kv", "query"), ("kv",)
CI_CASES = [
    pytest.param(1, 12, 2, 80, 64, 16, 4, "model", 8, BOTH, id="hpg6-G2-d64-S80"),
    pytest.param(1, 1, 1, 77, 32, 16, 8, "model", 8, BOTH, id="hpg1-G1-d32-nsel>blocks"),
    pytest.param(2, 3, 1, 64, 128, 32, 3, "popular", 1, BOTH, id="hpg3-B2-d128-popular-chunk1"),
    pytest.param(1, 32, 4, 40, 32, 16, 3, "model", 2, BOTH, id="hpg8-G4-d32"),
    pytest.param(1, 16, 1, 40, 64, 64, 4, "model", 8, BOTH, id="hpg16-S<l_sel"),
    pytest.param(1, 6, 1, 110, 64, 16, 5, "popular", 1, KV, id="hpg6-popular-chunk1"),
    pytest.param(1, 6, 2, 60, 32, 8, 5, "shuffled", 3, BOTH, id="hpg3-l_sel8-shuffled"),
    pytest.param(1, 6, 1, 160, 32, 64, 3, "model", 1000, KV, id="hpg6-l_sel64-S160-one-program-per-block"),
    pytest.param(1, 2, 1, 130, 32, 128, 2, "model", 8, BOTH, id="hpg2-l_sel128-stepped"),
]


@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,kind,bwd_tiles,loops", CI_CASES)
def test_matches_references(b, h, g, s, d, l_sel, n_sel, kind, bwd_tiles, loops):
    _check_against_references(b, h, g, s, d, d, l_sel, n_sel, kind, loops, bwd_tiles=bwd_tiles)


# Every (hpg, G, d) combination; the sequence shapes and the selection kind rotate with them (a full product with
# them too would take hours in the interpreter).
_SHAPES = [(70, 16, 3, "model"), (33, 64, 2, "popular"), (129, 32, 16, "popular"), (100, 16, 5, "shuffled")]
FULL_GRID = [pytest.param(hpg, g, d, *_SHAPES[i % len(_SHAPES)], id=f"hpg{hpg}-G{g}-d{d}")
             for i, (hpg, g, d) in enumerate((hpg, g, d) for hpg in (1, 3, 6, 8, 16) for g in (1, 2, 4)
                                             for d in (32, 64, 128))]


@pytest.mark.slow
@pytest.mark.parametrize("hpg,g,d,s,l_sel,n_sel,kind", FULL_GRID)
def test_matches_references_full_grid(hpg, g, d, s, l_sel, n_sel, kind):
    _check_against_references(1, g * hpg, g, s, d, d, l_sel, n_sel, kind, bwd_tiles=2, seed=hpg * 7 + g)


def test_different_d_k_and_d_v():
    _check_against_references(1, 4, 2, 40, 32, 64, 16, 3, "model")


def test_huge_scores_are_stable():
    """Scores in the hundreds: exp overflows unless every pass subtracts the true per-query maximum / lse.
    fp32 rounding of such scores is ~1e-4 of a logit, hence the looser tolerance on the CPU."""
    _check_against_references(1, 6, 2, 60, 32, 32, 16, 4, "popular", scale=6.0 if ON_GPU else 8.0, seed=5,
                              tol=TOL if ON_GPU else 1e-3)


def test_query_without_blocks_gets_zero_and_no_gradient():
    """Beyond the API (choose_blocks always lists the own block): an empty list gives 0 and no gradient."""
    q, k, v, do = _inputs(1, 2, 1, 40, 16, 16, seed=3)
    blocks = _selection("model", 1, 1, 40, 16, 3, seed=4).to(KERNEL_DEVICE)
    blocks[:, :, 5] = -1
    blocks[:, :, 30] = -1
    dense, dense_grads = _with_grads(lambda *x: _dense(*x, blocks, 16), q, k, v, do, torch.float64)
    for loop in ts.LOOPS:
        out, grads = _with_grads(lambda *x, loop=loop: ts.selected_attention(*x, blocks, 16, loop=loop), q, k, v, do)
        assert (out[:, :, [5, 30]] == 0).all() and (grads[0][:, :, [5, 30]] == 0).all()
        _close(out, dense, f"{loop}: o")
        for got, want in zip(grads, dense_grads):
            _close(got, want, f"{loop}: grads")


# ------------------------------------------------------------------------------------------------ the index
@pytest.mark.parametrize("kind", ["model", "popular", "shuffled"])
@pytest.mark.parametrize("per_tile", [1, 3, 10, 64])
def test_inverted_index_covers_every_pair_once(kind, per_tile):
    """Each non-empty (query, slot) pair lies in exactly one tile; a tile's pairs share its key block; tiles hold
    at most per_tile pairs; the shape-bounded grid is large enough. Built where the kernels run (the Triton build
    on a GPU, the torch one under the interpreter), read back on the CPU."""
    b, g, s, l_sel, n_sel = 2, 2, 150, 16, 5
    blocks = _selection(kind, b, g, s, l_sel, n_sel, seed=per_tile).to(torch.int32)
    nb = -(-s // l_sel)
    built = ts._build_index(blocks.to(KERNEL_DEVICE).contiguous(), l_sel, per_tile, 2 * per_tile)
    order, pair_t, fwd, bwd = (t.cpu() for t in built)
    flat_blocks = blocks.reshape(-1)
    n_pairs = int((flat_blocks >= 0).sum())
    assert torch.equal(pair_t.long(), (order.long() // n_sel) % s)
    for table, cap in ((fwd, per_tile), (bwd, 2 * per_tile)):
        key, start, count = table.long()
        assert table.shape[1] == ts._n_tiles(b, g, s, n_sel, l_sel, cap)
        assert int(count.max()) <= cap and int(count.min()) >= 0
        seen = torch.zeros(flat_blocks.numel(), dtype=torch.long)
        for kk, st, cn in zip(key.tolist(), start.tolist(), count.tolist()):
            pairs = order[st: st + cn].long()
            bg = pairs // (s * n_sel)
            assert torch.equal(bg * nb + flat_blocks[pairs].long(), torch.full_like(pairs, kk))
            seen[pairs] += 1
        assert int(seen.sum()) == n_pairs
        assert torch.equal(seen, (flat_blocks >= 0).long())
        used = count > 0
        # the real tiles come first, in key order
        assert bool(used[: int(used.sum())].all()) and bool((key[used][1:] >= key[used][:-1]).all())
    if kind == "popular":  # blocks 1 and 2 are listed by ~every query: their lists span many tiles
        assert int(((fwd[0] % nb == 1) & (fwd[2] > 0)).sum()) > 2


def test_index_of_blocks_the_triton_build_cannot_read_takes_the_torch_build(monkeypatch):
    """CPU blocks outside Triton's interpreter (a GPU machine's CPU tensors, where "auto" is the Triton build):
    the torch build answers, not a Triton launch that cannot read them (it raised "cpu tensor?" on a GPU)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    blocks = _selection("popular", 1, 2, 90, 16, 4, seed=2).to(torch.int32).contiguous()
    want = ts._build_index_torch(blocks, 16, 3, 6)
    for build in ("auto", "triton"):
        got = ts._build_index(blocks, 16, 3, 6, build)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), build


# The Triton build of the index (selected_attn/index.py) against the torch build, element for element: several chunks
# (more pairs than a chunk holds), S not a multiple of l_sel, S < l_sel, n_sel > blocks (-1 padding), popular
# blocks that span many tiles, shuffled lists, B x G > 1.
INDEX_CASES = [
    pytest.param(2, 2, 150, 16, 5, "model", 3, id="B2-G2"),
    pytest.param(1, 1, 77, 16, 8, "model", 21, id="nsel>blocks"),
    pytest.param(1, 2, 40, 64, 4, "model", 7, id="S<l_sel"),
    pytest.param(2, 1, 200, 16, 8, "popular", 21, id="popular"),
    pytest.param(1, 3, 100, 8, 6, "shuffled", 1, id="shuffled-per_tile1"),
]


@pytest.fixture
def small_chunks(monkeypatch):
    """Under the interpreter (seconds per 2,048-pair sort), chunks of 64 pairs: the same code at a smaller
    constexpr, many chunks per group. On a GPU the production chunk (2,048) runs."""
    if not ON_GPU:
        from nsa.attention.kernels.selected_attn import index as triton_index

        monkeypatch.setattr(triton_index, "PAIRS", 64)


@pytest.mark.parametrize("b,g,s,l_sel,n_sel,kind,per_tile", INDEX_CASES)
def test_triton_index_build_equals_the_torch_build(small_chunks, b, g, s, l_sel, n_sel, kind, per_tile):
    blocks = _selection(kind, b, g, s, l_sel, n_sel, seed=s).to(KERNEL_DEVICE, torch.int32).contiguous()
    want = ts._build_index(blocks, l_sel, per_tile, 2 * per_tile, build="torch")
    got = ts._build_index(blocks, l_sel, per_tile, 2 * per_tile, build="triton")
    for name, g_, w_ in zip(("order", "pair_t", "fwd tiles", "bwd tiles"), got, want):
        assert g_.dtype == w_.dtype == torch.int32 and g_.shape == w_.shape, name
        assert torch.equal(g_, w_), f"{name}: {int((g_ != w_).sum())} of {w_.numel()} entries differ"


@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,kind,bwd_tiles,loops", [CI_CASES[0], CI_CASES[2], CI_CASES[6]])
def test_matches_references_with_each_index_build(small_chunks, b, h, g, s, d, l_sel, n_sel, kind, bwd_tiles, loops):
    """With the index build that "auto" does not take here: the Triton one under the interpreter, the torch one on a
    GPU (each run of the file then covers both builds)."""
    other = "triton" if index_build() == "torch" else "torch"
    _check_against_references(b, h, g, s, d, d, l_sel, n_sel, kind, ("kv",), bwd_tiles, index_build=other)


def test_index_build_choice(monkeypatch):
    from nsa.attention.kernels.selected_attn import index as triton_index

    blocks = _selection("model", 1, 1, 50, 16, 3, seed=0).to(KERNEL_DEVICE, torch.int32).contiguous()
    with pytest.raises(ValueError, match="index_build must be one of"):
        ts._build_index(blocks, 16, 4, 8, build="sorted")
    assert triton_index.supported(50, 3, 4) is None
    assert "overflow" in triton_index.supported(2**31, 3, 2**21)
    assert "n_sel" in triton_index.supported(5000, 4096, 100)
    # a shape the Triton build cannot index takes the torch build
    monkeypatch.setattr(triton_index, "supported", lambda *a: "too large")
    monkeypatch.setattr(triton_index, "build_index", lambda *a: pytest.fail("the Triton build ran"))
    for got, want in zip(ts._build_index(blocks, 16, 4, 8, build="triton"), ts._build_index_torch(blocks, 16, 4, 8)):
        assert torch.equal(got, want)


def test_index_build_auto_and_bad_names(monkeypatch):
    """"auto" is the Triton build on a GPU and the torch build under the interpreter; an unknown name is an error
    naming the choices, from the function and from the public entry point."""
    assert index_build("auto") == ("triton" if ON_GPU else "torch")
    with monkeypatch.context() as m:
        m.setenv("TRITON_INTERPRET", "0")  # what "auto" takes where the kernels are compiled for a GPU
        assert index_build("auto") == "triton" and index_build() == "triton"
    assert index_build("torch") == "torch" and index_build("triton") == "triton"
    with pytest.raises(ValueError, match="index_build must be one of auto, torch, triton, got 'sorted'"):
        index_build("sorted")
    q, k, v, _ = _inputs(1, 2, 1, 16, 32, 32, 0, 1.0)
    blocks = _selection("model", 1, 1, 16, 8, 2, seed=1).to(KERNEL_DEVICE)
    with pytest.raises(ValueError, match="index_build must be one of"):
        ts.selected_attention(q, k, v, blocks, 8, index_build="fast")


# ------------------------------------------------------------------------------------------------ API edges
def test_rejects_bad_arguments():
    q, k, v, _ = _inputs(1, 2, 1, 20, 16, 16, seed=0)
    blocks = _selection("model", 1, 1, 20, 8, 2, seed=0).to(KERNEL_DEVICE)
    with pytest.raises(ValueError, match="loop"):
        ts.selected_attention(q, k, v, blocks, 8, loop="rows")
    with pytest.raises(ValueError, match="power of two"):
        ts.selected_attention(q[..., :12], k[..., :12], v, blocks, 8)
    with pytest.raises(ValueError, match="shape"):
        ts.selected_attention(q, k, v, blocks[:, :, :10], 8)
    with pytest.raises(ValueError, match="bwd_tiles"):
        ts.selected_attention(q, k, v, blocks, 8, bwd_tiles=0)
    with pytest.raises(ValueError, match="dtype"):
        ts.selected_attention(q, k.double(), v, blocks, 8)


def test_custom_op_registration_opcheck():
    """Schema, fake (meta) kernel and autograd registration are consistent with the real kernels."""
    q, k, v, _ = _inputs(1, 4, 2, 24, 16, 16, seed=1)
    blocks = _selection("model", 1, 2, 24, 8, 3, seed=2).to(KERNEL_DEVICE)
    args = (q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_(), blocks, 8, "kv", 2,
            index_build())
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.nsa.selected_attention_fwd.default, args, test_utils=checks)
    o, lse, pair_t, tiles = torch.ops.nsa.selected_attention_fwd(*[a.detach() if torch.is_tensor(a) else a
                                                                   for a in args])
    bwd_args = (torch.randn_like(o), *[a.detach() for a in args[:3]], o, lse, pair_t, tiles, 8, 2)
    torch.library.opcheck(torch.ops.nsa.selected_attention_bwd.default, bwd_args, test_utils=checks[:2])


def test_torch_compile_sees_one_opaque_op():
    """fullgraph=True: no graph break around the op, forward and backward through the fake registrations."""
    q, k, v, do = _inputs(1, 4, 2, 40, 16, 16, seed=6)
    blocks = _selection("model", 1, 2, 40, 16, 3, seed=7).to(KERNEL_DEVICE)

    def f(q, k, v):
        return ts.selected_attention(q * 1.0, k, v, blocks, 16) * 2.0

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    want, want_grads = _with_grads(f, q, k, v, do)
    got, got_grads = _with_grads(compiled, q, k, v, do)
    _close(got, want, "compiled o", 1e-6)
    for a, b in zip(got_grads, want_grads):
        _close(a, b, "compiled grads", 1e-6)


def _op_counts(s, loop):
    from torch.profiler import ProfilerActivity, profile

    q, k, v, do = _inputs(1, 1, 1, s, 16, 16, seed=0)
    blocks = _selection("model", 1, 1, s, 64, 4, seed=1).to(KERNEL_DEVICE)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = ts.selected_attention(*leaves, blocks, 64, loop=loop)
        torch.autograd.grad(out, leaves, do)
    counts = {}
    for e in prof.events():
        if e.name.startswith("aten::"):
            counts[e.name] = counts.get(e.name, 0) + 1
    return counts


@pytest.mark.parametrize("loop", ["kv", "query"])
def test_operator_calls_do_not_grow_with_s_and_never_sync(loop):
    """A fixed number of operator calls whatever S (no Python loop over data), none of them a host sync."""
    lengths = (256, 1024) if (ON_GPU or loop == "kv") else (64, 160)  # the interpreter runs a program per query
    small, large = (_op_counts(s, loop) for s in lengths)
    assert small == large
    for name in ("aten::nonzero", "aten::item", "aten::_local_scalar_dense"):
        assert name not in small, name


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("loop", ["kv", "query"])
def test_cuda_graph_capture_of_forward_and_backward(loop):
    """Forward + backward captured in one CUDA graph with sync debug mode 'error'; replays on new inputs (values
    and selection changed in place) match eager."""
    b, h, g, s, d, l_sel, n_sel = 1, 12, 2, 1000, 64, 64, 16
    q, k, v, do = _inputs(b, h, g, s, d, d, seed=0)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    blocks = _selection("model", b, g, s, l_sel, n_sel, seed=1).cuda()

    def step():
        out = ts.selected_attention(q, k, v, blocks, l_sel, loop=loop)
        return (out, *torch.autograd.grad(out, (q, k, v), do))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            static = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    q2, k2, v2, do2 = _inputs(b, h, g, s, d, d, seed=9)
    with torch.no_grad():
        for dst, src in ((q, q2), (k, k2), (v, v2), (do, do2)):
            dst.copy_(src)
        blocks.copy_(_selection("popular", b, g, s, l_sel, n_sel, seed=3))
    graph.replay()
    eager = step()
    for name, got, want in zip(("o", "dq", "dk", "dv"), static, eager):
        _close(got, want, f"graph replay {name}", 1e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_model_size_smoke_on_gpu():
    """The model's shapes (hpg 6, d 64, l_sel 64, n_sel 16) at S = 4096, both loops, against the torch path."""
    b, h, g, s, d, l_sel, n_sel = 1, 12, 2, 4096, 64, 64, 16
    q, k, v, do = _inputs(b, h, g, s, d, d, seed=0)
    blocks = _selection("model", b, g, s, l_sel, n_sel, seed=1).cuda()
    # float64 reference: the PyTorch path (the dense [S, S] mask would take 1.6 GB per head set at this S)
    want, want_grads = _with_grads(lambda *x: _torch_path(*x, blocks, l_sel), q, k, v, do, torch.float64)
    lowp, lowp_grads = _with_grads(lambda *x: _torch_path(*x, blocks, l_sel), q, k, v, do)
    for loop in ts.LOOPS:
        out, grads = _with_grads(lambda *x, loop=loop: ts.selected_attention(*x, blocks, l_sel, loop=loop), q, k, v, do)
        assert_within_torch_error(f"{loop} o", out, want, lowp)
        for name, got, ref, torch_got in zip(("dq", "dk", "dv"), grads, want_grads, lowp_grads):
            assert_within_torch_error(f"{loop} {name}", got, ref, torch_got)
        assert not math.isnan(float(out.float().sum()))
