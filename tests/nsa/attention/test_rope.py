"""RoPE (nsa/attention/rope.py): the fused implementation (`rope(..., impl="fused")`; on CPU its torch-op form)
against a float64 reference of the formula `apply_rope` implements, forward and gradient; the toggle's choices.

The float64 reference is written here from the definition (pairs (x_j, x_{j+D/2}) rotated by the angle
p / theta^(2j/D)), not by calling the code under test.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nsa.attention import DenseAttention, NSAAttention
from nsa.attention import rope as rope_mod
from nsa.attention.kernels import rotary
from nsa.attention.rope import apply_rope, resolve_rope, rope
from nsa.config import NSAConfig


def reference64(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [..., S, D] rotated in float64: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) at angle p * theta^(-2j/D)."""
    d = x.shape[-1]
    half = d // 2
    inv = torch.tensor([theta ** (-2.0 * j / d) for j in range(half)], dtype=torch.float64)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@pytest.mark.parametrize("start,step", [(0, 1), (15, 8)])
def test_fused_matches_float64_reference_forward_and_gradient(start, step):
    torch.manual_seed(0)
    b, h, s, d, theta = 2, 3, 37, 16, 10000.0
    x = torch.randn(b, h, s, d, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(s) * step + start
    want = reference64(x, pos, theta)
    got = rope(x, theta, "fused", start=start, step=step)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(want)
    (gx_want,) = torch.autograd.grad(want, x, grad)
    (gx_got,) = torch.autograd.grad(got, x, grad)
    torch.testing.assert_close(gx_got, gx_want, rtol=1e-12, atol=1e-12)
    # the reference implementation at the same positions (fp32 inside for an fp32 x) agrees to fp32 precision
    torch.testing.assert_close(rope(x, theta, "reference", start=start, step=step), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rope(x, pos, theta), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_in_low_precision_is_as_close_to_float64_as_the_reference(dtype):
    """The fused path computes in x's dtype: its error against float64 stays within a few times the reference's
    (which rounds once, from fp32) and its gradient likewise; it returns x's dtype."""
    torch.manual_seed(1)
    s, d, theta = 300, 32, 10000.0
    x64 = torch.randn(2, 2, s, d, dtype=torch.float64)
    x = x64.to(dtype).requires_grad_()
    pos = torch.arange(s)
    want = reference64(x.detach(), pos, theta)
    got, ref = rotary(x, theta, "fused"), rope(x, theta, "reference")  # the Triton kernel on CUDA
    assert got.dtype == dtype and ref.dtype == dtype
    eps = torch.finfo(dtype).eps
    err_ref = (ref.double() - want).abs().max().item()
    err_got = (got.double() - want).abs().max().item()
    assert err_got <= max(4 * err_ref, 8 * eps), (err_got, err_ref)
    grad = torch.randn_like(want)
    (g_got,) = torch.autograd.grad(got, x, grad.to(dtype))
    (g_ref,) = torch.autograd.grad(ref, x, grad.to(dtype))
    # the gradient is the rotation by -angle: float64 of it at the same (rounded) output gradient
    g_want = reference64(grad.to(dtype).double(), -pos, theta)
    assert (g_got.double() - g_want).abs().max().item() <= max(4 * (g_ref.double() - g_want).abs().max().item(),
                                                                8 * eps)


def test_cos_sin_are_cached_per_shape_and_dtype_and_not_under_inference_mode():
    rope_mod._COS_SIN.clear()
    x = torch.randn(1, 1, 8, 16)
    rope(x, 500.0, "fused")
    rope(x, 500.0, "fused")
    assert len(rope_mod._COS_SIN) == 1
    rope(x.bfloat16(), 500.0, "fused")
    assert len(rope_mod._COS_SIN) == 2
    with torch.inference_mode():
        rope(torch.randn(1, 1, 9, 16), 500.0, "fused")
    assert len(rope_mod._COS_SIN) == 2
    xg = torch.randn(1, 1, 8, 16, requires_grad=True)
    rope(xg, 500.0, "fused").sum().backward()  # a cached pair is usable by autograd
    assert xg.grad is not None and math.isfinite(float(xg.grad.sum()))


def test_a_long_decode_leaves_the_forwards_table_cached():
    # a decode step's table starts at its own position, met once: kept, 64 of them filled the cache, after which a
    # forward's table (the same every step) was computed again at every call
    rope_mod._COS_SIN.clear()
    for t in range(1, 200):
        rope(torch.randn(1, 1, 1, 16), 500.0, "fused", start=t)
    assert len(rope_mod._COS_SIN) == 0
    x = torch.randn(1, 1, 8, 16)
    rope(x, 500.0, "fused")
    assert len(rope_mod._COS_SIN) == 1
    (cached,) = rope_mod._COS_SIN.values()
    rope(x, 500.0, "fused")
    assert next(iter(rope_mod._COS_SIN.values())) is cached
    # and a decode step's rotation still equals the forward's at that position
    seq = torch.randn(1, 1, 12, 16, dtype=torch.float64)
    full = rope(seq, 500.0, "fused")
    assert torch.allclose(rope(seq[:, :, 7:8], 500.0, "fused", start=7), full[:, :, 7:8], atol=1e-12)


def test_resolve_rope():
    assert resolve_rope("auto") == "reference"  # until a GPU A/B shows the fused one faster
    assert resolve_rope("fused") == "fused" and resolve_rope("reference") == "reference"
    with pytest.raises(ValueError, match="rope must be one of"):
        resolve_rope("triton")


def test_dense_twin_with_fused_rope_matches_the_reference_rope():
    """DenseAttention with cfg.rope "fused" in float64 (angles in float64) against "reference" (angles in fp32):
    outputs and gradients agree to fp32 precision."""
    cfg = NSAConfig(dim=32, n_heads=4, n_kv_groups=2, d_k=16, d_v=8, l=8, d=4, l_sel=8, n_sel=3, w=8)
    torch.manual_seed(0)
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    out = {}
    for impl in ("reference", "fused"):
        torch.manual_seed(1)
        layer = DenseAttention(dataclasses.replace(cfg, rope=impl)).double()
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.pow(2).sum().backward()
        out[impl] = (y.detach(), xi.grad, layer.q_proj.weight.grad)
    for a, b in zip(out["fused"], out["reference"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_nsa_layer_with_fused_rope_matches_the_reference_rope():
    """NSAAttention's PyTorch path with cfg.rope "fused" (queries, selection and window keys at their positions,
    compressed keys at each block's last position: start l - 1, step d) against "reference", float64: the outputs,
    the input's gradient and a compressor's gradient agree, in training and in a decode continuing a prefill."""
    cfg = NSAConfig(dim=32, n_heads=4, n_kv_groups=2, d_k=16, d_v=8, l=8, d=4, l_sel=8, n_sel=3, w=8)
    torch.manual_seed(0)
    x = torch.randn(2, 37, 32, dtype=torch.float64)
    out = {}
    for impl in ("reference", "fused"):
        torch.manual_seed(1)
        layer = NSAAttention(dataclasses.replace(cfg, rope=impl)).double()
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.pow(2).sum().backward()
        grads = [p.grad for p in layer.parameters() if p.grad is not None]
        cache = layer.new_cache(2)  # token by token: positions t, compressed blocks first_block > 0
        decoded = torch.cat([layer.decode_step(x[:, t:t + 1], cache) for t in range(x.shape[1])], dim=1)
        out[impl] = (y.detach(), decoded, xi.grad, *grads)
    for a, b in zip(out["fused"], out["reference"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rope_on_cuda_matches_float64_reference(dtype):
    """On CUDA "fused" is the Triton path's rope kernel (a [B, S, H, D] projection viewed as [B, H, S, D], as the
    dense twin gives it): forward and gradient within the reference's own error against float64."""
    torch.manual_seed(0)
    b, s, h, d, theta = 2, 300, 4, 64, 10000.0
    x = torch.randn(b, s, h, d, device="cuda").to(dtype).transpose(1, 2).requires_grad_()
    pos = torch.arange(s)
    want = reference64(x.detach().cpu(), pos, theta)
    got, ref = rotary(x, theta, "fused"), rope(x, theta, "reference")  # the Triton kernel on CUDA
    assert got.dtype == dtype
    eps = torch.finfo(dtype).eps
    err = lambda t, w: (t.detach().double().cpu() - w).abs().max().item()  # noqa: E731
    assert err(got, want) <= max(2 * err(ref, want), 8 * eps)
    grad = torch.randn(want.shape, dtype=torch.float64).to(dtype)
    (g_got,) = torch.autograd.grad(got, x, grad.cuda())
    (g_ref,) = torch.autograd.grad(ref, x, grad.cuda())
    g_want = reference64(grad.double(), -pos, theta)
    assert err(g_got, g_want) <= max(2 * err(g_ref, g_want), 8 * eps)
