"""Every branch of NSAAttention against the test-side dense reference.

The reference (tests/nsa/reference.py) is plain masked softmax attention over
the projected tensors exposed by ``attn.project(x)``; the implementation's
``branch_outputs`` and forward are compared against it for both prefill
paths, both compression functions and both gate types.
"""

import itertools

import pytest
import torch

import reference as R
from nsa_test_utils import assert_close, assert_nontrivial, make_attn, make_cfg, rand_x

COMBOS = [
    pytest.param(pf, phi, gate, id=f"{pf}-{phi}-{gate}")
    for pf, phi, gate in itertools.product(["batched", "sequential"], ["mlp", "avg"], ["sigmoid", "softmax"])
]

# covering: w >= S and n_sel * l_sel >= S (window and selection are plain causal)
# general:  S > w and S > n_sel * l_sel (banded window, top-k selection active),
#           S not a multiple of l, d or l_sel; d_k != d_v, H * d_v != dim and 3 heads
#           per group so that scale / head-to-group / shape mix-ups show
# short:    S < l, no compressed block exists
SCENARIOS = {
    "covering": (dict(l=8, d=4, l_sel=16, n_sel=3, w=32), 2, 27),
    "general": (dict(l=8, d=4, l_sel=8, n_sel=4, w=16, n_heads=6, n_kv_groups=2, d_k=12, d_v=6), 2, 50),
    "short": (dict(l=8, d=4, l_sel=8, n_sel=4, w=16), 2, 6),
}

_CACHE = {}


def run_case(scenario, prefill, phi, gate):
    key = (scenario, prefill, phi, gate)
    if key not in _CACHE:
        torch.manual_seed(0)
        over, b, s = SCENARIOS[scenario]
        cfg = make_cfg(prefill=prefill, phi=phi, gate=gate, **over)
        attn = make_attn(cfg, seed=1)
        x = rand_x(b, s, cfg.dim, seed=2)
        with torch.no_grad():
            p = attn.project(x)
            br = attn.branch_outputs(x)
            y = attn(x)
            blocks = attn.selected_blocks(x)
        _CACHE[key] = (cfg, attn, x, p, br, y, blocks)
    return _CACHE[key]


@pytest.mark.parametrize("gate", ["sigmoid", "softmax"])
@pytest.mark.parametrize("scenario", ["general", "short"])
def test_projection_shapes_and_gates(scenario, gate):
    cfg, attn, x, p, br, y, blocks = run_case(scenario, "batched", "mlp", gate)
    b, s = x.shape[:2]
    H, G = cfg.n_heads, cfg.n_kv_groups
    n_cmp = R.num_cmp_blocks(s, cfg.l, cfg.d)
    assert p.q.shape == (b, H, s, cfg.d_k)
    assert p.k_cmp.shape == (b, G, n_cmp, cfg.d_k)
    assert p.v_cmp.shape == (b, G, n_cmp, cfg.d_v)
    assert p.k_sel.shape == (b, G, s, cfg.d_k) and p.v_sel.shape == (b, G, s, cfg.d_v)
    assert p.k_win.shape == (b, G, s, cfg.d_k) and p.v_win.shape == (b, G, s, cfg.d_v)
    assert p.gates.shape == (b, s, H, 3)
    assert y.shape == x.shape and y.dtype == x.dtype
    for name in ("cmp", "sel", "win"):
        assert br[name].shape == (b, H, s, cfg.d_v), name
    assert blocks.shape == (b, G, s, cfg.n_sel) and blocks.dtype == torch.long
    assert torch.all(p.gates >= 0) and torch.all(p.gates <= 1)
    if gate == "softmax":
        assert_close(p.gates.sum(-1), torch.ones(b, s, H), "softmax gates sum to 1")
    assert isinstance(attn.o_proj, torch.nn.Linear)
    assert attn.o_proj.in_features == H * cfg.d_v and attn.o_proj.out_features == cfg.dim


@pytest.mark.parametrize("prefill,phi,gate", COMBOS)
def test_covering_window_and_selected_equal_dense_causal(prefill, phi, gate):
    cfg, attn, x, p, br, y, blocks = run_case("covering", prefill, phi, gate)
    s = x.shape[1]
    assert cfg.w >= s and cfg.n_sel * cfg.l_sel >= s
    ref_win = R.ref_causal(p.q, p.k_win, p.v_win)
    ref_sel = R.ref_causal(p.q, p.k_sel, p.v_sel)
    assert_nontrivial(ref_win, "window reference")
    assert_close(br["win"], ref_win, "window branch vs dense causal attention")
    assert_close(br["sel"], ref_sel, "selected branch vs dense causal attention")


