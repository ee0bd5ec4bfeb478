"""The batched kernels and selection helpers on their own, against dense references and the paper's formulas.

These drive the PyTorch path (nsa.attention.kernels' naive.py modules) / nsa.attention.selection directly with hand-made inputs (arbitrary
selections, tiny tiles, huge scores) that the module-level tests cannot reach, and compare with
reference.masked_attention.
"""

import pytest
import torch

from nsa.attention.kernels import compressed_attention, selected_attention, window_attention
from nsa.attention.selection import (choose_blocks, importance_from_cmp, overlap_weights, selection_ranges_v1,
                           selection_ranges_v2)
from reference import masked_attention


def _grouped(h, *tensors):
    return [t.repeat_interleave(h // t.shape[1], dim=1) for t in tensors]


def _selection_mask(blocks, s, l_sel):
    """[B, G, S, S] bool from block lists: key p visible to query t iff p // l_sel is listed and p <= t."""
    key_block = torch.arange(s) // l_sel
    listed = (blocks.unsqueeze(-1) == key_block).any(dim=-2)
    return listed & (torch.arange(s).view(1, s) <= torch.arange(s).view(s, 1))


def _random_selection(b, g, s, l_sel, n_sel, seed):
    gen = torch.Generator().manual_seed(seed)
    n_blocks = -(-s // l_sel)
    blocks = choose_blocks(torch.rand(b, g, s, n_blocks, generator=gen), torch.arange(s), n_sel, l_sel)
    return blocks, selection_ranges_v2(blocks, torch.arange(s), l_sel)


@pytest.mark.parametrize("b,h,g,s,l_sel,n_sel,tile", [
    (2, 4, 2, 77, 8, 3, 5),     # S not a multiple of l_sel, tiles smaller than a block's pair count
    (1, 4, 1, 130, 16, 4, 64),  # one group
    (2, 6, 3, 33, 8, 5, 1),     # tile of one pair
    (1, 4, 4, 64, 16, 3, 7),    # G = H
    (1, 2, 1, 5, 8, 3, 4),      # S < l_sel: only the own block
])
def test_selected_attention_matches_dense_reference(b, h, g, s, l_sel, n_sel, tile):
    torch.manual_seed(0)
    q = torch.randn(b, h, s, 8, dtype=torch.float64)
    k, v = torch.randn(b, g, s, 8, dtype=torch.float64), torch.randn(b, g, s, 6, dtype=torch.float64)
    blocks, ranges = _random_selection(b, g, s, l_sel, n_sel, seed=1)
    out = selected_attention(q, k, v, ranges, l_sel, tile=tile)
    mask = _selection_mask(blocks, s, l_sel)  # [B, G, S, S]
    ref = masked_attention(q, *_grouped(h, k, v), *_grouped(h, mask))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_selected_attention_gradients_match_dense_reference():
    torch.manual_seed(1)
    b, h, g, s, l_sel = 1, 4, 2, 70, 8
    q = torch.randn(b, h, s, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, g, s, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, g, s, 8, dtype=torch.float64, requires_grad=True)
    blocks, ranges = _random_selection(b, g, s, l_sel, 3, seed=2)
    grads = torch.autograd.grad(selected_attention(q, k, v, ranges, l_sel, tile=4).sin().sum(), (q, k, v))
    mask = _selection_mask(blocks, s, l_sel)
    ref = masked_attention(q, *_grouped(h, k, v), *_grouped(h, mask))
    ref_grads = torch.autograd.grad(ref.sin().sum(), (q, k, v))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_selected_attention_is_stable_for_huge_scores():
    """Scores of +-1e4 overflow exp() unless the softmax subtracts each query's true maximum."""
    torch.manual_seed(2)
    b, h, g, s, l_sel = 1, 4, 2, 90, 8
    q, k = torch.randn(b, h, s, 8) * 40, torch.randn(b, g, s, 8) * 40
    v = torch.randn(b, g, s, 8)
    blocks, ranges = _random_selection(b, g, s, l_sel, 4, seed=3)
    out = selected_attention(q, k, v, ranges, l_sel, tile=8)
    assert torch.isfinite(out).all()
    ref = masked_attention(q, *_grouped(h, k, v), *_grouped(h, _selection_mask(blocks, s, l_sel)))
    torch.testing.assert_close(out, ref.float(), atol=1e-4, rtol=1e-4)


def test_selected_attention_rejects_ranges_without_the_own_block():
    s, l_sel = 40, 8
    blocks = torch.zeros(1, 1, s, 3, dtype=torch.long)  # only block 0: queries beyond it lack their own block
    ranges = selection_ranges_v2(blocks, torch.arange(s), l_sel)
    with pytest.raises(ValueError, match="own block"):
        selected_attention(torch.randn(1, 2, s, 4), torch.randn(1, 1, s, 4), torch.randn(1, 1, s, 4), ranges, l_sel)


@pytest.mark.parametrize("s,w,chunk", [(10, 16, 4), (16, 16, 4), (17, 16, 4), (50, 7, 3), (64, 8, 64), (33, 1, 5)])
def test_window_attention_matches_dense_band(s, w, chunk):
    torch.manual_seed(3)
    q = torch.randn(2, 4, s, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, s, 8, dtype=torch.float64), torch.randn(2, 2, s, 8, dtype=torch.float64)
    t, j = torch.arange(s).view(s, 1), torch.arange(s).view(1, s)
    ref = masked_attention(q, *_grouped(4, k, v), (j <= t) & (j > t - w))
    torch.testing.assert_close(window_attention(q, k, v, w, chunk=chunk), ref, atol=1e-12, rtol=1e-10)


def test_compressed_attention_rows_without_blocks_are_exactly_zero():
    torch.manual_seed(4)
    l, d, s = 8, 4, 30
    n_cmp = (s - l) // d + 1
    q = torch.randn(1, 4, s, 8, dtype=torch.float64)
    k, v = torch.randn(1, 2, n_cmp, 8, dtype=torch.float64), torch.randn(1, 2, n_cmp, 8, dtype=torch.float64)
    out = compressed_attention(q, k, v, l, d)
    visible = torch.arange(n_cmp).view(1, n_cmp) * d + l - 1 <= torch.arange(s).view(s, 1)
    torch.testing.assert_close(out, masked_attention(q, *_grouped(4, k, v), visible), atol=1e-12, rtol=1e-10)
    assert (out[:, :, : l - 1] == 0).all() and (out[:, :, l - 1:].abs().sum(-1) > 0).all()
    assert (compressed_attention(q[:, :, :5], k[:, :, :0], v[:, :, :0], l, d) == 0).all()


@pytest.mark.parametrize("l,d,l_sel", [(32, 16, 64), (8, 4, 16), (16, 16, 16), (8, 8, 32), (12, 4, 8)])
def test_eq9_vectorized_equals_paper_double_sum_and_interval_overlap(l, d, l_sel):
    """Three independent forms of Eq. 9 agree: the unfold kernel, the literal double sum, the interval overlap."""
    torch.manual_seed(5)
    s = 5 * l_sel + 3
    n_cmp, n_blocks = (s - l) // d + 1, -(-s // l_sel)
    p = torch.rand(3, n_cmp, dtype=torch.float64)
    fast = importance_from_cmp(p, n_blocks, l, d, l_sel)
    literal = torch.zeros(3, n_blocks, dtype=torch.float64)
    for j in range(n_blocks):
        for m in range(l_sel // d):
            for n in range(l // d):
                i = (l_sel // d) * j + m - n
                if 0 <= i < n_cmp:
                    literal[:, j] += p[:, i]
    torch.testing.assert_close(fast, literal)
    torch.testing.assert_close(p @ overlap_weights(n_cmp, n_blocks, l, d, l_sel).double(), literal)


def test_ranges_v1_equals_v2_and_clips_at_t():
    gen = torch.Generator().manual_seed(6)
    s, l_sel = 100, 16
    n_blocks = -(-s // l_sel)
    blocks = choose_blocks(torch.rand(2, 3, s, n_blocks, generator=gen), torch.arange(s), 4, l_sel)
    v1, v2 = selection_ranges_v1(blocks, torch.arange(s), l_sel), selection_ranges_v2(blocks, torch.arange(s), l_sel)
    assert torch.equal(v1, v2)
    assert (v2[..., 1] <= torch.arange(s).view(1, 1, s, 1) + 1).all()
    assert ((blocks < 0) == (v2[..., 1] == v2[..., 0])).all()


def test_choose_blocks_forced_and_ties_to_lower_index():
    imp = torch.zeros(1, 10)  # all tied: forced blocks, then the lowest indices
    assert choose_blocks(imp, torch.tensor([95]), 5, 10).tolist() == [[0, 1, 2, 8, 9]]
    imp = torch.tensor([[0.0, 5, 1, 5, 0, 0, 0, 0, 0, 0]])  # blocks 1 and 3 tie: both fit
    assert choose_blocks(imp, torch.tensor([75]), 5, 10).tolist() == [[0, 1, 3, 6, 7]]
    imp = torch.tensor([[0.0, 5, 1, 5, 0, 0, 0, 0, 0, 9]])  # block 9 starts after t: never chosen
    assert choose_blocks(imp, torch.tensor([75]), 4, 10).tolist() == [[0, 1, 6, 7]]
    assert choose_blocks(torch.rand(1, 2), torch.tensor([12]), 4, 10).tolist() == [[0, 1, -1, -1]]


@pytest.mark.parametrize("chunk", [1, 3 * 4 * 8 * 8])  # one tile per chunk; a few tiles per chunk
def test_chunked_kernels_match_dense_reference_across_chunks(monkeypatch, chunk):
    """Many chunks: the online softmax must rescale earlier chunks when a query's maximum grows, and the
    recomputing backward must give the dense gradients. Scores are large so that a wrong rescale shows."""
    from nsa.attention.kernels import common

    monkeypatch.setattr(common, "SCORE_CHUNK", chunk)
    torch.manual_seed(7)
    b, h, g, s, l_sel = 2, 4, 2, 75, 8
    q = (torch.randn(b, h, s, 8, dtype=torch.float64) * 6).requires_grad_()
    k = (torch.randn(b, g, s, 8, dtype=torch.float64) * 6).requires_grad_()
    v = torch.randn(b, g, s, 8, dtype=torch.float64, requires_grad=True)
    blocks, ranges = _random_selection(b, g, s, l_sel, 5, seed=8)
    out = selected_attention(q, k, v, ranges, l_sel, tile=3)
    ref = masked_attention(q, *_grouped(h, k, v), *_grouped(h, _selection_mask(blocks, s, l_sel)))
    torch.testing.assert_close(out, ref, atol=1e-11, rtol=1e-9)
    for got, want in zip(torch.autograd.grad(out.cos().sum(), (q, k, v)), torch.autograd.grad(ref.cos().sum(), (q, k, v))):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-8)


def test_chunked_selection_equals_single_chunk(monkeypatch):
    """selected_blocks must not depend on how the importance computation is chunked over queries."""
    from nsa import NSAAttention, NSAConfig
    from nsa.attention.kernels import common

    torch.manual_seed(9)
    attn = NSAAttention(NSAConfig(dim=32, n_heads=4, n_kv_groups=2, d_k=8, d_v=8, l=8, d=4, l_sel=8, n_sel=4, w=16))
    x = torch.randn(2, 90, 32)
    whole = attn.selected_blocks(x)
    monkeypatch.setattr(common, "SCORE_CHUNK", 1)  # one query per chunk
    assert torch.equal(attn.selected_blocks(x), whole)


def test_group_probabilities_are_zero_for_queries_that_see_no_compressed_block():
    """Rows t < l - 1 see no compression block: their Eq. 10 probabilities are exactly 0 (not block 0's 1)."""
    from nsa.attention.kernels import cmp_group_probabilities

    l, d, s = 16, 4, 40
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, s, 8, generator=gen)
    k_cmp = torch.randn(1, 2, (s - l) // d + 1, 8, generator=gen)
    rows = torch.cat([p for _, p in cmp_group_probabilities(q, k_cmp, l, d, 0)], dim=2)  # [1, 2, s, n_vis]
    assert torch.all(rows[:, :, : l - 1] == 0)
    torch.testing.assert_close(rows[:, :, l - 1:].sum(-1), torch.full((1, 2, s - l + 1), 2.0))  # 2 heads a group
