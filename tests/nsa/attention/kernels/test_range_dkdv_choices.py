"""The range kernels' dK/dV launch choices side by side (nsa.attention.kernels.range_attn.host.DKDV_CHOICES: tiles
that fit two or more CTAs per SM on sm_90, and a finer split of the cmp launch): every choice's q/k/v gradients
against an independent float64 dense reference, in each mode that takes the dK/dV kernel (window; cmp and the band
with a sink, which take the split), and the split's arithmetic at the m7c shape.

Without a GPU the kernels run in Triton's interpreter (fp32, small shapes, tight tolerances); with one, natively in
bf16 (the same tolerance rule as test_triton_range.py: the PyTorch path's own error sets the scale).
"""

import pytest
import torch

from reference import masked_attention
from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, assert_within_torch_error, needs_triton

from nsa.attention import kernels as ref_path

if HAVE_TRITON:
    import triton

    from nsa.attention.kernels.range_attn import host as tr

pytestmark = needs_triton

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
TOL = (5e-5, 1e-4)  # (atol, rtol) of gradients against float64 in the interpreter
CHOICES = ["shipped", "w4s1", "w4s1_split", "bn32_w4_split", "split"]


def _inputs(b, h, g, s, t, d, seed):
    gen = torch.Generator().manual_seed(seed)

    def x(n, length):  # [B, n, length, d] seen through [B, length, n, d] storage, as the layer passes it
        return torch.randn(b, length, n, d, generator=gen).to(KERNEL_DEVICE, DTYPE).transpose(1, 2).requires_grad_()

    return x(h, s), x(g, t), x(g, t)


def _dense(q, k, v, mask):
    hpg = q.shape[1] // k.shape[1]
    k64, v64 = (y.double().repeat_interleave(hpg, dim=1) for y in (k, v))
    return masked_attention(q.double(), k64, v64, mask.to(q.device))


