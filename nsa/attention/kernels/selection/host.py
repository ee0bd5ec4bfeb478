"""Block selection on the GPU (paper Eq. 8-10 and the top-n choice) without [B, H, S, n_cmp] probabilities.

    select_blocks(q, k_cmp, lse_cmp, l, d, l_sel, n_sel) -> blocks [B, G, S, n_sel] int64 (no gradient)
    block_importance(q, k_cmp, lse_cmp, l, d, l_sel, start=0, stop=None) -> [B, G, stop - start, n_blocks] fp32

Importance (paper Eq. 8-10) and the top-n_sel choice computed tile by tile from q, the compressed keys and the
compressed branch's log-sum-exp: p = exp(q.k_i / sqrt(d_k) - lse) are the compressed probabilities without a second
softmax pass. Both paths equal choose_blocks(importance, arange(S), n_sel, l_sel) of the reference importance up to
the order of floating-point summation (ties to the lower block index, forced blocks 0, t // l_sel and the one
before, ascending output, -1 padding).

Design
------
One @triton.jit tile function (_importance_tile) serves both kernels. A program owns BT query tokens of one
(batch, KV group): BM = BT * hpg query rows packed token-major (row r = token r // hpg, head r % hpg; hpg 6 -> 21
tokens in 128 rows, 2 idle rows, where padding heads to 8 would idle 25%). For a tile of BJ selection blocks
j0 .. j0 + BJ - 1 it reads the BC compressed keys j0 * l_sel/d - (l/d - 1) .. + BC - 1, which are exactly the keys
overlapping those blocks, halo included (BJ = (BC - l/d + 1) // (l_sel/d), 15 with BC 64 for the model's
l=32, d=16, l_sel=64: 64 keys read for the 61 needed, 4.27 per selection block where 4 is the least), so every
key tile serves one selection tile and nothing is carried between tiles. Then, all in registers:
  S = Q K^T (tensor cores, [BM, BC]);  P = exp2(S * log2e / sqrt(d_k) - lse * log2e), 0 where i*d + l - 1 > t;
  Eq. 9: acc = P @ W with W[i, j] = |chunks of block i and selection block j| (stride-d chunks, index arithmetic,
         small integers: exact in fp16), [BM, 16];
  Eq. 10: imp = R @ acc with R[token, row] = 1 for the rows of that token ([BT_PAD, BM] 0/1), [BT_PAD, 16].
The two products take an fp32 operand; each is split into fp16 hi + lo parts (two dots, fp32 accumulation), scaled
by powers of two (P * 8192 <= 8192, acc below 2^15) so neither part overflows nor lands in fp16's subnormals:
importance keeps ~2^-22 relative accuracy (one bf16 or tf32 dot would give 2^-9 / 2^-11 and flip choices at
near-ties of 1e-3). fp16 rather than bf16 also because Triton's interpreter multiplies bf16 dot operands as raw
uint16 (wrong results on the CPU test path).

(b) fused, _blocksel_topk_kernel, grid (cdiv(S, BT), B*G): the program walks its selection tiles in ascending
    order up to the last block its tokens have started (causal: work grows with t, like causal attention) and keeps
    per token a running list of the 16 best keys, key = (importance bits << 32) | (2^32 - 1 - j) in int64 (non-
    negative fp32 bits order like the floats, so keys order by importance with ties to the lower index; forced
    blocks get +inf's bits; blocks not started and padding -1). Merge = one bitonic top-K step: the tile's keys
    sorted ascending, the elementwise max with the descending list is bitonic and holds the 16 best of both, one
    bitonic merge sorts it (14 compare-exchange rounds on [BT_PAD, 16], where a full sort of the 32 would take 15 on
    twice the elements); a tile none of whose keys beats its tokens' 16th is skipped. Finally the first n_sel
    keys' indices are sorted ascending, -1 last, and written: [B, G, S, n_sel] int64, no importance buffer. Tokens
    whose program has at most n_sel started blocks skip the scores (all started blocks are kept anyway).
    The bitonic network is written here (tl.sort's, with the partner of an element found by a sum reduction
    instead of an xor reduction: the same one cross-lane step compiled, but vectorised by the interpreter).
(a) tiled, _blocksel_importance_kernel, grid (token tiles, selection tiles, B*G): the same tile written to an fp32
    buffer [B, G, rows, n_blocks] of at most IMP_CHUNK_ELEMS (64 MB) per chunk of query rows (chunk count from the
    shape), then choose_blocks per chunk (torch.sort: ~6x the buffer transiently). Tiles whose tokens have at most
    n_sel started blocks, or have not started the tile's blocks, return at once (the buffer is zero-filled).
    Its top-n_sel choice (nsa.attention.selection.TOPK_CHOICE, "auto" = QUALIFIED_TOPK; issue 31 item 2.2):
    "sort" as above (the shipped one: at S 65,536 on an H200 the importance kernel 3.9 ms, torch's radix sort
    3.2 ms, ~1 ms of fill and `where`); "topk": _blocksel_keys_kernel, the same grid and importance tile, writes
    every entry of an int64 buffer with packed keys (monotone_int32(importance) << 32 | 0xFFFFFFFF - j: unique,
    ordered like importance desc, index asc; +inf's for the forced blocks, -inf's for blocks not started, tiles
    skipped as above holding importance 0), so no fill and no `where` pass over the buffer; then torch.topk(n_sel,
    sorted=False) and _blocksel_finish_kernel, which decodes the n_sel kept keys, sorts their indices (a bitonic
    sort of n_sel per row), writes -1 for the empty slots and stores the rows into the output (what
    selection.blocks_from_keys does in five aten ops and a copy): no full sort, three launches per chunk. The
    buffer is int64 (2x the fp32 one per entry, same IMP_CHUNK_ELEMS per chunk; topk needs no copy of it, the
    sort ~6x).
    Same blocks as "sort" (the kernels share _importance_tile): tests/nsa/attention/kernels/
    test_triton_selection_topk.py. Not the default until a GPU run qualifies it (tests, memcheck, alternated A/B).
    Its importance launch (IMPORTANCE_CHOICE; 2026-12-01): one tile per program (the shipped kernels above), or
    "rows8" / "rows", _blocksel_rows_kernel, a program walking 8 or all of its tokens' tiles with q, lse, R and W
    loaded once (either output: importance or packed keys), at hpg 1 and >= 4 (reports/aot/
    selection_importance_rows.md; tests/nsa/attention/kernels/test_triton_selection_rows.py). Not the default until
    a GPU run qualifies it.
select_method: "tiled" at every n_sel (the default since the fused kernel faulted on an H100, "Known fault"
below); method="fused" takes n_sel <= FUSED_MAX_N_SEL = 16 (a 32-key running list spills on sm_90);
block_importance (tests, diagnostics) uses (a)'s kernels, under IMPORTANCE_CHOICE.

Launch configuration (block_config, shape and kernel only): the importance kernel (tiled path) takes BM 128 rows
and 8 warps at every hpg (hpg 1: 128 tokens, no head sum; 2-3: 42-64 tokens); the fused kernel takes hpg 1: BM 64
token rows, no head sum, 4 warps; hpg 2-3: BM 64 (21-32 tokens), 4 warps; both at hpg >= 4: BM 128 (8-32 tokens),
8 warps (see "GPU findings" for why they differ); BT_PAD = next power of two >= 16 of the tokens
(at most 32 but for hpg 1: a 64-token list spills under 3.6); BC from {32, 64, 128} minimising (BC + 32) / BJ (a
merge guessed to cost about 32 keys of score work: to be measured), at most 32 when d_k > 64 and 64 when d_k > 32
with BM 64 (the key tile is a dot operand every warp holds whole; larger tiles spill).

Alternatives considered: importance buffer + torch.topk on the floats (ties unspecified, so not choose_blocks'
answer: the "topk" choice ranks packed keys, unique per row, instead); head
sum before Eq. 9 (R @ P costs BC/16 = 4x the R @ acc); carrying each key tile's contribution to the next selection
tile instead of re-reading the halo key (two more dots per tile, for 1 key in 64); a full bitonic sort per merge.

To measure on a GPU (H100, bf16, B=1, H=12, G=2, d_k=64, l=32, d=16, l_sel=64, n_sel=16, S = 4K .. 64K):
  triton.testing.do_bench on select_blocks(q, k_cmp, lse, 32, 16, 64, 16) for method "fused" and "tiled", against
  the layer's path (cmp_group_probabilities + importance_from_cmp + choose_blocks, as NSAAttention._select_batched)
  and against the compressed-attention forward, which does the same Q K^T and exp work (the fused kernel should be
  within ~2x of it); then ncu on the fused kernel: issue-slot share of the merge vs the exp/dot part, achieved
  occupancy (1 CTA of 8 warps per SM at >128 registers), and with a counter, the share of merges the skip filter
  avoids on real (trained) inputs. Tuning knobs: BM (64/128), BC (32/64), num_warps (4/8).

Known fault (H100, triton 3.6, bf16/fp16: why the tiled path is the default)
-----------
Seen: CUDA illegal memory access in _blocksel_topk_kernel at S = 2,048, 2,560, 3,072, 4,096, 6,144, 8,192 and
65,536 in bf16 and fp16 (m7c shape, B 1 and 8); none at 1,024, 1,536, 16,384, 32,768; none in fp32. memcheck:
"Out-of-range shared or local address at _blocksel_topk_kernel+0x4c80 in triton_selection.py:223 (now selection/jit.py), thread (0,0,0),
block (60,0,0)" (bf16, S=2,048, B=1, hpg 6).
Cause, found without a GPU: compiled as the GPU's JIT compiled it (triton 3.6, sm_90, the integer arguments that
are multiples of 16 at S=2,048 specialised) and disassembled (the wheel's nvdisasm), the kernel has at +0x4c80 an
HGMMA.64x16x16: the third of the four k-steps of P @ W (Eq. 9; line 223 then). Its B descriptor is built from
UR34:UR35, and ptxas 12.8.93 (triton 3.6's) computes UR34:UR35 as UR34:UR35 + 0xC000001000000020 without ever
writing them first: they are live at the kernel's first instruction (nvdisasm -plr). The PTX is correct (all
four descriptors from W's shared address, in the loop's preheader) and ptxas 12.9.86 (triton 3.9's) assembles
it correctly. So three of the four descriptors of W hold what the SM's previous occupant left in two uniform
registers: a shared address outside the CTA's 32,768 bytes (the fault), or inside them (wrong Eq. 9 sums, wrong
blocks, no fault).
What this explains: at S=1,024 no program has more than n_sel = 16 started blocks, none takes the `need` path,
the wgmma never runs; at other lengths it runs in the programs past t = 1,024 and the stale value decides,
which depends on what ran on that SM before (earlier programs, the compressed branch's kernel), not on S: hence
the non-monotone pattern, not reproducible from the source. fp32 (IEEE: Q K^T at input_precision "ieee") is a
different binary without the unwritten read; bf16 and fp16 share one schedule. Under 3.6 every BC=64 tiling of
the fused kernel (hpg 1/2/3/6/8, d_k 32/64) has the pattern, BC=32 (d_k 128) does not.
Ruled out, reading the source and the compiled code: global out-of-bounds (the report is shared/local; every
store is masked, the output index int64), int32 overflow (in-kernel products stay below 2^31 at S = 65,536), the
literals (0xFFFFFFFF is uint32 and promotes to int64 against the int64 key, 0x7FFFFFFF is int32), the 9-D
bitonic reshapes and the reduction/convert_layout scratch in the loop (the faulting instruction is the wgmma,
not one of their shared loads/stores), local memory (no .local in the PTX, 0 spills).
The tiled path: _blocksel_importance_kernel (no loop) compiled by the same ptxas writes every descriptor before
use (hpg 1/2/3/6/8, bf16/fp16/fp32), so _importance_tile's source is not the cause; its compiled code is the same
PTX before and after the change below (3.6 and 3.9). (On a GPU it then failed at hpg 1-2 in
another way: "GPU findings" below.)
Change, in the fused kernel only: W does not depend on j0 (with c0 = j0*A - (B_ - 1) the weights are
min(c + 1, (j + 1)*A) - max(c - B_ + 1, j*A)), so the kernel builds it once before its loop (_overlap_tile,
W_GIVEN) instead of per tile; +2 KB shared. Compiled by triton 3.6 every fused tiling checked (hpg 1/2/3/6/8,
d_k 32/64/128, bf16/fp16/fp32) then writes every uniform register before reading it. This steps around a
compiler fault, it does not fix one: test_compiled_selection_kernels_read_no_uniform_register_before_writing_it
checks the compiled code under whichever triton the tests run with. Not qualified until a GPU run: memcheck of
both methods (bf16/fp16/fp32, S 1,024-65,536, hpg 1-32, after other kernels have run, repeatedly: the fault
depended on stale state) and the selection tests with NSA_TEST_FUSED_SELECTION=1; until then it stays off the
default path.

GPU findings (one NVIDIA H200, driver 580.159.04, torch 2.11.0+cu130, triton 3.6.0, 2026-11-26;
reports/gpu/2026-11-26/)
------------
- The fused kernel with W built before its loop ran without a fault at every length that faulted before (bf16 and
  fp16, S = 1,024 .. 65,536, B 1 and 8, m7c shape, hpg 6), and compute-sanitizer memcheck of its selection found 0
  errors (bf16, hpg 6 at S 2,048 and 65,536, hpg 1 at 65,536). Not the default yet: the full qualification
  (runbooks/gpu_kernels.yaml's memcheck_fused grid and its tests across hpg) has not run; with 128-row tiles at
  hpg 2-3 it read unwritten uniform registers under 3.6 (the SASS test) and failed selection tests at hpg 3.
- The importance kernel (the tiled path, the default) with 64 rows and 4 warps (its tiling at hpg 1-3 until then)
  computed wrong bf16 importances at hpg 1 and 2 (39% and 29% of the elements of the test shapes wrong, by up to
  2.6; the same wrong values in two runs: a deterministic miscompile, not a race), faulted at hpg 2 (d_k 32) in
  the tests, and under memcheck at hpg 1 (m7c, S 65,536: "Out-of-range shared or local address" at the P @ W
  wgmma, line `acc = tl.dot(p_hi, w)`, one program of the last chunk). fp32 (its Q K^T at input_precision "ieee",
  no bf16 wgmma) was right on the same shapes. Four variants were run side by side: loading the key tile [BC, D]
  and transposing it in the dot changed nothing; 128 rows and 8 warps at every hpg made every importance and
  tiled-selection test pass (hpg 1, 2, 3; d_k 32, 64, 128) and memcheck clean (m7c hpg 1 S 65,536; hpg 2 d_k 32
  S 2,048). The importance kernel now always takes that tiling; hpg >= 4 was already on it (m7c, hpg 6: memcheck
  clean in bf16 and fp16 at S 2,048 and 65,536, all kernels, forward and backward). The cause inside the 64-row
  code is not identified (the uniform-register check finds nothing there); triton 3.9 was not run on the GPU.
- runbooks/gpu_kernels.yaml, run whole (default grid, reports/gpu/2026-11-26/gpu_kernels_run): memcheck clean in
  18 of 18 cases for each method (bf16 / fp16 / fp32 x S 1,024 / 2,048 / 65,536 x hpg 1 / 6; the fused one with
  the selected branch on its blocks), and the fused selection's tests (NSA_TEST_FUSED_SELECTION=1, CI subset) 75
  passed. That qualifies the fused kernel on the H200 at the default grid.
- The same runbook on an H100 (reports/gpu/2026-11-26-h100, run 4; cut before its trainer step, and NO-GO on a
  test of the fp32 layer, not of the selection): the fused selection's 75 tests passed and memcheck was clean in
  18 of 18 cases for each method, including bf16 / fp16 at S 2,048 and 65,536, where it had faulted. It stays off
  the default path until the deep grid has run (every hpg branch of the launch configurations, 9 lengths).

Measured
--------
GPU timings (H200, bf16, m7c shape, one layer forward + backward, torch.profiler; benchmarks/profile_layer.py,
reports/gpu/2026-11-26/): at S = 65,536, B = 1 the tiled selection costs 8 launches each of the importance kernel
(3.9 ms) and torch's radix sort (3.2 ms) plus ~1 ms of `where`, 413 kernel launches per layer in all; the fused
kernel 7.1 ms in one launch, 165 launches per layer; layer GPU time 43.1 ms (tiled) vs 40.2 ms (fused). At
S = 2,048, B = 8: 191 launches (tiled) vs 161 (fused), GPU time 4.55 vs 4.43 ms, host issue time 7.1 vs 6.7 ms.
AOT compile (python -m nsa.attention.kernels.aot, since 2026-12-01 with the 16-divisible integer arguments the JIT
specialises, JIT_DIVISIBLE: without them the registers were not the GPU's, 176 for the importance kernel at hpg 6
under 3.6 where the GPU compiles 77): every case compiles for sm_80 and sm_90 without spills under triton 3.9 and 3.6
but one, the fused kernel at hpg 3, d 128 on sm_80 under 3.9 (8 bytes, accepted in aot.py with its reason; the 44
bytes 3.6 showed in the importance kernel at hpg 1, d 128 without the hints are gone with them); registers and
shared memory per case: reports/aot/triton-<version>.md. On sm_90 Q K^T and P W
reach wgmma; the head-sum dot R @ acc (16-32 rows) stays mma.sync. NSA_AOT_FULL=1 compiles all 104 configurations
(both kernels, hpg 1/3/6/8, d_k 32/64/128, l_sel/d 2/4/8, bf16/fp16). Above 128 registers a SM holds one CTA (8 or
4 warps): the skip filter's branch around the merge (~40 registers under 3.6) changes nothing at that occupancy.
"""

