"""Gradient flow, degenerate lengths and bf16."""


import pytest
import torch

from nsa import NSAAttention
from nsa_test_utils import make_attn, make_cfg, rand_x, variant


@pytest.mark.parametrize("phi", ["mlp", "avg"])
@pytest.mark.parametrize("gate", ["sigmoid", "softmax"])
def test_every_parameter_gets_a_finite_nonzero_gradient(phi, gate):
    torch.manual_seed(0)
    # S > l (compressed blocks), S > w (window), S > n_sel * l_sel (selection)
    cfg = make_cfg(phi=phi, gate=gate)
    attn = make_attn(cfg, seed=1)
    x = rand_x(2, 40, cfg.dim, seed=2).requires_grad_(True)
    r = rand_x(2, 40, cfg.dim, seed=3)
    y = attn(x)
    (y * r).sum().backward()
    params = list(attn.named_parameters())
    assert params, "module has no parameters"
    bad = []
    for name, p in params:
        if p.grad is None:
            bad.append(f"{name}: no gradient")
        elif not torch.isfinite(p.grad).all():
            bad.append(f"{name}: non-finite gradient")
        elif torch.all(p.grad == 0):
            bad.append(f"{name}: all-zero gradient")
    assert not bad, "parameters not trained by the loss:\n" + "\n".join(bad)
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() > 0
    # the o_proj is part of it
    assert attn.o_proj.weight.grad is not None and attn.o_proj.weight.grad.abs().max() > 0


def test_mlp_compression_has_parameters_avg_does_not_need():
    """phi='mlp' carries learnable compression MLPs that phi='avg' lacks."""
    n_mlp = sum(p.numel() for p in NSAAttention(make_cfg(phi="mlp")).parameters())
    n_avg = sum(p.numel() for p in NSAAttention(make_cfg(phi="avg")).parameters())
    assert n_mlp > n_avg


def test_all_branches_contribute_and_are_differentiable():
    """Every branch has a non-zero gate somewhere and a differentiable output."""
    torch.manual_seed(0)
    cfg = make_cfg()
    attn = make_attn(cfg, seed=1)
    x = rand_x(1, 40, cfg.dim, seed=2)
    p = attn.project(x)
    # the gates of every branch are strictly inside (0, 1) somewhere, i.e. every branch contributes
    for c in range(3):
        assert (p.gates[..., c] > 1e-4).any()
    br = attn.branch_outputs(x)
    for name in ("cmp", "sel", "win"):
        assert br[name].requires_grad, f"branch {name} output is detached"


@pytest.mark.parametrize("prefill", ["batched", "sequential"])
@pytest.mark.parametrize("s", [1, 3, 7, 8])  # S=1, S<l, S=l-1, S=l (l=8)
def test_no_nan_for_short_sequences(prefill, s):
    torch.manual_seed(0)
    cfg = make_cfg(prefill=prefill)
    assert cfg.l == 8
    attn = make_attn(cfg, seed=1)
    x = rand_x(2, s, cfg.dim, seed=2).requires_grad_(True)
    y = attn(x)
    assert y.shape == (2, s, cfg.dim)
    assert torch.isfinite(y).all(), f"non-finite output at S={s}"
    br = attn.branch_outputs(x)
    for name in ("cmp", "sel", "win"):
        assert torch.isfinite(br[name]).all(), f"branch {name} non-finite at S={s}"
    if s < cfg.l:
        assert torch.all(br["cmp"] == 0)
    y.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all(), f"non-finite input gradient at S={s}"
    for name, p in attn.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), f"non-finite gradient of {name} at S={s}"


def test_no_nan_in_first_decode_steps():
    torch.manual_seed(0)
    cfg = make_cfg()
    attn = make_attn(cfg, seed=1)
    x = rand_x(2, 9, cfg.dim, seed=2)
    with torch.no_grad():
        cache = attn.new_cache(2)
        for k in range(9):
            assert torch.isfinite(attn.decode_step(x[:, k : k + 1], cache)).all(), k


def test_default_init_forward_is_finite():
    torch.manual_seed(0)
    attn = NSAAttention(make_cfg())
    y = attn(rand_x(2, 40, 32, seed=1))
    assert torch.isfinite(y).all()


def _bf16_check(cfg, s, check_close):
    torch.manual_seed(0)
    attn32 = make_attn(cfg, seed=1)
    attn16 = variant(attn32).to(torch.bfloat16)
    x = rand_x(2, s, cfg.dim, seed=2)
    y32 = attn32(x).detach()
    x16 = x.to(torch.bfloat16).requires_grad_(True)
    y16 = attn16(x16)
    assert y16.dtype == torch.bfloat16 and y16.shape == x.shape
    assert torch.isfinite(y16.float()).all()
    y16.float().pow(2).mean().backward()
    assert x16.grad is not None and x16.grad.dtype == torch.bfloat16 and torch.isfinite(x16.grad.float()).all()
    for name, p in attn16.named_parameters():
        assert p.dtype == torch.bfloat16, name
        assert p.grad is not None and torch.isfinite(p.grad.float()).all(), f"bf16 grad of {name}"
    if check_close:
        scale = y32.abs().max().item()
        err = (y16.float() - y32).abs().max().item()
        assert err < 0.05 * scale, f"bf16 vs fp32 max abs diff {err:.4g} (output scale {scale:.4g})"


@pytest.mark.parametrize("prefill", ["batched", "sequential"])
def test_bf16_forward_backward_close_to_fp32(prefill):
    # selection covers the whole sequence (n_sel*l_sel >= S) so rounding cannot flip a
    # top-k choice; all three branches, compression and window banding are active
    cfg = make_cfg(prefill=prefill, l=8, d=4, l_sel=16, n_sel=3, w=16)
    _bf16_check(cfg, 40, check_close=True)


def test_bf16_with_active_selection_runs():
    cfg = make_cfg(l=8, d=4, l_sel=8, n_sel=4, w=16)
    _bf16_check(cfg, 50, check_close=False)
