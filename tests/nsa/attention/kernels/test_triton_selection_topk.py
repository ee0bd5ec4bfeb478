"""The Triton tiled selection's two top-n_sel choices side by side (nsa.attention.selection.TOPK_CHOICES): "sort"
(the importance kernel, then choose_blocks' full sort) and "topk" (_blocksel_keys_kernel writes packed int64 keys,
then torch.topk). Under the interpreter both compute the same importance, so the keys equal packed_keys of the
importance kernel's buffer and the blocks are identical; on a GPU the two kernels are compiled separately, and the
blocks must still agree (the importance tile's code is the same)."""


import pytest
import torch

import reference as R
from triton_test_utils import KERNEL_DEVICE, ON_GPU, needs_triton, selection_inputs as _inputs
from op_counting import count

pytestmark = needs_triton

DTYPES = [torch.bfloat16, torch.float32] if ON_GPU else [torch.float32]

# (B, G, hpg, S, d_k, l, d, l_sel, n_sel): the branches of block_config (hpg 1, 2-3, >= 4), chunking, ties
CASES = [
    (1, 2, 6, 256, 64, 32, 16, 64, 3),   # the model's geometry and hpg; S = 4 selection blocks > n_sel
    (2, 1, 1, 200, 32, 8, 4, 16, 4),     # hpg 1 (no head sum), B = 2, S not a multiple of l_sel
    (1, 4, 3, 150, 32, 16, 8, 16, 5),    # G = 4, hpg 3, l = l_sel
    (1, 1, 6, 20, 32, 32, 4, 4, 3),      # S < l: no compressed block at all, yet 5 blocks > n_sel (ties at 0)
    (1, 2, 3, 40, 64, 8, 4, 16, 4),      # S < n_sel * l_sel: every started block kept, importance irrelevant
    (1, 1, 1, 7, 16, 8, 4, 16, 3),       # S shorter than one selection block and than l
    (1, 2, 6, 256, 48, 12, 4, 8, 16),    # n_sel = 16 (the model's), 32 blocks, d_k 48 padded
]


def _ts():
    from nsa.attention.kernels.selection import host as triton_selection
    return triton_selection


def _select(monkeypatch, choice_name, *args):
    from nsa.attention import selection

    monkeypatch.setattr(selection, "TOPK_CHOICE", choice_name)
    return _ts().select_blocks(*args, method="tiled")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}G{}hpg{}S{}dk{}l{}d{}ls{}n{}".format(*c))
def test_topk_choice_gives_the_sort_choices_blocks(monkeypatch, case, dtype):
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = case
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, dtype)
    args = (q, k, lse, l, d, l_sel, n_sel)
    assert torch.equal(_select(monkeypatch, "topk", *args), _select(monkeypatch, "sort", *args))


def test_keys_kernel_writes_packed_keys_of_the_importance_kernels_buffer():
    """Every entry, skipped tiles included: the keys equal packed_keys of the importance kernel's zero-filled buffer
    (same skip rule), a row chunk in the middle of the sequence, bit for bit."""
    from nsa.attention.selection import packed_keys

    ts = _ts()
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = (1, 2, 3, 300, 32, 16, 8, 16, 5)
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32, seed=3)
    cfg = ts.block_config(hpg, d_k, l, d, l_sel)
    n_blocks = -(-s // l_sel)
    r0, r1 = 37, 211
    imp = torch.zeros(b, g, r1 - r0, n_blocks, device=q.device)
    ts._importance_into(imp, q, k, lse, l, d, l_sel, r0, n_sel, cfg)
    keys = torch.full((b, g, r1 - r0, n_blocks), 12345, dtype=torch.int64, device=q.device)  # no entry left
    ts._importance_into(keys, q, k, lse, l, d, l_sel, r0, n_sel, cfg, kernel=ts._blocksel_keys_kernel)
    assert not (keys == 12345).any()
    # exact on a GPU too: the two kernels run the same _importance_tile code (a difference here is a finding
    # about the compiled code, not a tolerance to widen)
    assert torch.equal(keys, packed_keys(imp, torch.arange(r0, r1, device=q.device), l_sel))


def test_topk_choice_in_several_chunks(monkeypatch):
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = CASES[-1]
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32)
    args = (q, k, lse, l, d, l_sel, n_sel)
    whole = _select(monkeypatch, "sort", *args)
    monkeypatch.setattr(_ts(), "IMP_CHUNK_ELEMS", 2 * 32 * 37)  # 37 rows of 2 groups x 32 blocks per chunk
    assert torch.equal(_select(monkeypatch, "topk", *args), whole)


