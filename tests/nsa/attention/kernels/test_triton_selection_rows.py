"""The tiled selection's importance launch choices (nsa.attention.kernels.selection.host.IMPORTANCE_CHOICES): "tile",
one selection tile per program (the shipped kernels), against "rows8" and "rows", a program walking 8 or all of its
tokens' tiles in a loop (_blocksel_rows_kernel: query rows, lse, R and W loaded once).

Checked against the float64 importance of tests/nsa/reference.py (explicit overlap counting) within the importance
test's bound, and bit for bit against the one-tile kernels: the loop's bookkeeping (which tiles a program visits,
where it writes, the skip rules, the keys of tiles not computed) must give the same buffer, every entry of the keys
buffer written. Then the blocks select_blocks returns under each choice, with either top-n_sel choice, in one chunk
and in several (a chunk starting mid-sequence), and against the float64 reference's choice."""

from types import SimpleNamespace

import pytest
import torch

import reference as R
from triton_test_utils import ON_GPU, needs_triton, selection_inputs as _inputs

pytestmark = needs_triton

DTYPES = [torch.bfloat16, torch.float32] if ON_GPU else [torch.float32]
LOOPS = ("rows8", "rows")

# (B, G, hpg, S, d_k, l, d, l_sel, n_sel): the branches of block_config the loop runs at (hpg 1, >= 4; at 2-3 the
# one-tile kernels run: test_hpg_2_and_3_run_the_one_tile_kernels), a tile count that 8 does not divide, S < n_sel *
# l_sel (every program skipped), S < l (no compressed block)
CASES = [
    (1, 2, 6, 256, 64, 32, 16, 64, 3),   # the model's geometry and hpg: 4 blocks, one tile
    (2, 1, 1, 200, 32, 8, 4, 16, 4),     # hpg 1 (no head sum), B = 2, S not a multiple of l_sel
    (1, 2, 4, 300, 32, 2, 2, 2, 5),      # 150 blocks in 10 tiles of 16 (BC 32): "rows8" walks 8 tiles, then 2
    (1, 1, 6, 20, 32, 32, 4, 4, 3),      # S < l: no compressed block at all, 5 blocks > n_sel
    (1, 2, 4, 40, 64, 8, 4, 16, 4),      # S < n_sel * l_sel: every started block kept, importance irrelevant
]
IDS = ["B{}G{}hpg{}S{}dk{}l{}d{}ls{}n{}".format(*c) for c in CASES]
SLOW = pytest.mark.slow  # the interpreter takes seconds a case: CI keeps a cover of each rule, a GPU runs them all


def _params(pairs, fast):
    """pytest params of (case index, loop) pairs; those not in `fast` under -m slow."""
    return [pytest.param(CASES[i], loop, id=f"{IDS[i]}-{loop}", marks=() if (i, loop) in fast else SLOW)
            for i, loop in pairs]


def _ts():
    from nsa.attention.kernels.selection import host
    return host


@pytest.fixture
def importance(monkeypatch):
    """choose(name): set IMPORTANCE_CHOICE for the rest of the test."""
    return lambda name: monkeypatch.setattr(_ts(), "IMPORTANCE_CHOICE", name)


def test_the_choices_cover_one_tile_a_few_and_the_whole_row_with_the_shipped_one_qualified():
    ts = _ts()
    assert ts.IMPORTANCE_CHOICES == {"tile": 1, "rows8": 8, "rows": 0}
    assert ts.QUALIFIED_IMPORTANCE == "tile" and ts.importance_choice() == "tile"


def test_an_unknown_choice_is_an_error_naming_the_setting(importance):
    importance("row")
    with pytest.raises(ValueError, match="IMPORTANCE_CHOICE must be one of auto | tile | rows8 | rows, got 'row'"):
        _ts().importance_choice()


@pytest.mark.parametrize("case,loop", _params([(i, loop) for i in range(len(CASES)) for loop in LOOPS],
                                               fast={(i, "rows") for i in range(len(CASES))} | {(2, "rows8")}))
