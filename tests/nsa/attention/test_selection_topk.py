"""choose_blocks' two top-n_sel choices (selection.TOPK_CHOICES: a full sort, or torch.topk on packed int64 keys)
against an independent brute-force reference: a Python loop per row implementing the docstring's rule."""

import math
import re

import pytest
import torch

from nsa.attention import selection
from nsa.attention.selection import blocks_from_keys, choose_blocks, packed_keys, topk_choice

METHODS = selection.TOPK_CHOICES


def _rank(score: float) -> tuple:
    """torch.sort's descending order of a float as an ascending sort key: NaN first, then +inf, ..., -inf."""
    return (0, 0.0) if math.isnan(score) else (1, -score)


def brute_force(importance: torch.Tensor, positions: torch.Tensor, n_sel: int, l_sel: int) -> torch.Tensor:
    """The docstring's rule, one row at a time: started blocks j <= t // l_sel; block 0, the current block and the
    one before it scored +inf, the others by importance (NaN above every number); ties to the lower index; the
    first n_sel; a block scored -inf is never kept; ascending, -1 padded."""
    n_blocks = importance.shape[-1]
    rows = importance.reshape(-1, n_blocks).tolist()
    ts = positions.expand(importance.shape[:-1]).reshape(-1).tolist()
    out = []
    for row, t in zip(rows, ts):
        cur = t // l_sel
        score = {j: math.inf if j in (0, cur, cur - 1) else row[j] for j in range(min(cur + 1, n_blocks))}
        ranked = sorted(score, key=lambda j: (_rank(score[j]), j))
        kept = sorted(j for j in ranked[:n_sel] if score[j] != -math.inf)
        out.append(kept + [-1] * (n_sel - len(kept)))
    return torch.tensor(out, dtype=torch.long).reshape(*importance.shape[:-1], n_sel)


def _quantised(shape, levels, seed):
    """Random importances on a few levels: many exact ties."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, levels, shape, generator=gen).float() / levels


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n_blocks,n_sel,l_sel,levels", [
    (40, 16, 64, 4),    # many ties, n_blocks > n_sel
    (40, 16, 64, 1000),
    (9, 16, 64, 3),     # fewer blocks than n_sel: -1 padding
    (16, 16, 32, 2),    # exactly n_sel blocks
    (33, 5, 16, 3),
    (12, 1, 8, 2),      # n_sel below the forced blocks' count
    (12, 2, 8, 5),
])
def test_matches_brute_force_with_ties(method, n_blocks, n_sel, l_sel, levels):
    imp = _quantised((2, 3, 37, n_blocks), levels, seed=n_blocks * 7 + levels)
    gen = torch.Generator().manual_seed(1)
    # several positions: before the second block, inside, at block ends, past the last block's start
    positions = torch.randint(0, n_blocks * l_sel + 3 * l_sel, (37,), generator=gen)
    positions[:4] = torch.tensor([0, l_sel - 1, l_sel, n_blocks * l_sel - 1])
    want = brute_force(imp, positions, n_sel, l_sel)
    assert torch.equal(choose_blocks(imp, positions, n_sel, l_sel, method=method), want)


@pytest.mark.parametrize("method", METHODS)
def test_special_values(method):
    """-inf importance never kept, +inf and NaN first, -0.0 ties +0.0 (to the lower index), negatives ordered."""
    n_blocks, n_sel, l_sel = 24, 8, 16
    gen = torch.Generator().manual_seed(3)
    imp = _quantised((5, 50, n_blocks), 3, seed=5) - 0.5  # negatives and ties
    specials = torch.tensor([float("-inf"), float("inf"), float("nan"), -0.0, 0.0, -1e-30, 1e-30, -3e38])
    mask = torch.rand(imp.shape, generator=gen) < 0.3
    imp[mask] = specials[torch.randint(0, len(specials), (int(mask.sum()),), generator=gen)]
    imp[0] = float("-inf")  # whole rows of -inf: only the forced blocks
    imp[1, :, ::2] = -0.0
    imp[1, :, 1::2] = 0.0
    imp[2].neg_()  # a negative NaN too
    positions = torch.randint(0, n_blocks * l_sel, (50,), generator=gen)
    want = brute_force(imp, positions, n_sel, l_sel)
    assert torch.equal(choose_blocks(imp, positions, n_sel, l_sel, method=method), want)


def test_choices_agree_on_random_rows_and_positions_broadcast():
    imp = torch.rand(2, 2, 300, 70)
    positions = torch.arange(300) * 15
    got = {m: choose_blocks(imp, positions, 16, 64, method=m) for m in METHODS}
    assert torch.equal(got["sort"], got["topk"])
    # positions per row (the decode cache's shape)
    pos = torch.randint(0, 70 * 64, (2, 2, 300))
    assert torch.equal(choose_blocks(imp, pos, 16, 64, method="sort"), choose_blocks(imp, pos, 16, 64, method="topk"))


def test_packed_keys_order_like_score_then_lower_index():
    imp = torch.tensor([[0.5, 0.25, 0.5, -0.0, 0.0, float("-inf"), -1.0, 3.0]])
    keys = packed_keys(imp, torch.tensor([7 * 16]), 16)[0].tolist()
    # forced: 0 (first block), 6 and 7 (current and previous); then 2 (0.5), 1, 3 (= 4, lower index), 4, 5 (-inf)
    order = sorted(range(8), key=lambda j: -keys[j])
    assert order == [0, 6, 7, 2, 1, 3, 4, 5]
    assert len(set(keys)) == 8
    assert keys[5] < selection.EMPTY_LIMIT <= min(keys[j] for j in range(8) if j != 5)
    assert blocks_from_keys(torch.tensor([keys]), 10).tolist() == [[0, 1, 2, 3, 4, 6, 7, -1, -1, -1]]


def test_choice_switch(monkeypatch):
    assert selection.TOPK_CHOICE == "auto" and topk_choice() == selection.QUALIFIED_TOPK == "sort"
    monkeypatch.setattr(selection, "TOPK_CHOICE", "topk")
    assert topk_choice() == "topk"
    monkeypatch.setattr(selection, "TOPK_CHOICE", "heap")
    with pytest.raises(ValueError, match=re.escape("TOPK_CHOICE must be one of auto | sort | topk, got 'heap'")):
        topk_choice()
    with pytest.raises(ValueError, match="method must be one of"):
        choose_blocks(torch.rand(1, 4), torch.tensor([100]), 2, 16, method="heap")


def test_topk_choice_does_no_full_sort():
    """The topk choice sorts only the n_sel kept indices (torch.sort on [..., n_sel]); the sort choice all rows."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sorts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.widths = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith("sort"):
                self.widths.append(args[0].shape[-1])
            return func(*args, **(kwargs or {}))

    imp = torch.rand(1, 2, 64, 200)
    for method, widths in (("topk", [16]), ("sort", [200, 16])):
        with Sorts() as mode:
            choose_blocks(imp, torch.arange(64) * 200, 16, 64, method=method)
        assert mode.widths == widths, method