@pytest.mark.parametrize("scenario", ["covering", "general", "short"])
@pytest.mark.parametrize("prefill,phi,gate", COMBOS)
def test_compressed_equals_dense_block_visibility(scenario, prefill, phi, gate):
    cfg, attn, x, p, br, y, blocks = run_case(scenario, prefill, phi, gate)
    ref = R.ref_compressed(p.q, p.k_cmp, p.v_cmp, cfg.l, cfg.d)
    assert_close(br["cmp"], ref, "compressed branch vs dense attention with block visibility mask")
    # queries before the first block completes see nothing: exactly zero, never NaN
    first_visible = cfg.l - 1
    assert torch.all(br["cmp"][:, :, :first_visible] == 0), "compressed output must be exactly 0 with no visible block"
    assert torch.isfinite(br["cmp"]).all()
    if scenario != "short":
        assert_nontrivial(ref[:, :, first_visible:], "compressed reference")


@pytest.mark.parametrize("prefill,phi,gate", COMBOS)
def test_window_banded_when_w_less_than_s(prefill, phi, gate):
    cfg, attn, x, p, br, y, blocks = run_case("general", prefill, phi, gate)
    assert cfg.w < x.shape[1]
    ref = R.ref_window(p.q, p.k_win, p.v_win, cfg.w)
    assert_nontrivial(ref, "window reference")
    assert_close(br["win"], ref, "window branch vs dense banded attention")
    # and it really is different from full causal attention (the band matters)
    causal = R.ref_causal(p.q, p.k_win, p.v_win)
    assert (causal[:, :, cfg.w + 1 :] - ref[:, :, cfg.w + 1 :]).abs().max() > 1e-3


@pytest.mark.parametrize("prefill,phi,gate", COMBOS)
def test_selected_general_equals_dense_with_selected_blocks_mask(prefill, phi, gate):
    cfg, attn, x, p, br, y, blocks = run_case("general", prefill, phi, gate)
    s = x.shape[1]
    assert cfg.n_sel * cfg.l_sel < s
    ref = R.ref_selected(p.q, p.k_sel, p.v_sel, blocks, cfg.l_sel)
    assert_nontrivial(ref, "selected reference")
    assert_close(br["sel"], ref, "selected branch vs dense attention masked by selected_blocks")
    # the selection is really sparse here: some rows differ from full causal attention
    causal = R.ref_causal(p.q, p.k_sel, p.v_sel)
    assert (causal - ref).abs().max() > 1e-3


@pytest.mark.parametrize("scenario", ["covering", "general", "short"])
@pytest.mark.parametrize("prefill,phi,gate", COMBOS)
def test_full_output_equals_o_proj_of_gated_references(scenario, prefill, phi, gate):
    cfg, attn, x, p, br, y, blocks = run_case(scenario, prefill, phi, gate)
    ref_cmp = R.ref_compressed(p.q, p.k_cmp, p.v_cmp, cfg.l, cfg.d)
    ref_win = R.ref_window(p.q, p.k_win, p.v_win, cfg.w)
    ref_sel = R.ref_selected(p.q, p.k_sel, p.v_sel, blocks, cfg.l_sel)
    o = R.combine_gated(p.gates.double(), ref_cmp.double(), ref_sel.double(), ref_win.double())
    w = attn.o_proj.weight.double()
    bias = attn.o_proj.bias.double() if attn.o_proj.bias is not None else 0.0
    y_ref = o @ w.T + bias
    assert_nontrivial(y_ref, "reference output")
    assert_close(y, y_ref, "forward output vs o_proj(gated dense references)")