def test_importance_matches_float64_and_the_one_tile_kernel(importance, case, loop):
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = case
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32)
    ts = _ts()
    importance("tile")
    tile = ts.block_importance(q, k, lse, l, d, l_sel)
    importance(loop)
    got = ts.block_importance(q, k, lse, l, d, l_sel)
    ref = R.selection_importance(q, k, SimpleNamespace(l=l, d=d, l_sel=l_sel, n_sel=n_sel)).to(got.device)
    torch.testing.assert_close(got.double(), ref.double(), rtol=1e-5, atol=1e-5 * max(1.0, ref.abs().max().item()))
    assert torch.equal(got, tile)
    # a chunk of rows in the middle of the sequence: the loop's rows are offset by row0. Its row tiles start at lo, not
    # at a multiple of the tile: equal but for the last bits (the interpreter's dots are numpy matmuls, and OpenBLAS
    # rounds a row by where it sits in the matrix on some CPUs: a few ulps on a 2-core AMD EPYC), as the compiled
    # model's chunk test below allows; a wrong row0 moves whole rows (errors of the importance's size)
    lo, hi = s // 3, s // 3 + max(1, s // 2)
    part = ts.block_importance(q, k, lse, l, d, l_sel, start=lo, stop=hi)
    torch.testing.assert_close(part, tile[:, :, lo:hi], rtol=1e-5, atol=1e-6 * max(1.0, tile.abs().max().item()))


@pytest.mark.parametrize("case,loop", _params([(i, loop) for i in (0, 2, 4) for loop in LOOPS],
                                               fast={(2, "rows8"), (0, "rows"), (4, "rows")}))