def test_topk_choice_matches_the_float64_reference():
    """The reference's own ties: importance all zero (S < l: no compressed block) and a random case."""
    from nsa.attention import selection
    from types import SimpleNamespace

    for case in (CASES[3], CASES[1]):
        b, g, hpg, s, d_k, l, d, l_sel, n_sel = case
        q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32)
        cfg = SimpleNamespace(l=l, d=d, l_sel=l_sel, n_sel=n_sel)
        saved = selection.TOPK_CHOICE
        try:
            selection.TOPK_CHOICE = "topk"
            got = _ts().select_blocks(q, k, lse, l, d, l_sel, n_sel, method="tiled")
        finally:
            selection.TOPK_CHOICE = saved
        want = R.reference_selected_blocks(q, k, cfg)
        if case is CASES[3]:
            assert torch.equal(got, want)
        else:  # near-ties may flip between fp32 kernels and float64: nearly all rows agree
            assert (got == want).all(-1).float().mean() > 0.9


@pytest.mark.skipif(ON_GPU, reason="counts under the interpreter (CPU)")
def test_topk_choice_has_no_full_sort_and_fewer_ops(monkeypatch):
    """benchmarks/bench_ops.py's counter on nsa::select_blocks alone: "topk" ranks a row with topk and one launch
    (_blocksel_finish_kernel) sorts the n_sel kept indices and writes the rows, "sort" sorts whole rows and then
    the kept indices in aten; neither count depends on S (fewer blocks than n_sel, more)."""
    l, d, l_sel, n_sel = 8, 4, 8, 4
    totals = {}
    for name in ("sort", "topk"):
        for s in (20, 100):  # 3 and 13 selection blocks
            q, k, lse = _inputs(1, 2, 2, s, 16, l, d, torch.float32)
            counter = count(lambda: _select(monkeypatch, name, q, k, lse, l, d, l_sel, n_sel))
            n_blocks = -(-s // l_sel)
            want = ({f"sort[{n_blocks}]": 1, f"sort[{n_sel}]": 1} if name == "sort"
                    else {f"topk[{n_blocks}]": 1})
            assert dict(counter.sort_widths) == want, (name, s)
            launches = ({"_blocksel_keys_kernel": 1, "_blocksel_finish_kernel": 1} if name == "topk"
                        else {"_blocksel_importance_kernel": 1})
            assert dict(counter.launches) == launches
            totals.setdefault(name, set()).add(counter.total)
    assert len(totals["sort"]) == len(totals["topk"]) == 1, totals
    assert max(totals["topk"]) <= 3 < min(totals["sort"]), totals  # the keys kernel, topk, the finish kernel


def test_finish_kernel_writes_blocks_from_keys_rows():
    """_blocksel_finish_kernel against selection.blocks_from_keys (the aten path) on keys made to hit every case:
    empty slots (-inf scores, and below), NaN and +inf scores, fewer blocks than n_sel, a row chunk written in the
    middle of the output with the rows around it untouched."""
    from nsa.attention.selection import blocks_from_keys, packed_keys

    ts = _ts()
    gen = torch.Generator().manual_seed(5)
    empties = 0
    for b, g, s, n_blocks, n_sel, r0, r1 in ((2, 3, 70, 37, 16, 9, 70), (1, 2, 90, 3, 5, 0, 90),
                                              (1, 1, 8, 40, 3, 2, 5)):
        imp = torch.rand(b, g, r1 - r0, n_blocks, generator=gen)
        imp[imp < 0.1] = float("-inf")  # started blocks of -inf importance: never kept
        imp[(imp > 0.1) & (imp < 0.12)] = float("nan")
        imp[..., :2] = torch.where(torch.rand(b, g, r1 - r0, 1, generator=gen) < 0.5, 0.0, imp[..., :2])  # ties
        positions = torch.randint(0, n_blocks * 8, (r1 - r0,), generator=gen)
        keys = packed_keys(imp, positions, 8).to(KERNEL_DEVICE)
        want = blocks_from_keys(keys, n_sel)
        top, _ = torch.topk(keys, min(n_sel, n_blocks), dim=-1, sorted=False)
        out = torch.full((b, g, s, n_sel), 777, dtype=torch.int64, device=keys.device)
        ts.finish_rows(top[..., torch.randperm(top.shape[-1], generator=gen)], out, r0)  # any order within a row
        assert torch.equal(out[:, :, r0:r1], want), (b, g, s, n_blocks, n_sel)
        assert (out[:, :, :r0] == 777).all() and (out[:, :, r1:] == 777).all()
        empties += int((want == -1).sum())
    assert empties  # the empty slots were exercised
    with pytest.raises(ValueError, match="finish_rows"):
        ts.finish_rows(top, out[..., :2], 0)
