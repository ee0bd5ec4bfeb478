"""The PyTorch path's SDPA calls with a mask and GQA (the window branch's chunks): on CUDA k/v are repeated to the
query heads so that a fused kernel takes the call (flash takes GQA but no mask, memory-efficient a mask but no GQA:
the math kernel would run, and the SDPA audit of h100_single counts it a fallback). The repeated operands give
the same attention as enable_gqa, and an explicit float64 reference. On a GPU, tests/nsa/attention/test_cuda.py
checks the backend the window branch runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nsa.attention.kernels.range_attn import naive


def _inputs(b=2, h=6, g=2, s=24, t=40, d=8, device="cpu", dtype=torch.float32):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(b, h, s, d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(b, g, t, d, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(b, 1, s, t, generator=gen) > 0.4
    mask[..., 0] = True  # every query sees a key
    return [x.to(device, dtype) if x.is_floating_point() else x.to(device) for x in (q, k, v, mask)]


def _reference(q, k, v, mask):
    """Attention per query head h over kv head h // hpg, with the mask, in float64."""
    hpg = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for h in range(q.shape[1]):
        scores = q[:, h].double() @ k[:, h // hpg].double().transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~mask[:, 0], float("-inf"))
        out[:, h] = scores.softmax(-1) @ v[:, h // hpg].double()
    return out


def test_on_cuda_a_masked_gqa_call_gets_its_kv_heads_repeated_and_the_same_attention():
    q, k, v, mask = _inputs()
    k2, v2 = naive.gqa_operands(q, k, v, mask, device_type="cuda")
    assert k2.shape[1] == v2.shape[1] == q.shape[1]
    got = F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask)
    torch.testing.assert_close(got.double(), _reference(q, k, v, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))


@pytest.mark.parametrize("device_type, masked, heads", [("cpu", True, 2), ("cuda", False, 2), ("cuda", True, 6)])
def test_the_operands_are_left_as_they_are_where_a_fused_kernel_takes_the_call(device_type, masked, heads):
    q, k, v, mask = _inputs(g=heads)
    k2, v2 = naive.gqa_operands(q, k, v, mask if masked else None, device_type=device_type)
    assert k2 is k and v2 is v
