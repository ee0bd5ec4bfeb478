"""The selected branch's inverted index in Triton: a deterministic counting sort of (query, slot) pairs by key block.

    build_index(blocks, l_sel, qpt_fwd, qpt_bwd, n_tiles_fwd, n_tiles_bwd) -> (order, pair_t, fwd_tiles, bwd_tiles)

The same four int32 tensors as host._build_index_torch, equal element for element (the tests compare
them): `order`, the flat pair index ((b*G + g)*S + t)*n_sel + slot of every pair sorted by key
(b*G + g)*NB + block, ascending within a key, the empty slots (-1) last; `pair_t`, the query t of each sorted pair;
and the tile tables [3, n_tiles] (key, first sorted pair, pairs) of QPT-pair tiles. The torch build takes 53
kernel-launching aten ops (a stable sort, scatter_add_, cumsum, and per table searchsorted and a dozen small ops;
issue 21's host-overhead target is 80 ops per layer forward + backward); this one takes one aten op (the zeroed
histogram) and six Triton launches (the tile kernel once per table), with no host synchronisation and a grid
bounded by shapes alone.

Design: the pairs of one KV group (b, g) are cut into chunks of CT queries x NS_PAD slots (PAIRS = 2,048 pairs).
1. _index_hist, one program per chunk: hist[chunk, block] += 1 per pair (NB + 1 columns: the last counts the
   empty slots), integer atomics into the zeroed histogram (deterministic: integer adds commute). Under the
   selected branch's "fused" host choice (host.HOST_CHOICES) each program zeroes its own row first (ZERO_ROW) and
   the build issues no aten op at all; it also reads the int64 block lists as given (each index converted to
   int32 on load). Checked in the interpreter and compiled ahead of time; not run on a GPU.
2. _index_colscan, one program per (group, BK keys): an exclusive scan of hist down the group's chunks, in place
   (each chunk's offset within each key), and the per-key totals.
3. _index_keyscan, one program: the exclusive scan of the totals in key order (the sorted position where each
   key's list starts), the empty slots' lists after all keys, group by group; and, per tile table, the inclusive
   scan of ceil(count / QPT) (where each key's tiles end).
4. _index_scatter, one program per chunk: the chunk's pairs sorted by (block, position in the chunk) with tl.sort
   (the composite key block * PAIRS + position is unique, so the sort is stable by construction), each one's rank
   in its key's run by a segmented count (tl.associative_scan with a combine that restarts at a new key: exact
   for sorted input); a pair's place = its key's start + the chunk's offset in that key + its rank; stores order
   and pair_t there.
5. _index_tiles, one program per 128 tile ids, per table: tile i's key by a binary search over the tiles' ends
   (searchsorted, right), then (key, start + chunk * QPT, min(count - chunk * QPT, QPT) clamped at 0); the tiles
   past the last real one get count 0 (the kernels return at once), exactly as the torch build.

Sizes: hist is [B*G*ceil(S / CT), NB + 1] int32 (S 65,536, l_sel 64, n_sel 16, B*G 2: 1,024 x 1,025, 4 MB).
Measured: op counts in benchmarks/bench_ops.py (CPU, interpreter). GPU: not run yet (this module is new since the
last GPU run): its correctness on a GPU is gpu_kernels.yaml's kernel tests, its time is not measured.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.attention.kernels.aot import AotCase

PAIRS = 2048  # pairs per chunk (CT queries x NS_PAD slots): one tl.sort of 2,048 int32 per program
NUM_WARPS = 4
BLOCK_KEYS = 1024  # keys per program of the column scan, per step of the key scan
BLOCK_TILES = 128  # tile ids per program of the tile tables
_BIG = 2**31 - 1  # the sort key of a padding element (past S or past n_sel): sorts last, never stored


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _ns_pad(n_sel: int) -> int:
    return max(1, triton.next_power_of_2(n_sel))


def supported(s: int, n_sel: int, nb: int) -> str | None:
    """Why this build cannot index these shapes (None: it can): the composite sort key (NB + 1) * PAIRS must fit
    int32 and a query's slots one chunk."""
    if _ns_pad(n_sel) > PAIRS:
        return f"n_sel {n_sel} > {PAIRS} pairs per chunk"
    if (nb + 2) * PAIRS >= 2**31:
        return f"{nb} key blocks x {PAIRS} pairs per chunk overflow the int32 sort key"
    return None


