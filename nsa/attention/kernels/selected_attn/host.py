"""Triton kernels of NSA's selected branch: block-sparse attention over each query's chosen key blocks.

    selected_attention(q, k, v, blocks, l_sel, loop="kv", bwd_tiles=BWD_TILES) -> o

q [B, H, S, d_k]; k [B, G, S, d_k]; v [B, G, S, d_v] (any strides with a unit last stride, typically transposed
views of [B, S, *, d] storage); blocks [B, G, S, n_sel] integer block indices per (sequence, group, query), -1 for
an empty slot, as nsa.attention.selection.choose_blocks returns them. Query t of head h (group h // hpg) attends to
the keys p <= t of its group's listed blocks (block j = keys [j*l_sel, (j+1)*l_sel)); scale 1/sqrt(d_k). Result
o [B, H, S, d_v] in q's dtype (a transposed view of [B, S, H, d_v] storage), equal to
naive.selected_attention(q, k, v, selection_ranges_v2(blocks, arange(S), l_sel), l_sel); differentiable in q,
k, v. The kernels need none of choose_blocks' guarantees (order, forced blocks): any list of distinct blocks
0 <= j <= t // l_sel works, and a query with no block gets 0 (entries >= ceil(S / l_sel) or repeated ones give
wrong results: checking them would need a host synchronisation). Softmax statistics and accumulation in fp32;
inputs fp32 (interpreter), bf16/fp16 (GPU). The entry points are the custom ops nsa::selected_attention_fwd /
_bwd (fake and autograd registered: opaque to torch.compile, capturable in a CUDA graph; no host synchronisation).

Design
------
Inverted index (_build_index, built once per forward, sync-free, kept for backward): every non-empty (query, slot)
pair gets the key (b*G + g)*NB + block (NB = ceil(S / l_sel)); one stable torch.sort of the keys lists, per key
block, the queries that chose it in ascending t (`order`: flat pair index ((b*G + g)*S + t)*n_sel + slot of each
sorted pair; `pair_t`: its t). Counts per key by scatter_add_ into a fixed [B*G*NB + 1] buffer, exclusive cumsum
offsets, then a tile table [3, n_tiles] (key, first sorted pair, pairs): each key's list is cut into tiles of QPT
queries, and tile i of a grid bounded by shapes alone (ceil(pairs_max / QPT) + B*G*NB) finds its key by
searchsorted over the cumulative tile counts; tiles past the real count have count 0 and return at once. A fixed
number of torch ops whatever S; no .item(), nonzero, bincount or data-dependent shape. The same index in Triton
(index.py: a chunked counting sort, 1 aten op and 6 launches instead of 53 ops, equal element for element)
is the default on a GPU (NSAConfig.index_build "auto"; the comment above _build_index): qualified on an H100 and
faster there at S 2,048, the same at 65,536.

Tiles are rows of (query, head) pairs: row r of a tile is query r // hpg of the tile's list and head r % hpg (hpg
is a compile-time constant: the divisions are multiply-shifts), so BLOCK_R = 128 rows hold QPT = 128 // hpg
queries x all their hpg heads (hpg = 6: 21 queries, 126 of 128 rows used; hpg is not padded to a power of two).
Every row of a tile meets the same key block, so a tile is one [BLOCK_R, d_k] x [d_k, l_sel] product and one
[BLOCK_R, l_sel] x [l_sel, d_v] product: M >= 64 rows, wgmma on sm_90. The queries' rows are gathered (one d_k
vector per row); keys and values are read once per tile. l_sel, n_sel, hpg and d are compile-time constants
(l_sel = 64, n_sel = 16 in the model); blocks of more than 64 keys are walked 64 at a time.

Forward, loop="kv" (the default; KV-block-outer, FSA-style):
  1. _sel_fwd_kv_stats, one program per tile: scores against the block (masks p <= t, which only bites in a
     query's own block, and p < S), each row's log2-sum-exp2 over the block, stored at the pair's place in
     part [B, G, S, n_sel, hpg] fp32 (-inf for empty slots). No atomics: a pair lies in exactly one tile.
  2. lse = logsumexp of part over the slots (torch) -> [B, G, S, hpg] fp32 (log2 units), saved for backward.
  3. _sel_fwd_kv_out, same grid: recomputes the scores, p = exp2(s - lse) (already normalised), and adds p V
     into an fp32 [B, S, H, d_v] output with relaxed atomics (red.global.add.v4.f32 on sm_90); cast at the end.
  Two QK^T products and one PV per pair (1.5x a single pass) plus pairs * hpg * d_v fp32 atomic adds, but every
  product is a >= 64-row tensor-core tile. Peak extra memory: part (pairs * hpg fp32: 50 MB at S = 65,536,
  B = 1, G = 2, n_sel = 16, hpg = 6; freed before the output pass), the fp32 output (2x the bf16 output), the
  index (2 int32 per pair, 17 MB there): about 2x dense attention's forward, far from a [pairs, hpg, d_v] buffer.
  Output choices (OUT_CHOICES; "auto" = QUALIFIED_OUT, "atomic" = step 3 above): "partial" (issue 31 item 2.4,
  FSA's way) replaces step 3 by _sel_fwd_kv_part, storing each pair's p V without atomics into exactly that
  [pairs, hpg, d_v] fp32 buffer (3.2 GB there), and _sel_fwd_reduce, summing each query's slots into o. Untimed.
  Host glue choices (HOST_CHOICES; "auto" = QUALIFIED_HOST = "torch", steps 1-3 above; issue 31 item 2.6): "fused"
  allocates part without its -inf fill and replaces step 2 (and the output's zero fill) by _sel_fwd_lse, one
  program per 64 (query, head) rows: the log2-sum-exp2 of each row's listed slots (blocks >= 0; the others were
  never written and are not read) and, for the atomic output, zeroes of its fp32 output rows; and the kernels read
  choose_blocks' int64 lists as they are, with no int32 copy (each kernel that reads BLOCKS, the Triton index
  build's included, converts a loaded index to int32: a no-op on the int32 lists the torch choice hands them, whose
  compiles are unchanged). Untimed.
  Tile choices (FWD_TILE_CHOICES; "auto" = QUALIFIED_FWD_TILE = "shipped", the tiles above; issue 31 item 2.4,
  "fewer registers"): "m64_w4" cuts the tile table into 64-row tiles (10 queries x 6 heads at hpg 6) for the three
  passes and runs step 3 (_sel_fwd_kv_out) at that tile on 4 warps (one m64 wgmma warpgroup): 94-95 registers on
  sm_90 ahead of time, 5 CTAs of 4 warps per SM, against 90 and 2 CTAs of 8 warps at the shipped tile (both compiled
  with the strides' 16-divisibility a launch's JIT gives); d_k = d_v = 64 only. Twice the tiles: each key block's K and V are read by twice the
  programs. Untimed.
Forward, loop="query" (the public NSA kernels' order: fla parallel_nsa, XunhaoLai/native-sparse-attention-triton):
  _sel_fwd_query, one program per (sequence, group, query) with the hpg heads as rows, padded to
  HPG_PAD = max(16, pow2(hpg)) for tl.dot (hpg = 6 uses 6 of 16 rows), walks its n_sel blocks with an online
  softmax and writes o and lse directly: one QK^T, no atomics, no index needed, but every product is M = 16
  (mma.sync on sm_90, 10/16 of it wasted at hpg = 6) and each block is re-read by every query that chose it.
The default is "kv": for hpg = 6 its products are 2.7x denser and reach wgmma, which should outweigh the second
QK^T and the atomics; the measurement that decides it is PENDING (no GPU in this session). Both are tested.

Backward (one design for both forward orders; the index is built by both):
  _sel_bwd_delta: delta = rowsum(dO * O) per (query, head), fp32. Then _sel_bwd_kv, KV-block-outer: one program
  per backward chunk = up to bwd_tiles tiles of QPT_bwd = BLOCK_R // hpg queries of one key block (the tile table
  is the forward's, cut at bwd_tiles * QPT_bwd). It reads K and V of the block once and loops over its chunk
  QPT_bwd queries at a time, in transposed form so that the keys are the products' M dimension (64 rows: wgmma on
  sm_90 even though a step has only 32 query rows): s^T = K Q^T, p^T = exp2(s^T - lse), dV += p^T dO,
  dp^T = V dO^T, ds^T = p^T (dp^T - delta), dK += ds^T Q, and dQ = ds K (mma.sync, M = 32) added into an fp32
  dQ with relaxed atomics (a query's dQ sums over blocks held by different programs). At the end it adds its dK
  and dV into fp32 buffers with atomics. Five products per pair, no recomputation beyond FA2's.
  Popular blocks: block 0 is chosen by all S queries, every block j is forced for the 2 * l_sel queries of blocks
  j and j + 1, and importance can make any block popular, so one program per block would serialise up to S
  queries in one program (S = 65,536: 13,000 tile steps). Cutting every list into chunks of bwd_tiles *
  QPT_bwd queries bounds each program's work (hpg = 6, bwd_tiles = 16: 80 queries; block 0 at S = 65,536 becomes
  820 programs) and the fp32 atomics sum the chunks (order-dependent rounding only, not bitwise deterministic).
  The forced blocks (0, previous, own) as a dense band plus only the importance-chosen blocks as the sparse part,
  merged through lse (what naive.py does), is the "band" forced choice (FORCED_CHOICES, beside the shipped
  "sparse", the uniform path above; issue 31 item 2.4): range attention's band kernel (mode BAND with the sink)
  takes the forced blocks, _sel_band_rest packs each query's other listed blocks into min(n_sel, NB) - 3 slots for
  the selected kernels (index, part and tiles 3 of 16 slots smaller), _sel_band_merge merges the two fp32 parts
  through their lse, and each part's backward runs from the merged O and lse (the selected backward's atomics add
  onto the band's fp32 gradients instead of zero-filled buffers). Importance-chosen blocks can be just as popular
  (attention sinks near the start), so the sparse part keeps the chunking; the band saves the per-pair work, index
  entries and atomics of 3 of 16 blocks, for 3 launches more forward (the lists' packing, the band, the merge) and
  2 backward (the band's dQ and dK/dV, whose split partials are summed: 2 ops; the 3 zero fills go). Checked on CPU
  (interpreter, AOT compile, op count); not timed on a GPU.
  dQ choices (DQ_CHOICES, picked by DQ_CHOICE; "auto" = QUALIFIED_DQ, "atomic" until a GPU run qualifies another):
  "atomic" is the above. "query" (issue 31 item 2.3: on an H100 at S = 65,536 _sel_bwd_kv took 7.59 ms against a
  0.50 ms floor, its per-step fp32 dQ atomics the suspect) splits the backward as fla's parallel_nsa and
  XunhaoLai/native-sparse-attention-triton do: _sel_bwd_kv with WITH_DQ = False (dK and dV only), and
  _sel_bwd_dq_query, one program per (sequence, group, query) with the hpg heads as rows (as _sel_fwd_query),
  walking the query's listed blocks (the forward's `blocks`, saved for backward): s = Q K^T, p = exp2(s - lse),
  dp = dO V^T, ds = p (dp - delta), dQ += ds K, stored once in q's dtype. No atomics and no fp32 dQ buffer, but
  two products per pair recomputed (seven instead of five), M = HPG_PAD products (mma.sync on sm_90, wgmma needs
  64 rows), and each block's K and V re-read by every query that lists it (at S = 65,536, B 1, G 2, n_sel 16,
  d 64: ~34 GB of mostly-L2 reads against ~3.2 GB of fp32 atomics). Which is faster is the GPU A/B's question
  (benchmarks/bench_attention.py --sel-dq-choice; reports/aot/selected_bwd_dq.md, registers and CTAs per SM).
  Host glue choice "fused" (HOST_CHOICES): _sel_bwd_delta_zero writes delta and zeroes the fp32 buffers the
  atomics add into (dQ with the atomic dQ choice; dK and dV from the programs of each group's first head) instead
  of three torch.zeros before the kernels, and _sel_cast casts the fp32 dQ, dK and dV to the activation dtype in
  one launch instead of three aten casts (bf16 and fp16 only: in fp32 nothing is cast; the band choice's backward
  likewise): the backward's glue is then that one launch (none in fp32). The forward's fp32 output is still cast
  by torch (one launch, as a kernel of its own would be: nothing reads the output after _sel_fwd_kv_out).

Expected bottleneck (arithmetic only, to be checked): at S = 65,536 (B = 1, G = 2, hpg = 6, d = 64, n_sel = 16:
2.1M pairs) the kv forward does 3.1e11 flops (< 1 ms of tensor cores) but adds 3.2 GB of fp32 atomics into the
output and gathers 1.6 GB of query rows per pass; the backward likewise adds 3.2 GB into dQ. Both loop orders are
likely bound by memory traffic and atomics rather than by the products, so the atomics' cost decides kv vs query.

What to measure on a GPU (H100, bf16, B = 1, H = 12, G = 2, d = 64, l_sel = 64, n_sel = 16, S = 8K..64K, blocks
from choose_blocks on real importance): forward loop="kv" vs loop="query" (triton.testing.do_bench); backward
for bwd_tiles in {4, 8, 16, 32}; BLOCK_R / num_warps around _config's choices; the share of the index build
(torch.sort of B*G*S*n_sel keys) and of the atomics (compare against a variant without them); peak memory
(torch.cuda.max_memory_allocated) against dense SDPA at the same S.
tests/nsa/attention/kernels/test_triton_selected.py runs natively in bf16 when CUDA is present (including CUDA-graph capture and an S = 4096 model-shape check).

Measured
--------
On GPUs: reports/gpu/ (benchmarks/profile_layer.py, benchmarks/bench_selected_kernel.py). Ahead of time (python -m
nsa.attention.kernels.aot; bf16, l_sel = 64, bwd_tiles = 16): every case compiles for sm_80 and sm_90 without spills
under triton 3.9 and 3.6; on sm_90 the forward's products reach wgmma, the backward's M = 32 dQ product stays on
mma.sync beside four wgmma products, and d = 128's backward (BLOCK_N = 32, BLOCK_R = 16, to avoid spills) stays on
mma.sync. hpg > 32, or d = 128 with hpg > 16, are not compiled ahead of time: BLOCK_R grows to pow2(hpg) there and
may spill. Registers and shared memory per case: reports/aot/triton-<version>.md; the dQ choices side by side
(registers, CTAs per SM): reports/aot/selected_bwd_dq.md; the forward's tile choices: reports/aot/
selected_fwd_occupancy.md; the "band" forced choice's own compiles (_sel_band_rest, _sel_band_merge, the band's
range forward and dQ with fp32 outputs: no spills, 40-70 registers for the two small kernels, 168 and 161 for the
band's forward and dQ on sm_90 under 3.9) and its op count: reports/aot/selected_band.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from typing import Optional

import torch

from nsa.attention.kernels.selected_attn import index
from nsa.attention.kernels.aot import AotCase
from nsa.attention.kernels.common import LOG2E, TRITON_HEAD_DIMS, LaunchConfig, dot_precision, interpreting
from nsa.attention.kernels.common import index_build as resolve_index_build

_LN2 = 0.6931471805599453
# Tiles of one key block per backward program (each tile = QPT queries): bounds a popular block's work per program.
BWD_TILES = 16
LOOPS = ("kv", "query")


from nsa.config import resolve_auto
from nsa.attention.kernels.selected_attn.jit import (  # noqa: F401 - the jit code
    _tile_rows, _sel_fwd_kv_stats, _sel_fwd_kv_out, _sel_fwd_query, _sel_bwd_delta, _sel_bwd_kv, _sel_bwd_dq_query,
    _sel_fwd_kv_part, _sel_fwd_reduce, _sel_fwd_lse, _sel_bwd_delta_zero, _sel_band_rest, _sel_band_merge, _sel_cast)
from nsa.attention.kernels.range_attn import host as range_host


# dQ choices side by side (issue 31 item 2.3; the module docstring, "Backward"). "atomic": _sel_bwd_kv adds every
# pair's dQ term into an fp32 dQ with atomics (the shipped backward). "query": _sel_bwd_kv computes dK and dV only
# (WITH_DQ = False) and _sel_bwd_dq_query, one program per (sequence, group, query), sums its query's dQ over the
# listed blocks in registers and stores it once. A choice becomes QUALIFIED_DQ once a GPU run qualifies it: its
# tests on the GPU against float64 (test_selected_dq_choices.py, test_triton_selected.py), memcheck clean, and
# faster than the one before in an alternated A/B of the layer (benchmarks/bench_attention.py --sel-dq-choice).
# "query" has no GPU timing yet (reports/aot/selected_bwd_dq.md: its ahead-of-time compile only).
DQ_CHOICES = ("atomic", "query")
QUALIFIED_DQ = "atomic"  # what "auto" picks: the choice a GPU run has qualified
DQ_CHOICE = "auto"  # the launcher's choice: "auto" or one of DQ_CHOICES (bench_attention sets it for an A/B)


def dq_choice() -> str:
    """The dQ choice in effect (DQ_CHOICE, "auto" = QUALIFIED_DQ), read at each backward launch."""
    name = resolve_auto("selected attention: DQ_CHOICE", DQ_CHOICE, tuple(DQ_CHOICES), QUALIFIED_DQ)
    return name


# Output choices of the kv forward (issue 31 item 2.4, first part). "atomic": _sel_fwd_kv_out adds each pair's p V
# into an fp32 [B, S, H, d_v] output with atomics (the shipped forward; that accumulator is larger than L2 at long S).
# "partial" (FSA's way): _sel_fwd_kv_part stores each pair's p V at the pair's place in a [pairs, hpg, d_v] fp32
# buffer (no atomics; pairs * hpg * d_v * 4 bytes, ~3.2 GB at S = 65,536, B 1, G 2, n_sel 16, hpg 6, d 64, against
# the 0.2 GB fp32 output) and _sel_fwd_reduce sums each query's slots into o. Same qualification rule as DQ_CHOICES
# (GPU tests, memcheck, an alternated A/B: bench_attention.py --sel-out-choice); no GPU timing yet.
OUT_CHOICES = ("atomic", "partial")
QUALIFIED_OUT = "atomic"  # what "auto" picks: the choice a GPU run has qualified
OUT_CHOICE = "auto"  # the launcher's choice: "auto" or one of OUT_CHOICES


def out_choice() -> str:
    """The kv forward's output choice in effect (OUT_CHOICE, "auto" = QUALIFIED_OUT), read at each forward launch."""
    name = resolve_auto("selected attention: OUT_CHOICE", OUT_CHOICE, tuple(OUT_CHOICES), QUALIFIED_OUT)
    return name


