"""The language model's loss, RoPE and sampling at their edges, against references written here: F.cross_entropy of
float64 logits (one token, a custom ignore_index, a vocabulary the chunk does not divide, logits in the thousands),
RoPE as the complex product (x_j + i x_{j+D/2}) * e^{i p theta^(-2j/D)} at decode offsets, and sampling at a
temperature too small for the logits' dtype, which must give the argmax of the full forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nsa.attention.rope import apply_rope, rope
from nsa.loss import linear_cross_entropy
from nsa.model import ModelConfig, NSAModel


def _float64_reference(hidden, weight, targets, ignore_index):
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    loss = F.cross_entropy(h @ w.T, targets.long(), ignore_index=ignore_index)
    return (loss.detach(), *torch.autograd.grad(loss, (h, w)))


@pytest.mark.parametrize("n,v,chunk,ignore_index,scale", [
    (1, 7, 3, -100, 1.0),  # one token, a chunk larger than the batch
    (13, 10, 4, 3, 1.0),  # a class id as ignore_index; chunks of 4, 4, 4, 1
    (13, 10, 5, -1, 1.0),  # another negative ignore_index
    (9, 11, 4, -100, 1e3),  # logits around 1e6: no overflow in the log-sum-exp
])
def test_chunked_loss_edges_equal_float64_cross_entropy(n, v, chunk, ignore_index, scale):
    gen = torch.Generator().manual_seed(n + v)
    hidden = (torch.randn(n, 6, generator=gen, dtype=torch.float64) * scale).requires_grad_()
    weight = (torch.randn(v, 6, generator=gen, dtype=torch.float64) * scale).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen)
    if n > 3:
        targets[2] = ignore_index
    want, gh, gw = _float64_reference(hidden, weight, targets, ignore_index)
    loss = linear_cross_entropy(hidden, weight, targets.int(), chunk=chunk, ignore_index=ignore_index)
    got_h, got_w = torch.autograd.grad(loss, (hidden, weight))
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss.detach(), want, rtol=1e-12, atol=0)
    torch.testing.assert_close(got_h, gh, rtol=1e-9, atol=1e-12 * scale)
    torch.testing.assert_close(got_w, gw, rtol=1e-9, atol=1e-12 * scale)


def _complex_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """The rotation as a complex product, in float64: z_j = x_j + i x_{j+D/2} times e^{i p theta^(-2j/D)}."""
    d = x.shape[-1]
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
    angle = positions.double()[:, None] * theta ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
    r = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((r.real, r.imag), dim=-1)


@pytest.mark.parametrize("theta", [10000.0, 500000.0, 7.5])
@pytest.mark.parametrize("start,step", [(0, 1), (123, 1), (7, 4)])
def test_rope_is_the_complex_rotation_at_offset_positions(theta, start, step):
    x = torch.randn(2, 3, 9, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(9) * step + start
    want = _complex_rope(x, positions, theta)
    for got in (apply_rope(x, positions, theta), rope(x, theta, "reference", start=start, step=step),
                rope(x, theta, "fused", start=start, step=step)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # a decode step at position p rotates as row p of the whole sequence does
    whole = rope(x, theta, "fused", start=start, step=step)
    assert torch.equal(rope(x[..., 5:6, :], theta, "fused", start=start + 5 * step, step=step), whole[..., 5:6, :])


TINY = dict(vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_groups=1, d_k=8, d_v=8, l=8, d=4, l_sel=8, n_sel=3,
            w=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1e-46, 1e-50, 1e-300])
def test_sampling_below_the_dtypes_smallest_temperature_is_the_argmax(dtype, temperature):
    """softmax(logits / T) -> the argmax as T -> 0 (generate's contract for any finite T > 0). A T that fp32 (the
    sampling dtype of an fp32 or bf16 model) rounds to 0 must still give the argmax, not 0 / 0 = NaN probabilities
    that torch.multinomial refuses."""
    torch.manual_seed(0)
    model = NSAModel(ModelConfig.from_flat({**TINY, "attention": "dense"})).to(dtype)
    with torch.no_grad():
        model.head.weight.normal_(0.0, 1.0)  # well-separated logits: no ties, even in bf16
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, 3, temperature=temperature, generator=torch.Generator().manual_seed(0))
    want = ids
    with torch.no_grad():
        for _ in range(3):  # the argmax of the full forward over the sequence so far
            want = torch.cat([want, model(want)[:, -1].float().argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, want)