# ------------------------------------------------------------------------------------------------ jit code
@triton.jit
def _run_count(k1, c1, k2, c2):
    """Combine of a segmented count over SORTED keys: (last key, trailing run length). Exact for sorted input:
    when the left part's last key equals the right part's last key, the whole right part is that key."""
    return k2, c2 + tl.where(k1 == k2, c1, 0)


@triton.jit
def _chunk_pairs(BLOCKS, c, S, NB, CPB, N_SEL: tl.constexpr, NS_PAD: tl.constexpr, PAIRS_: tl.constexpr):
    """Chunk c's pairs, position li = query x NS_PAD + slot: (li, valid mask (inside S and n_sel), block (NB for
    an empty slot))."""
    CT: tl.constexpr = PAIRS_ // NS_PAD
    bg = c // CPB
    li = tl.arange(0, PAIRS_)
    t = (c % CPB) * CT + li // NS_PAD
    slot = li % NS_PAD
    valid = (t < S) & (slot < N_SEL)
    blk = tl.load(BLOCKS + (bg.to(tl.int64) * S + t) * N_SEL + slot, mask=valid, other=-1).to(tl.int32)
    return li, valid, tl.where(blk >= 0, blk, NB)


@triton.jit
def _sorted_chunk(BLOCKS, c, S, NB, CPB, N_SEL: tl.constexpr, NS_PAD: tl.constexpr, PAIRS_: tl.constexpr):
    """The chunk's pairs sorted by (block, position): (sorted composite keys, their block (NB = empty), the
    forward run rank from 1, valid mask)."""
    li, valid, j = _chunk_pairs(BLOCKS, c, S, NB, CPB, N_SEL, NS_PAD, PAIRS_)
    srt = tl.sort(tl.where(valid, j * PAIRS_ + li, 2**31 - 1))
    key = srt // PAIRS_
    ones = tl.full([PAIRS_], 1, tl.int32)
    _, rank = tl.associative_scan((key, ones), 0, _run_count)
    return srt, key, rank, srt != 2**31 - 1


@triton.jit
def _index_hist(BLOCKS, HIST, S, NB, CPB, W, N_SEL: tl.constexpr, NS_PAD: tl.constexpr, PAIRS_: tl.constexpr,
                ZERO_ROW: tl.constexpr = False, BK: tl.constexpr = 1024):
    """Chunk c's histogram, row c of HIST (this program's alone). ZERO_ROW (the selected branch's "fused" host
    choice): the program zeroes its row first, BK columns a step, then a barrier orders those stores before its
    atomics (bar.sync orders a CTA's global memory accesses among its threads), in place of a zero-filled HIST."""
    c = tl.program_id(0)
    _, valid, j = _chunk_pairs(BLOCKS, c, S, NB, CPB, N_SEL, NS_PAD, PAIRS_)
    if ZERO_ROW:
        for w0 in range(0, W, BK):
            cols = w0 + tl.arange(0, BK)
            tl.store(HIST + c.to(tl.int64) * W + cols, tl.zeros([BK], tl.int32), mask=cols < W)
        tl.debug_barrier()
    tl.atomic_add(HIST + c.to(tl.int64) * W + j, 1, mask=valid, sem="relaxed")  # integer adds: deterministic


@triton.jit
def _index_colscan(HIST, COUNTS, CPB, W, BK: tl.constexpr):
    bg = tl.program_id(0)
    jb = tl.program_id(1) * BK + tl.arange(0, BK)
    m = jb < W
    run = tl.zeros([BK], tl.int32)
    for cc in range(0, CPB):
        row = (bg * CPB + cc).to(tl.int64) * W
        h = tl.load(HIST + row + jb, mask=m, other=0)
        tl.store(HIST + row + jb, run, mask=m)  # in place: the chunk's offset within each key
        run += h
    tl.store(COUNTS + bg * W + jb, run, mask=m)


