"""The whole NSAAttention layer against an independent float64 NSA written here from the paper's definitions.

The reference starts from the layer's weights and x (not from `project`): projections, rotate-half RoPE (token
keys at their position, compressed keys at their block's last position i*d + l - 1), phi over the overlapping
blocks [i*d, i*d + l), the gates (sigmoid or softmax of the gate MLP), and the three branches as dense attention
with explicit boolean masks:
  cmp  block i visible to query t iff i*d + l - 1 <= t (no visible block: output 0);
  sel  block importance = the group's head-summed compressed probabilities times |block i & selection block j| / d
       (the module's documented, overlap-aligned reading of Eq. 9), blocks 0, t // l_sel and t // l_sel - 1 forced,
       the rest by importance (ties to the lower index), tokens p <= t of the chosen blocks;
  win  t - w < p <= t.
Every path runs in float64 too, so any precision loss inside it (a hidden cast to fp32) shows: float64 layer vs
float64 reference must agree to 1e-10 of the output scale (they agree to ~1e-15), the fp32 layer to 1e-4. Shapes:
sequence lengths around every block length and stride, B > 1 with different rows, heads per group 1 and > 1, a
head width of 2, n_sel above the blocks that exist, w of 1 and above S; decode one token at a time from an empty
cache; and the Triton path (fp32, under TRITON_INTERPRET=1 on CPU) at a few tiny shapes.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from nsa.attention.rope import apply_rope
from nsa_test_utils import make_attn, make_cfg
from triton_test_utils import ON_GPU, needs_triton

TIGHT = 1e-10  # float64 layer against the float64 reference, relative to max |reference|
FP32 = 1e-4  # fp32 layer against the float64 reference, relative to max |reference|


# ----------------------------------------------------------------------------------------------- the reference


def _lin(x, mod):
    y = x @ mod.weight.double().T
    return y if mod.bias is None else y + mod.bias.double()


def _rope(x, positions, theta):
    """Rotate-half RoPE in float64: the pair (x_j, x_{j + D/2}) turned by positions * theta^(-2j/D)."""
    width = x.shape[-1]
    inv = torch.tensor([theta ** (-2.0 * j / width) for j in range(width // 2)], dtype=torch.float64)
    ang = positions.double()[:, None] * inv[None, :]
    x1, x2 = x[..., : width // 2], x[..., width // 2:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


def _phi(blocks, comp):
    """blocks [B, G, n, l, width] -> [B, G, n, width]: the mean, plus the MLP of the flattened block + position."""
    mean = blocks.mean(3)
    if comp.kind == "avg":
        return mean
    return mean + _lin(F.gelu(_lin((blocks + comp.pos.double()).flatten(3), comp.fc1)), comp.fc2)


def _attend(q, k, v, mask):
    """softmax(q k^T / sqrt(d_k)) v over the True keys of mask [B, H, S, T]; rows with no key give 0."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    has = mask.any(-1, keepdim=True)
    scores = torch.where(has, scores.masked_fill(~mask, float("-inf")), torch.zeros_like(scores))
    p = torch.softmax(scores, -1) * mask
    return p @ v, p


