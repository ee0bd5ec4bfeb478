"""Small helpers shared by the NSA tests (config factory, module builders)."""

from __future__ import annotations

import dataclasses
import math

import torch

from nsa import NSAAttention, NSAConfig

# Tiny sizes: every branch and top-k selection is exercised with S of a few dozen.
# n_sel must exceed 3 for importance to matter: blocks 0, t//l_sel and t//l_sel - 1
# are forced, so with n_sel = 3 the choice would never depend on importance.
BASE = dict(dim=32, n_heads=4, n_kv_groups=2, d_k=8, d_v=8, l=8, d=4, l_sel=8, n_sel=4, w=16)

FP32 = dict(atol=1e-5, rtol=1e-4)


def make_cfg(**overrides) -> NSAConfig:
    kw = dict(BASE)
    kw.update(overrides)
    return NSAConfig(**kw)


@torch.no_grad()
def randomize_params(module: torch.nn.Module, seed: int = 0) -> None:
    """Overwrite every parameter with well-scaled random values.

    This makes the tests independent of the implementation's initialisation
    (e.g. a zero-initialised gate or output layer would make many comparisons
    vacuous).  Matrices get N(0, 1/fan_in); vectors get N(0, 0.1^2) (+1 for
    vectors that were initialised to all ones, i.e. norm weights).
    """
    gen = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        if p.dim() >= 2:
            fan_in = math.prod(p.shape[1:])
            val = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)
        else:
            val = torch.randn(p.shape, generator=gen) * 0.1
            if p.numel() > 0 and bool(torch.all(p == 1)):
                val = val + 1.0
        p.copy_(val.to(dtype=p.dtype, device=p.device))


def make_attn(cfg: NSAConfig, seed: int = 0) -> NSAAttention:
    torch.manual_seed(seed)
    attn = NSAAttention(cfg)
    randomize_params(attn, seed=seed + 1000)
    return attn


def variant(attn: NSAAttention, **changes) -> NSAAttention:
    """A module built from a replaced config carrying the same weights."""
    cfg2 = dataclasses.replace(attn.cfg, **changes)
    other = NSAAttention(cfg2)
    other.load_state_dict(attn.state_dict())
    p = next(attn.parameters())
    return other.to(device=p.device, dtype=p.dtype)


def rand_x(b, s, dim, seed=0, scale=1.0, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, s, dim, generator=gen) * scale).to(dtype=dtype, device=device)


def assert_close(actual, expected, what="", **tol):
    tol = {**FP32, **tol}
    expected = expected.to(dtype=actual.dtype, device=actual.device)
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tol)


def assert_nontrivial(t, what="", min_std=1e-2):
    """Guard against vacuous comparisons of (near) all-zero tensors."""
    std = t.double().std().item()
    assert std > min_std, f"{what}: tensor is (near) constant/zero, std={std:.3g}; comparison would be vacuous"
