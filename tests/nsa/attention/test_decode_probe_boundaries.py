"""The decode cache (nsa/attention/cache.py) through NSAModel.prefill / decode_step / generate, against the full
forward of the same model over the whole sequence in float64 (causal: its logits at position t are what a prefill of
a prefix followed by decode steps gives at t), and the cache's buffers against plain concatenation.

Tiny blocks so that every boundary comes within a few tokens: compression blocks of l=4 every d=2 tokens (the first
ends at t=3, then one every 2 tokens), selection blocks of l_sel=4 of which n_sel=4 are kept (importance decides
from t=16 on), a window of w=6 (it starts dropping tokens at t=6); 2 KV groups of 2 query heads each.
"""

from __future__ import annotations

import pytest
import torch

from nsa.attention import layer as nsa_layer
from nsa.attention.cache import _Buffer
from nsa.attention.geometry import decode_reads, num_cmp_blocks
from nsa.model import ModelConfig, NSAModel
from nsa_test_utils import assert_nontrivial, randomize_params

SMALL = dict(vocab_size=48, dim=32, n_layers=1, n_heads=4, n_kv_groups=2, d_k=8, d_v=8,
             l=4, d=2, l_sel=4, n_sel=4, w=6)
TIGHT = dict(atol=1e-10, rtol=1e-10)
CACHE_NAMES = ("k_sel", "v_sel", "k_win", "v_win", "k_raw", "v_raw", "k_cmp", "v_cmp")


def model_of(seed: int = 0, **overrides) -> NSAModel:
    torch.manual_seed(seed)
    model = NSAModel(ModelConfig.from_flat({**SMALL, **overrides}))
    randomize_params(model, seed=seed + 500)
    return model.double()


def ids_of(b: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, SMALL["vocab_size"], (b, s), generator=torch.Generator().manual_seed(seed))