def reference(attn, x):
    """(output [B, S, dim], chosen blocks [B, G, S, n_sel]) of NSA in float64 with attn's weights."""
    cfg = attn.cfg
    x = x.double()
    b, s, _ = x.shape
    h, g, hpg = cfg.n_heads, cfg.n_kv_groups, cfg.heads_per_group
    l, d, l_sel, theta = cfg.l, cfg.d, cfg.l_sel, cfg.rope_theta
    pos = torch.arange(s)

    def heads(y, n):
        return y.view(b, s, n, -1).transpose(1, 2)

    def per_head(t):
        return t.repeat_interleave(hpg, 1)

    q = _rope(heads(_lin(x, attn.q_proj), h), pos, theta)
    k_sel, v_sel = _rope(heads(_lin(x, attn.k_sel), g), pos, theta), heads(_lin(x, attn.v_sel), g)
    k_win, v_win = _rope(heads(_lin(x, attn.k_win), g), pos, theta), heads(_lin(x, attn.v_win), g)
    k_raw, v_raw = heads(_lin(x, attn.k_cmp), g), heads(_lin(x, attn.v_cmp), g)
    starts = list(range(0, s - l + 1, d))  # compression blocks that fit: [i*d, i*d + l)
    if starts:
        k_cmp = _rope(_phi(torch.stack([k_raw[:, :, a: a + l] for a in starts], 2), attn.phi_k),
                      torch.tensor([a + l - 1 for a in starts]), theta)
        v_cmp = _phi(torch.stack([v_raw[:, :, a: a + l] for a in starts], 2), attn.phi_v)
    else:
        k_cmp, v_cmp = x.new_zeros(b, g, 0, cfg.d_k), x.new_zeros(b, g, 0, cfg.d_v)
    logits = _lin(F.silu(_lin(x, attn.gate[0])), attn.gate[2]).view(b, s, h, 3)
    gates = torch.sigmoid(logits) if cfg.gate == "sigmoid" else torch.softmax(logits, -1)

    t = pos[:, None]
    visible = torch.tensor([[a + l - 1 <= tt for a in starts] for tt in range(s)], dtype=torch.bool).view(s, -1)
    o_cmp, p_cmp = _attend(q, per_head(k_cmp), per_head(v_cmp), visible.expand(b, h, s, len(starts)))

    n_blocks = -(-s // l_sel)
    overlap = torch.tensor([[len(set(range(a, a + l)) & set(range(j * l_sel, (j + 1) * l_sel))) / d
                             for j in range(n_blocks)] for a in starts], dtype=torch.float64).view(-1, n_blocks)
    importance = (p_cmp @ overlap).view(b, g, hpg, s, n_blocks).sum(2)
    chosen = torch.full((b, g, s, cfg.n_sel), -1, dtype=torch.long)
    sel_mask = torch.zeros(b, g, s, s, dtype=torch.bool)
    for bi in range(b):
        for gi in range(g):
            for tt in range(s):
                cur = tt // l_sel
                forced = {0, cur, max(cur - 1, 0)}
                row = importance[bi, gi, tt].tolist()
                keep = sorted(sorted(range(cur + 1), key=lambda j: (j not in forced, -row[j], j))[: cfg.n_sel])
                chosen[bi, gi, tt, : len(keep)] = torch.tensor(keep)
                for j in keep:
                    sel_mask[bi, gi, tt, j * l_sel: min((j + 1) * l_sel, tt + 1)] = True
    o_sel, _ = _attend(q, per_head(k_sel), per_head(v_sel), per_head(sel_mask))
    key = torch.arange(s)[None, :]
    o_win, _ = _attend(q, per_head(k_win), per_head(v_win), ((key <= t) & (key > t - cfg.w)).expand(b, h, s, s))

    mixed = sum(gates[..., i].transpose(1, 2).unsqueeze(-1) * o for i, o in enumerate((o_cmp, o_sel, o_win)))
    return mixed.transpose(1, 2).reshape(b, s, -1) @ attn.o_proj.weight.double().T, chosen


# ----------------------------------------------------------------------------------------------- helpers


def _rel(got, want):
    scale = want.double().abs().max().item()
    return (got.double() - want.double()).abs().max().item() / max(scale, 1e-300)


def _inputs(b, s, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, dim, generator=gen, dtype=torch.float64), \
        torch.randn(b, s, dim, generator=gen, dtype=torch.float64)


def _compare(attn, x64, upstream, tol):
    """The layer (in its own dtype) against the reference on attn's weights: output, x gradient, every parameter
    gradient and the chosen blocks."""
    dtype = next(attn.parameters()).dtype
    ref_mod = copy.deepcopy(attn).double()
    x = x64.detach().to(dtype, copy=True).requires_grad_(True)
    xr = x64.detach().clone().requires_grad_(True)
    y = attn(x)
    yr, chosen = reference(ref_mod, xr)
    assert y.dtype == dtype and y.shape == yr.shape
    assert yr.double().std() > 1e-2, "vacuous comparison"
    (y.double() * upstream).sum().backward()
    (yr * upstream).sum().backward()
    assert _rel(y, yr) < tol, f"output: relative error {_rel(y, yr):.3g} >= {tol:g}"
    assert _rel(x.grad, xr.grad) < tol, f"x gradient: relative error {_rel(x.grad, xr.grad):.3g} >= {tol:g}"
    for (name, p), (_, pr) in zip(attn.named_parameters(), ref_mod.named_parameters()):
        if pr.grad is None or not pr.grad.abs().max() > 0:  # e.g. S < l: the compressor takes no part
            assert p.grad is None or p.grad.abs().max() <= 1e-5, f"{name}: a gradient the reference does not have"
            continue
        assert p.grad is not None, f"{name}: no gradient"
        assert _rel(p.grad, pr.grad) < tol, f"{name} gradient: relative error {_rel(p.grad, pr.grad):.3g}"
    with torch.no_grad():
        blocks = attn.selected_blocks(x64.to(dtype))
    assert torch.equal(blocks, chosen), "selected blocks differ from the reference's"


# (config overrides on l=8, d=4, l_sel=8, n_sel=4, w=16, H=4, G=2, d_k=d_v=8; B; S)
SHAPES = [
    pytest.param(dict(), 2, 1, id="S1"),
    pytest.param(dict(), 2, 7, id="S=l-1"),
    pytest.param(dict(), 2, 9, id="S=l+1"),
    pytest.param(dict(), 3, 33, id="S=n_sel*l_sel+1-B3"),
    pytest.param(dict(n_kv_groups=1, w=15), 2, 41, id="hpg4-w=15"),
    pytest.param(dict(n_kv_groups=4, n_sel=16, w=64), 2, 37, id="hpg1-n_sel>blocks-w>S"),
    pytest.param(dict(dim=8, n_heads=2, n_kv_groups=2, d_k=2, d_v=2, w=1), 2, 29, id="d_k2-w1"),
    pytest.param(dict(l=16, d=4, l_sel=4, n_sel=3, w=3, phi="avg", gate="softmax"), 2, 42, id="l>l_sel-avg-softmax"),
    pytest.param(dict(l=12, d=4, l_sel=8, n_sel=5, w=7, gate="softmax"), 2, 47, id="l12-softmax"),
]


@pytest.mark.parametrize("prefill,selection", [("batched", "v2"), ("sequential", "v1")])
@pytest.mark.parametrize("over,b,s", SHAPES)
def test_float64_layer_equals_the_float64_reference(over, b, s, prefill, selection):
    """In float64 nothing inside the layer may round to fp32 (RoPE and the softmax gate did)."""
    attn = make_attn(make_cfg(prefill=prefill, selection=selection, **over), seed=1).double()
    x, upstream = _inputs(b, s, attn.cfg.dim, seed=s)
    _compare(attn, x, upstream, TIGHT)


@pytest.mark.parametrize("over,b,s", SHAPES[2:6] + SHAPES[7:8])
def test_fp32_layer_is_within_fp32_rounding_of_the_reference(over, b, s):
    attn = make_attn(make_cfg(**over), seed=1)
    x, upstream = _inputs(b, s, attn.cfg.dim, seed=s)
    _compare(attn, x, upstream, FP32)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, TIGHT), (torch.float32, FP32)], ids=["fp64", "fp32"])