from __future__ import annotations

import math

import torch
import triton

from nsa.attention.geometry import num_cmp_blocks, num_sel_blocks
from nsa.attention.kernels.aot import AotCase
from nsa.attention.kernels.common import LOG2E, TRITON_MAX_OVERLAP
from nsa.attention import selection as choice
from nsa.attention.kernels.selection.jit import (_blocksel_finish_kernel, _blocksel_importance_kernel,
                                                 _blocksel_keys_kernel, _blocksel_rows_kernel, _blocksel_topk_kernel)
from nsa.attention.selection import choose_blocks
from nsa.config import resolve_auto
from nsa.toggles import parse

# Importance entries per chunk of the tiled path (16M fp32 = 64 MB; choose_blocks' sort needs ~6x that transiently).
IMP_CHUNK_ELEMS = 1 << 24
# Largest n_sel the fused kernel takes: its running list is 16 keys wide (32 spills on sm_90).
FUSED_MAX_N_SEL = 16

# The tiled path's importance launch (issue 31 item 2.2; the importance, or its packed keys under TOPK_CHOICE
# "topk", is the same either way): selection tiles per program. "tile": one (_blocksel_importance_kernel /
# _blocksel_keys_kernel, the shipped kernels, qualified on the H100 and H200); "rows8": 8, "rows": every tile of
# the program's tokens (_blocksel_rows_kernel: the query rows, lse, R and W loaded once, a loop over the tiles), at
# hpg 1 and >= 4 (the model's 6): at hpg 2-3 the one-tile kernels run whatever the choice (ptxas 3.6, see the kernel).
# At S 65,536 on an H200 the one-tile kernel took 3.9 ms, 10.6% of its floor. A choice becomes QUALIFIED_IMPORTANCE
# once a GPU run qualifies it (its tests there, memcheck clean, faster in an alternated A/B: bench_choices.py).
IMPORTANCE_CHOICES = {"tile": 1, "rows8": 8, "rows": 0}  # tiles per program (0: all of the row's)
QUALIFIED_IMPORTANCE = "tile"  # what "auto" picks: the choice a GPU run has qualified
IMPORTANCE_CHOICE = "auto"  # "auto" or a key of IMPORTANCE_CHOICES (the benchmarks set it for an A/B)