def full_logits(model: NSAModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


GEOMETRIES = [
    pytest.param({}, id="l4-d2-lsel4-w6"),
    # compression blocks that do not overlap (d == l), only the forced selection blocks, a window of 1 token
    pytest.param(dict(l=4, d=4, l_sel=4, n_sel=3, w=1, d_k=4, d_v=6), id="l4-d4-lsel4-w1"),
    # selection blocks longer than compression blocks, one query head per group, softmax gates, avg compression
    pytest.param(dict(l=2, d=1, l_sel=6, n_sel=3, w=5, n_kv_groups=4, phi="avg", gate="softmax"),
                 id="l2-d1-lsel6-G4-avg"),
]


@pytest.mark.parametrize("over", GEOMETRIES)
def test_decode_after_each_prompt_length_equals_the_full_forward(over):
    """A 1-token prompt decoded to 24 tokens (through every compression, selection and window boundary and the
    buffers' first growth), then prompts shorter than a compression block (3), ending at the first one (4), of an odd
    length (5) and past the window (7), each followed by 4 decode steps; every position's logits are the full
    forward's at that position, and every step's reads are decode_reads'."""
    model = model_of(**over)
    cfg = model.cfg.nsa
    s = 24
    ids = ids_of(2, s, seed=1)
    full = full_logits(model, ids)
    assert_nontrivial(full, "logits")
    for prompt, end in ((1, s), (3, 7), (4, 8), (5, 9), (7, 11)):
        logits, caches = model.prefill(ids[:, :prompt])
        torch.testing.assert_close(logits, full[:, prompt - 1], **TIGHT)
        for k in range(prompt, end):
            step = model.decode_step(ids[:, k: k + 1], caches)
            torch.testing.assert_close(step, full[:, k], **TIGHT, msg=lambda m: f"prompt {prompt}, position {k}: {m}")
        (cache,) = caches
        assert (cache.length, cache.n_cmp, cache.k_sel.len) == (end, num_cmp_blocks(end, cfg.l, cfg.d), end)
        assert cache.reads == [decode_reads(k + 1, cfg) for k in range(prompt, end)]


def _contents(cache, cfg) -> dict[str, torch.Tensor]:
    """Everything a later decode step can read: every selected-branch and compressed key/value, the last w window
    and the last l raw ones."""
    keep = {"k_win": cfg.w, "v_win": cfg.w, "k_raw": cfg.l, "v_raw": cfg.l}
    return {name: getattr(cache, name).last(keep.get(name)) for name in CACHE_NAMES
            if getattr(cache, name).data is not None}


@pytest.mark.parametrize("over", GEOMETRIES[:2])
def test_prefill_then_decode_leaves_the_cache_of_a_longer_prefill(over):
    """prefill(ids[:p]) + decode steps to n gives the outputs and the cache contents of prefill(ids[:n]), and both
    caches go on the same way; B = 3, 2 layers."""
    model = model_of(seed=3, n_layers=2, **over)
    cfg = model.cfg.nsa
    ids = ids_of(3, 20, seed=11)
    for p, n in ((1, 4), (2, 9), (4, 5), (7, 19)):
        _, caches = model.prefill(ids[:, :p])
        for k in range(p, n):
            step = model.decode_step(ids[:, k: k + 1], caches)
        logits, longer = model.prefill(ids[:, :n])
        torch.testing.assert_close(step, logits, **TIGHT)
        for layer, (a, b) in enumerate(zip(caches, longer)):
            assert (a.length, a.n_cmp, a.batch_size) == (b.length, b.n_cmp, b.batch_size) == \
                (n, num_cmp_blocks(n, cfg.l, cfg.d), 3)
            ca, cb = _contents(a, cfg), _contents(b, cfg)
            assert ca.keys() == cb.keys(), (p, n, layer)
            for name in ca:
                torch.testing.assert_close(ca[name], cb[name], **TIGHT,
                                           msg=lambda m: f"prefill {p} + decode to {n}, layer {layer} {name}: {m}")
        nxt = ids[:, n: n + 1]
        torch.testing.assert_close(model.decode_step(nxt, caches), model.decode_step(nxt, longer), **TIGHT)


def test_decode_selection_is_shared_within_a_group_as_in_the_forward(monkeypatch):
    """B = 3, 2 KV groups of 2 query heads: each decode step's chosen blocks are, per sequence and group, the ones
    the forward's selection picks at that position (NSAAttention.selected_blocks), past n_sel * l_sel = 16 so that
    importance decides; the outputs are the forward's."""
    model = model_of(seed=5)
    cfg = model.cfg.nsa
    attn = model.blocks[0].attn
    s = 26
    x = torch.randn(3, s, cfg.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    expected = attn.selected_blocks(x)  # [B, G, S, n_sel]
    seen = []
    choose = nsa_layer.choose_blocks

    def recording(*args, **kwargs):
        blocks = choose(*args, **kwargs)
        seen.append(blocks.clone())
        return blocks

    with torch.no_grad():
        full = attn(x)
        cache = attn.new_cache(3)
        first = attn.prefill(x[:, :1], cache)
        monkeypatch.setattr(nsa_layer, "choose_blocks", recording)
        steps = [first[:, 0]] + [attn.decode_step(x[:, k: k + 1], cache)[:, 0] for k in range(1, s)]
    assert len(seen) == s - 1
    for k, blocks in zip(range(1, s), seen):
        assert blocks.shape == (3, cfg.n_kv_groups, cfg.n_sel)
        assert torch.equal(blocks, expected[:, :, k]), f"position {k}: {blocks.tolist()} != {expected[:, :, k].tolist()}"
    # the choice differs between sequences and between groups, so the comparison is not vacuous
    late = expected[:, :, cfg.n_sel * cfg.l_sel:]
    assert not torch.equal(late[0], late[1]) and not torch.equal(late[:, 0], late[:, 1])
    for k in range(s):
        torch.testing.assert_close(steps[k], full[:, k], **TIGHT, msg=lambda m: f"position {k}: {m}")


def test_greedy_generate_is_the_argmax_of_the_full_forward_step_by_step():
    """Temperature 0, 2 layers: each new token is the argmax of the full forward over the sequence so far; 22 new
    tokens after a 3-token prompt cross every boundary."""
    model = model_of(seed=7, n_layers=2)
    prompt = ids_of(2, 3, seed=8)
    out = model.generate(prompt, max_new_tokens=22)
    ref = prompt
    for _ in range(22):
        ref = torch.cat([ref, full_logits(model, ref)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ref)
    assert len(set(out[:, 3:].flatten().tolist())) > 5


@pytest.mark.parametrize("keep", [None, 1, 3, 16, 40])
def test_buffer_holds_what_plain_concatenation_holds(keep):
    """_Buffer against torch.cat of everything appended: after appends of 1 to 37 entries (the first allocation
    outgrown, the kept tail compacted many times), last(n) is the concatenation's last n, for every n <= keep."""
    gen = torch.Generator().manual_seed(keep or 0)
    buf, whole = _Buffer(keep=keep), torch.zeros(2, 3, 0, 5, dtype=torch.float64)
    sizes = [1] * 20 + [3, 1, 17, 1, 37, 2] + [1] * 50
    for i, n in enumerate(sizes):
        if keep is not None:
            n = min(n, keep)  # what the layers append to a bounded buffer: at most its w or l
        x = torch.randn(2, 3, n, 5, generator=gen, dtype=torch.float64)
        buf.append(x)
        whole = torch.cat([whole, x], dim=2)
        assert buf.len >= min(whole.shape[2], keep or whole.shape[2])
        for m in {1, 2, keep or whole.shape[2], whole.shape[2]}:
            if keep is None or m <= keep:
                assert torch.equal(buf.last(m), whole[:, :, -m:]), (i, m)
    assert keep is None or buf.data.shape[2] <= 2 * (2 * keep + 37)


def test_an_empty_prompt_is_a_clear_error():
    model = model_of()
    with pytest.raises(ValueError, match=r"prefill expects token ids of shape \[B>=1, S>=1\]"):
        model.prefill(ids_of(2, 0))
    attn = model.blocks[0].attn
    with pytest.raises(ValueError, match=r"\[B>=1, S>=1, 32\]"):
        attn.prefill(torch.zeros(2, 0, 32, dtype=torch.float64), attn.new_cache(2))


def test_a_decode_step_that_raises_leaves_the_cache_unchanged(monkeypatch):
    """A decode step refused with an error leaves the caches as they were: the same step retried gives the full
    forward's logits at that position (not those of the token seen twice, one position later)."""
    model = model_of()
    ids = ids_of(2, 8, seed=2)
    full = full_logits(model, ids)
    _, caches = model.prefill(ids[:, :5])
    monkeypatch.setattr(nsa_layer, "DECODE_SELECTED", "vectorised")
    with pytest.raises(ValueError, match="DECODE_SELECTED must be one of"):
        model.decode_step(ids[:, 5:6], caches)
    monkeypatch.setattr(nsa_layer, "DECODE_SELECTED", "gather")
    assert [c.length for c in caches] == [5]
    torch.testing.assert_close(model.decode_step(ids[:, 5:6], caches), full[:, 5], **TIGHT)