@pytest.mark.parametrize("over,b,s", [
    pytest.param(dict(), 2, 45, id="base-S45"),
    pytest.param(dict(l=16, d=4, l_sel=4, n_sel=3, w=3, gate="softmax"), 2, 41, id="l>l_sel-softmax"),
    pytest.param(dict(l=8, d=8, l_sel=16, n_sel=3, w=40, phi="avg", n_kv_groups=1), 3, 50, id="d=l-G1-B3"),
])
def test_decode_from_an_empty_cache_equals_the_reference_at_every_position(over, b, s, dtype, tol):
    attn = make_attn(make_cfg(**over), seed=1).to(dtype)
    x, _ = _inputs(b, s, attn.cfg.dim, seed=s)
    with torch.no_grad():
        want, _ = reference(copy.deepcopy(attn).double(), x)
        cache = attn.new_cache(b)
        got = torch.cat([attn.decode_step(x[:, t: t + 1].to(dtype), cache) for t in range(s)], 1)
    for t in range(s):
        assert _rel(got[:, t], want[:, t]) < tol, f"decode position {t}: relative error {_rel(got[:, t], want[:, t])}"


@needs_triton
@pytest.mark.skipif(ON_GPU, reason="the interpreter's fp32 comparison; on a GPU test_triton_layer.py judges bf16")
@pytest.mark.parametrize("over,b,s", [
    pytest.param(dict(), 2, 1, id="S1"),
    pytest.param(dict(), 2, 9, id="S=l+1"),
    pytest.param(dict(phi="avg", gate="softmax", w=3), 2, 19, id="avg-softmax-w3"),
    pytest.param(dict(l=4, d=2, l_sel=6, n_sel=4, w=9, n_heads=4, n_kv_groups=2), 2, 25, id="l_sel6-hpg2"),
])
def test_triton_path_is_within_fp32_rounding_of_the_reference(over, b, s):
    kw = dict(dim=32, n_heads=2, n_kv_groups=1, d_k=32, d_v=32, kernel="triton")
    attn = make_attn(make_cfg(**{**kw, **over}), seed=1)
    x, upstream = _inputs(b, s, attn.cfg.dim, seed=s)
    _compare(attn, x, upstream, FP32)


def test_reference_rope_keeps_float64_precision():
    """apply_rope (the "reference" RoPE every path uses) on float64: the float64 formula, not an fp32 round trip."""
    x = torch.randn(2, 3, 50, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(50) * 7 + 3
    assert _rel(apply_rope(x, positions, 10000.0), _rope(x, positions, 10000.0)) < 1e-13