# Host glue choices (issue 31 item 2.6: fold zero fills and partial sums into the kernels). "torch": the shipped
# glue, in aten ops around the kernels: the kv forward fills part with -inf, reduces it to lse in torch (logsumexp
# and two scalings: 4 ops) and zeroes the fp32 output for the atomics (1 op), copies the block lists to int32 (1 op)
# and the Triton index build zeroes its histogram (1 op); the backward zeroes its fp32 dQ (atomic dQ choice), dK and
# dV (3 ops) and casts them to a bf16/fp16 activation dtype (3 ops; none in fp32). "fused": _sel_fwd_lse reduces
# part to lse over each query's listed slots (so part needs no fill) and zeroes the output rows the atomics add
# into; the kernels read choose_blocks' int64 lists as they are (_block_lists); _index_hist zeroes its own rows
# (ZERO_ROW); _sel_bwd_delta_zero writes delta and zeroes dQ, dK and dV; _sel_cast casts dQ, dK and dV in one launch
# (_cast_fp32). 10 aten ops fewer in fp32 with the Triton index build (13 in bf16), one launch more (the lse; two in
# bf16: the cast), the same function (lse to rounding: log2-sum-exp2 in one pass instead of torch's natural-log
# logsumexp; the casts bit for bit, round to nearest even, checked in the interpreter). Same qualification rule as
# DQ_CHOICES (GPU tests against float64, memcheck, an alternated A/B of the layer: bench_attention.py
# --sel-host-choice); no GPU timing yet.
HOST_CHOICES = ("torch", "fused")
QUALIFIED_HOST = "torch"  # what "auto" picks: the choice a GPU run has qualified
HOST_CHOICE = "auto"  # the launcher's choice: "auto" or one of HOST_CHOICES


