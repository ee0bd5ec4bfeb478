"""A decode cache refuses what it cannot hold as it is (nsa/attention/cache.py _Buffer.append): keys or values of
another dtype, device, batch, group count or width are a clear error before anything in the cache changes, where
they were cast silently (a float32 prefill followed by float64 decode steps attended over float32 keys and gave the
float64 forward's outputs only to 1e-7) or failed inside a tensor copy.

Tiny NSA layer: compression blocks of l=4 every d=2 tokens, selection blocks of l_sel=4 (n_sel=4), a window of 6;
its forward is the per-token path (prefill="sequential"), the same function as the batched one.
"""

from __future__ import annotations

import math

import pytest
import torch

from nsa import NSAConfig
from nsa.attention import DenseAttention, NSAAttention
from nsa.attention.cache import _Buffer

CFG = NSAConfig(dim=16, n_heads=4, n_kv_groups=2, d_k=4, d_v=6, l=4, d=2, l_sel=4, n_sel=4, w=6,
                prefill="sequential")  # the per-token forward: the batched one's first call alone takes a second


def _layer(kind=NSAAttention, seed: int = 0):
    torch.manual_seed(seed)
    layer = kind(CFG)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in layer.parameters():
            fan_in = math.prod(p.shape[1:]) if p.dim() > 1 else 10
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
    return layer


def _x(s: int, seed: int = 2, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(2, s, CFG.dim, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention], ids=["nsa", "dense"])
def test_a_decode_step_in_another_dtype_than_the_prefill_is_refused_and_the_cache_kept(kind):
    """Prefill 9 tokens in float32, then the layer in float64: the step is refused naming both dtypes, the cache
    holds the 9 tokens as before, and the layer back in float32 decodes position 9 as the float64 forward does
    (to float32 precision)."""
    layer = _layer(kind)
    x = _x(11)
    cache = layer.new_cache(2)
    with torch.no_grad():
        layer.prefill(x[:, :9], cache)
        held = {name: buf.last().clone() for name, buf in vars(cache).items() if isinstance(buf, _Buffer)}
        layer.double()
        with pytest.raises(ValueError, match=r"torch\.float32.*torch\.float64"):
            layer.decode_step(x[:, 9:10].double(), cache)
        assert cache.length == 9
        for name, before in held.items():
            assert torch.equal(getattr(cache, name).last(), before), name
        reference = layer(x[:, :10].double())[:, 9]  # the float64 forward at position 9
        layer.float()
        step = layer.decode_step(x[:, 9:10], cache)
    torch.testing.assert_close(step[:, 0].double(), reference, atol=1e-5, rtol=1e-5)
    assert cache.length == 10


def test_a_cache_of_another_layer_shape_is_refused_before_it_changes():
    """A cache prefilled by a layer of 1 KV group (keys [2, 1, len, 4]) given to a layer of 2: a ValueError naming
    the shapes, the cache's length and selected keys unchanged."""
    other = NSAAttention(NSAConfig(**{**vars(CFG), "n_kv_groups": 1}))
    cache = other.new_cache(2)
    with torch.no_grad():
        other.prefill(_x(5), cache)
        before = cache.k_sel.last().clone()
        with pytest.raises(ValueError, match=r"holds \[2, 1, len, 4\].*got \(2, 2, 1, 4\)"):
            _layer().decode_step(_x(1), cache)
    assert cache.length == 5 and torch.equal(cache.k_sel.last(), before)


@pytest.mark.parametrize("bad", [
    pytest.param(dict(dtype=torch.float64), id="dtype"),
    pytest.param(dict(shape=(2, 3, 1, 5)), id="groups"),
    pytest.param(dict(shape=(2, 2, 1, 4)), id="width"),
    pytest.param(dict(shape=(1, 2, 1, 5)), id="batch"),
])
def test_buffer_refuses_an_entry_unlike_what_it_holds(bad):
    buf = _Buffer(keep=3)
    first = torch.arange(2 * 2 * 4 * 5, dtype=torch.float32).view(2, 2, 4, 5)
    buf.append(first)
    x = torch.zeros(bad.get("shape", (2, 2, 1, 5)), dtype=bad.get("dtype", torch.float32))
    with pytest.raises(ValueError, match="decode cache: it holds"):
        buf.append(x)
    assert buf.len == 4 and torch.equal(buf.last(), first)
    buf.append(torch.ones(2, 2, 1, 5))  # an entry like the others still goes in
    assert torch.equal(buf.last(2), torch.cat([first[:, :, -1:], torch.ones(2, 2, 1, 5)], dim=2))
