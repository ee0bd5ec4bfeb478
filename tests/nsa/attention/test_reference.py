"""Self-checks of the test-side dense reference (no implementation involved).

The reference is what every correctness test trusts, so it is itself checked
against torch's scaled_dot_product_attention and against hand-worked values.
"""

import math
from types import SimpleNamespace

import pytest
import torch

import reference as R


def test_masked_attention_matches_torch_sdpa():
    torch.manual_seed(0)
    q = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    k = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    v = torch.randn(2, 3, 9, 5, dtype=torch.float64)
    mask = torch.rand(2, 3, 7, 9) > 0.4
    mask[..., 0] = True  # every row non-empty so SDPA is defined
    ours = R.masked_attention(q, k, v, mask)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-10)


def test_masked_attention_empty_rows_are_exact_zero_and_explicit_formula():
    torch.manual_seed(1)
    q = torch.randn(1, 1, 4, 6, dtype=torch.float64)
    k = torch.randn(1, 1, 5, 6, dtype=torch.float64)
    v = torch.randn(1, 1, 5, 3, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    out = R.masked_attention(q, k, v, mask)
    assert torch.equal(out[0, 0, 0], torch.zeros(3, dtype=torch.float64))
    # single visible key -> exactly its value
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, 0])
    # explicit formula for row 2
    s = torch.stack([q[0, 0, 2] @ k[0, 0, 1], q[0, 0, 2] @ k[0, 0, 2]]) / math.sqrt(6)
    p = torch.softmax(s, 0)
    torch.testing.assert_close(out[0, 0, 2], p[0] * v[0, 0, 1] + p[1] * v[0, 0, 2])
    # zero keys at all
    out0 = R.masked_attention(q, k[:, :, :0], v[:, :, :0], torch.zeros(4, 0, dtype=torch.bool))
    assert out0.shape == (1, 1, 4, 3) and torch.all(out0 == 0)


def test_masks_by_hand():
    assert R.window_mask(5, 2).int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    assert torch.equal(R.window_mask(6, 6), R.causal_mask(6))
    # l=4, d=2: block i covers [2i, 2i+4), visible from t = 2i+3
    assert R.num_cmp_blocks(9, 4, 2) == 3
    assert R.num_cmp_blocks(3, 4, 2) == 0
    m = R.cmp_visible_mask(9, 3, 4, 2)
    assert m[:, 0].int().tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert m[:, 1].int().tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert m[:, 2].int().tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    blocks = torch.tensor([[[[0, 2], [1, -1], [0, 2], [0, 2], [0, 2], [0, 2]]]])  # l_sel = 2
    sm = R.selection_mask_from_blocks(blocks, 6, 2)[0, 0]
    assert sm[5].int().tolist() == [1, 1, 0, 0, 1, 1]
    assert sm[4].int().tolist() == [1, 1, 0, 0, 1, 0]
    assert sm[1].int().tolist() == [0, 0, 0, 0, 0, 0]  # block 1 = tokens 2,3 > t=1
    assert sm[0].int().tolist() == [1, 0, 0, 0, 0, 0]


def test_overlap_counts_by_hand():
    # l=8, d=4, l_sel=16: block i covers [4i, 4i+8)
    assert R.overlap_chunks(0, 0, 8, 4, 16) == 2
    assert R.overlap_chunks(3, 0, 8, 4, 16) == 1  # [12, 20) vs [0, 16)
    assert R.overlap_chunks(3, 1, 8, 4, 16) == 1  # [12, 20) vs [16, 32)
    assert R.overlap_chunks(4, 0, 8, 4, 16) == 0
    # paper sizes l=32, d=16, l_sel=64: Eq. 9 sums over l'/d = 4 and l/d = 2 offsets
    assert [R.overlap_chunks(i, 1, 32, 16, 64) for i in range(1, 9)] == [0, 0, 1, 2, 2, 2, 1, 0]
    # l > l_sel: l=16, d=8, l_sel=8
    assert [R.overlap_chunks(i, 2, 16, 8, 8) for i in range(0, 4)] == [0, 1, 1, 0]


def test_reference_selection_by_hand():
    cfg = SimpleNamespace(l=4, d=2, l_sel=4, n_sel=3)
    # One head, one group, S=16, blocks are 4 tokens; d_k=2.
    s = 16
    n_cmp = R.num_cmp_blocks(s, 4, 2)  # 7
    q = torch.zeros(1, 1, s, 2)
    k = torch.zeros(1, 1, n_cmp, 2)
    q[..., 0] = 10.0
    k[0, 0, 2, 0] = 10.0  # compressed block 2 covers tokens [4, 8) -> selection block 1
    imp = R.selection_importance(q, k, cfg)
    blocks = R.reference_selected_blocks(q, k, cfg, imp)
    # t=15: valid blocks 0..3, forced {0, 3, 2}; the fourth (block 1) is not chosen
    # because n_sel = 3 and the forced ones fill it.
    assert blocks[0, 0, 15].tolist() == [0, 2, 3]
    # t=11: valid 0..2, all forced
    assert blocks[0, 0, 11].tolist() == [0, 1, 2]
    # t=2: one valid block -> padded
    assert blocks[0, 0, 2].tolist() == [0, -1, -1]
    # importance at t=15 is dominated by block 1 (p_cmp ~ 1 on compressed block 2)
    assert imp[0, 0, 15].argmax().item() == 1
    # with n_sel = 4 at t = 15 everything fits
    cfg4 = SimpleNamespace(l=4, d=2, l_sel=4, n_sel=4)
    assert R.reference_selected_blocks(q, k, cfg4, imp)[0, 0, 15].tolist() == [0, 1, 2, 3]
    # no visible compressed block: importance exactly zero
    assert torch.all(imp[0, 0, :3] == 0)


def test_reference_selection_prefers_important_block():
    cfg = SimpleNamespace(l=4, d=2, l_sel=4, n_sel=4)
    s = 32  # blocks 0..7
    n_cmp = R.num_cmp_blocks(s, 4, 2)
    q = torch.zeros(1, 1, s, 2)
    k = torch.zeros(1, 1, n_cmp, 2)
    q[..., 0] = 5.0
    k[0, 0, 6, 0] = 5.0  # tokens [12, 16) -> selection block 3
    blocks = R.reference_selected_blocks(q, k, cfg)
    assert blocks[0, 0, 31].tolist() == [0, 3, 6, 7]


@pytest.mark.parametrize(
    "ctx,expected",
    [(1, 0 + 1 + 1), (8, 1 + 8 + 8), (9, 1 + 9 + 9), (48, 11 + 48 + 16), (49, 11 + 33 + 16), (64, 15 + 48 + 16)],
)
def test_ref_decode_reads_by_hand(ctx, expected):
    # l=8, d=4, l_sel=16, n_sel=3, w=16
    assert R.ref_decode_reads(ctx, 8, 4, 16, 3, 16) == expected
    blocks_row = list(range(0, -(-ctx // 16)))
    if len(blocks_row) > 3:
        cur = (ctx - 1) // 16
        blocks_row = [0, cur - 1, cur]
    assert R.counted_decode_reads(ctx, blocks_row, 8, 4, 16, 16) == expected