def host_choice() -> str:
    """The host glue choice in effect (HOST_CHOICE, "auto" = QUALIFIED_HOST), read at each forward and backward
    launch."""
    name = resolve_auto("selected attention: HOST_CHOICE", HOST_CHOICE, tuple(HOST_CHOICES), QUALIFIED_HOST)
    return name


def _block_lists(blocks: torch.Tensor) -> torch.Tensor:
    """blocks as the kernels read them: an int32 copy ("torch" host choice: the shipped _to_copy), or, under "fused",
    the int32 or int64 list as given (choose_blocks' int64: every kernel that reads BLOCKS, the index build's
    included, converts each loaded index to int32, so no copy launches); contiguous either way."""
    if host_choice() == "fused" and blocks.dtype in (torch.int32, torch.int64):
        return blocks.contiguous()
    return blocks.to(torch.int32).contiguous()


CAST_BLOCK = 1024  # elements per program of _sel_cast (no products: memory-bound)


def _dense(t: torch.Tensor) -> bool:
    """t's elements fill one span of memory without gaps or overlaps, in some order of its dims."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _cast_fp32(bufs, dtype: torch.dtype) -> tuple:
    """The fp32 buffers `bufs` (at most three) in `dtype`, cast by one _sel_cast launch ("fused" host choice) in
    place of one aten cast each; a buffer already in `dtype` is returned as it is (in fp32 nothing launches, as
    .to() launches nothing). Each result has its buffer's strides; a buffer that is not dense takes .to()."""
    todo = [i for i, x in enumerate(bufs) if x.dtype != dtype]
    out = list(bufs)
    for i in list(todo):
        if bufs[i].dtype != torch.float32 or not _dense(bufs[i]):
            out[i] = bufs[i].to(dtype)
            todo.remove(i)
    if not todo:
        return tuple(out)
    for i in todo:
        out[i] = torch.empty_like(bufs[i], dtype=dtype)
    bf16 = dtype == torch.bfloat16
    args = []
    for i in todo + [todo[0]] * (3 - len(todo)):  # unused slots repeat the first buffer (never launched: grid)
        args += [bufs[i], out[i].view(torch.int16) if bf16 else out[i], bufs[i].numel()]
    n = max(bufs[i].numel() for i in todo)
    _sel_cast[(max(1, _cdiv(n, CAST_BLOCK)), len(todo))](*args, BLOCK=CAST_BLOCK, BF16_RNE=bf16, num_warps=4)
    return tuple(out)


# Forward tile choices of the kv forward (issue 31 item 2.4, "fewer registers"). "shipped": _config's tile (128 rows
# of (query, head), 8 warps for the output pass). "m64_w4": a 64-row tile (10 queries x 6 heads at hpg 6: twice the
# tiles, each key block's K and V read by twice as many programs) for all three forward kernels, since the stats and
# output passes share one tile table, and the output pass on 4 warps, one m64 wgmma warpgroup. For d_k = d_v = 64
# only (other head dims keep _config's). Ahead of time (bf16, hpg 6, d 64, reports/aot/selected_fwd_occupancy.md,
# triton 3.9, the strides' 16-divisibility stated as the JIT infers it): _sel_fwd_kv_out takes 90 registers on sm_90
# at the shipped tile (2 CTAs of 8 warps: 16 warps an SM; 162 and 1 CTA without the hint) and 94-95 at m64_w4's (5
# CTAs of 4 warps: 20 warps), no spills on sm_80 or sm_90, wgmma on sm_90. (A kernel of its own stating its rows'
# alignment with tl.multiple_of compiled the same, once the AOT cases gave the hint: one kernel serves both.) (128
# rows on 4 warps, 122 registers on sm_90, spills on sm_80 at hpg 16: not offered.) Same qualification rule as
# DQ_CHOICES (its tests on the GPU, memcheck, an alternated A/B: bench_attention.py --sel-tile-choice); no GPU has
# run it.
FWD_TILE_CHOICES: dict[str, Optional[LaunchConfig]] = {
    "shipped": None,
    "m64_w4": LaunchConfig(64, 64, 4, 1),
}
QUALIFIED_FWD_TILE = "shipped"  # what "auto" picks: the choice a GPU run has qualified
FWD_TILE_CHOICE = "auto"  # the launcher's choice: "auto" or a key of FWD_TILE_CHOICES


def fwd_tile_choice() -> str:
    """The kv forward's tile choice in effect (FWD_TILE_CHOICE, "auto" = QUALIFIED_FWD_TILE), read at each forward
    launch."""
    return resolve_auto("selected attention: FWD_TILE_CHOICE", FWD_TILE_CHOICE, tuple(FWD_TILE_CHOICES),
                        QUALIFIED_FWD_TILE)


def _lean_tile(hpg: int, d_k: int, d_v: int) -> Optional[LaunchConfig]:
    """The output pass's launch under the tile choice in effect, None where _config's shipped tile runs (the
    "shipped" choice, or head dims other than 64)."""
    cfg = FWD_TILE_CHOICES[fwd_tile_choice()]
    if cfg is None or not d_k == d_v == 64:
        return None
    return cfg._replace(block_m=max(cfg.block_m, _pow2(hpg)))


# Forced-block choices (issue 31 item 2.4, "the forced blocks through the band kernel"; the module docstring's
# "Backward" section). "sparse": every listed block, forced or chosen, goes through the selected kernels (the shipped
# path). "band": the forced blocks (block 0, the previous and the own block: choose_blocks' +inf scores) go through
# range attention's band kernel (mode BAND with the sink: keys [0, l_sel) and [(t // l_sel - 1) * l_sel, t]), and
# only the other listed blocks through the selected kernels (_sel_band_rest packs them into min(n_sel, NB) - 3 slots:
# 3 of n_sel fewer pairs in the tile tables, the kernels and the atomics); the two parts are merged exactly through
# their log-sum-exp (_sel_band_merge) and each part's backward reads the merged O and lse, so its gradient is its
# exact share (the selected backward's atomics add onto the band's fp32 gradients, cast once). A block is counted
# once: a forced block listed by importance too is dropped from the sparse list. It requires every forced block in
# the list (choose_blocks' lists with n_sel >= 3: the choice refuses n_sel < 3) and the range kernels' shapes (d in
# 32/64/128, hpg <= 32); for a list without a forced block it differs from "sparse" (the band attends it anyway).
# Where no block can be other than forced (n_sel = 3, or S <= 3 * l_sel) the band kernel alone runs. Checked on CPU
# only (Triton's interpreter in fp32 against float64, tests/nsa/attention/kernels/test_selected_band_choice.py; the
# AOT compile, reports/aot/selected_band.md; the op count, benchmarks/bench_ops.py --sel-forced-choice); no GPU has
# run it, so nothing is known of its speed. Same qualification rule as DQ_CHOICES (bench_attention.py
# --sel-forced-choice).
FORCED_CHOICES = ("sparse", "band")
QUALIFIED_FORCED = "sparse"  # what "auto" picks: the choice a GPU run has qualified
FORCED_CHOICE = "auto"  # the launcher's choice: "auto" or one of FORCED_CHOICES


def forced_choice() -> str:
    """The forced-block choice in effect (FORCED_CHOICE, "auto" = QUALIFIED_FORCED), read at each forward launch."""
    return resolve_auto("selected attention: FORCED_CHOICE", FORCED_CHOICE, tuple(FORCED_CHOICES), QUALIFIED_FORCED)


FORCED_BLOCKS = 3  # block 0, the previous and the own block (nsa.attention.selection._scores)

# The selected backward's warps (2026-12-01; _sel_bwd_kv was the layer's largest kernel at S 65,536 on an H200: 7.59
# ms, 6.6% of its floor, at one CTA per SM). "shipped": _config's 8 warps. "w4": 4 warps, one warpgroup for the
# products whose M is the 64 keys of a block: ahead of time (triton 3.6, sm_90, bf16, hpg 6, d 64) 188 registers
# against 141, so 2 CTAs of 4 warps an SM against 1 of 8 (the same warps, from two key blocks' programs at once);
# without dQ (the "query" dQ choice) 149 against 127, 3 CTAs of 4 against 2 of 8. No spills on sm_80 or sm_90, wgmma
# on sm_90 (reports/aot/triton-3.6.md, triton-3.9.md). The same tiles and tile table: only the launch changes. d_k =
# d_v = 64 and hpg <= 16 only (other shapes keep _config's warps). Same qualification rule as DQ_CHOICES; no GPU has
# run it.
BWD_WARPS_CHOICES: dict[str, Optional[int]] = {"shipped": None, "w4": 4}
QUALIFIED_BWD_WARPS = "shipped"  # what "auto" picks: the choice a GPU run has qualified
BWD_WARPS_CHOICE = "auto"  # the launcher's choice: "auto" or a key of BWD_WARPS_CHOICES


def bwd_warps_choice() -> str:
    """The selected backward's warps choice in effect (BWD_WARPS_CHOICE, "auto" = QUALIFIED_BWD_WARPS), read at
    each backward launch."""
    return resolve_auto("selected attention: BWD_WARPS_CHOICE", BWD_WARPS_CHOICE, tuple(BWD_WARPS_CHOICES),
                        QUALIFIED_BWD_WARPS)


def _bwd_warps(hpg: int, d_k: int, d_v: int, shipped: int) -> int:
    """_sel_bwd_kv's num_warps under the choice in effect: `shipped` (the launch's own, _config's or what
    benchmarks/tune_kernels.py puts in its place) where the choice is "shipped" or does not apply."""
    warps = BWD_WARPS_CHOICES[bwd_warps_choice()]
    if warps is None or not (d_k == d_v == 64 and hpg <= 16):
        return shipped
    return warps