def importance_choice() -> str:
    """The importance launch in effect (IMPORTANCE_CHOICE, "auto" = QUALIFIED_IMPORTANCE), read at each launch."""
    return resolve_auto("selection: IMPORTANCE_CHOICE", IMPORTANCE_CHOICE, tuple(IMPORTANCE_CHOICES),
                        QUALIFIED_IMPORTANCE)


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def block_config(hpg: int, d_k: int, l: int, d: int, l_sel: int, fused: bool = False) -> dict:
    """Tile sizes for one shape and kernel (pure function of them; used by both kernels and by aot_cases).

    fused False: the importance kernel (the tiled path, block_importance); True: the fused top-k kernel. They
    differ at hpg < 4 only: the importance kernel always takes BM = 128 rows and 8 warps (on the GPU its 64-row,
    4-warp tiling gave wrong bf16 importances at hpg 1 and 2 and an out-of-range shared address under
    compute-sanitizer at hpg 1: the module docstring's "GPU findings"); the fused kernel keeps 64 rows there (its
    128-row tilings at hpg 2-3 read unwritten uniform registers under triton 3.6's ptxas, and hpg 3 failed the
    selection tests on the GPU).

    BM       query rows per program: BT tokens x hpg heads packed token-major (row r: token r // hpg, head r % hpg)
    BT_PAD   token rows of the importance tile (power of two >= 16; BT = BM // hpg of them are real)
    D_PAD    d_k padded to a power of two >= 16
    K        selection blocks per tile = width of the running top list: 16 (tl.dot's minimum; n_sel <= 16)
    BC       compressed keys per tile; BJ = min(K, (BC - (l/d - 1)) // (l_sel/d)) selection blocks per tile use them
    """
    a, b = l_sel // d, l // d
    if hpg == 1:
        bm = 64 if fused else 128
        bt_pad, head_sum = bm, False
    else:  # fused: at most 32 token rows: the running top list and its merges stay small (64 rows spill under 3.6)
        bm = 64 if (hpg < 4 and fused) else max(128, _next_pow2(hpg))
        bt_pad, head_sum = max(16, _next_pow2(bm // hpg)), True
    k = 16
    d_pad = max(16, _next_pow2(d_k))
    # compressed tile: fewest keys computed per useful selection block, a merge costing about 32 keys' worth;
    # larger tiles spill (the tile's keys are a dot operand every warp holds whole): above 32 keys at d_k 128,
    # above 64 at d_k 64 with 4 warps (BM 64)
    cap = 32 if d_pad >= 128 else 64 if (bm == 64 and d_pad >= 64) else 128
    best = None
    for bc in sorted({32, 64, 128, _next_pow2(a + b - 1)}):
        bj = min(k, (bc - (b - 1)) // a)
        if bj < 1 or (bc > cap and best is not None):
            continue
        cost = (bc + 32) / bj
        if best is None or cost < best[0]:
            best = (cost, bc, bj)
    _, bc, bj = best
    return dict(BM=bm, BT_PAD=bt_pad, D_PAD=d_pad, K=k, BC=bc, BJ=bj, HEAD_SUM=head_sum,
                num_warps=8 if bm >= 128 else 4, num_stages=1)



def _check(q, k_cmp, lse_cmp, l, d, l_sel):
    b, h, s, d_k = q.shape
    g = k_cmp.shape[1]
    if k_cmp.shape[0] != b or k_cmp.shape[3] != d_k or h % g:
        raise ValueError(f"q {tuple(q.shape)} and k_cmp {tuple(k_cmp.shape)} do not match")
    if tuple(lse_cmp.shape) != (b, h, s):
        raise ValueError(f"lse_cmp must be [B, H, S] = {(b, h, s)}, got {tuple(lse_cmp.shape)}")
    if q.dtype != k_cmp.dtype or lse_cmp.dtype != torch.float32:
        raise ValueError(f"q and k_cmp must share a dtype and lse_cmp be fp32, got {q.dtype}, {k_cmp.dtype}, "
                         f"{lse_cmp.dtype}")
    if l % d or l_sel % d:
        raise ValueError(f"d={d} must divide l={l} and l_sel={l_sel}")
    if min(l // d, l_sel // d) > TRITON_MAX_OVERLAP:
        raise ValueError(f"overlap weights above {TRITON_MAX_OVERLAP} are not exact in bf16 (min(l/d, l_sel/d) = "
                         f"{min(l // d, l_sel // d)})")
    if k_cmp.shape[2] != num_cmp_blocks(s, l, d):
        raise ValueError(f"k_cmp holds {k_cmp.shape[2]} blocks, S={s} has {num_cmp_blocks(s, l, d)}")


def _launch_args(q, k_cmp, lse_cmp, l, d, l_sel, cfg):
    h, s, d_k = q.shape[1:]
    g = k_cmp.shape[1]
    # head-sum split: 8192 * importance per head <= 8192 * min(l/d, l_sel/d), rescaled to <= 2^15 for fp16
    hs = 2.0 ** (15 - 13 - math.ceil(math.log2(min(l // d, l_sel // d))))
    return dict(S=s, G=g, hpg=h // g, n_cmp=k_cmp.shape[2], d_k=d_k, l=l, d=d, l_sel=l_sel, A=l_sel // d,
                B_=l // d, bj=cfg["BJ"], qk_scale=LOG2E / math.sqrt(d_k), hs_scale=hs, out_scale=1.0 / (hs * 8192.0),
                sqb=q.stride(0), sqh=q.stride(1), sqs=q.stride(2), sqd=q.stride(3),
                skb=k_cmp.stride(0), skg=k_cmp.stride(1), skn=k_cmp.stride(2), skd=k_cmp.stride(3),
                slb=lse_cmp.stride(0), slh=lse_cmp.stride(1), sls=lse_cmp.stride(2),
                BM=cfg["BM"], BT_PAD=cfg["BT_PAD"], D_PAD=cfg["D_PAD"], K=cfg["K"], BC=cfg["BC"],
                HEAD_SUM=cfg["HEAD_SUM"], IEEE=q.dtype == torch.float32, num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"])


def _importance_into(out, q, k_cmp, lse_cmp, l, d, l_sel, row0, skip_n, cfg, kernel=_blocksel_importance_kernel):
    """Fill the zeroed out [B, G, rows, n_blocks] with the importance of queries row0 .. row0 + rows - 1; with
    kernel=_blocksel_keys_kernel, write every entry of the int64 out with the packed keys of that importance
    (nsa.attention.selection.packed_keys)."""
    b, h = q.shape[:2]
    g, n_rows, n_blocks = k_cmp.shape[1], out.shape[2], out.shape[3]
    if n_rows == 0 or (k_cmp.shape[2] == 0 and kernel is _blocksel_importance_kernel):
        return out
    bt = cfg["BM"] // (h // g) if cfg["HEAD_SUM"] else cfg["BM"]
    tiles = triton.cdiv(n_blocks, cfg["BJ"])
    per = IMPORTANCE_CHOICES[importance_choice()]
    if cfg["HEAD_SUM"] and cfg["BT_PAD"] > 32:  # hpg 2-3: the loop's compiled code is not clean under triton 3.6
        per = 1  # (_blocksel_rows_kernel's docstring): the one-tile kernels
    args = dict(n_blocks=n_blocks, row0=row0, n_rows=n_rows, skip_n=skip_n, sob=out.stride(0), sog=out.stride(1),
                sot=out.stride(2), **_launch_args(q, k_cmp, lse_cmp, l, d, l_sel, cfg))
    if per == 1:
        kernel[(triton.cdiv(n_rows, bt), tiles, b * g)](q, k_cmp, lse_cmp, out, **args)
        return out
    jt = per or tiles  # a loop over jt tiles in each program
    _blocksel_rows_kernel[(triton.cdiv(n_rows, bt), triton.cdiv(tiles, jt), b * g)](
        q, k_cmp, lse_cmp, out, jt=jt, KEYS=kernel is _blocksel_keys_kernel, **args)
    return out


def block_importance(q, k_cmp, lse_cmp, l: int, d: int, l_sel: int, start: int = 0, stop: int | None = None):
    """Eq. 9-10 importance of queries start .. stop - 1: [B, G, stop - start, ceil(S / l_sel)] fp32, no gradient.

    importance[b, g, t, j] = sum over heads h of group g, over compression blocks i visible to t, of
    exp(q_t.k_i / sqrt(d_k) - lse_cmp[b, h, t]) * (stride-d chunks block i shares with selection block j).
    """
    _check(q, k_cmp, lse_cmp, l, d, l_sel)
    b, h, s, d_k = q.shape
    g = k_cmp.shape[1]
    stop = s if stop is None else stop
    if not 0 <= start <= stop <= s:
        raise ValueError(f"rows {start}..{stop} outside 0..{s}")
    cfg = block_config(h // g, d_k, l, d, l_sel)
    out = torch.zeros(b, g, max(stop - start, 0), num_sel_blocks(s, l_sel), device=q.device, dtype=torch.float32)
    with torch.no_grad():
        return _importance_into(out, q, k_cmp, lse_cmp, l, d, l_sel, start, 0, cfg)


def _select_tiled(q, k_cmp, lse_cmp, l, d, l_sel, n_sel):
    """Path (a): per chunk of queries, the importance into a bounded buffer and choose_blocks' full sort (choice
    "sort"), or the packed keys into it and torch.topk (choice "topk": nsa.attention.selection.TOPK_CHOICE)."""
    b, h, s, d_k = q.shape
    g = k_cmp.shape[1]
    n_blocks = num_sel_blocks(s, l_sel)
    cfg = block_config(h // g, d_k, l, d, l_sel)
    rows = max(1, min(s, IMP_CHUNK_ELEMS // max(1, b * g * n_blocks)))
    out = torch.empty(b, g, s, n_sel, dtype=torch.long, device=q.device)
    keys = choice.topk_choice() == "topk"
    positions = None if keys else torch.arange(s, device=q.device)
    for r0 in range(0, s, rows):
        r1 = min(s, r0 + rows)
        if keys:  # every entry written by the kernel: no fill; topk, then one launch writes the rows' blocks
            buf = torch.empty((b, g, r1 - r0, n_blocks), dtype=torch.int64, device=q.device)
            _importance_into(buf, q, k_cmp, lse_cmp, l, d, l_sel, r0, n_sel, cfg, kernel=_blocksel_keys_kernel)
            top, _ = torch.topk(buf, min(n_sel, n_blocks), dim=-1, sorted=False)
            finish_rows(top, out, r0)
            continue
        imp = torch.full((b, g, r1 - r0, n_blocks), 0.0, device=q.device)  # full: one fill_ at any size
        _importance_into(imp, q, k_cmp, lse_cmp, l, d, l_sel, r0, n_sel, cfg)
        out[:, :, r0:r1] = choose_blocks(imp, positions[r0:r1], n_sel, l_sel, method="sort")
    return out


FINISH_ROWS = 64  # rows per program of _blocksel_finish_kernel (64 x 16 keys: 4 warps)


def finish_rows(top: torch.Tensor, out: torch.Tensor, row0: int) -> torch.Tensor:
    """out[:, :, row0 : row0 + rows] = the blocks of top [B, G, rows, k] (topk's packed keys, any order within a row):
    ascending, -1 for the empty slots and for the columns k .. n_sel - 1 (blocks_from_keys' result, one launch).
    out [B, G, S, n_sel] int64, contiguous."""
    b, g, rows, k = top.shape
    n_sel = out.shape[-1]
    if not out.is_contiguous() or out.dtype != torch.int64 or k > n_sel or row0 + rows > out.shape[2]:
        raise ValueError(f"finish_rows: out {tuple(out.shape)} {out.dtype} (contiguous int64 [B, G, S, n_sel] "
                         f"needed) does not take {k} keys of rows {row0}..{row0 + rows}")
    n = b * g * rows
    if n == 0:
        return out
    top = top.contiguous()
    k_pad = max(2, _next_pow2(n_sel))
    _blocksel_finish_kernel[(triton.cdiv(n, FINISH_ROWS),)](
        top, out, n, rows, k, n_sel, out.stride(1), out.stride(2), row0, BLOCK_R=FINISH_ROWS, K_PAD=k_pad,
        LOG_K=k_pad.bit_length() - 1, N_DIMS=(FINISH_ROWS * k_pad).bit_length() - 1, num_warps=4)
    return out


def _select_fused(q, k_cmp, lse_cmp, l, d, l_sel, n_sel):
    b, h, s, d_k = q.shape
    g = k_cmp.shape[1]
    cfg = block_config(h // g, d_k, l, d, l_sel, fused=True)
    out = torch.empty(b, g, s, n_sel, dtype=torch.long, device=q.device)
    bt = cfg["BM"] // (h // g) if cfg["HEAD_SUM"] else cfg["BM"]
    _blocksel_topk_kernel[(triton.cdiv(s, bt), b * g)](q, k_cmp, lse_cmp, out, n_sel=n_sel,
                                                 LOG_K=cfg["K"].bit_length() - 1,
                                                 N_DIMS=(cfg["K"] * cfg["BT_PAD"]).bit_length() - 1,
                                                 **_launch_args(q, k_cmp, lse_cmp, l, d, l_sel, cfg))
    return out


def select_method(n_sel: int) -> str:
    """Which path select_blocks takes by default: "tiled", at every n_sel.

    The fused kernel (method="fused", n_sel <= FUSED_MAX_N_SEL) faulted on an H100 in bf16 and fp16 at
    S = 2,048-8,192 and 65,536 (illegal memory access; the module docstring's "Known fault"). Changed since, it ran
    clean on an H200 at every length, and runbooks/gpu_kernels.yaml's default grid qualified it there and on an
    H100, where it had faulted (its tests and memcheck: "GPU findings"), but it is not the default until the
    runbook's deep grid has run. The tiled path (its importance kernel on 128-row tiles) passed its tests and
    memcheck on both too.
    """
    return "tiled"


@torch.library.custom_op("nsa::select_blocks", mutates_args=())
def _select_blocks_op(q: torch.Tensor, k_cmp: torch.Tensor, lse_cmp: torch.Tensor, l: int, d: int, l_sel: int,
                      n_sel: int, method: str) -> torch.Tensor:
    with torch.no_grad():
        if q.shape[2] == 0:
            return q.new_empty(q.shape[0], k_cmp.shape[1], 0, n_sel, dtype=torch.long)
        if method == "fused":
            return _select_fused(q, k_cmp, lse_cmp, l, d, l_sel, n_sel)
        return _select_tiled(q, k_cmp, lse_cmp, l, d, l_sel, n_sel)


@_select_blocks_op.register_fake
def _(q, k_cmp, lse_cmp, l, d, l_sel, n_sel, method):
    b, _, s, _ = q.shape
    return q.new_empty(b, k_cmp.shape[1], s, n_sel, dtype=torch.long)


def select_blocks(q, k_cmp, lse_cmp, l: int, d: int, l_sel: int, n_sel: int, method: str | None = None):
    """Top-n_sel selection blocks per query and KV group: [B, G, S, n_sel] int64, ascending, -1 padded.

    q [B, H, S, d_k] (bf16/fp16/fp32, any strides); k_cmp [B, G, n_cmp, d_k] compressed keys; lse_cmp [B, H, S]
    fp32 log-sum-exp of the scaled compressed scores over the visible blocks (-inf where none). Equals
    choose_blocks(importance, arange(S), n_sel, l_sel) of the Eq. 9-10 importance, up to the order of summation.
    method: "fused" (one kernel, running top list; not qualified on a GPU, see "Known fault") or "tiled"
    (importance buffer + choose_blocks, or with nsa.attention.selection.TOPK_CHOICE "topk" packed keys +
    torch.topk); default select_method(n_sel), i.e. "tiled".
    """
    _check(q, k_cmp, lse_cmp, l, d, l_sel)
    if n_sel < 1:
        raise ValueError(f"n_sel must be >= 1, got {n_sel}")
    method = method or select_method(n_sel)
    if method not in ("fused", "tiled"):
        raise ValueError(f"method must be 'fused' or 'tiled', got {method!r}")
    if method == "fused" and n_sel > FUSED_MAX_N_SEL:
        raise ValueError(f"the fused kernel keeps at most {FUSED_MAX_N_SEL} blocks, n_sel={n_sel}")
    return _select_blocks_op(q.detach(), k_cmp.detach(), lse_cmp.detach(), l, d, l_sel, n_sel, method)


def _aot_signature(kernel: str, dtype: str, cfg: dict) -> tuple[dict, dict]:
    ptrs = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "lse_ptr": "*fp32",
            "out_ptr": "*fp32" if kernel in ("imp", "rows") else "*i64"}
    if kernel in ("imp", "keys", "rows", "rows_keys"):  # _blocksel_rows_kernel: the one-tile kernels' and jt
        ints = ("S G hpg n_cmp n_blocks d_k l d l_sel A B_ bj row0 n_rows skip_n").split()
        ints += ["jt"] if kernel.startswith("rows") else []
        floats = ("qk_scale", "hs_scale", "out_scale")
        strides = "sqb sqh sqs sqd skb skg skn skd slb slh sls sob sog sot".split()
    else:
        ints = "S G hpg n_cmp d_k l d l_sel A B_ bj n_sel".split()
        floats = ("qk_scale", "hs_scale", "out_scale")
        strides = "sqb sqh sqs sqd skb skg skn skd slb slh sls".split()
    sig = dict(ptrs)
    sig.update({n: "i32" for n in ints})
    sig.update({n: "fp32" for n in floats})
    sig.update({n: "i32" for n in strides})
    # unit strides are specialised by the JIT (an int argument equal to 1 becomes a constant): the innermost
    # dimension of q and k_cmp, and lse_cmp's sequence stride, are contiguous in the model
    consts = {n: 1 for n in ("sqd", "skd", "sls")}
    consts.update({k: cfg[k] for k in ("BM", "BT_PAD", "D_PAD", "K", "BC", "HEAD_SUM")})
    consts["IEEE"] = False
    if kernel in ("rows", "rows_keys"):
        consts["KEYS"] = kernel == "rows_keys"
    if kernel == "sel":
        consts["LOG_K"] = cfg["K"].bit_length() - 1
        consts["N_DIMS"] = (cfg["K"] * cfg["BT_PAD"]).bit_length() - 1
    sig.update({n: "constexpr" for n in consts})
    return sig, consts


# The integer arguments a launch at the model's shape passes as multiples of 16, which Triton's JIT specialises (S
# 2,048 or 65,536, d_k 64, l 32, d 16, l_sel 64, n_sel 16 and the contiguous tensors' strides): the ahead-of-time
# compile states them too, or its registers are not the GPU's (the importance kernel: 176 without, 77 with, triton
# 3.6, sm_90). The compiled-code test (test_triton_selection.py's _SASS_SCRIPT) states the same set.
JIT_DIVISIBLE = tuple("S d_k l d l_sel n_sel sqb sqh sqs skb skg skn slb slh sob sog sot".split())


def aot_cases():
    """The configurations block_config picks, each axis value at least once (all of them: NSA_AOT_FULL=1).

    Default (kept under a minute): the model's shape (hpg 6, d_k 64, l=32, d=16, l_sel=64) for the three kernels,
    for the fused kernel the other tilings: hpg 1 (64 token rows, no head sum), hpg 3 (64 token rows), hpg 8 (16),
    d_k 32 and 128 (BC 32), l_sel = 128 (BC 128), fp16; the importance kernel at hpg 1, d_k 128 and the keys
    kernel at hpg 1 (128 token rows, no head sum); the "topk" choice's finish kernel at n_sel 16 and 3.
    NSA_AOT_FULL=1: the three kernels at hpg {1, 3, 6, 8} x d_k {32, 64, 128} x l_sel {32, 64, 128} x {bf16, fp16}
    (the finish kernel as by default).
    """
    if parse("NSA_AOT_FULL"):
        shapes = [(kernel, hpg, d_k, l_sel, dtype) for kernel in ("sel", "imp", "keys", "rows", "rows_keys")
                  for hpg in (1, 3, 6, 8)
                  for d_k in (32, 64, 128) for l_sel in (32, 64, 128) for dtype in ("bf16", "fp16")]
    else:
        shapes = [("sel", 6, 64, 64, "bf16"), ("imp", 6, 64, 64, "bf16"), ("sel", 1, 32, 64, "bf16"),
                  ("sel", 3, 128, 64, "bf16"), ("sel", 8, 64, 64, "fp16"), ("sel", 6, 128, 64, "bf16"),
                  ("sel", 6, 64, 128, "bf16"), ("imp", 1, 128, 64, "bf16"), ("keys", 6, 64, 64, "bf16"),
                  ("keys", 1, 64, 64, "bf16"), ("rows", 6, 64, 64, "bf16"), ("rows_keys", 6, 64, 64, "bf16"),
                  ("rows", 1, 64, 64, "bf16")]
    cases, seen = [], set()
    for kernel, hpg, d_k, l_sel, dtype in shapes:
        cfg = block_config(hpg, d_k, 32, 16, l_sel, fused=kernel == "sel")
        key = (kernel, dtype, *(cfg[k] for k in ("BM", "BT_PAD", "D_PAD", "BC", "HEAD_SUM", "num_warps")))
        if key in seen:
            continue
        seen.add(key)
        fn = {"sel": _blocksel_topk_kernel, "imp": _blocksel_importance_kernel, "keys": _blocksel_keys_kernel,
              "rows": _blocksel_rows_kernel, "rows_keys": _blocksel_rows_kernel}[kernel]
        sig, consts = _aot_signature(kernel, dtype, cfg)
        label = f"BM={cfg['BM']},BT={cfg['BT_PAD']},D={cfg['D_PAD']},BC={cfg['BC']},hpg={hpg},{dtype}"
        if kernel in ("rows", "rows_keys"):
            label += f",KEYS={int(kernel == 'rows_keys')}"
        choice = {"sel": "select_blocks method fused", "imp": "", "keys": "TOPK_CHOICE topk",
                  "rows": "IMPORTANCE_CHOICE rows", "rows_keys": "IMPORTANCE_CHOICE rows, TOPK_CHOICE topk"}[kernel]
        divisible = tuple(n for n in JIT_DIVISIBLE if sig.get(n) == "i32")  # as the JIT sees the model's launch
        cases.append(AotCase(name=f"{fn.__name__}[{label}]", fn=fn, signature=sig, constexprs=consts,
                             num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], choice=choice,
                             divisible=divisible))
    # the "topk" choice's finish (finish_rows: integer work, no products) at the model's n_sel (16) and the tests' 3
    for n_sel in (16, 3):
        k_pad = max(2, _next_pow2(n_sel))
        consts = {"BLOCK_R": FINISH_ROWS, "K_PAD": k_pad, "LOG_K": k_pad.bit_length() - 1,
                  "N_DIMS": (FINISH_ROWS * k_pad).bit_length() - 1}
        sig = {"top_ptr": "*i64", "out_ptr": "*i64", **{n: "i32" for n in "n_rows rows k n_sel sog sot row0".split()},
               **{n: "constexpr" for n in consts}}
        cases.append(AotCase(name=f"_blocksel_finish_kernel[BLOCK_R={FINISH_ROWS},K_PAD={k_pad}]",
                             fn=_blocksel_finish_kernel, signature=sig, constexprs=consts, num_warps=4,
                             num_stages=1, tensor_cores=False, choice="TOPK_CHOICE topk",
                             divisible=("sog", "sot") if n_sel % 16 == 0 else ()))  # as the JIT sees the strides
    return cases
