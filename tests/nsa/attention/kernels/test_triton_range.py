"""Triton range attention (nsa.attention.kernels.range_attn.host): window, compressed and band attention against the
PyTorch reference path and an independent dense reference (explicit boolean mask, float64 softmax), outputs and the
gradients of q, k and v under a random upstream gradient.

Without a GPU the kernels run in Triton's interpreter (fp32, small shapes, tight tolerances); with one, natively in
bf16, each output and gradient judged against the float64 dense reference by the rule of
triton_test_utils.assert_within_torch_error (at most 2 x the PyTorch path's own error at the kernel's dtype +
1e-3 x max|ref|; on CPU the rule holds as well as the tight tolerances). The CI subset covers every value of each axis at least once (hpg 1/3/6/8/16, G 1/2/4, d_k 32/64/128, d_k != d_v,
S not a multiple of any block, S shorter than one block, w >= S, w = 1, queries that see no compressed block); the
full grid is marked `slow` (tests/conftest.py: it runs with `-m slow`, and by default where a GPU is present).
"""

import math

import pytest
import torch

from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, assert_within_torch_error, needs_triton
from reference import masked_attention

from nsa.attention import kernels as ref_path
from nsa.attention.selection import selection_ranges_v2

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from nsa.attention.kernels.range_attn import host as tr

pytestmark = needs_triton

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
# (atol, rtol) for outputs and for gradients against float64 references
TOL = {torch.float32: ((2e-5, 1e-4), (5e-5, 1e-4)), torch.bfloat16: ((2e-2, 2e-2), (6e-2, 5e-2))}[DTYPE]


# ----------------------------------------------------------------------------------------------------- helpers
def _bshd(b, s, n, d, gen):
    """[B, n, S, d] seen through the layer's [B, S, n, d] storage (transposed view, as NSAAttention passes it)."""
    x = torch.randn(b, s, n, d, generator=gen, dtype=torch.float32)
    return x.to(device=KERNEL_DEVICE, dtype=DTYPE).transpose(1, 2)