def _n_rest(n_sel: int, s: int, l_sel: int) -> int:
    """Slots of the "band" choice's sparse list: the blocks a list of distinct blocks holding its forced ones can
    list besides them (0: the band kernel alone)."""
    return max(0, min(n_sel, _cdiv(s, l_sel)) - FORCED_BLOCKS)


# ------------------------------------------------------------------------------------------------ launch configs
def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _cdiv(a, b):
    return -(-a // b)


def _block_n(l_sel: int, cap: int = 64) -> int:
    """Keys per product: the block (>= 16 for tl.dot), at most `cap`; larger blocks are walked in steps."""
    return min(cap, max(16, _pow2(l_sel)))


def _hpg_pad(hpg: int) -> int:
    return max(16, _pow2(hpg))


def _config(kind: str, hpg: int, d_k: int, d_v: int) -> LaunchConfig:
    """The launch of a KV-outer kernel: block_m = BLOCK_R rows of (query, head), block_n = BLOCK_N keys, num_warps,
    num_stages.

    kind: 'stats' and 'out' (the forward passes, which share one tile table: same BLOCK_R, the tile choice's rows
    under FWD_TILE_CHOICES) or 'bwd'. Chosen from the AOT compile (no spills on sm_80 and sm_90, wgmma on sm_90 where
    M >= 64), not yet from GPU timings.
    """
    d = max(d_k, d_v)
    if kind in ("stats", "out"):
        block_r, block_n = (128, 64) if d <= 64 else (64, 64)
        warps = 4 if kind == "stats" and d <= 64 else 8
        lean = _lean_tile(hpg, d_k, d_v)
        if lean is not None:  # the tile choice's rows: the passes share one tile table (the output's launch: lean)
            block_r = lean.block_m
    else:
        block_r, block_n, warps = (32, 64, 8) if d <= 64 else (16, 32, 8)
    return LaunchConfig(max(block_r, _pow2(hpg)), block_n, warps, 1)


def _reduce_tile(hpg: int) -> tuple[int, int]:
    """_sel_fwd_reduce's (HPG_PAD, BLOCK_T): heads padded to a power of two, 64 rows of (query, head) a program."""
    hpg_pad = _pow2(hpg)
    return hpg_pad, max(1, 64 // hpg_pad)


def _query_warps(d_k: int, d_v: int) -> int:
    return 4 if max(d_k, d_v) <= 64 else 8


def _dq_query_config(l_sel: int, d_k: int, d_v: int) -> tuple[int, int]:
    """_sel_bwd_dq_query's (BLOCK_N, num_warps), from the AOT compile (reports/aot/selected_bwd_dq.md), not from GPU
    timings: d <= 64, 64 keys and 8 warps (hpg 6 d 64: 64 registers, 4 CTAs per SM); d = 128, 32 keys and 4 warps
    (94-96 registers). Both were picked from the compile without the strides' 16-divisibility, where 4 warps at d 64
    spilled 4 bytes on sm_80 and 64 keys at d 128 took 255 registers; with it (what a launch compiles) neither holds:
    4 warps at d 64 take 86-94 registers, 64 keys at d 128 80-140, no spills. Kept until a GPU timing decides."""
    if max(d_k, d_v) <= 64:
        return _block_n(l_sel, 64), 8
    return _block_n(l_sel, 32), 4


# ------------------------------------------------------------------------------------------------ index
def _n_tiles(b, g, s, n_sel, l_sel, per_tile):
    """Tiles of `per_tile` pairs that any selection of these shapes can need: sum_key ceil(count / per_tile)."""
    nb = _cdiv(s, l_sel)
    pairs_max = b * g * s * min(n_sel, nb)
    return _cdiv(pairs_max, per_tile) + b * g * nb


def _tile_table(counts, pair_start, per_tile, n_tiles):
    """[3, n_tiles] int32 (key, first sorted pair, pairs) of the tiles of `per_tile` pairs; count 0 = unused."""
    n_keys = counts.shape[0]
    tiles = torch.div(counts + (per_tile - 1), per_tile, rounding_mode="floor")
    tile_end = torch.cumsum(tiles, 0)
    tid = torch.arange(n_tiles, device=counts.device)
    key = torch.searchsorted(tile_end, tid, right=True).clamp_(max=n_keys - 1)
    chunk = tid - (tile_end - tiles)[key]
    start = pair_start[key] + chunk * per_tile
    cnt = (counts[key] - chunk * per_tile).clamp_(0, per_tile)  # 0 past the last real tile (chunk too large)
    return torch.stack((key, start, cnt)).to(torch.int32)


# Which build of the inverted index the forward takes: "torch" (53 aten ops) or "triton" (index.py: 1 aten op and
# 6 Triton launches), the same tensors element for element. NSAConfig.index_build chooses it (model.index_build in a
# config, NSA_INDEX_BUILD at the trainer's start-up: nsa/toggles.py, read once and passed down); "auto", the default,
# is the Triton build on a GPU and the torch build under Triton's interpreter, where tl.sort of a 2,048-pair chunk
# takes seconds a call. The Triton build ran clean on an H100 (gpu_kernels.yaml, 2026-11-26: its tests, `qualify
# --kernels index` under memcheck in 18 of 18 cases, the 125M trainer with CUDA graphs) and, alternated with the
# torch build (A B A B, reports/gpu/2026-11-26-h100/run6), the layer's forward+backward at S 2,048 took 5.71 and 5.65
# ms with it against 6.51 and 6.28 ms (medians of 10), the same at 65,536 (46.96 / 46.84 against 46.77 / 46.93 ms).
# benchmarks/bench_ops.py counts the layer's ops with either build.


def _build_index(blocks: torch.Tensor, l_sel: int, qpt_fwd: int, qpt_bwd: int, build: str = "auto"):
    """Sync-free inverted index of blocks [B, G, S, n_sel] (int32 or int64, contiguous).

    Returns order [pairs] int32 (flat pair index ((b*G + g)*S + t)*n_sel + slot of each pair, sorted by key block,
    empty slots last), pair_t (the query t of each sorted pair) and the forward and backward tile tables. `build`
    (common.index_build): "auto", "torch" or "triton"; shapes the Triton build cannot index take the torch one, and
    so do blocks its kernels cannot read (not on a GPU, outside Triton's interpreter: a GPU machine's CPU tensors).
    """
    build = resolve_index_build(build)
    if build == "triton" and blocks.device.type != "cuda" and not interpreting():
        build = "torch"
    b, g, s, n_sel = blocks.shape
    if build == "triton" and index.supported(s, n_sel, _cdiv(s, l_sel)) is None:
        return index.build_index(blocks, l_sel, qpt_fwd, qpt_bwd, _n_tiles(b, g, s, n_sel, l_sel, qpt_fwd),
                                 _n_tiles(b, g, s, n_sel, l_sel, qpt_bwd), zero_in_kernel=host_choice() == "fused")
    return _build_index_torch(blocks, l_sel, qpt_fwd, qpt_bwd)


def _build_index_torch(blocks: torch.Tensor, l_sel: int, qpt_fwd: int, qpt_bwd: int):
    """_build_index in torch ops: one stable sort of the pairs' keys, scatter_add_ counts, cumsum offsets, and per
    tile table searchsorted over the cumulative tile counts (see the module docstring)."""
    b, g, s, n_sel = blocks.shape
    nb = _cdiv(s, l_sel)
    n_keys = b * g * nb
    dev = blocks.device
    base = (torch.arange(b * g, device=dev, dtype=torch.int32) * nb).view(b, g, 1, 1)
    key = torch.where(blocks >= 0, blocks + base, n_keys).reshape(-1)
    _, order = torch.sort(key, stable=True)
    pair_t = torch.div(order, n_sel, rounding_mode="floor").remainder_(s).to(torch.int32)
    counts = torch.zeros(n_keys + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key.long(), torch.ones_like(order))
    counts = counts[:n_keys]
    pair_start = torch.cumsum(counts, 0) - counts
    fwd = _tile_table(counts, pair_start, qpt_fwd, _n_tiles(b, g, s, n_sel, l_sel, qpt_fwd))
    bwd = _tile_table(counts, pair_start, qpt_bwd, _n_tiles(b, g, s, n_sel, l_sel, qpt_bwd))
    return order.to(torch.int32), pair_t, fwd, bwd


def _check(q, k, v, blocks, l_sel, loop, bwd_tiles):
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
    if bwd_tiles < 1:
        raise ValueError(f"bwd_tiles must be >= 1, got {bwd_tiles}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or blocks.dim() != 4:
        raise ValueError("q, k, v, blocks must be 4-d: [B, H, S, d], [B, G, S, d], [B, G, S, d], [B, G, S, n_sel]")
    b, h, s, d_k = q.shape
    g = k.shape[1]
    if h % g or k.shape != (b, g, s, d_k) or v.shape[:3] != (b, g, s) or tuple(blocks.shape[:3]) != (b, g, s):
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"blocks {tuple(blocks.shape)}")
    if blocks.dtype.is_floating_point or blocks.dtype == torch.bool:
        raise ValueError(f"blocks must be an integer tensor, got {blocks.dtype}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if s < 1:
        raise ValueError("selected_attention: empty sequence")
    if l_sel < 1:
        raise ValueError(f"l_sel must be >= 1, got {l_sel}")
    for name, d in (("d_k", d_k), ("d_v", v.shape[-1])):
        if d < 16 or d > 256 or d & (d - 1):
            raise ValueError(f"{name} must be a power of two in [16, 256], got {d}")
    if max(q.numel(), k.numel(), v.numel(), blocks.numel() * (h // g)) >= 2**31:
        raise ValueError("selected_attention: tensors of 2**31 elements or more are not supported (int32 offsets)")


def _unit_last(t):
    return t if t.stride(-1) == 1 else t.contiguous()


# ------------------------------------------------------------------------------------------------ custom ops
def _per_tile(hpg, d_k, d_v, bwd_tiles):
    """Queries per forward tile and per backward program."""
    return _config("out", hpg, d_k, d_v)[0] // hpg, (_config("bwd", hpg, d_k, d_v)[0] // hpg) * bwd_tiles


@torch.library.custom_op("nsa::selected_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, l_sel: int, loop: str,
            bwd_tiles: int, index_build: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [B, H, S, d_v], lse [B, G, S, hpg] fp32 in log2 units, pair_t, backward tile table)."""
    return _forward(q, k, v, blocks, l_sel, loop, bwd_tiles, index_build)


def _forward(q, k, v, blocks, l_sel, loop, bwd_tiles, index_build, o_fp32: bool = False):
    """_fwd_op's work; o_fp32: o in fp32, uncast (the "band" forced choice merges it with its band part first)."""
    o_dtype = torch.float32 if o_fp32 else q.dtype
    b, h, s, d_k = q.shape
    g, d_v = k.shape[1], v.shape[-1]
    hpg, nb = h // g, _cdiv(s, l_sel)
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    blocks = _block_lists(blocks)
    n_sel = blocks.shape[-1]
    qpt_fwd, qpt_bwd = _per_tile(hpg, d_k, d_v, bwd_tiles)
    order, pair_t, fwd_tiles, bwd_tiles_tab = _build_index(blocks, l_sel, qpt_fwd, qpt_bwd, index_build)
    qk_scale = LOG2E / math.sqrt(d_k)
    prec = dot_precision(q.dtype)
    if loop == "query":
        o = torch.empty(b, s, h, d_v, dtype=o_dtype, device=q.device).transpose(1, 2)
        lse = torch.empty(b, g, s, hpg, dtype=torch.float32, device=q.device)
        _sel_fwd_query[(b * g * s,)](
            q, k, v, blocks, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            s, g, qk_scale, N_SEL=n_sel, L_SEL=l_sel,
            HPG=hpg, HPG_PAD=_hpg_pad(hpg), BLOCK_N=_block_n(l_sel), D_K=d_k, D_V=d_v,
            num_warps=_query_warps(d_k, d_v), num_stages=1, DOT_PREC=prec)
        return o, lse, pair_t, bwd_tiles_tab
    block_r, block_n, warps, stages = _config("stats", hpg, d_k, d_v)
    n_tiles = fwd_tiles.shape[1]
    fused, partial = host_choice() == "fused", out_choice() == "partial"
    if fused:  # _sel_fwd_lse reads the listed slots only: no fill
        part = torch.empty((b, g, s, n_sel, hpg), dtype=torch.float32, device=q.device)
    else:
        part = torch.full((b, g, s, n_sel, hpg), float("-inf"), dtype=torch.float32, device=q.device)
    _sel_fwd_kv_stats[(n_tiles,)](
        q, k, part, order, pair_t, fwd_tiles, n_tiles, *q.stride()[:3], *k.stride()[:3], s, g, nb, qk_scale,
        L_SEL=l_sel, HPG=hpg, BLOCK_R=block_r, BLOCK_N=_block_n(l_sel, block_n), D_K=d_k, num_warps=warps,
        num_stages=stages, DOT_PREC=prec)
    o32 = None
    if fused:  # lse, and the zeroed fp32 output of the atomic choice, in one launch
        lse = torch.empty(b, g, s, hpg, dtype=torch.float32, device=q.device)
        if not partial:
            o32 = torch.empty(b, s, h, d_v, dtype=torch.float32, device=q.device).transpose(1, 2)
        hpg_pad, block_t = _reduce_tile(hpg)
        _sel_fwd_lse[(_cdiv(s, block_t), b * g)](
            part, blocks, lse, lse if o32 is None else o32, *(o32.stride()[:3] if o32 is not None else (0, 0, 0)),
            s, g, N_SEL=n_sel, HPG=hpg, HPG_PAD=hpg_pad, BLOCK_T=block_t, D_V=d_v, ZERO_O=o32 is not None,
            num_warps=4)
    else:
        lse = torch.logsumexp(part.mul_(_LN2), dim=3).mul_(LOG2E)  # log2-sum-exp2 over the slots
    del part
    if partial:
        block_r, block_n, warps, stages = _config("out", hpg, d_k, d_v)
        op = torch.empty(b * g * s * n_sel, hpg, d_v, dtype=torch.float32, device=q.device)
        _sel_fwd_kv_part[(n_tiles,)](
            q, k, v, lse, op, order, pair_t, fwd_tiles, n_tiles,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], s, g, nb, qk_scale,
            L_SEL=l_sel, HPG=hpg, BLOCK_R=block_r, BLOCK_N=_block_n(l_sel, block_n), D_K=d_k, D_V=d_v,
            num_warps=warps, num_stages=stages, DOT_PREC=prec)
        o = torch.empty(b, s, h, d_v, dtype=o_dtype, device=q.device).transpose(1, 2)
        hpg_pad, block_t = _reduce_tile(hpg)
        _sel_fwd_reduce[(_cdiv(s, block_t), b * g)](
            op, blocks, o, *o.stride()[:3], s, g, N_SEL=n_sel, HPG=hpg, HPG_PAD=hpg_pad, BLOCK_T=block_t, D_V=d_v,
            num_warps=4)
        return o, lse, pair_t, bwd_tiles_tab
    if o32 is None:
        o32 = torch.zeros(b, s, h, d_v, dtype=torch.float32, device=q.device).transpose(1, 2)
    lean = _lean_tile(hpg, d_k, d_v)  # the tile choice's output pass (FWD_TILE_CHOICES), else _config's
    block_r, block_n, warps, stages = lean if lean is not None else _config("out", hpg, d_k, d_v)
    block_n = _block_n(l_sel, block_n)
    _sel_fwd_kv_out[(n_tiles,)](
        q, k, v, lse, o32, pair_t, fwd_tiles, n_tiles,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o32.stride()[:3], s, g, nb, qk_scale,
        L_SEL=l_sel, HPG=hpg, BLOCK_R=block_r, BLOCK_N=block_n, D_K=d_k, D_V=d_v, num_warps=warps, num_stages=stages,
        DOT_PREC=prec)
    return o32.to(o_dtype), lse, pair_t, bwd_tiles_tab


@_fwd_op.register_fake
def _(q, k, v, blocks, l_sel, loop, bwd_tiles, index_build):
    b, h, s, d_k = q.shape
    g, d_v, n_sel = k.shape[1], v.shape[-1], blocks.shape[-1]
    n_tiles = _n_tiles(b, g, s, n_sel, l_sel, _per_tile(h // g, d_k, d_v, bwd_tiles)[1])
    return (q.new_empty(b, s, h, d_v).transpose(1, 2), q.new_empty(b, g, s, h // g, dtype=torch.float32),
            q.new_empty(b * g * s * n_sel, dtype=torch.int32), q.new_empty(3, n_tiles, dtype=torch.int32))


@torch.library.custom_op("nsa::selected_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
            lse: torch.Tensor, pair_t: torch.Tensor, tiles: torch.Tensor, l_sel: int, bwd_tiles: int,
            blocks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in the inputs' dtypes, as transposed views of [B, S, *, d] storage; dQ as dq_choice() says
    ("atomic": in _sel_bwd_kv; "query": _sel_bwd_dq_query over `blocks`, the forward's block lists, which that
    choice needs)."""
    return _backward_grads(do, q, k, v, o, lse, pair_t, tiles, l_sel, bwd_tiles, blocks)


def _backward_grads(do, q, k, v, o, lse, pair_t, tiles, l_sel, bwd_tiles, blocks, seed=None):
    """_bwd_op's work. seed: (dq, dk, dv) fp32 gradients of another part of the same softmax (the "band" forced
    choice's band) that this backward adds into instead of zero-filled buffers (the atomics' starting values; under
    the query dQ choice its stored dQ is added to seed's after), returned in fp32, uncast; the host choice's zero fill
    is then not needed (_sel_bwd_delta runs)."""
    choice = dq_choice()
    if choice == "query" and blocks is None:
        raise ValueError("selected attention: the 'query' dQ choice needs the forward's blocks")
    b, h, s, d_k = q.shape
    g, d_v = k.shape[1], v.shape[-1]
    hpg, nb = h // g, _cdiv(s, l_sel)
    q, k, v, o, do = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(o), _unit_last(do)
    delta = torch.empty(b, g, s, hpg, dtype=torch.float32, device=q.device)
    block_t = 64
    qk_scale, sm_scale, prec = LOG2E / math.sqrt(d_k), 1.0 / math.sqrt(d_k), dot_precision(q.dtype)
    with_dq = choice == "atomic"
    # the fp32 buffers _sel_bwd_kv's atomics add into: zeroed by torch ("torch" host choice) or by the delta kernel,
    # or the seed's gradients
    fused = host_choice() == "fused" and seed is None
    new32 = torch.empty if fused else torch.zeros
    if seed is not None:
        dq_seed, dk, dv = seed
        dq = dq_seed if with_dq else torch.empty_like(dq_seed)  # the query choice stores every row once
    else:
        if with_dq:
            dq = new32(b, s, h, d_k, dtype=torch.float32, device=q.device).transpose(1, 2)
        else:  # every (query, head) row is stored once, in q's dtype
            dq = torch.empty(b, s, h, d_k, dtype=q.dtype, device=q.device).transpose(1, 2)
        dk = new32(b, s, g, d_k, dtype=torch.float32, device=q.device).transpose(1, 2)
        dv = new32(b, s, g, d_v, dtype=torch.float32, device=q.device).transpose(1, 2)
    if fused:
        _sel_bwd_delta_zero[(_cdiv(s, block_t), b * h)](
            o, do, delta, dq, dk, dv, *o.stride()[:3], *do.stride()[:3], *dq.stride()[:3], *dk.stride()[:3],
            *dv.stride()[:3], s, h, hpg, BLOCK_T=block_t, D_K=d_k, D_V=d_v, ZERO_DQ=with_dq,
            num_warps=DELTA_ZERO_WARPS)
    else:
        _sel_bwd_delta[(_cdiv(s, block_t), b * h)](o, do, delta, *o.stride()[:3], *do.stride()[:3], s, h, hpg,
                                                   BLOCK_T=block_t, D_V=d_v, num_warps=4)
    if not with_dq:
        blocks = _block_lists(blocks)
        dq_block_n, dq_warps = _dq_query_config(l_sel, d_k, d_v)
        _sel_bwd_dq_query[(b * g * s,)](
            q, k, v, do, lse, delta, blocks, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *do.stride()[:3], *dq.stride()[:3], s, g, qk_scale, sm_scale,
            N_SEL=blocks.shape[-1], L_SEL=l_sel, HPG=hpg, HPG_PAD=_hpg_pad(hpg), BLOCK_N=dq_block_n, D_K=d_k,
            D_V=d_v, DOT_PREC=prec, num_warps=dq_warps, num_stages=1)
    block_r, block_n, warps, stages = _config("bwd", hpg, d_k, d_v)
    warps = _bwd_warps(hpg, d_k, d_v, warps)
    n_tiles = tiles.shape[1]
    _sel_bwd_kv[(n_tiles,)](
        q, k, v, do, lse, delta, dq, dk, dv, pair_t, tiles, n_tiles,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
        *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
        s, g, nb, qk_scale, sm_scale,
        L_SEL=l_sel, BWD_TILES=bwd_tiles, HPG=hpg, BLOCK_R=block_r, BLOCK_N=_block_n(l_sel, block_n), D_K=d_k,
        D_V=d_v, num_warps=warps, num_stages=stages, DOT_PREC=prec, WITH_DQ=with_dq)
    if seed is not None:
        return (dq if with_dq else dq.add_(seed[0])), dk, dv
    if fused:  # one launch for the three casts (none in fp32)
        return _cast_fp32((dq, dk, dv), q.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_bwd_op.register_fake
def _(do, q, k, v, o, lse, pair_t, tiles, l_sel, bwd_tiles, blocks=None):
    b, h, s, d_k = q.shape
    g, d_v = k.shape[1], v.shape[-1]
    return (q.new_empty(b, s, h, d_k).transpose(1, 2), k.new_empty(b, s, g, d_k).transpose(1, 2),
            v.new_empty(b, s, g, d_v).transpose(1, 2))


def _setup_context(ctx, inputs, output):
    q, k, v, blocks, l_sel, _loop, bwd_tiles, _index_build = inputs
    o, lse, pair_t, tiles = output
    # blocks: the "query" dQ choice walks each query's list (dq_choice() is read when the backward launches)
    ctx.save_for_backward(q, k, v, o, lse, pair_t, tiles, blocks)
    ctx.l_sel, ctx.bwd_tiles = l_sel, bwd_tiles
    # lse and the index tables carry no gradient: autograd would otherwise fill a zero tensor for each of them
    # (three launches per step); with materialisation off, an unused output's gradient arrives as None
    ctx.mark_non_differentiable(lse, pair_t, tiles)
    ctx.set_materialize_grads(False)


def _backward(ctx, do, _dlse, _dpair_t, _dtiles):
    if do is None:  # o took no part in the loss
        return None, None, None, None, None, None, None, None
    q, k, v, o, lse, pair_t, tiles, blocks = ctx.saved_tensors
    dq, dk, dv = torch.ops.nsa.selected_attention_bwd(do, q, k, v, o, lse, pair_t, tiles, ctx.l_sel,
                                                      ctx.bwd_tiles, blocks)
    return dq, dk, dv, None, None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


# ------------------------------------------------------------------------------------------------ the band choice
BAND_ROWS = 64  # rows of _sel_band_rest and queries of _sel_band_merge a program (no products)


def _rest_blocks(blocks: torch.Tensor, l_sel: int, n_rest: int) -> torch.Tensor:
    """[B, G, S, n_rest] int32: each query's listed blocks other than its forced ones, packed, -1 after them
    (_sel_band_rest; one launch)."""
    b, g, s, n_sel = blocks.shape
    rest = torch.empty(b, g, s, n_rest, dtype=torch.int32, device=blocks.device)
    rows = b * g * s
    _sel_band_rest[(_cdiv(rows, BAND_ROWS),)](
        blocks, rest, rows, s, L_SEL=l_sel, N_SEL=n_sel, N_SEL_PAD=_pow2(n_sel), N_REST=n_rest,
        N_REST_PAD=_pow2(n_rest), BLOCK_T=BAND_ROWS, num_warps=4)
    return rest


@torch.library.custom_op("nsa::selected_band_attention_fwd", mutates_args=())
def _band_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, l_sel: int, loop: str,
                 bwd_tiles: int, index_build: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                            torch.Tensor, torch.Tensor]:
    """The "band" forced choice (FORCED_CHOICES): (o [B, H, S, d_v], lse natural [B, H, S] and log2 [B, G, S, hpg]
    of the merged softmax, fp32, the sparse list [B, G, S, n_rest] int32, its pair_t and backward tile table)."""
    b, h, s, _ = q.shape
    g, d_v = k.shape[1], v.shape[-1]
    hpg = h // g
    rest = _rest_blocks(_block_lists(blocks), l_sel, _n_rest(blocks.shape[-1], s, l_sel))
    o_s, lse_s, pair_t, tiles = _forward(q, k, v, rest, l_sel, loop, bwd_tiles, index_build, o_fp32=True)
    o_b, lse_b = range_host._forward(q, k, v, range_host.BAND, l_sel, l_sel, o_dtype=torch.float32)
    o = torch.empty(b, s, h, d_v, dtype=q.dtype, device=q.device).transpose(1, 2)
    lse_h = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
    lse_g = torch.empty(b, g, s, hpg, dtype=torch.float32, device=q.device)
    _sel_band_merge[(_cdiv(s, BAND_ROWS), b * h)](
        o_b, lse_b, o_s, lse_s, o, lse_h, lse_g, *o_b.stride()[:3], *o_s.stride()[:3], *o.stride()[:3], s, h, hpg,
        BLOCK_T=BAND_ROWS, D_V=d_v, num_warps=4)
    return o, lse_h, lse_g, rest, pair_t, tiles


@_band_fwd_op.register_fake
def _(q, k, v, blocks, l_sel, loop, bwd_tiles, index_build):
    b, h, s, d_k = q.shape
    g, d_v = k.shape[1], v.shape[-1]
    n_rest = _n_rest(blocks.shape[-1], s, l_sel)
    n_tiles = _n_tiles(b, g, s, n_rest, l_sel, _per_tile(h // g, d_k, d_v, bwd_tiles)[1])
    return (q.new_empty(b, s, h, d_v).transpose(1, 2), q.new_empty(b, h, s, dtype=torch.float32),
            q.new_empty(b, g, s, h // g, dtype=torch.float32), q.new_empty(b, g, s, n_rest, dtype=torch.int32),
            q.new_empty(b * g * s * n_rest, dtype=torch.int32), q.new_empty(3, n_tiles, dtype=torch.int32))


@torch.library.custom_op("nsa::selected_band_attention_bwd", mutates_args=())
def _band_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse_h: torch.Tensor, lse_g: torch.Tensor, rest: torch.Tensor, pair_t: torch.Tensor,
                 tiles: torch.Tensor, l_sel: int, bwd_tiles: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the "band" choice: the band's share (range attention's backward, mode BAND with the sink, from
    the merged O and lse) in fp32, then the sparse part's (the selected backward under the dQ choice in effect, p =
    exp2(s - lse) of the merged lse, delta of the merged O) added onto it by its atomics (no zero fill, no sums),
    cast once. dK and dV come back contiguous ([B, G, S, d], the band's layout)."""
    band = range_host._backward(do, q, k, v, lse_h, o, None, range_host.BAND, l_sel, l_sel, fp32=True)
    dq, dk, dv = _backward_grads(do, q, k, v, o, lse_g, pair_t, tiles, l_sel, bwd_tiles, rest, seed=band)
    if host_choice() == "fused":  # one launch for the three casts (none in fp32)
        return _cast_fp32((dq, dk, dv), q.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_band_bwd_op.register_fake
def _(do, q, k, v, o, lse_h, lse_g, rest, pair_t, tiles, l_sel, bwd_tiles):
    b, h, s, d_k = q.shape
    g, d_v = k.shape[1], v.shape[-1]
    return q.new_empty(b, s, h, d_k).transpose(1, 2), k.new_empty(b, g, s, d_k), v.new_empty(b, g, s, d_v)


def _band_setup_context(ctx, inputs, output):
    q, k, v, _blocks, l_sel, _loop, bwd_tiles, _index_build = inputs
    o, lse_h, lse_g, rest, pair_t, tiles = output
    ctx.save_for_backward(q, k, v, o, lse_h, lse_g, rest, pair_t, tiles)
    ctx.l_sel, ctx.bwd_tiles = l_sel, bwd_tiles
    ctx.mark_non_differentiable(lse_h, lse_g, rest, pair_t, tiles)
    ctx.set_materialize_grads(False)


def _band_backward(ctx, do, *_unused):
    if do is None:  # o took no part in the loss
        return None, None, None, None, None, None, None, None
    q, k, v, o, lse_h, lse_g, rest, pair_t, tiles = ctx.saved_tensors
    dq, dk, dv = torch.ops.nsa.selected_band_attention_bwd(do, q, k, v, o, lse_h, lse_g, rest, pair_t, tiles,
                                                           ctx.l_sel, ctx.bwd_tiles)
    return dq, dk, dv, None, None, None, None, None


_band_fwd_op.register_autograd(_band_backward, setup_context=_band_setup_context)


def _check_band(q, k, v, n_sel):
    if n_sel < FORCED_BLOCKS:
        raise ValueError(f"selected attention: FORCED_CHOICE 'band' needs n_sel >= {FORCED_BLOCKS} (every forced "
                         f"block listed), got {n_sel}")
    h, g, d_k, d_v = q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]
    if d_k not in TRITON_HEAD_DIMS or d_v not in TRITON_HEAD_DIMS or h // g > range_host.MAX_HPG:
        raise ValueError(f"selected attention: FORCED_CHOICE 'band' runs the range kernels' band: d_k, d_v in "
                         f"{TRITON_HEAD_DIMS} and at most {range_host.MAX_HPG} heads per group, got d_k {d_k}, "
                         f"d_v {d_v}, {h // g} heads per group")


def selected_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, l_sel: int,
                       loop: str = "kv", bwd_tiles: int = BWD_TILES, index_build: str = "auto") -> torch.Tensor:
    """Selected-branch attention (see the module docstring): o [B, H, S, d_v] in q's dtype.

    loop: "kv" (KV-block-outer forward, the default) or "query" (query-outer forward); bwd_tiles: forward tiles
    of one key block per backward program (bounds the work of a popular block's program); index_build: the
    inverted index's build, "auto", "torch" or "triton" (common.index_build; NSAConfig.index_build).
    """
    _check(q, k, v, blocks, l_sel, loop, bwd_tiles)
    dq_choice(), out_choice(), host_choice(), fwd_tile_choice()  # an unknown choice fails here, before the forward
    build = resolve_index_build(index_build)
    if forced_choice() == "band":
        _check_band(q, k, v, blocks.shape[-1])
        if _n_rest(blocks.shape[-1], q.shape[2], l_sel) == 0:  # every listable block is forced: the band alone
            return range_host.range_attention_op(q, k, v, range_host.BAND, l_sel, l_sel)[0]
        return torch.ops.nsa.selected_band_attention_fwd(q, k, v, blocks, l_sel, loop, bwd_tiles, build)[0]
    return torch.ops.nsa.selected_attention_fwd(q, k, v, blocks, l_sel, loop, bwd_tiles, build)[0]


# ------------------------------------------------------------------------------------------------ AOT
AOT_HPG = (1, 6, 16, 32)  # heads per group compiled ahead of time (HPG is a compile-time constant)


# The strides of the [.., d] tensors (q, k, v, o, do, dq, dk, dv: sq_b, sdo_h, ...): multiples of d (>= 32) at
# every shape the layer launches, so Triton's JIT compiles each launch with their 16-divisibility; the AOT cases are
# told the same (AotCase.divisible). Without it the compile sees scalar loads and atomics and overstates registers
# (sel_fwd_kv_out at hpg 6, d 64 on sm_90, triton 3.9: 162 without, 90 with; reports/aot/selected_fwd_occupancy.md).
_ROW_STRIDE = re.compile(r"s(q|k|v|o|do|dq|dk|dv)_[bhgs]")


def _aot_case(label, fn, ptrs, consts, warps, stages, tensor_cores=True):
    sig = {}
    for n in inspect.signature(fn.fn).parameters:
        sig[n] = ptrs.get(n) or ("constexpr" if n in consts else "fp32" if n.endswith("scale") else "i32")
    strides = tuple(n for n, kind in sig.items() if kind == "i32" and _ROW_STRIDE.fullmatch(n))
    return AotCase(label, fn, sig, consts, warps, stages, tensor_cores, divisible=strides)


def bwd_aot_cases(hpg: int, d: int, choice: str) -> list:
    """The backward's dQ-carrying kernels of one dQ choice (DQ_CHOICES) at l_sel = 64, n_sel = 16, bf16: "atomic",
    _sel_bwd_kv with dQ; "query", _sel_bwd_kv without it and _sel_bwd_dq_query (reports/aot/selected_bwd_dq.md)."""
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    r, n, w, st = _config("bwd", hpg, d, d)
    with_dq = choice == "atomic"
    kv = _aot_case(f"sel_bwd_kv[hpg={hpg},d={d},BLOCK_R={r},BLOCK_N={n}{'' if with_dq else ',WITH_DQ=False'}]",
                   _sel_bwd_kv, {"Q": bf, "K": bf, "V": bf, "DO": bf, "LSE": f32, "DELTA": f32, "DQ": f32, "DK": f32,
                                 "DV": f32, "PAIR_T": i32, "TILES": i32},
                   {"L_SEL": 64, "BWD_TILES": BWD_TILES, "HPG": hpg, "BLOCK_R": r, "BLOCK_N": n, "D_K": d, "D_V": d,
                    "DOT_PREC": "tf32", "WITH_DQ": with_dq}, w, st)
    if with_dq:
        return [kv]
    bn, w = _dq_query_config(64, d, d)
    dq = _aot_case(f"sel_bwd_dq_query[hpg={hpg},d={d},HPG_PAD={_hpg_pad(hpg)},BLOCK_N={bn}]", _sel_bwd_dq_query,
                   {"Q": bf, "K": bf, "V": bf, "DO": bf, "LSE": f32, "DELTA": f32, "BLOCKS": i32, "DQ": bf},
                   {"N_SEL": 16, "L_SEL": 64, "HPG": hpg, "HPG_PAD": _hpg_pad(hpg), "BLOCK_N": bn, "D_K": d,
                    "D_V": d, "DOT_PREC": "tf32"}, w, 1)
    return [kv, dq]


def bwd_warps_aot_cases(hpg: int, d: int) -> list:
    """_sel_bwd_kv under the "w4" warps choice (BWD_WARPS_CHOICES) at l_sel = 64, bf16, with dQ and without (the
    "query" dQ choice's): bwd_aot_cases' compiles at 4 warps."""
    return [dataclasses.replace(c, name=c.name.replace("]", ",warps=4]", 1), num_warps=4)
            for c in bwd_aot_cases(hpg, d, "atomic") + bwd_aot_cases(hpg, d, "query")[:1]]


def fwd_out_aot_cases(hpg: int, d: int) -> list:
    """The "partial" output choice's kernels (OUT_CHOICES) at l_sel = 64, n_sel = 16, bf16: _sel_fwd_kv_part at the
    "out" pass's tile, _sel_fwd_reduce (no products); "atomic" is aot_cases()' sel_fwd_kv_out."""
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    r, n, w, st = _config("out", hpg, d, d)
    hpg_pad, block_t = _reduce_tile(hpg)
    return [_aot_case(f"sel_fwd_kv_part[hpg={hpg},d={d},BLOCK_R={r},BLOCK_N={n}]", _sel_fwd_kv_part,
                      {"Q": bf, "K": bf, "V": bf, "LSE": f32, "OP": f32, "ORDER": i32, "PAIR_T": i32, "TILES": i32},
                      {"L_SEL": 64, "HPG": hpg, "BLOCK_R": r, "BLOCK_N": n, "D_K": d, "D_V": d, "DOT_PREC": "tf32"},
                      w, st),
            _aot_case(f"sel_fwd_reduce[hpg={hpg},d={d},HPG_PAD={hpg_pad},BLOCK_T={block_t}]", _sel_fwd_reduce,
                      {"OP": f32, "BLOCKS": i32, "O": bf},
                      {"N_SEL": 16, "HPG": hpg, "HPG_PAD": hpg_pad, "BLOCK_T": block_t, "D_V": d}, 4, 1,
                      tensor_cores=False)]


# _sel_bwd_delta_zero's warps, as _sel_bwd_delta's: with its strides' 16-divisibility (a launch's JIT, _ROW_STRIDE)
# it takes 32-37 registers on 4 warps (d = 64, BLOCK_T = 64; AOT compile, triton 3.9), so occupancy is bound by
# threads, not registers (without the hint it took 149-156, which had suggested 8 warps). Not timed on a GPU.
DELTA_ZERO_WARPS = 4


def fwd_tile_aot_cases(hpg: int, d: int, choice: str) -> list:
    """The kv forward's kernels of one tile choice (FWD_TILE_CHOICES) at l_sel = 64, bf16 (d = 64: the choices' head
    dim). "shipped": aot_cases()' sel_fwd_kv_out (its strides 16-divisible, as Triton's JIT sees them at a launch of
    the layer's tensors: _ROW_STRIDE), then the same kernel compiled without that hint (AotCase.divisible empty: what
    the committed tables showed before they gave it). A lean choice: _sel_fwd_kv_out at its tile and warps and,
    where its rows are not the shipped 128, _sel_fwd_kv_stats and _sel_fwd_kv_part at those rows (the passes share
    one tile table; their warps are _config's). reports/aot/selected_fwd_occupancy.md."""
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    out_ptrs = {"Q": bf, "K": bf, "V": bf, "LSE": f32, "O32": f32, "PAIR_T": i32, "TILES": i32}
    if d != 64:
        raise ValueError(f"the tile choices are for d = 64 (other head dims keep _config's tile), got d = {d}")
    r, n, w, st = max(128, _pow2(hpg)), 64, 8, 1  # _config("out", hpg, 64, 64) under the shipped choice
    consts = {"L_SEL": 64, "HPG": hpg, "BLOCK_N": 64, "D_K": d, "D_V": d, "DOT_PREC": "tf32"}
    if FWD_TILE_CHOICES[choice] is None:
        tag = f"hpg={hpg},d={d},BLOCK_R={r},BLOCK_N={n}"
        shipped = _aot_case(f"sel_fwd_kv_out[{tag}]", _sel_fwd_kv_out, out_ptrs, {**consts, "BLOCK_R": r}, w, st)
        return [shipped, dataclasses.replace(shipped, name=f"sel_fwd_kv_out[{tag}] (no stride hints)", divisible=())]
    cfg = FWD_TILE_CHOICES[choice]
    rows = max(cfg.block_m, _pow2(hpg))
    cases = [_aot_case(f"sel_fwd_kv_out[hpg={hpg},d={d},BLOCK_R={rows},BLOCK_N={cfg.block_n},warps={cfg.num_warps}]",
                       _sel_fwd_kv_out, out_ptrs, {**consts, "BLOCK_R": rows, "BLOCK_N": cfg.block_n},
                       cfg.num_warps, cfg.num_stages)]
    if rows != r:
        cases.append(_aot_case(f"sel_fwd_kv_stats[hpg={hpg},d={d},BLOCK_R={rows},BLOCK_N=64]", _sel_fwd_kv_stats,
                               {"Q": bf, "K": bf, "PART": f32, "ORDER": i32, "PAIR_T": i32, "TILES": i32},
                               {"L_SEL": 64, "HPG": hpg, "BLOCK_R": rows, "BLOCK_N": 64, "D_K": d,
                                "DOT_PREC": "tf32"}, 4 if d <= 64 else 8, 1))
        cases.append(_aot_case(f"sel_fwd_kv_part[hpg={hpg},d={d},BLOCK_R={rows},BLOCK_N=64]", _sel_fwd_kv_part,
                               {"Q": bf, "K": bf, "V": bf, "LSE": f32, "OP": f32, "ORDER": i32, "PAIR_T": i32,
                                "TILES": i32}, {**consts, "BLOCK_R": rows}, 8, 1))
    return cases


def _i64_blocks(case) -> AotCase:
    """`case` with int64 block lists (BLOCKS "*i64"): what the "fused" host choice launches (_block_lists)."""
    return dataclasses.replace(case, name=case.name.replace("[", "[BLOCKS=i64,", 1),
                               signature={**case.signature, "BLOCKS": "*i64"}, choice="HOST_CHOICE fused")


def host_aot_cases(hpg: int, d: int) -> list:
    """The "fused" host glue's kernels (HOST_CHOICES) at n_sel = 16, bf16, each with its zero fill on and off as
    the other choices launch them: _sel_fwd_lse (ZERO_O: the atomic output choice; off: "partial"; int64 block
    lists, which only this choice hands it) and _sel_bwd_delta_zero (ZERO_DQ: the atomic dQ choice; off: "query");
    _sel_cast for bf16 (its rounding written out on int16 bits) and fp16. No products: no tensor cores expected.
    The other kernels' int64-list compiles: aot_cases() (_i64_blocks) and index.aot_cases()."""
    bf, f32 = "*bf16", "*fp32"
    hpg_pad, block_t = _reduce_tile(hpg)
    cases = []
    for zero in (True, False):
        cases.append(_aot_case(f"sel_fwd_lse[hpg={hpg},d={d},HPG_PAD={hpg_pad},BLOCK_T={block_t},ZERO_O={zero}]",
                               _sel_fwd_lse, {"PART": f32, "BLOCKS": "*i64", "LSE": f32, "O32": f32},
                               {"N_SEL": 16, "HPG": hpg, "HPG_PAD": hpg_pad, "BLOCK_T": block_t, "D_V": d,
                                "ZERO_O": zero}, 4, 1, tensor_cores=False))
        cases.append(_aot_case(f"sel_bwd_delta_zero[d={d},BLOCK_T=64,ZERO_DQ={zero}]", _sel_bwd_delta_zero,
                               {"O": bf, "DO": bf, "DELTA": f32, "DQ": f32 if zero else bf, "DK": f32, "DV": f32},
                               {"BLOCK_T": 64, "D_K": d, "D_V": d, "ZERO_DQ": zero}, DELTA_ZERO_WARPS, 1,
                               tensor_cores=False))
    for out, rne in (("*i16", True), ("*fp16", False)):
        sig = {n: kind for i in range(3) for n, kind in ((f"X{i}", f32), (f"Y{i}", out), (f"N{i}", "i32"))}
        cases.append(AotCase(f"sel_cast[{'bf16' if rne else 'fp16'},BLOCK={CAST_BLOCK}]", _sel_cast,
                             {**sig, "BLOCK": "constexpr", "BF16_RNE": "constexpr"},
                             {"BLOCK": CAST_BLOCK, "BF16_RNE": rne}, 4, 1, tensor_cores=False))
    return cases


def band_aot_cases(hpg: int, d: int) -> list:
    """The "band" forced choice's own launches (FORCED_CHOICES) at l_sel = 64, n_sel = 16 (13 other slots), bf16:
    _sel_band_rest and _sel_band_merge (no products), and the range kernels it launches with fp32 outputs (the band's
    forward into an fp32 O, its dQ into an fp32 dQ: other compiles than the cmp/win branches' bf16 ones; the
    shipped tiles, fwd_config / dq_config). Its dK/dV and the sparse part's kernels are the shipped compiles."""
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    rest = AotCase(f"sel_band_rest[N_SEL=16,N_REST=13,BLOCK_T={BAND_ROWS}]", _sel_band_rest,
                   {"BLOCKS": i32, "REST": i32, "R": "i32", "S": "i32", "L_SEL": "constexpr", "N_SEL": "constexpr",
                    "N_SEL_PAD": "constexpr", "N_REST": "constexpr", "N_REST_PAD": "constexpr",
                    "BLOCK_T": "constexpr"},
                   {"L_SEL": 64, "N_SEL": 16, "N_SEL_PAD": 16, "N_REST": 13, "N_REST_PAD": 16, "BLOCK_T": BAND_ROWS},
                   4, 1, tensor_cores=False)
    strides = ("sob_b", "sob_h", "sob_s", "sos_b", "sos_h", "sos_s", "so_b", "so_h", "so_s")
    merge_sig = {"OB": f32, "LSEB": f32, "OS": f32, "LSES": f32, "O": bf, "LSEH": f32, "LSEG": f32,
                 **{n: "i32" for n in strides}, "S": "i32", "H": "i32", "HPG": "i32", "BLOCK_T": "constexpr",
                 "D_V": "constexpr"}
    merge = AotCase(f"sel_band_merge[d={d},BLOCK_T={BAND_ROWS}]", _sel_band_merge, merge_sig,
                    {"BLOCK_T": BAND_ROWS, "D_V": d}, 4, 1, tensor_cores=False, divisible=strides)
    cases = [rest, merge]
    for kernel, fn, out, cfg in (("fwd", range_host._range_fwd_kernel, "O", range_host.fwd_config(d, d)),
                                 ("dq", range_host._range_bwd_dq_kernel, "DQ", range_host.dq_config(d, d))):
        consts = dict(D_K=d, D_V=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DOT_PREC="tf32")
        sig = {**range_host._signature(kernel, "bf16"), out: f32, **{n: "constexpr" for n in consts}}
        cases.append(AotCase(f"range_{kernel}[BLOCK_M={cfg.block_m},BLOCK_N={cfg.block_n},warps={cfg.num_warps},"
                             f"stages={cfg.num_stages},d_k={d},d_v={d},bf16,{out}=fp32]", fn, sig, consts,
                             cfg.num_warps, cfg.num_stages))
    return cases


def _chose(cases, choice: str) -> list:
    """cases tagged as compiled for one launch choice alone (AotCase.choice: under -m slow in CI)."""
    return [dataclasses.replace(c, choice=choice) for c in cases]


def aot_cases():
    """Every kernel at every configuration the launcher picks for l_sel = 64 (BLOCK_N = 64), bf16: each d with
    the model's hpg = 6, and the other hpg values (they change the row tiling) at d = 64; the kernels of the other
    launch choices ("query" dQ, "partial" output, "fused" host glue, "band" forced blocks) at the m7c shape alone
    (hpg = 6, d = 64; other shapes: bwd_aot_cases, fwd_out_aot_cases, host_aot_cases, band_aot_cases)."""
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    case = _aot_case
    cases = []
    for d in (32, 64, 128):
        for hpg in (AOT_HPG if d == 64 else (6,)):
            r, n, w, st = _config("stats", hpg, d, d)
            tag = f"hpg={hpg},d={d},BLOCK_R={r},BLOCK_N={n}"
            cases.append(case(f"sel_fwd_kv_stats[{tag}]", _sel_fwd_kv_stats,
                              {"Q": bf, "K": bf, "PART": f32, "ORDER": i32, "PAIR_T": i32, "TILES": i32},
                              {"L_SEL": 64, "HPG": hpg, "BLOCK_R": r, "BLOCK_N": n, "D_K": d,
                               "DOT_PREC": "tf32"}, w, st))
            r, n, w, st = _config("out", hpg, d, d)
            cases.append(case(f"sel_fwd_kv_out[{tag}]", _sel_fwd_kv_out,
                              {"Q": bf, "K": bf, "V": bf, "LSE": f32, "O32": f32, "PAIR_T": i32, "TILES": i32},
                              {"L_SEL": 64, "HPG": hpg, "BLOCK_R": r, "BLOCK_N": n, "D_K": d, "D_V": d,
                               "DOT_PREC": "tf32"}, w, st))
            cases.append(case(f"sel_fwd_query[hpg={hpg},d={d},HPG_PAD={_hpg_pad(hpg)}]", _sel_fwd_query,
                              {"Q": bf, "K": bf, "V": bf, "BLOCKS": i32, "O": bf, "LSE": f32},
                              {"N_SEL": 16, "L_SEL": 64, "HPG": hpg, "HPG_PAD": _hpg_pad(hpg), "BLOCK_N": 64,
                               "D_K": d, "D_V": d, "DOT_PREC": "tf32"},
                              _query_warps(d, d), 1))
            cases += bwd_aot_cases(hpg, d, "atomic")
            if (hpg, d) == (6, 64):
                cases += _chose(bwd_aot_cases(hpg, d, "query"), "DQ_CHOICE query")
                cases += _chose(bwd_warps_aot_cases(hpg, d), "BWD_WARPS_CHOICE w4")
                cases += _chose(fwd_out_aot_cases(hpg, d), "OUT_CHOICE partial")
                cases += _chose(host_aot_cases(hpg, d), "HOST_CHOICE fused")
                cases += _chose(band_aot_cases(hpg, d), "FORCED_CHOICE band")
                # the "fused" host choice hands these kernels choose_blocks' int64 lists (_block_lists)
                cases += [_i64_blocks(c) for c in cases if c.name.startswith((
                    "sel_fwd_query[hpg=6,d=64,", "sel_bwd_dq_query[hpg=6,d=64,", "sel_fwd_reduce[hpg=6,d=64,",
                    "sel_band_rest["))]
        cases.append(case(f"sel_bwd_delta[d={d}]", _sel_bwd_delta, {"O": bf, "DO": bf, "DELTA": f32},
                          {"BLOCK_T": 64, "D_V": d}, 4, 1, tensor_cores=False))
    return cases
