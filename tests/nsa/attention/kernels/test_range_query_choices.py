"""The range kernels' forward / dQ launch choices side by side (nsa.attention.kernels.range_attn.host.QUERY_CHOICES:
32-key tiles that fit two or more CTAs per SM on sm_90): every choice's output, LSE and q/k/v gradients against an
independent float64 dense reference with an explicit mask, in each mode that runs the forward and dQ kernels
(window; cmp, with rows that see nothing; the band, through the partial API whose dQ reads the given delta; the
band with a sink), and the choice's plumbing ('auto' is the qualified one, an unknown name is refused).

Without a GPU the kernels run in Triton's interpreter (fp32, small shapes, tight tolerances; the interpreter ignores
warps and stages, so bn32_s3 computes what bn32 does and runs only where `slow` tests run); with one, natively in
bf16 (test_triton_range.py's rule: the PyTorch path's own error at bf16 sets the scale).
"""

import re

import pytest
import torch
import torch.nn.functional as F

from reference import masked_attention
from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, assert_within_torch_error, needs_triton

from nsa.attention import kernels as ref_path

if HAVE_TRITON:
    from nsa.attention.kernels.range_attn import host as tr

pytestmark = needs_triton

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
TOL = (5e-5, 1e-4)  # (atol, rtol) against float64 in the interpreter (fp32)
CHOICES = ["shipped", "bn32", "bn32_s3", "m64_bn32"]
MODES = ["window", "cmp", "band", "band-sink"]
# the sizes: hpg 6 (the model's), d 64 (the choices' head dim), one group. window: w 70 over S 84, so 21-token
# (and 10-token) tiles have an unmasked 32-key tile between a masked head and tail; cmp: l 8, stride 2 over S 100
# (47 blocks: one whole 32-key tile, one partly filled, the last query tile sees the first unmasked; tokens < 7
# see nothing); band: l_sel 16 (below the key tile) over S 72 (the sink from token 32 on)
SEQ = {"window": 84, "cmp": 100, "band": 72, "band-sink": 72}
W, L_CMP, D_CMP, L_SEL = 70, 8, 2, 16


def _masks(mode: str, s: int):
    """(mode, p0, p1, T, mask [S, T]) of one mode: the explicit visibility the reference applies."""
    t, j = torch.arange(s).view(s, 1), torch.arange(s).view(1, s)
    if mode == "window":
        return tr.WINDOW, W, 0, s, (j <= t) & (j > t - W)
    if mode == "cmp":
        n_cmp = (s - L_CMP) // D_CMP + 1
        return tr.COMPRESSED, L_CMP, D_CMP, n_cmp, torch.arange(n_cmp).view(1, n_cmp) * D_CMP + L_CMP - 1 <= t
    mask = (j <= t) & (j >= (t // L_SEL - 1) * L_SEL)
    if mode == "band-sink":
        mask |= (j < L_SEL) & (t // L_SEL >= 2)
    return tr.BAND, L_SEL, L_SEL if mode == "band-sink" else 0, s, mask


def _dense64(q, k, v, mask):
    """(o, lse) in float64: the masked softmax attention and the natural log-sum-exp of its scaled scores (-inf
    where a row sees nothing)."""
    hpg = q.shape[1] // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(hpg, 1), v.double().repeat_interleave(hpg, 1)
    mask = mask.to(q.device)
    scores = (q64 @ k64.transpose(-1, -2)) / q.shape[-1] ** 0.5
    lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), -1)
    return masked_attention(q64, k64, v64, mask), lse


def _lowp(mode, q, k, v, mask):
    """The PyTorch path at the kernel's dtype (the GPU rule's error scale)."""
    if mode == "cmp":
        return ref_path.compressed_attention(q, k, v, L_CMP, D_CMP)
    if mode == "window":
        return ref_path.window_attention(q, k, v, W)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device), enable_gqa=True)


def _kernel(mode, q, k, v, upstream, code, p0, p1):
    """(o, lse, (dq, dk, dv)) of the kernels. The band without a sink goes through the partial API: its dQ kernel
    reads the given lse and delta instead of computing delta itself."""
    if mode == "band":
        o, lse = tr.band_attention_partial(q, k, v, L_SEL)
        delta = (upstream.float() * o.float()).sum(-1)
        return o, lse, tr.band_attention_partial_bwd(upstream, q, k, v, lse, delta, L_SEL)
    o, lse = tr.range_attention_op(q, k, v, code, p0, p1)
    return o.detach(), lse, torch.autograd.grad(o, (q, k, v), upstream)