def _inputs(b, h, g, s, t, d_k, d_v, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _bshd(b, s, h, d_k, gen), _bshd(b, t, g, d_k, gen), _bshd(b, t, g, d_v, gen)
    return [x.requires_grad_() for x in (q, k, v)]


def _window_mask(s, w):
    t, j = torch.arange(s).view(s, 1), torch.arange(s).view(1, s)
    return (j <= t) & (j > t - w)


def _cmp_mask(s, n_cmp, l, d):
    return torch.arange(n_cmp).view(1, n_cmp) * d + l - 1 <= torch.arange(s).view(s, 1)


def _band_mask(s, l_sel, sink):
    t, j = torch.arange(s).view(s, 1), torch.arange(s).view(1, s)
    mask = (j <= t) & (j >= (t // l_sel - 1) * l_sel)
    if sink:
        mask |= (j < l_sel) & (t // l_sel >= 2)
    return mask


def _dense(q, k, v, mask):
    """float64 softmax over the allowed keys (tests/nsa/reference.py), heads expanded to their groups."""
    hpg = q.shape[1] // k.shape[1]
    k64, v64 = (x.double().repeat_interleave(hpg, dim=1) for x in (k, v))
    return masked_attention(q.double(), k64, v64, mask.to(q.device))


def _band_reference_path(q, k, v, l_sel, sink, dtype=torch.float64):
    """The band through the PyTorch selected-branch kernel: blocks {cur - 1, cur} (and 0 from block 2 on)."""
    b, g, s = q.shape[0], k.shape[1], q.shape[2]
    t = torch.arange(s)
    cur = t // l_sel
    blocks = torch.stack((torch.where(sink & (cur >= 2), 0, -1), torch.where(cur >= 1, cur - 1, -1), cur), dim=-1)
    ranges = selection_ranges_v2(blocks.expand(b, g, s, 3), t, l_sel).to(q.device)
    return ref_path.selected_attention(q.to(dtype), k.to(dtype), v.to(dtype), ranges, l_sel)


def _grads(out, inputs, upstream):
    return torch.autograd.grad(out, inputs, upstream)


def _check(got, want, tol, what):
    atol, rtol = tol
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def _compare(out, inputs, references, torch_fn):
    """out and its q/k/v gradients against each (name, reference output built from the same inputs); references[0]
    is the float64 dense one, which torch_fn (the PyTorch path at the kernel's dtype) sets the rule's scale for."""
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(99)).to(out.device, out.dtype)
    got = _grads(out, inputs, upstream)
    lowp_inputs = [x.detach().requires_grad_() for x in inputs]
    lowp = torch_fn(*lowp_inputs)
    lowp_grads = _grads(lowp, lowp_inputs, upstream.to(lowp.dtype))
    dense = references[0][1]
    dense_grads = torch.autograd.grad(dense, inputs, upstream.double(), retain_graph=True)
    assert_within_torch_error("output", out, dense, lowp)
    for label, a, b, c in zip("qkv", got, dense_grads, lowp_grads):
        assert_within_torch_error(f"d{label}", a, b, c)
    if ON_GPU:
        return
    for name, ref in references:
        _check(out, ref, TOL[0], f"{name}: output")
        want = _grads(ref, inputs, upstream.double())
        for label, a, b in zip("qkv", got, want):
            _check(a, b, TOL[1], f"{name}: d{label}")


# ----------------------------------------------------------------------------------------------------- bounds
# The kernels skip whole tiles and drop masks by formulas (per-token ranges, per-key token intervals, the tokens that
# touch or fully see a key tile). A kernel-level test sees an off-by-one in them only when a tile edge falls on it;
# these run the kernels' own jit helpers in a probe kernel and compare every token and key with the dense masks.
if HAVE_TRITON:
    @triton.jit
    def _probe_bounds(RNG, KEY, TILE, S, T, MODE, P0, P1, N_TOK: tl.constexpr, N_KEY: tl.constexpr,
                      BLOCK_N: tl.constexpr):
        t = tl.arange(0, N_TOK)
        pre, lo, hi = tr._ranges(t, T, MODE, P0, P1)
        tl.store(RNG + t * 3, pre)
        tl.store(RNG + t * 3 + 1, lo)
        tl.store(RNG + t * 3 + 2, hi)
        kn = tl.arange(0, N_KEY)
        c1, c0, win, blk, sink = tr._mask_params(MODE, P0, P1)
        lo_k, hi_k = tr._key_bounds(kn, T, c1, c0, win, blk, sink)
        tl.store(KEY + kn * 2, lo_k)
        tl.store(KEY + kn * 2 + 1, hi_k)
        for j in range(0, tl.cdiv(T, BLOCK_N)):
            tok_lo, full_lo, full_hi, tok_hi = tr._key_tile_tokens(j * BLOCK_N, S, T, MODE, P0, P1, BLOCK_N)
            tl.store(TILE + j * 4, tok_lo)
            tl.store(TILE + j * 4 + 1, full_lo)
            tl.store(TILE + j * 4 + 2, full_hi)
            tl.store(TILE + j * 4 + 3, tok_hi)


def _interval(mask_1d):
    """(lo, hi) when the True entries of a 1-d bool tensor form one interval [lo, hi), else None; (0, 0) if none."""
    idx = torch.nonzero(mask_1d).flatten()
    if idx.numel() == 0:
        return 0, 0
    lo, hi = int(idx[0]), int(idx[-1]) + 1
    return (lo, hi) if idx.numel() == hi - lo else None


BOUND_CASES = (
    [("win", s, w, 0) for s in (1, 37, 200) for w in (1, 5, 64, 100, 250)]
    + [("cmp", s, l, d) for s in (1, 37, 200) for l, d in ((32, 16), (8, 4), (16, 16), (12, 5), (4, 2))]
    + [("band", s, l_sel, sink) for s in (1, 37, 200) for l_sel in (8, 16, 64, 128) for sink in (False, True)]
)


@pytest.mark.parametrize("block_n", [64, 32])
def test_bounds_are_token_exact(block_n):
    mode_id = {"win": tr.WINDOW, "cmp": tr.COMPRESSED, "band": tr.BAND}
    for mode, s, p0, p1 in BOUND_CASES:
        if mode == "win":
            t_keys, mask, params = s, _window_mask(s, p0), (min(p0, s), 0)
        elif mode == "cmp":
            t_keys = max((s - p0) // p1 + 1, 0)
            mask, params = _cmp_mask(s, t_keys, p0, p1), (p0, p1)
        else:
            t_keys, mask, params = s, _band_mask(s, p0, p1), (p0, p0 if p1 else 0)
        if t_keys == 0:
            continue
        n_tok, n_key = triton.next_power_of_2(s), triton.next_power_of_2(t_keys + block_n)
        n_tiles = triton.cdiv(t_keys, block_n)
        # on the kernels' device (a GPU launch needs device pointers), read back on the CPU
        rng, key, tile = (torch.zeros(n, c, dtype=torch.int32, device=KERNEL_DEVICE)
                          for n, c in ((n_tok, 3), (n_key, 2), (n_tiles, 4)))
        _probe_bounds[(1,)](rng, key, tile, s, t_keys, mode_id[mode], *params, N_TOK=n_tok, N_KEY=n_key,
                            BLOCK_N=block_n)
        rng, key, tile = rng.cpu(), key.cpu(), tile.cpu()
        case = f"{mode} S={s} p={p0},{p1} BLOCK_N={block_n}"
        keys = torch.arange(t_keys)
        for t in range(s):  # per token: [0, pre) + [lo, hi), non-decreasing in t
            pre, lo, hi = rng[t].tolist()
            assert pre <= lo <= hi <= t_keys, case
            assert torch.equal(mask[t], (keys < pre) | ((keys >= lo) & (keys < hi))), f"{case} t={t}"
            if t:
                assert (rng[t] >= rng[t - 1]).all(), f"{case}: ranges not monotone at t={t}"
        toks = torch.arange(s)
        for k in range(n_key):  # per key: the tokens that see it are [lo_k, hi_k)
            lo_k, hi_k = key[k].tolist()
            want = mask[:, k] if k < t_keys else torch.zeros(s, dtype=torch.bool)
            assert torch.equal(want, (toks >= lo_k) & (toks < hi_k)), f"{case} k={k}"
        for j in range(n_tiles):  # per key tile: tokens touching it, tokens seeing all of it (exact intervals)
            n0 = j * block_n
            tok_lo, full_lo, full_hi, tok_hi = tile[j].tolist()
            touching = mask[:, n0: n0 + block_n].any(-1)
            whole = mask[:, n0: n0 + block_n].all(-1) & (n0 + block_n <= t_keys)
            assert _interval(touching) is not None and _interval(whole) is not None, case
            got_touch = (toks >= tok_lo) & (toks < tok_hi)
            got_whole = (toks >= full_lo) & (toks < full_hi)
            assert torch.equal(touching, got_touch), f"{case} tile {j}: touching {tok_lo, tok_hi}"
            assert not (got_whole & ~whole).any(), f"{case} tile {j}: unmasked {full_lo, full_hi} too wide"
            if not (mode == "band" and p1 and block_n > p0):
                # exact, except a sink narrower than a key tile: the tile's sink half plus band half is not
                # counted as whole (those tokens take the masked path, correct and a little slower; l_sel = 64 in
                # the model, = BLOCK_N)
                assert torch.equal(whole, got_whole), f"{case} tile {j}: whole {full_lo, full_hi}"


# ----------------------------------------------------------------------------------------------------- window
WINDOW_CASES = [  # b, h, g, s, d_k, d_v, w
    pytest.param(1, 6, 1, 100, 64, 64, 16, id="hpg6-d64-w16-S100"),
    pytest.param(2, 4, 4, 70, 32, 32, 7, id="hpg1-G4-B2-d32-w7"),
    pytest.param(1, 16, 1, 40, 32, 32, 64, id="hpg16-w>=S-S<block"),
    pytest.param(1, 6, 2, 70, 128, 128, 1, id="hpg3-G2-d128-w1"),
    pytest.param(1, 16, 2, 50, 64, 128, 20, id="hpg8-G2-dk64-dv128"),
    # w > BLOCK_N, as the model's w = 512 >> 64: whole key tiles run unmasked in all three kernels
    pytest.param(1, 16, 1, 160, 32, 32, 101, id="hpg16-w101>BLOCK_N-unmasked-tiles"),
]


@pytest.mark.parametrize("b,h,g,s,d_k,d_v,w", WINDOW_CASES)
def test_window_matches_references(b, h, g, s, d_k, d_v, w):
    q, k, v = _inputs(b, h, g, s, s, d_k, d_v, seed=s + w)
    out = tr.window_attention(q, k, v, w)
    assert out.shape == (b, h, s, d_v) and out.dtype == DTYPE
    refs = [("dense", _dense(q, k, v, _window_mask(s, w))),
            ("reference path", ref_path.window_attention(q.double(), k.double(), v.double(), w))]
    _compare(out, (q, k, v), refs, lambda *x: ref_path.window_attention(*x, w))


# ----------------------------------------------------------------------------------------------------- compressed
CMP_CASES = [  # b, h, g, s, d_k, d_v, l, d
    pytest.param(1, 12, 2, 200, 64, 64, 32, 16, id="model-hpg6-l32-d16"),
    pytest.param(2, 8, 1, 90, 32, 32, 8, 4, id="hpg8-B2-l8-d4"),
    pytest.param(1, 3, 1, 50, 128, 128, 16, 16, id="hpg3-d128-3blocks"),
    pytest.param(1, 4, 4, 300, 32, 32, 4, 2, id="hpg1-G4-149blocks-split"),
    pytest.param(1, 16, 1, 40, 32, 32, 32, 16, id="hpg16-1block"),
]


@pytest.mark.parametrize("b,h,g,s,d_k,d_v,l,d", CMP_CASES)
def test_compressed_matches_references(b, h, g, s, d_k, d_v, l, d):
    n_cmp = (s - l) // d + 1
    q, k, v = _inputs(b, h, g, s, n_cmp, d_k, d_v, seed=s + l)
    out, lse = tr.compressed_attention_lse(q, k, v, l, d)
    mask = _cmp_mask(s, n_cmp, l, d)
    refs = [("dense", _dense(q, k, v, mask)),
            ("reference path", ref_path.compressed_attention(q.double(), k.double(), v.double(), l, d))]
    _compare(out, (q, k, v), refs, lambda *x: ref_path.compressed_attention(*x, l, d))
    # lse: natural log of sum(exp(scores * scale)) over the visible blocks, -inf where none; detached
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32 and not lse.requires_grad
    scores = (q.double() @ k.double().repeat_interleave(h // g, dim=1).transpose(-1, -2)) / math.sqrt(d_k)
    want = torch.logsumexp(scores.masked_fill(~mask.to(q.device), float("-inf")), dim=-1)
    seen = mask.any(-1).to(q.device)
    assert torch.isneginf(lse[:, :, ~seen]).all() and torch.isfinite(lse[:, :, seen]).all()
    _check(lse[:, :, seen], want[:, :, seen], (TOL[0][0] * 10, TOL[0][1]), "lse")
    # p = exp(s - lse) is the compressed attention probability the importance score reuses: rows sum to 1
    probs = torch.exp(scores - lse.double().unsqueeze(-1)).masked_fill(~mask.to(q.device), 0)
    _check(probs.sum(-1)[:, :, seen], torch.ones_like(probs.sum(-1)[:, :, seen]), (1e-2 if ON_GPU else 1e-5, 0),
           "sum of exp(s - lse)")


def test_compressed_rows_without_blocks_are_exactly_zero_with_zero_gradient():
    b, h, g, s, l, d = 1, 6, 2, 70, 32, 16
    n_cmp = (s - l) // d + 1
    q, k, v = _inputs(b, h, g, s, n_cmp, 32, 32, seed=5)
    out = tr.compressed_attention(q, k, v, l, d)
    (dq,) = torch.autograd.grad(out.float().square().sum(), (q,))
    assert (out[:, :, : l - 1] == 0).all() and (out[:, :, l - 1:].abs().sum(-1) > 0).all()
    # rows that see one block have p = 1 whatever q is (dq ~ 0); from two blocks on q matters
    assert (dq[:, :, : l - 1] == 0).all() and (dq[:, :, l - 1 + d:].abs().sum(-1) > 1e-3).all()


def test_compressed_with_no_blocks_at_all():
    q, k, v = _inputs(1, 4, 2, 20, 0, 32, 32, seed=6)  # S < l: n_cmp = 0
    out, lse = tr.compressed_attention_lse(q, k, v, 32, 16)
    assert out.shape == (1, 4, 20, 32) and (out == 0).all() and torch.isneginf(lse).all()
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


# ----------------------------------------------------------------------------------------------------- band
BAND_CASES = [  # b, h, g, s, d_k, d_v, l_sel, sink
    pytest.param(1, 6, 1, 200, 32, 32, 16, True, id="hpg6-l16-sink"),
    pytest.param(1, 2, 1, 300, 64, 64, 64, True, id="l64=BLOCK_N-sink"),
    pytest.param(2, 4, 2, 70, 32, 32, 8, False, id="l8-no-sink"),
]


@pytest.mark.parametrize("b,h,g,s,d_k,d_v,l_sel,sink", BAND_CASES)
def test_band_matches_references(b, h, g, s, d_k, d_v, l_sel, sink):
    q, k, v = _inputs(b, h, g, s, s, d_k, d_v, seed=s + l_sel)
    out = tr.band_attention(q, k, v, l_sel, sink)
    refs = [("dense", _dense(q, k, v, _band_mask(s, l_sel, sink))),
            ("reference path (selected)", _band_reference_path(q, k, v, l_sel, sink))]
    _compare(out, (q, k, v), refs, lambda *x: _band_reference_path(*x, l_sel, sink, DTYPE))


def test_band_partial_shares_one_softmax_with_another_part():
    """Causal attention split into the band (kernel, partial) and every other visible key (float64 torch): the
    combined output and the sum of both parts' gradients (each part from the combined lse and delta) equal the dense
    causal attention and its gradients."""
    b, h, g, s, d, l_sel = 1, 6, 2, 150, 32, 16
    q, k, v = _inputs(b, h, g, s, s, d, d, seed=11)
    band = _band_mask(s, l_sel, True).to(q.device)
    rest = torch.ones(s, s, dtype=torch.bool).tril().to(q.device) & ~band
    hpg = h // g
    q64 = q.detach().double()
    k64, v64 = (x.detach().double().repeat_interleave(hpg, dim=1) for x in (k, v))
    scale = 1.0 / math.sqrt(d)

    o_band, lse_band = tr.band_attention_partial(q, k, v, l_sel, sink=True)
    assert not o_band.requires_grad and not lse_band.requires_grad
    s_rest = (q64 @ k64.transpose(-1, -2) * scale).masked_fill(~rest, float("-inf"))
    lse_rest = torch.logsumexp(s_rest, -1)  # -inf for the first rows (nothing outside the band)
    lse = torch.logaddexp(lse_band.double(), lse_rest)
    p_rest = torch.exp(s_rest - lse.unsqueeze(-1))
    o = o_band.double() * torch.exp(lse_band.double() - lse).unsqueeze(-1) + p_rest @ v64

    causal = torch.ones(s, s, dtype=torch.bool).tril()
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _dense(qr, kr, vr, causal)
    _check(o, ref, TOL[0], "combined output")

    upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(q.device)
    delta = (upstream * o).sum(-1)
    dq, dk, dv = tr.band_attention_partial_bwd(upstream.to(DTYPE), q.detach(), k.detach(), v.detach(),
                                               lse.float(), delta.float(), l_sel, sink=True)
    ds_rest = p_rest * (upstream @ v64.transpose(-1, -2) - delta.unsqueeze(-1))
    dq_rest = ds_rest @ k64 * scale
    dk_rest = (ds_rest.transpose(-1, -2) @ q64 * scale).view(b, g, hpg, s, d).sum(2)
    dv_rest = (p_rest.transpose(-1, -2) @ upstream).view(b, g, hpg, s, d).sum(2)
    want = torch.autograd.grad(ref, (qr, kr, vr), upstream)
    for label, part, other, full in zip("qkv", (dq, dk, dv), (dq_rest, dk_rest, dv_rest), want):
        _check(part.double() + other, full, TOL[1], f"d{label} (band share + rest share)")


# ----------------------------------------------------------------------------------------------------- API edges
def test_misaligned_inputs_are_copied_not_misread():
    """A view whose rows are not 16-byte aligned (here: an offset of one element) takes the aligned-copy path."""
    b, h, g, s, d, w = 1, 4, 2, 60, 32, 9
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(b, s, h, d + 1, generator=gen).to(KERNEL_DEVICE, DTYPE)
    q = base[..., 1:].transpose(1, 2).requires_grad_()
    k, v = (_bshd(b, s, g, d, gen).requires_grad_() for _ in range(2))
    out = tr.window_attention(q, k, v, w)
    _compare(out, (q, k, v), [("dense", _dense(q, k, v, _window_mask(s, w)))],
             lambda *x: ref_path.window_attention(*x, w))


def test_rejects_shapes_the_kernels_do_not_take():
    q, k, v = (x.detach() for x in _inputs(1, 4, 2, 8, 8, 32, 32, seed=0))
    with pytest.raises(ValueError, match="d_k"):
        tr.window_attention(q[..., :16], k[..., :16], v, 4)
    with pytest.raises(ValueError, match="heads per group"):
        tr.window_attention(q.repeat(1, 17, 1, 1), k, v, 4)
    with pytest.raises(ValueError, match="dtypes"):
        tr.window_attention(q, k.double(), v, 4)
    with pytest.raises(ValueError, match="queries' length"):
        tr.band_attention(q, k[:, :, :4], v[:, :, :4], 8)


def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) implementation and autograd registration of the custom ops (torch.library.opcheck)."""
    q, k, v = _inputs(1, 4, 2, 40, 40, 32, 32, seed=8)
    torch.library.opcheck(tr.range_attention_op, (q, k, v, tr.WINDOW, 8, 0))
    with torch.no_grad():
        o, lse = tr.range_attention_op(q, k, v, tr.BAND, 16, 16)
        do = torch.randn_like(o)
    torch.library.opcheck(tr.range_attention_bwd_op, (do, q.detach(), k.detach(), v.detach(), lse, o, None,
                                                      tr.BAND, 16, 16))
    n_cmp = (40 - 8) // 4 + 1
    qc, kc, vc = _inputs(1, 4, 2, 40, n_cmp, 32, 32, seed=9)
    torch.library.opcheck(tr.range_attention_op, (qc, kc, vc, tr.COMPRESSED, 8, 4))


def test_torch_compile_sees_opaque_ops_without_graph_breaks():
    """fullgraph=True fails on any graph break; aot_eager traces forward and backward through the fake kernels."""
    b, h, g, s, d, l, dd, w = 1, 4, 2, 64, 32, 8, 4, 16
    q, k, v = _inputs(b, h, g, s, s, d, d, seed=10)
    kc, vc = (x.detach()[:, :, : (s - l) // dd + 1].clone().requires_grad_() for x in (k, v))

    def branches(q, k, v, kc, vc):
        return tr.window_attention(q, k, v, w) + tr.compressed_attention(q, kc, vc, l, dd)

    torch._dynamo.reset()
    compiled = torch.compile(branches, backend="aot_eager", fullgraph=True)
    inputs = (q, k, v, kc, vc)
    got = compiled(*inputs)
    want = branches(*inputs)
    torch.testing.assert_close(got, want)
    upstream = torch.randn_like(want)
    for a, b_ in zip(torch.autograd.grad(got, inputs, upstream), torch.autograd.grad(want, inputs, upstream)):
        torch.testing.assert_close(a, b_)


def _op_counts(s):
    from torch.profiler import ProfilerActivity, profile

    b, h, g, d, l, dd, w = 1, 1, 1, 32, 32, 16, 64
    q, k, v = _inputs(b, h, g, s, s, d, d, seed=s)
    n_cmp = (s - l) // dd + 1
    kc, vc = (x.detach()[:, :, :n_cmp].clone().requires_grad_() for x in (k, v))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = tr.window_attention(q, k, v, w) + tr.compressed_attention(q, kc, vc, l, dd)
        torch.autograd.grad(out, (q, k, v, kc, vc), torch.ones_like(out))
    counts = {}
    for event in prof.events():
        counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def test_operator_calls_do_not_depend_on_sequence_length_and_never_sync():
    short, long = _op_counts(256), _op_counts(1024)
    assert short == long
    for name in ("aten::nonzero", "aten::item", "aten::_local_scalar_dense"):
        assert name not in short


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_forward_backward_capture_in_a_cuda_graph_without_syncs():
    b, h, g, s, d, w, l, dd = 2, 12, 2, 512, 64, 128, 32, 16
    q, k, v = _inputs(b, h, g, s, s, d, d, seed=12)
    n_cmp = (s - l) // dd + 1
    kc, vc = (x.detach()[:, :, :n_cmp].clone().requires_grad_() for x in (k, v))
    upstream = torch.randn(b, h, s, d, device="cuda", dtype=DTYPE)
    inputs = (q, k, v, kc, vc)

    def step():
        out = tr.window_attention(q, k, v, w) + tr.compressed_attention(q, kc, vc, l, dd)
        # `out` is returned detached: with its graph alive, the leaves' grad accumulators from the eager run (made on
        # the legacy stream) would outlive it, and the captured backward's end-of-backward sync with their stream
        # fails the capture ("operation would make the legacy stream depend on a capturing blocking stream", the
        # first GPU run of gpu_kernels.yaml; pytorch/pytorch#164302)
        return (out.detach(), *torch.autograd.grad(out, inputs, upstream))

    eager = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compile and autotune outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            captured = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph.replay()
    torch.cuda.synchronize()
    for a, b_ in zip(captured, eager):
        torch.testing.assert_close(a, b_)


# ----------------------------------------------------------------------------------------------------- full grid
GRID = [pytest.param(mode, hpg, g, d, id=f"{mode}-hpg{hpg}-G{g}-d{d}", marks=pytest.mark.slow)
        for mode in ("win", "cmp", "band") for hpg in (1, 3, 6, 8, 16) for g in (1, 2, 4) for d in (32, 64, 128)]


@pytest.mark.parametrize("mode,hpg,g,d", GRID)
def test_full_grid(mode, hpg, g, d):
    b, s = 1, 157
    h = g * hpg
    if mode == "win":
        w = 37
        q, k, v = _inputs(b, h, g, s, s, d, d, seed=hpg * 100 + g * 10 + d)
        _compare(tr.window_attention(q, k, v, w), (q, k, v), [("dense", _dense(q, k, v, _window_mask(s, w)))],
                 lambda *x: ref_path.window_attention(*x, w))
    elif mode == "cmp":
        l, dd = 16, 8
        n_cmp = (s - l) // dd + 1
        q, k, v = _inputs(b, h, g, s, n_cmp, d, d, seed=hpg * 100 + g * 10 + d)
        _compare(tr.compressed_attention(q, k, v, l, dd), (q, k, v),
                 [("dense", _dense(q, k, v, _cmp_mask(s, n_cmp, l, dd)))],
                 lambda *x: ref_path.compressed_attention(*x, l, dd))
    else:
        l_sel = 32
        q, k, v = _inputs(b, h, g, s, s, d, d, seed=hpg * 100 + g * 10 + d)
        _compare(tr.band_attention(q, k, v, l_sel, True), (q, k, v),
                 [("dense", _dense(q, k, v, _band_mask(s, l_sel, True)))],
                 lambda *x: _band_reference_path(*x, l_sel, True, DTYPE))