def test_keys_are_written_to_every_entry_as_the_keys_kernel_writes_them(importance, case, loop):
    """With the skip rule on (skip_n = n_sel: programs whose tokens have at most n_sel blocks compute nothing) and a
    row chunk in the middle: every entry written (a sentinel first), bit for bit the one-tile keys kernel's."""
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = case
    ts = _ts()
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32, seed=3)
    cfg = ts.block_config(hpg, d_k, l, d, l_sel)
    n_blocks = -(-s // l_sel)
    r0, r1 = s // 5, s - s // 7
    out = {}
    for name in ("tile", loop):
        importance(name)
        keys = torch.full((b, g, r1 - r0, n_blocks), 12345, dtype=torch.int64, device=q.device)
        ts._importance_into(keys, q, k, lse, l, d, l_sel, r0, n_sel, cfg, kernel=ts._blocksel_keys_kernel)
        assert not (keys == 12345).any(), name
        out[name] = keys
    assert torch.equal(out[loop], out["tile"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("loop,topk", [("rows8", "topk"), ("rows", "sort"), pytest.param("rows8", "sort", marks=SLOW),
                                       pytest.param("rows", "topk", marks=SLOW)])
def test_blocks_under_each_choice_equal_the_one_tile_kernels_in_one_chunk_and_several(monkeypatch, importance, loop,
                                                                                      topk, dtype):
    from nsa.attention import selection

    monkeypatch.setattr(selection, "TOPK_CHOICE", topk)
    ts = _ts()
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = CASES[2]
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, dtype)
    args = (q, k, lse, l, d, l_sel, n_sel)
    importance("tile")
    want = ts.select_blocks(*args, method="tiled")
    importance(loop)
    assert torch.equal(ts.select_blocks(*args, method="tiled"), want)
    monkeypatch.setattr(ts, "IMP_CHUNK_ELEMS", 2 * 150 * 37)  # 37 rows of 2 groups x 150 blocks per chunk
    assert torch.equal(ts.select_blocks(*args, method="tiled"), want)


def test_blocks_under_the_whole_row_loop_match_the_float64_reference(importance):
    """The reference's own ties (S < l: every importance 0) exactly; a random case up to near-ties."""
    importance("rows")
    for case in (CASES[3], CASES[1]):
        b, g, hpg, s, d_k, l, d, l_sel, n_sel = case
        q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32)
        got = _ts().select_blocks(q, k, lse, l, d, l_sel, n_sel, method="tiled")
        want = R.reference_selected_blocks(q, k, SimpleNamespace(l=l, d=d, l_sel=l_sel, n_sel=n_sel)).to(got.device)
        if case is CASES[3]:
            assert torch.equal(got, want)
        else:
            assert (got == want).all(-1).float().mean() > 0.9


@pytest.mark.skipif(ON_GPU, reason="counts launches under the interpreter (CPU)")
def test_the_loop_is_one_launch_per_chunk_with_its_programs_walking_the_tiles(monkeypatch, importance):
    """One _blocksel_rows_kernel launch in place of the one-tile kernel's, its grid's second axis cdiv(tiles, jt)."""
    ts = _ts()
    grids = []
    real = ts._blocksel_rows_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                grids.append((grid, kwargs["jt"], kwargs["KEYS"]))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(ts, "_blocksel_rows_kernel", Spy())
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = CASES[2]
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32)
    cfg = ts.block_config(hpg, d_k, l, d, l_sel)
    tiles = -(-(-(-s // l_sel)) // cfg["BJ"])
    assert tiles == 10
    for name, jt in (("rows8", 8), ("rows", tiles)):
        importance(name)
        grids.clear()
        ts.block_importance(q, k, lse, l, d, l_sel)
        bt = cfg["BM"] // hpg
        assert grids == [((-(-s // bt), -(-tiles // jt), b * g), jt, False)], name


@pytest.mark.skipif(ON_GPU, reason="counts launches under the interpreter (CPU)")
def test_hpg_2_and_3_run_the_one_tile_kernels_whatever_the_choice(monkeypatch, importance):
    """At 64 token rows (hpg 2-3) the loop's compiled code reads a wgmma descriptor register before writing it under
    triton 3.6 (_blocksel_rows_kernel's docstring): the host launches the one-tile kernel there."""
    ts = _ts()
    launched = []
    monkeypatch.setattr(ts, "_blocksel_rows_kernel", None)  # a launch of it would fail
    real = ts._blocksel_importance_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(ts, "_blocksel_importance_kernel", Spy())
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = (1, 2, 3, 150, 32, 8, 4, 16, 4)
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, torch.float32)
    importance("rows")
    imp = ts._importance_into(torch.zeros(b, g, s, -(-s // l_sel), device=q.device), q, k, lse, l, d, l_sel, 0, 0,
                              ts.block_config(hpg, d_k, l, d, l_sel), kernel=ts._blocksel_importance_kernel)
    assert len(launched) == 1
    ref = R.selection_importance(q, k, SimpleNamespace(l=l, d=d, l_sel=l_sel, n_sel=n_sel)).to(imp.device)
    torch.testing.assert_close(imp.double(), ref.double(), rtol=1e-5, atol=1e-5 * max(1.0, ref.abs().max().item()))


# The model's geometry (m7c: hpg 6, d_k 64, l 32, d 16, l_sel 64, n_sel 16) compiled natively, where a bf16 or fp16
# miscompile would show (the importance kernel's 64-row tiling once computed wrong bf16 importances on a GPU: host.py's
# "GPU findings"): S 2,048 (32 blocks, 3 tiles: the skip rule on the early tokens) and 10,240 (160 blocks, 11 tiles:
# "rows8" walks 8 tiles, then 3), the whole sequence and a chunk starting mid-sequence. On a GPU only: the
# interpreter runs these shapes for minutes, and the small cases above cover its rules.
MODEL = dict(b=1, g=2, hpg=6, d_k=64, l=32, d=16, l_sel=64, n_sel=16)


@pytest.mark.slow
@pytest.mark.skipif(not ON_GPU, reason="the model's kernels compiled natively: on a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("s", [2048, 10240])
@pytest.mark.parametrize("loop", LOOPS)
def test_the_models_kernels_compiled_give_the_one_tile_kernels_importance_keys_and_blocks(monkeypatch, importance,
                                                                                          loop, s, dtype):
    from nsa.attention import selection

    m = MODEL
    ts = _ts()
    q, k, lse = _inputs(m["b"], m["g"], m["hpg"], s, m["d_k"], m["l"], m["d"], dtype, seed=11)
    lo, hi = s // 3, s - s // 5
    got = {}
    for name in ("tile", loop):
        importance(name)
        imp = ts.block_importance(q, k, lse, m["l"], m["d"], m["l_sel"])
        part = ts.block_importance(q, k, lse, m["l"], m["d"], m["l_sel"], start=lo, stop=hi)
        cfg = ts.block_config(m["hpg"], m["d_k"], m["l"], m["d"], m["l_sel"])
        keys = torch.full((m["b"], m["g"], hi - lo, -(-s // m["l_sel"])), 12345, dtype=torch.int64, device=q.device)
        ts._importance_into(keys, q, k, lse, m["l"], m["d"], m["l_sel"], lo, m["n_sel"], cfg,
                            kernel=ts._blocksel_keys_kernel)
        assert not (keys == 12345).any(), name  # every entry written
        blocks = {}
        for topk in ("sort", "topk"):
            monkeypatch.setattr(selection, "TOPK_CHOICE", topk)
            blocks[topk] = ts.select_blocks(q, k, lse, m["l"], m["d"], m["l_sel"], m["n_sel"], method="tiled")
        got[name] = imp, part, blocks
    (imp, part, blocks), (want, want_part, want_blocks) = got[loop], got["tile"]
    # the same _importance_tile on the same tiles: equal but for the order the compiled code sums in
    scale = want.abs().max().item()
    torch.testing.assert_close(imp, want, rtol=1e-5, atol=1e-6 * scale)
    torch.testing.assert_close(part, want_part, rtol=1e-5, atol=1e-6 * scale)
    torch.testing.assert_close(part, imp[:, :, lo:hi], rtol=1e-5, atol=1e-6 * scale)
    for topk in ("sort", "topk"):  # as test_triton_selection_topk asserts of its two kernels: the same blocks
        assert torch.equal(blocks[topk], want_blocks[topk]), topk