def _run(mode, b, h, g, s, d, seed):
    """(kernel grads, float64 dense grads, PyTorch-path grads at the kernel's dtype) of one mode's attention."""
    t_idx, j_idx = torch.arange(s).view(s, 1), torch.arange(s).view(1, s)
    if mode == "cmp":
        l, st = 8, 4
        n_cmp = (s - l) // st + 1
        q, k, v = _inputs(b, h, g, s, n_cmp, d, seed)
        mask = torch.arange(n_cmp).view(1, n_cmp) * st + l - 1 <= t_idx
        fn = lambda q, k, v: tr.compressed_attention(q, k, v, l, st)  # noqa: E731
        torch_fn = lambda q, k, v: ref_path.compressed_attention(q, k, v, l, st)  # noqa: E731
    elif mode == "window":
        w = 40
        q, k, v = _inputs(b, h, g, s, s, d, seed)
        mask = (j_idx <= t_idx) & (j_idx > t_idx - w)
        fn = lambda q, k, v: tr.window_attention(q, k, v, w)  # noqa: E731
        torch_fn = lambda q, k, v: ref_path.window_attention(q, k, v, w)  # noqa: E731
    else:  # the band with a sink: partials and the split, as cmp
        l_sel = 16
        q, k, v = _inputs(b, h, g, s, s, d, seed)
        mask = (j_idx <= t_idx) & (j_idx >= (t_idx // l_sel - 1) * l_sel)
        mask |= (j_idx < l_sel) & (t_idx // l_sel >= 2)
        fn = lambda q, k, v: tr.band_attention(q, k, v, l_sel, True)  # noqa: E731
        torch_fn = None
    upstream = torch.randn(b, h, s, d, generator=torch.Generator().manual_seed(seed + 1)).to(KERNEL_DEVICE, DTYPE)
    got = torch.autograd.grad(fn(q, k, v), (q, k, v), upstream)
    want = torch.autograd.grad(_dense(q, k, v, mask), (q, k, v), upstream.double())
    lowp = None
    if torch_fn is not None:
        leaves = [y.detach().requires_grad_() for y in (q, k, v)]
        lowp = torch.autograd.grad(torch_fn(*leaves), leaves, upstream)
    return got, want, lowp


# every new choice in cmp (its tile and its split; test_triton_range covers the shipped one); the window and the
# band with a sink for each distinct tile (the split choices share the tiles); the rest of the product is `slow`
FAST = [(c, "cmp") for c in CHOICES[1:]] + [(c, m) for c in ("w4s1", "bn32_w4_split") for m in ("window", "band-sink")]
PAIRS = [pytest.param(c, m, id=f"{m}-{c}", marks=() if (c, m) in FAST else pytest.mark.slow)
         for m in ("cmp", "window", "band-sink") for c in CHOICES]


@pytest.mark.parametrize("choice,mode", PAIRS)
def test_every_dkdv_choice_matches_float64(monkeypatch, choice, mode):
    monkeypatch.setattr(tr, "DKDV_CHOICE", choice)
    # hpg 6 (the model's), d 64; cmp: 37 blocks (two 32-key tiles, one 64-key tile partly filled); window and band:
    # S over two 64-key tiles with a masked head and tail
    got, want, lowp = _run(mode, 1, 6, 1, 155 if mode == "cmp" else 100, 64, seed=len(mode) + len(choice))
    for label, a, b, c in zip("qkv", got, want, lowp or (None,) * 3):
        if c is not None:
            assert_within_torch_error(f"{choice} {mode} d{label}", a, b, c)
        if not ON_GPU:
            torch.testing.assert_close(a.double(), b.double(), atol=TOL[0], rtol=TOL[1],
                                       msg=lambda m, label=label: f"{choice} {mode} d{label}: {m}")


def test_a_fine_split_with_short_chunks_matches_float64(monkeypatch):
    """A split into many short chunks (4 query tiles each: the key tiles' ranges cut 6 ways, uneven last chunks,
    empty chunks past a key tile's range) sums to the same gradients."""
    monkeypatch.setitem(tr.DKDV_CHOICES, "fine", tr.DkdvChoice(tr.LaunchConfig(32, 32, 4, 2),
                                                                  tr.DkdvSplit(1, 64, 2)))
    monkeypatch.setattr(tr, "DKDV_CHOICE", "fine")
    n_q_tiles = triton.cdiv(120, 32 // 6)
    cfg = tr.dkdv_config(64, 64)
    assert tr.dkdv_splits(tr.COMPRESSED, 1, 1, 29, 120, 6, 132, cfg) == min(64, triton.cdiv(n_q_tiles, 4)) == 6
    got, want, _ = _run("cmp", 1, 6, 1, 120, 64, seed=3)
    if not ON_GPU:
        for label, a, b in zip("qkv", got, want):
            torch.testing.assert_close(a.double(), b.double(), atol=TOL[0], rtol=TOL[1],
                                       msg=lambda m, label=label: f"d{label}: {m}")


def test_split_arithmetic_at_the_m7c_shape():
    """S = 65,536, B 1, 2 groups of 6 heads, l 32, stride 16 (n_cmp 4,095) on an H100's 132 SMs: the shipped split
    cuts each key tile's query range 3 ways (384 programs, the first key tile's chunks ~4,370 query tiles long); the
    finer split bounds a chunk to 512 query tiles (26 chunks, 3,328 programs)."""
    s, n_cmp, hpg = 65536, (65536 - 32) // 16 + 1, 6
    shipped = tr.DKDV_CHOICES["shipped"]
    cfg = tr.DKDV
    q_tiles = triton.cdiv(s, cfg.block_m // hpg)
    n = tr.dkdv_splits(tr.COMPRESSED, 1, 2, n_cmp, s, hpg, 132, cfg, split=shipped.split)
    assert n == 3 and triton.cdiv(q_tiles, n) > 4300
    for name in ("w4s1_split", "split"):
        n = tr.dkdv_splits(tr.COMPRESSED, 1, 2, n_cmp, s, hpg, 132, cfg, split=tr.DKDV_CHOICES[name].split)
        assert n == 26 and triton.cdiv(q_tiles, n) <= 512
    bn32 = tr.DKDV_CHOICES["bn32_w4_split"]
    n = tr.dkdv_splits(tr.COMPRESSED, 1, 2, n_cmp, s, hpg, 132, bn32.cfg, split=bn32.split)
    assert triton.cdiv(q_tiles, n) <= 512
    # the window's ranges are bounded: never split
    assert tr.dkdv_splits(tr.WINDOW, 1, 2, s, s, hpg, 132, cfg, split=tr.DKDV_CHOICES["split"].split) == 1


def test_auto_picks_the_qualified_choice_and_a_bad_name_is_refused(monkeypatch):
    assert tr.DKDV_CHOICE == "auto" and tr.QUALIFIED_DKDV == "w4s1_split"  # qualified on an H200, 2026-11-28
    assert tr.dkdv_config(64, 64) == tr.LaunchConfig(32, 64, 4, 1) and tr.dkdv_config(64, 128) == tr.DKDV_MIXED
    monkeypatch.setattr(tr, "DKDV_CHOICE", "shipped")
    assert tr.dkdv_config(64, 64) == tr.DKDV
    monkeypatch.setattr(tr, "DKDV_CHOICE", "w4s1")
    assert tr.dkdv_config(64, 64) == tr.LaunchConfig(32, 64, 4, 1)
    assert tr.dkdv_config(128, 128) == tr.DKDV  # the choices' tiles are for d <= 64 only
    monkeypatch.setattr(tr, "DKDV_CHOICE", "nope")
    with pytest.raises(ValueError, match="DKDV_CHOICE"):
        tr.dkdv_config(64, 64)


def test_every_choice_tile_is_an_aot_case():
    names = {c.name for c in tr.aot_cases(dims=((64, 64), (32, 32)))}
    for choice in tr.DKDV_CHOICES.values():
        cfg = choice.cfg or tr.DKDV
        for d in (32, 64):
            assert any(n.startswith("range_dkdv") and f"[BLOCK_M={cfg.block_m},BLOCK_N={cfg.block_n},"
                       f"warps={cfg.num_warps},stages={cfg.num_stages},d_k={d},d_v={d}," in n for n in names)