@pytest.mark.parametrize("phi", ["mlp", "avg"])
def test_compressed_block_covers_exactly_its_tokens(phi):
    """k_cmp/v_cmp block i depends on tokens [i*d, i*d + l) and on nothing else."""
    torch.manual_seed(3)
    cfg = make_cfg(phi=phi, l=8, d=4)
    attn = make_attn(cfg, seed=4)
    s = 30
    x = rand_x(1, s, cfg.dim, seed=5)
    n_cmp = R.num_cmp_blocks(s, cfg.l, cfg.d)
    with torch.no_grad():
        base = attn.project(x)
        for i in [0, 1, 3, n_cmp - 1]:
            lo, hi = i * cfg.d, i * cfg.d + cfg.l
            outside = x.clone()
            outside[:, :lo] += 3 * torch.randn_like(outside[:, :lo])
            outside[:, hi:] += 3 * torch.randn_like(outside[:, hi:])
            po = attn.project(outside)
            assert_close(po.k_cmp[:, :, i], base.k_cmp[:, :, i], f"k_cmp[{i}] changed by tokens outside [{lo},{hi})", atol=1e-6, rtol=1e-5)
            assert_close(po.v_cmp[:, :, i], base.v_cmp[:, :, i], f"v_cmp[{i}] changed by tokens outside [{lo},{hi})", atol=1e-6, rtol=1e-5)
            for pos in (lo, hi - 1):
                inside = x.clone()
                inside[:, pos] += 3 * torch.randn_like(inside[:, pos])
                pi = attn.project(inside)
                assert (pi.k_cmp[:, :, i] - base.k_cmp[:, :, i]).abs().max() > 1e-4, f"k_cmp[{i}] ignores token {pos}"
                assert (pi.v_cmp[:, :, i] - base.v_cmp[:, :, i]).abs().max() > 1e-4, f"v_cmp[{i}] ignores token {pos}"


def test_projections_of_a_prefix_are_the_prefix_of_the_projections():
    torch.manual_seed(6)
    cfg = make_cfg()
    attn = make_attn(cfg, seed=7)
    x = rand_x(2, 37, cfg.dim, seed=8)
    with torch.no_grad():
        full = attn.project(x)
        for s in (1, 7, 8, 20):
            pre = attn.project(x[:, :s])
            n = R.num_cmp_blocks(s, cfg.l, cfg.d)
            assert_close(pre.q, full.q[:, :, :s], f"q prefix S={s}")
            for name in ("k_sel", "v_sel", "k_win", "v_win"):
                assert_close(getattr(pre, name), getattr(full, name)[:, :, :s], f"{name} prefix S={s}")
            assert_close(pre.gates, full.gates[:, :s], f"gates prefix S={s}")
            assert_close(pre.k_cmp, full.k_cmp[:, :, :n], f"k_cmp prefix S={s}")
            assert_close(pre.v_cmp, full.v_cmp[:, :, :n], f"v_cmp prefix S={s}")


def _rope_rotate(u, pos, theta, interleaved):
    """Rotate the last dim of u (float64) by RoPE angle pos * theta^(-2i/dk)."""
    dk = u.shape[-1]
    half = dk // 2
    u = u.expand(*u.shape[:-2], pos.shape[0], dk)  # [..., S, dk]
    inv = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / dk)
    ang = pos[:, None] * inv  # [S, half]
    c, s_ = torch.cos(ang), torch.sin(ang)
    if interleaved:
        a, b = u[..., 0::2], u[..., 1::2]
        out = torch.empty_like(u)
        out[..., 0::2] = a * c - b * s_
        out[..., 1::2] = a * s_ + b * c
    else:
        a, b = u[..., :half], u[..., half:]
        out = torch.cat([a * c - b * s_, a * s_ + b * c], dim=-1)
    return out


@pytest.mark.parametrize("theta", [10000.0, 50.0])
def test_rope_on_q_and_k_sel_rotates_by_position(theta):
    """With the same token at every position, q_t = RoPE(q_0, t) and k_sel likewise.

    Accepts either the interleaved or the half-split pair layout, but the same
    one for q and k_sel, with frequencies rope_theta^(-2i/d_k).
    """
    torch.manual_seed(9)
    cfg = make_cfg(rope_theta=theta)
    attn = make_attn(cfg, seed=10)
    s = 12
    x = rand_x(1, 1, cfg.dim, seed=11).expand(1, s, cfg.dim).contiguous()
    with torch.no_grad():
        p = attn.project(x)
    pos = torch.arange(s, dtype=torch.float64)
    ok = []
    for interleaved in (True, False):
        good = True
        for t_name, t in (("q", p.q), ("k_sel", p.k_sel)):
            t64 = t.double()
            rot = _rope_rotate(t64[:, :, :1, :], pos, theta, interleaved)
            if not torch.allclose(rot, t64, atol=1e-5, rtol=1e-4):
                good = False
        ok.append(good)
    assert any(ok), "q/k_sel are not RoPE-rotated copies of position 0 (neither interleaved nor half-split layout)"
    # RoPE is actually applied: q differs across positions
    assert (p.q[:, :, 1:] - p.q[:, :, :1]).abs().max() > 1e-3