@triton.jit
def _index_keyscan(COUNTS, START, TEND_F, TEND_B, NBG, NB, W, QPT_F, QPT_B, BK: tl.constexpr):
    n_keys = NBG * NB
    carry = 0
    carry_f = 0
    carry_b = 0
    for k0 in range(0, n_keys, BK):
        k = k0 + tl.arange(0, BK)
        m = k < n_keys
        at = (k // NB) * W + k % NB
        cnt = tl.load(COUNTS + at, mask=m, other=0)
        tl.store(START + at, carry + tl.cumsum(cnt, 0) - cnt, mask=m)
        carry += tl.sum(cnt, 0)
        tf = (cnt + QPT_F - 1) // QPT_F
        tl.store(TEND_F + k, carry_f + tl.cumsum(tf, 0), mask=m)
        carry_f += tl.sum(tf, 0)
        tb = (cnt + QPT_B - 1) // QPT_B
        tl.store(TEND_B + k, carry_b + tl.cumsum(tb, 0), mask=m)
        carry_b += tl.sum(tb, 0)
    for b0 in range(0, NBG, BK):  # the empty slots: after every key, group by group
        bg = b0 + tl.arange(0, BK)
        m = bg < NBG
        cnt = tl.load(COUNTS + bg * W + NB, mask=m, other=0)
        tl.store(START + bg * W + NB, carry + tl.cumsum(cnt, 0) - cnt, mask=m)
        carry += tl.sum(cnt, 0)


@triton.jit
def _index_scatter(BLOCKS, OFF, START, ORDER, PAIR_T, S, NB, CPB, W, N_SEL: tl.constexpr, NS_PAD: tl.constexpr,
                   PAIRS_: tl.constexpr):
    c = tl.program_id(0)
    srt, key, rank, ok = _sorted_chunk(BLOCKS, c, S, NB, CPB, N_SEL, NS_PAD, PAIRS_)
    CT: tl.constexpr = PAIRS_ // NS_PAD
    bg = c // CPB
    li = srt % PAIRS_
    t = (c % CPB) * CT + li // NS_PAD
    f = (bg * S + t) * N_SEL + li % NS_PAD
    key = tl.where(ok, key, 0)
    pos = tl.load(START + bg * W + key, mask=ok, other=0) + tl.load(OFF + c.to(tl.int64) * W + key, mask=ok,
                                                                   other=0) + rank - 1
    tl.store(ORDER + pos, f, mask=ok)
    tl.store(PAIR_T + pos, t, mask=ok)


@triton.jit
def _index_tiles(COUNTS, START, TEND, TAB, n_keys, NB, W, n_tiles, per_tile, n_steps, BT: tl.constexpr):
    tid = tl.program_id(0) * BT + tl.arange(0, BT)
    m = tid < n_tiles
    lo = tl.zeros([BT], tl.int32)
    hi = tl.zeros([BT], tl.int32) + n_keys
    for _ in range(0, n_steps):  # searchsorted(tile_end, tid, right=True): the first key whose tiles end past tid
        go = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(TEND + mid, mask=go, other=0)
        right = go & (v <= tid)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(go & (v > tid), mid, hi)
    key = tl.minimum(lo, n_keys - 1)
    at = (key // NB) * W + key % NB
    cnt = tl.load(COUNTS + at, mask=m, other=0)
    tiles = (cnt + per_tile - 1) // per_tile
    chunk = tid - (tl.load(TEND + key, mask=m, other=0) - tiles)
    start = tl.load(START + at, mask=m, other=0) + chunk * per_tile
    n = tl.minimum(tl.maximum(cnt - chunk * per_tile, 0), per_tile)
    tl.store(TAB + tid, key, mask=m)
    tl.store(TAB + n_tiles + tid, start, mask=m)
    tl.store(TAB + 2 * n_tiles + tid, n, mask=m)


# ------------------------------------------------------------------------------------------------ host side
def build_index(blocks: torch.Tensor, l_sel: int, qpt_fwd: int, qpt_bwd: int, n_tiles_fwd: int, n_tiles_bwd: int,
                zero_in_kernel: bool = False):
    """(order, pair_t, fwd tile table, bwd tile table) of blocks [B, G, S, n_sel] int32 or int64 (_chunk_pairs
    converts each loaded index to int32), contiguous; see the module docstring. The caller checks `supported`
    first. zero_in_kernel (the selected branch's "fused" host choice): _index_hist zeroes its own row of the
    histogram (ZERO_ROW) instead of torch.zeros: no aten op at all."""
    b, g, s, n_sel = blocks.shape
    nb = _cdiv(s, l_sel)
    nbg, n_keys = b * g, b * g * nb
    ns_pad = _ns_pad(n_sel)
    cpb = _cdiv(s, PAIRS // ns_pad)
    w = nb + 1
    dev = blocks.device
    hist = (torch.empty if zero_in_kernel else torch.zeros)(nbg * cpb, w, dtype=torch.int32, device=dev)
    counts = torch.empty(nbg, w, dtype=torch.int32, device=dev)
    start = torch.empty(nbg, w, dtype=torch.int32, device=dev)
    tend = torch.empty(2, n_keys, dtype=torch.int32, device=dev)
    order = torch.empty(blocks.numel(), dtype=torch.int32, device=dev)
    pair_t = torch.empty(blocks.numel(), dtype=torch.int32, device=dev)
    consts = dict(N_SEL=n_sel, NS_PAD=ns_pad, PAIRS_=PAIRS, num_warps=NUM_WARPS)
    if zero_in_kernel:
        _index_hist[(nbg * cpb,)](blocks, hist, s, nb, cpb, w, ZERO_ROW=True, BK=BLOCK_KEYS, **consts)
    else:
        _index_hist[(nbg * cpb,)](blocks, hist, s, nb, cpb, w, **consts)
    _index_colscan[(nbg, _cdiv(w, BLOCK_KEYS))](hist, counts, cpb, w, BK=BLOCK_KEYS, num_warps=NUM_WARPS)
    _index_keyscan[(1,)](counts, start, tend[0], tend[1], nbg, nb, w, qpt_fwd, qpt_bwd, BK=BLOCK_KEYS,
                         num_warps=NUM_WARPS)
    _index_scatter[(nbg * cpb,)](blocks, hist, start, order, pair_t, s, nb, cpb, w, **consts)
    tables = []
    for i, (per_tile, n_tiles) in enumerate(((qpt_fwd, n_tiles_fwd), (qpt_bwd, n_tiles_bwd))):
        tab = torch.empty(3, n_tiles, dtype=torch.int32, device=dev)
        _index_tiles[(_cdiv(n_tiles, BLOCK_TILES),)](counts, start, tend[i], tab, n_keys, nb, w, n_tiles, per_tile,
                                                     n_keys.bit_length(), BT=BLOCK_TILES, num_warps=NUM_WARPS)
        tables.append(tab)
    return order, pair_t, tables[0], tables[1]


def aot_cases() -> list:
    """Every index kernel at the model's n_sel (16) and the tests' (3), and the two that read the block lists with
    int64 lists at 16; block sizes are fixed. Integer work only: no tensor-core instruction expected."""
    i32 = "*i32"
    cases = []

    def add(name, fn, sig, constexprs, hidden=None, choice=""):  # hidden: constexprs at their defaults, unlabelled
        label = f"index_{name}[" + ",".join(f"{k}={v}" for k, v in constexprs.items()) + "]"
        constexprs = {**constexprs, **(hidden or {})}
        sig = {**sig, **{k: "constexpr" for k in constexprs}}
        cases.append(AotCase(name=label, fn=fn, signature=sig, constexprs=constexprs, num_warps=NUM_WARPS,
                             num_stages=1, tensor_cores=False, choice=choice))

    ints = lambda *names: {n: "i32" for n in names}  # noqa: E731
    # int64 block lists at the model's n_sel: what the selected branch's "fused" host choice hands the build
    for n_sel, blocks in ((16, i32), (3, i32), (16, "*i64")):
        consts = dict(N_SEL=n_sel, NS_PAD=_ns_pad(n_sel), PAIRS_=PAIRS)
        tag = "" if blocks == i32 else "_i64"
        # the fused choice's build (int64 lists) zeroes its histogram rows in _index_hist
        zero = {"ZERO_ROW": True, "BK": BLOCK_KEYS} if tag else {}
        choice = "HOST_CHOICE fused" if tag else ""
        add("hist" + tag, _index_hist, {"BLOCKS": blocks, "HIST": i32, **ints("S", "NB", "CPB", "W")},
            {**consts, **zero}, hidden=None if tag else {"ZERO_ROW": False, "BK": BLOCK_KEYS}, choice=choice)
        add("scatter" + tag, _index_scatter, {"BLOCKS": blocks, "OFF": i32, "START": i32, "ORDER": i32,
                                              "PAIR_T": i32, **ints("S", "NB", "CPB", "W")}, consts, choice=choice)
    add("colscan", _index_colscan, {"HIST": i32, "COUNTS": i32, **ints("CPB", "W")}, dict(BK=BLOCK_KEYS))
    add("keyscan", _index_keyscan, {"COUNTS": i32, "START": i32, "TEND_F": i32, "TEND_B": i32,
                                    **ints("NBG", "NB", "W", "QPT_F", "QPT_B")}, dict(BK=BLOCK_KEYS))
    add("tiles", _index_tiles, {"COUNTS": i32, "START": i32, "TEND": i32, "TAB": i32,
                                **ints("n_keys", "NB", "W", "n_tiles", "per_tile", "n_steps")}, dict(BT=BLOCK_TILES))
    return cases