def _check(choice, mode, seed, b=1, h=6, g=1, d=64):
    s = SEQ[mode]
    code, p0, p1, t, mask = _masks(mode, s)
    gen = torch.Generator().manual_seed(seed)

    def x(n, length):  # [B, n, length, d] seen through [B, length, n, d] storage, as the layer passes it
        return torch.randn(b, length, n, d, generator=gen).to(KERNEL_DEVICE, DTYPE).transpose(1, 2).requires_grad_()

    q, k, v = x(h, s), x(g, t), x(g, t)
    upstream = torch.randn(b, h, s, d, generator=gen).to(KERNEL_DEVICE, DTYPE)
    o, lse, grads = _kernel(mode, q, k, v, upstream, code, p0, p1)
    leaves64 = [y.detach().double().requires_grad_() for y in (q, k, v)]
    o64, lse64 = _dense64(*leaves64, mask)
    grads64 = torch.autograd.grad(o64, leaves64, upstream.double())
    assert torch.equal(torch.isinf(lse), torch.isinf(lse64)), f"{choice} {mode}: lse is -inf on other rows"
    seen = torch.isfinite(lse64)
    torch.testing.assert_close(lse[seen].double(), lse64[seen], atol=TOL[0] if not ON_GPU else 2e-3,
                               rtol=TOL[1] if not ON_GPU else 2e-3, msg=lambda m: f"{choice} {mode} lse: {m}")
    if ON_GPU:
        leaves = [y.detach().requires_grad_() for y in (q, k, v)]
        o_low = _lowp(mode, *leaves, mask)
        lowp = [o_low.detach(), *torch.autograd.grad(o_low, leaves, upstream)]
        for label, a, ref, c in zip(("o", "dq", "dk", "dv"), (o, *grads), (o64, *grads64), lowp):
            assert_within_torch_error(f"{choice} {mode} {label}", a, ref, c)
        return
    for label, a, ref in zip(("o", "dq", "dk", "dv"), (o, *grads), (o64, *grads64)):
        torch.testing.assert_close(a.double(), ref, atol=TOL[0], rtol=TOL[1],
                                   msg=lambda m, label=label: f"{choice} {mode} {label}: {m}")


# in the interpreter (about 1-2 s a case): bn32 (128 x 32) in every mode, m64_bn32 (64 x 32) in the window and cmp
# (the band's masks and its partial dQ path are bn32's cases); the shipped tile is test_triton_range.py's, and
# bn32_s3 differs from bn32 in stages only (the GPU's concern). The rest runs with -m slow and on a GPU.
FAST = [("bn32", m) for m in MODES] + [("m64_bn32", "window"), ("m64_bn32", "cmp")]
PAIRS = [pytest.param(c, m, id=f"{m}-{c}", marks=() if (c, m) in FAST else pytest.mark.slow)
         for m in MODES for c in CHOICES]


@pytest.mark.parametrize("choice,mode", PAIRS)
def test_every_query_choice_matches_float64(monkeypatch, choice, mode):
    monkeypatch.setattr(tr, "QUERY_CHOICE", choice)
    cfg = tr.QUERY_CHOICES[choice]
    assert tr.fwd_config(64, 64) == (cfg.fwd or tr.LARGE_Q) and tr.dq_config(64, 64) == (cfg.dq or tr.LARGE_Q)
    _check(choice, mode, seed=len(mode) * 7 + len(choice))


def test_auto_picks_the_qualified_choice_and_a_bad_name_is_refused(monkeypatch):
    assert list(tr.QUERY_CHOICES) == CHOICES  # a new choice joins the parametrization above
    assert tr.QUERY_CHOICE == "auto" and tr.QUALIFIED_QUERY == "shipped"  # no GPU run has qualified another yet
    assert tr.fwd_config(64, 64) == tr.dq_config(64, 64) == tr.query_config(64, 64) == tr.LARGE_Q
    monkeypatch.setattr(tr, "QUERY_CHOICE", "m64_bn32")
    assert tr.fwd_config(64, 64) == tr.dq_config(64, 64) == tr.LaunchConfig(64, 32, 4, 2)
    for dims in ((32, 32), (128, 128), (64, 128)):  # the choices' tiles are for d_k = d_v = 64 only
        assert tr.fwd_config(*dims) == tr.dq_config(*dims) == tr.query_config(*dims)
    monkeypatch.setattr(tr, "QUERY_CHOICE", "nope")
    with pytest.raises(ValueError, match=re.escape("QUERY_CHOICE must be one of auto | shipped | bn32 | bn32_s3 | m64_bn32, got 'nope'")):
        tr.fwd_config(64, 64)
    with pytest.raises(ValueError, match="QUERY_CHOICE"):
        tr.dq_config(64, 64)


def test_every_choice_keeps_a_query_tile_of_all_heads():
    """A query tile holds all heads of its tokens (hpg <= BLOCK_M) and its dots keep tensor-core shapes."""
    for choice in tr.QUERY_CHOICES.values():
        for cfg in (choice.fwd, choice.dq):
            if cfg is not None:
                assert cfg.block_m >= tr.MAX_HPG and cfg.block_m % 64 == 0 and cfg.block_n % 16 == 0


def test_aot_cases_hold_the_launchers_pick_only(monkeypatch):
    """aot_cases() (the compile test's list) compiles the launcher's forward and dQ pick, one case per kernel and
    head dims whatever the choice: the other tiles are tune_kernels --aot's (reports/aot/range_query_occupancy.md)."""
    def query_cases():
        return [c.name for c in tr.aot_cases(dims=((64, 64),)) if c.name.startswith(("range_fwd", "range_dq"))]

    shipped = query_cases()
    assert len(shipped) == 2 and all("BLOCK_M=128,BLOCK_N=64,warps=8,stages=2," in n for n in shipped)
    monkeypatch.setattr(tr, "QUERY_CHOICE", "bn32")
    assert [n.replace("BLOCK_N=32", "BLOCK_N=64") for n in query_cases()] == shipped
