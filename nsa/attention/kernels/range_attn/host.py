"""Range attention in Triton: every query row attends to a contiguous key range of its KV group.

The compressed (cmp) and sliding-window (win) branches of NSA, and the selected branch's forced local band, are all
"range attention": query t of head h attends to the keys [lo(t), hi(t)) of group h // hpg, plus (band only) a
sink [0, pre(t)) with pre(t) <= lo(t). The mode (a runtime argument: one compiled kernel serves all three) picks
the formulas:

    WINDOW     (p0 = w):                [max(0, t - w + 1), t + 1)
    COMPRESSED (p0 = l, p1 = d):        [0, min(n_cmp, floor((t + 1 - l) / d) + 1))    block i ends at i*d + l - 1
    BAND       (p0 = l_sel, p1 = sink): [max(0, (t // l_sel - 1) * l_sel), t + 1), plus [0, min(sink, lo(t)))
                                        with sink = l_sel or 0: the sink reaches queries of selection block >= 2

lo, hi and pre are non-decreasing in t, and for a fixed key k the tokens that see it form one interval
[lo_k, hi_k) (window [k, k + w); cmp [k*d + l - 1, inf); band [k, (k // l_sel + 2) * l_sel), or [k, inf) for a sink
key). Every tile-skipping rule and every mask below rests on these two facts.

API (plain wrappers over torch.library custom ops "nsa::range_attention" and "nsa::range_attention_bwd", so
torch.compile sees opaque ops without graph breaks, and forward + backward can be captured in a CUDA graph):

    window_attention(q, k, v, w) -> o                             query t attends keys (t - w, t]
    compressed_attention(q, k_cmp, v_cmp, l, d) -> o              exactly 0 (gradient 0) where no block is visible
    compressed_attention_lse(q, k_cmp, v_cmp, l, d) -> (o, lse)   lse [B, H, S] fp32: natural log of
        sum(exp(q.k * scale)) over the visible blocks, -inf where none, detached (exp(s - lse) is the compressed
        attention probability the importance score needs, without a second softmax pass)
    band_attention(q, k, v, l_sel, sink=False) -> o               the band with its own softmax, differentiable
    band_attention_partial(q, k, v, l_sel, sink=False) -> (o, lse)               detached, for a shared softmax:
    band_attention_partial_bwd(do, q, k, v, lse, delta, l_sel, sink=False) -> (dq, dk, dv)
        the caller combines parts (lse = logaddexp of the parts', o = sum of o_part * exp(lse_part - lse)) in its
        own autograd.Function and, in backward, passes dO, lse and delta = rowsum(dO * O) of the COMBINED output;
        this returns the band's exact share of the gradient (p = exp(s - lse) on the band's keys).

Shapes: q [B, H, S, d_k]; k [B, G, T, d_k]; v [B, G, T, d_v]; H = G * hpg, head h uses group h // hpg; T = S for the
window and the band, T = n_cmp for cmp. d_k, d_v in {32, 64, 128} (may differ), hpg <= 32. q, k, v of one dtype:
fp32 (interpreter), bf16 or fp16 (GPU); o has that dtype; softmax statistics and accumulation are fp32 (the
scale is 1/sqrt(d_k)). Any strides with 16-byte aligned rows: the layer's [B, S, H, d] storage seen as
[B, H, S, d] is used in place (anything else is copied once, _aligned). o and dq are allocated in that
[B, S, H, d] layout, dk and dv contiguous.

Design
------
Tiling. A program's BLOCK_M rows are TM = BLOCK_M // hpg query tokens x the hpg heads of one KV group (row r ->
token t0 + r // hpg, head r % hpg; leftover rows and tokens >= S are masked). All heads of a group read the same
keys, so one key tile feeds every head of the tile: for the 125M model (hpg = 6, d = 64) a 128-row tile is 21
tokens x 6 heads (98 % of the rows used), and every dot has >= 64 rows, which is what Hopper's wgmma needs (m64
per warpgroup). The alternative, one head per program, reads each key tile hpg times and, for the window, widens a
tile's key span from w + 21 to w + 128 tokens.

Forward (grid: query tiles x B*G): online softmax (exp2, fp32) over the BLOCK_N-key tiles that meet the union of
the tile's ranges, [lo(first token), hi(last token)). The tiles inside every row's range,
[lo(last), hi(first)), run in a loop without the mask; the partial ones (head and tail of the band, and the band
mode's sink tiles below it) run in one masked loop over the concatenated index segments (_segment), so each kernel
holds two copies of its loop body, not four. For w = 512 and 21 tokens a tile, ~2 of ~10 key tiles take the masked
loop; for cmp, only the tile holding the newest blocks. The mask is branch-free for every mode:
lo_k <= t < hi_k (_key_bounds), two key vectors and the token; per-row range bounds would keep three row vectors
alive. lse = (m + log2 l) / log2 e is stored; rows that see nothing get o = 0, lse = -inf. cmp tiles run heaviest
first (later queries see more blocks), as causal flash attention orders its tiles.

Backward. dQ: query-tile-outer over the same two loops; it also computes delta = rowsum(dO * O) of its rows
(no separate preprocess launch) and stores it for dK/dV, which runs second (the partial-backward API takes delta
instead). dK/dV: key-tile-outer (grid: key tiles x B*G x NSPLIT), looping over only the query tiles whose tokens
touch the key tile, [tok_lo, tok_hi), of which those inside [full_lo, full_hi) (tokens that see all BLOCK_N keys)
run without the mask (_key_tile_tokens inverts the mode's formulas; window: [n0, n1 + w - 1) and
[n0 + 63, n0 + w); cmp: [n0*d + l - 1, S) and [(n0 + 63)*d + l - 1, S); band: [n0, (ceil(n1 / l_sel) + 1)*l_sel),
extended to S for sink keys). A query tile holds all hpg heads of its tokens, so the sum over the group's heads
happens inside the dots: no atomics. For cmp (and the sink), the first key tiles are seen by every later query,
a triangle with only n_cmp / 64 key tiles: each key tile's query range is cut into NSPLIT contiguous chunks (grid
z), written as fp32 partials [NSPLIT, B, G, T, d] and summed by torch (deterministic); NSPLIT (dkdv_splits) gives
about two programs per SM. The window's query range per key tile is bounded (BLOCK_N + w - 1 tokens): NSPLIT = 1.
dK/dV are always fp32 partials then cast (one compiled variant instead of two; the cast is one pass over B*G*T*d).
Under the glue choice "fused" (GLUE_CHOICES; not the default) _range_dkdv_sum sums the partials and casts them in one
launch instead of torch's sum and cast of each (checked on CPU only: interpreter, AOT compile, op count).
In backward, lse = -inf rows (nothing visible) use +inf, so p = 0 exactly.

The key-major dK/dV tiles hold the query rows' statistics (lse, delta, token) along their columns, where a
64-row vector costs 16 registers a thread: with 64 rows the kernel spilled on sm_80, so dK/dV steps 32 query rows
at a time (30 of 32 rows used at hpg = 6), which also bounds hpg <= 32.

Configurations (query_config, dkdv_config; every shipped one is in aot_cases()): forward and dQ use 64-key tiles with
128 rows / 8 warps for d = 64 (two m64 warpgroups share each key tile), 64 rows / 4 warps for d = 32 and 64 rows /
8 warps when max(d_k, d_v) = 128 (128 rows spill on sm_80). dK/dV: 64 keys x 32 rows, 8 warps; for d_k != d_v 32
keys x 32 rows, 4 warps (below wgmma's m64: mma.sync on sm_90, family range_dkdv_bn32). num_stages = 2. BLOCK_N =
64 rather than 128 keeps the masked head and tail of a window tile small. The sink counts a key tile as seen whole
only when it lies in [0, sink) or in the band; with l_sel < BLOCK_N some whole tiles take the masked path
(correct, slightly slower; the model's l_sel = 64 = BLOCK_N).

dK/dV choices (DKDV_CHOICES, picked by DKDV_CHOICE; "auto" = QUALIFIED_DKDV, the one a GPU run has qualified): the
shipped 8-warp tile runs one CTA per SM (registers), and its cmp launch has ~3 programs per key tile. Beside it sit
tiles that fit two or more CTAs per SM on sm_90 without spills (4 warps, one stage: 2; 32 keys x 4 warps,
mma.sync: 3) and a finer cmp split (DkdvSplit: chunks of at most 512 query tiles), reports/aot/
range_dkdv_occupancy.md; benchmarks/tune_kernels.py times them against the shipped one on a GPU.

Forward / dQ choices (QUERY_CHOICES, picked by QUERY_CHOICE; "auto" = QUALIFIED_QUERY, still the shipped
query_config): the 128 x 64, 8-warp tile runs one CTA per SM on sm_90 (registers). Beside it sit 32-key tiles that
fit two or more CTAs per SM on sm_90 without spills, wgmma kept (128 rows x 8 warps: 2; 64 rows x 4 warps: 4),
reports/aot/range_query_occupancy.md; each choice names the forward tile and the dQ tile apart (fwd_config,
dq_config), for d_k = d_v = 64 only. aot_cases() holds the launcher's pick; tune_kernels --aot compiles the rest.

Every [rows, d] pointer tile carries tl.multiple_of(ptrs, [1, 16]) (rows start 16-byte aligned; the launcher
guarantees it): Triton's JIT infers this from 16-divisible arguments, the ahead-of-time compile (no argument
attributes) would otherwise see unaligned element-wise loads, twice the registers and spills.

To measure on a GPU (test_triton_range.py holds the correctness side): fwd and fwd+bwd time of each branch against
the reference path and against dense SDPA (is_causal) at B = 1, S in {4k, 16k, 64k}, H = 12, G = 2, d = 64,
w = 512, l = 32, d_cmp = 16 (triton.testing.do_bench, or torch.cuda.Event over 20 iterations after 5 warm-ups);
the achieved TFLOP/s (window fwd: 4 * S * w * H * d FLOPs; cmp: 2 * S * n_cmp * H * d); then BLOCK_M 64 vs 128,
BLOCK_N 64 vs 128, num_stages 2 vs 3 and dK/dV rows 32 vs 64 on sm_90 and sm_80 to retune the configurations,
and NSPLIT for cmp's dK/dV at S = 64k (its triangle).

Measured
--------
On GPUs: reports/gpu/ (the layer and its kernels under torch.profiler: benchmarks/profile_layer.py; candidate launch
configurations: benchmarks/tune_kernels.py). Ahead of time (python -m nsa.attention.kernels.aot, bf16; MODE, hpg and
the window/block parameters are runtime arguments, so one compile covers them): every case compiles for sm_80 and
sm_90 without spills under triton 3.9 and 3.6, and sm_90 reaches wgmma except in the 32-key dK/dV tiles of
d_k != d_v; the registers and shared memory of each case are in reports/aot/triton-<version>.md.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple, Optional

import torch
import triton

from nsa.attention.kernels.aot import AotCase
from nsa.attention.kernels.common import (LOG2E, TRITON_HEAD_DIMS, TRITON_MAX_HEADS_PER_GROUP, LaunchConfig,
                                         dot_precision)

WINDOW, COMPRESSED, BAND = 0, 1, 2


from nsa.config import resolve_auto
from nsa.attention.kernels.range_attn.jit import (  # noqa: F401 - the jit code, re-exported for tests
    _ranges, _mask_params, _key_bounds, _segment, _key_tiles, _query_tile, _fwd_loop, _range_fwd_kernel, _dq_loop,
    _range_bwd_dq_kernel, _dkdv_loop, _key_tile_tokens, _range_bwd_dkdv_kernel, _range_dkdv_sum)


# ----------------------------------------------------------------------------------------------------- launch
SMALL_Q = LaunchConfig(64, 64, 4)
LARGE_Q = LaunchConfig(128, 64, 8)
WIDE_Q = LaunchConfig(64, 64, 8)  # max(d_k, d_v) = 128: 128 rows spill on sm_80, 4 warps sit at 255 registers
# dK/dV: 32 query rows a step (the rows' statistics are spread over a key-major tile's columns: 64 rows cost ~70 more
# registers a thread and spill on sm_80) and 8 warps (4 sit at 255 registers on sm_80 under triton 3.6).
DKDV = LaunchConfig(32, 64, 8)
DKDV_MIXED = LaunchConfig(32, 32, 4)  # d_k != d_v: the 64-key tile spills on sm_80
# a query tile holds all heads of its tokens: hpg <= the smallest BLOCK_M (dK/dV's 32)
MAX_HPG = TRITON_MAX_HEADS_PER_GROUP


@lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of the device (an H100's 132 when the kernels run in the interpreter)."""
    if device.type == "cuda":
        return _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 132


def query_config(d_k: int, d_v: int) -> LaunchConfig:
    """Forward and dQ as shipped: 128-row tiles (two m64 warpgroups sharing each key tile) for d = 64; 64 rows for
    d = 32 (4 warps) and for max(d) = 128 (8 warps: 128 rows spill on sm_80, 4 warps sit at 255 registers). The
    launcher asks fwd_config / dq_config, which take a QUERY_CHOICES tile at d = 64 instead."""
    if max(d_k, d_v) > 64:
        return WIDE_Q
    return LARGE_Q if d_k == d_v == 64 else SMALL_Q


class QueryChoice(NamedTuple):
    """A forward / dQ launch choice: the forward kernel's tile and the dQ kernel's for d_k = d_v = 64 (None:
    query_config's pick; other head dims always keep query_config's)."""

    fwd: Optional[LaunchConfig]
    dq: Optional[LaunchConfig]


# Forward / dQ choices side by side (issue 31 item 2.5). The shipped 128 x 64 tile, 8 warps, runs one CTA per SM on
# sm_90 (registers: 186 forward, 162 dQ under triton 3.9). The others fit two or more CTAs per SM on sm_90 in the
# ahead-of-time compile, without spills on sm_80 or sm_90 and with wgmma (reports/aot/range_query_occupancy.md):
# a 32-key tile halves the score, probability and dP tiles a thread holds (128 x 32 fp32 over 256 threads: 16
# registers each instead of 32), so the 128-row tile (21 tokens x 6 heads, the same key reads per token) drops to
# ~125 registers: 2 CTAs of 8 warps; with 64 rows and 4 warps (10 tokens a tile, twice the key tiles read per
# token) 4 CTAs. A choice becomes QUALIFIED_QUERY once a GPU run qualifies it: its tests on the GPU in bf16 against
# float64 (test_range_query_choices.py), memcheck clean, and faster than the one before in an alternated A/B
# (benchmarks/tune_kernels.py --families range_q; bench_attention.py --query-choice). No GPU has timed them yet.
QUERY_CHOICES: dict[str, QueryChoice] = {
    "shipped": QueryChoice(None, None),
    "bn32": QueryChoice(LaunchConfig(128, 32, 8, 2), LaunchConfig(128, 32, 8, 2)),
    "bn32_s3": QueryChoice(LaunchConfig(128, 32, 8, 3), LaunchConfig(128, 32, 8, 3)),
    "m64_bn32": QueryChoice(LaunchConfig(64, 32, 4, 2), LaunchConfig(64, 32, 4, 2)),
}
QUALIFIED_QUERY = "shipped"  # what "auto" picks: the choice a GPU run has qualified (none other has run on a GPU)
QUERY_CHOICE = "auto"  # the launcher's choice: "auto" or a key of QUERY_CHOICES (tune_kernels sets it for an A/B)


def query_choice() -> QueryChoice:
    """The forward / dQ choice in effect (QUERY_CHOICE, "auto" = QUALIFIED_QUERY), read at each launch."""
    name = resolve_auto("range attention: QUERY_CHOICE", QUERY_CHOICE, tuple(QUERY_CHOICES), QUALIFIED_QUERY)
    return QUERY_CHOICES[name]


def fwd_config(d_k: int, d_v: int) -> LaunchConfig:
    """The forward kernel's launch: the choice's tile at d_k = d_v = 64, else query_config's."""
    cfg = query_choice().fwd
    return cfg if cfg is not None and d_k == d_v == 64 else query_config(d_k, d_v)


def dq_config(d_k: int, d_v: int) -> LaunchConfig:
    """The dQ kernel's launch: the choice's tile at d_k = d_v = 64, else query_config's."""
    cfg = query_choice().dq
    return cfg if cfg is not None and d_k == d_v == 64 else query_config(d_k, d_v)


class DkdvSplit(NamedTuple):
    """How the cmp (and sink) dK/dV launch cuts each key tile's query range into chunks (grid z): enough chunks for
    about `programs_per_sm` programs per SM and, with max_steps > 0, enough that no chunk is longer than max_steps
    query tiles (a bounded serial length at long S); at most max_split chunks and one per 4 query tiles."""

    programs_per_sm: int = 2
    max_split: int = 16
    max_steps: int = 0  # 0: no bound on a chunk's length


class DkdvChoice(NamedTuple):
    """A dK/dV launch choice: the tile for d_k = d_v <= 64 (None: DKDV; other head dims keep dkdv_config's pick)
    and the split of the cmp launch."""

    cfg: Optional[LaunchConfig]
    split: DkdvSplit


# dK/dV choices side by side (issue 31 item 2.1). "shipped" is the configuration of the GPU runs before 2026-11-28; the
# others fit two or more CTAs per SM on sm_90 in the ahead-of-time compile (reports/aot/range_dkdv_occupancy.md):
# 4 warps (one m64 wgmma warpgroup) halve the threads a CTA holds, and the 32-key tile (mma.sync) also cuts the
# registers. 4 warps keep one stage: with two, the 64-key tile spills on sm_80 (36-48 bytes; on sm_90 it fits,
# 2 CTAs per SM: tune_kernels' range_dkdv candidate 1). The "_split" ones cut the cmp launch finer: at S = 65,536
# (m7c) 26 chunks of <= 512 query tiles per key tile (3,328 programs) instead of 3 chunks of up to 4,370 (384
# programs). A choice becomes QUALIFIED_DKDV once a GPU run qualifies it: its tests on the GPU against float64,
# memcheck clean, and faster than the one before in an alternated A/B (benchmarks/tune_kernels.py --families
# range_dkdv). w4s1_split did on an H200 (reports/gpu/2026-11-28-h200): the window and cmp branches' fwd+bwd took
# 0.58x the shipped choice's time at S 65,536 B 1 (backward 8.72 ms against 17.27, medians of 5) and 0.88x at
# 2,048 B 8; 19 GPU tests passed, memcheck 0 errors.
DKDV_CHOICES: dict[str, DkdvChoice] = {
    "shipped": DkdvChoice(None, DkdvSplit()),
    "w4s1": DkdvChoice(LaunchConfig(32, 64, 4, 1), DkdvSplit()),
    "w4s1_split": DkdvChoice(LaunchConfig(32, 64, 4, 1), DkdvSplit(4, 64, 512)),
    "bn32_w4_split": DkdvChoice(LaunchConfig(32, 32, 4, 2), DkdvSplit(4, 64, 512)),
    "split": DkdvChoice(None, DkdvSplit(4, 64, 512)),
}
QUALIFIED_DKDV = "w4s1_split"  # what "auto" picks: the choice a GPU run has qualified (2026-11-28, H200)
DKDV_CHOICE = "auto"  # the launcher's choice: "auto" or a key of DKDV_CHOICES (tune_kernels sets it for an A/B)


def dkdv_choice() -> DkdvChoice:
    """The dK/dV choice in effect (DKDV_CHOICE, "auto" = QUALIFIED_DKDV), read at each launch."""
    name = resolve_auto("range attention: DKDV_CHOICE", DKDV_CHOICE, tuple(DKDV_CHOICES), QUALIFIED_DKDV)
    return DKDV_CHOICES[name]


# Glue choices of the backward (issue 31 item 2.6, "fold partial sums and casts into the kernels"). "torch": dK/dV's
# fp32 partials [NSPLIT, B, G, T, d] are summed by torch where NSPLIT > 1 (the cmp branch: 2 ops) and cast to a
# bf16/fp16 activation dtype (2 ops; none in fp32; the window's one partial is cast alone). "fused": _range_dkdv_sum
# sums both partials in split order and stores them in the activation dtype in one launch (the bf16 rounding written
# out on the bits, round to nearest even: torch's bits, checked in the interpreter), wherever torch would launch
# anything (NSPLIT > 1, or a cast): 2 ops fewer and one launch more for the cmp branch in fp32; 4 ops for 1 launch
# (cmp) and 2 for 1 (window) in bf16; the band forced choice's fp32 band backward (fp32=True) sums its split in
# that launch too (2 ops for 1). The sum's order is torch's on a CPU (sequential over the splits), so the fp32
# result is the same bit for bit there; on a GPU torch's reduction order may differ by rounding. Same qualification
# rule as DKDV_CHOICES (GPU tests against float64, memcheck, an alternated A/B); no GPU has run it.
GLUE_CHOICES = ("torch", "fused")
QUALIFIED_GLUE = "torch"  # what "auto" picks: the choice a GPU run has qualified
GLUE_CHOICE = "auto"  # the launcher's choice: "auto" or one of GLUE_CHOICES
SUM_BLOCK = 1024  # elements per program of _range_dkdv_sum (no products: memory-bound)


def glue_choice() -> str:
    """The backward's glue choice in effect (GLUE_CHOICE, "auto" = QUALIFIED_GLUE), read at each backward."""
    return resolve_auto("range attention: GLUE_CHOICE", GLUE_CHOICE, tuple(GLUE_CHOICES), QUALIFIED_GLUE)


def _sum_cast(dk_part: torch.Tensor, dv_part: torch.Tensor, dtype: torch.dtype):
    """(dk, dv) [B, G, T, d] contiguous in `dtype`: the sums over dim 0 of the fp32 partials, in one _range_dkdv_sum
    launch."""
    dk = torch.empty(dk_part.shape[1:], dtype=dtype, device=dk_part.device)
    dv = torch.empty(dv_part.shape[1:], dtype=dtype, device=dv_part.device)
    bf16 = dtype == torch.bfloat16
    nk, nv = dk.numel(), dv.numel()
    _range_dkdv_sum[(max(1, triton.cdiv(max(nk, nv), SUM_BLOCK)), 2)](
        dk_part, dv_part, dk.view(torch.int16) if bf16 else dk, dv.view(torch.int16) if bf16 else dv, nk, nv,
        dk_part.shape[0], BLOCK=SUM_BLOCK, BF16_RNE=bf16, num_warps=4)
    return dk, dv


def dkdv_config(d_k: int, d_v: int) -> LaunchConfig:
    if d_k != d_v:
        return DKDV_MIXED
    cfg = dkdv_choice().cfg
    return cfg if cfg is not None and d_k <= 64 else DKDV


def dkdv_splits(mode: int, b: int, g: int, t: int, s: int, hpg: int, n_sm: int, cfg: LaunchConfig,
                sink: int = 0, split: Optional[DkdvSplit] = None) -> int:
    """Query-range chunks per key tile: 1 for the window (bounded ranges); for cmp and a band with a sink, by
    `split` (default: the choice in effect; shipped: about two programs per SM, at most 16) and at most one per 4
    query tiles."""
    if not _uses_partials(mode, sink):
        return 1
    split = dkdv_choice().split if split is None else split
    programs = b * g * triton.cdiv(max(t, 1), cfg.block_n)
    q_tiles = triton.cdiv(s, cfg.block_m // hpg)
    want = triton.cdiv(split.programs_per_sm * n_sm, programs)
    if split.max_steps > 0:
        want = max(want, triton.cdiv(q_tiles, split.max_steps))
    return max(1, min(split.max_split, want, triton.cdiv(q_tiles, 4)))


def _uses_partials(mode: int, p1: int) -> bool:
    return mode == COMPRESSED or (mode == BAND and p1 > 0)


def _check(q, k, v, mode, p0, p1):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("range attention: q, k, v must be 4-d ([B, H, S, d_k], [B, G, T, d_k], [B, G, T, d_v])")
    b, h, s, d_k = q.shape
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or k.shape[-1] != d_k:
        raise ValueError(f"range attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    g = k.shape[1]
    if g == 0 or h % g:
        raise ValueError(f"range attention: H = {h} is not a multiple of G = {g}")
    for name, d in (("d_k", d_k), ("d_v", v.shape[-1])):
        if d not in TRITON_HEAD_DIMS:
            raise ValueError(f"range attention: {name} = {d}; the Triton kernels take "
                             f"{', '.join(map(str, TRITON_HEAD_DIMS))}")
    if h // g > MAX_HPG:
        raise ValueError(f"range attention: {h // g} heads per group; the Triton kernels take at most {MAX_HPG}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"range attention: dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if mode in (WINDOW, BAND) and k.shape[2] != s:
        raise ValueError("range attention: window/band keys must have the queries' length")
    if mode == WINDOW and p0 < 1:
        raise ValueError(f"window_attention: w must be >= 1, got {p0}")
    if mode == COMPRESSED and (p0 < 1 or p1 < 1):
        raise ValueError(f"compressed_attention: l and d must be >= 1, got {p0}, {p1}")
    if mode == BAND and (p0 < 1 or p1 not in (0, p0)):
        raise ValueError(f"band_attention: l_sel >= 1 and sink in (0, l_sel), got {p0}, {p1}")


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x itself when every row of its last dimension starts 16-byte aligned and is contiguous (what the kernels'
    tl.multiple_of hints promise), else an aligned contiguous copy. Reads metadata only (no device sync)."""
    size = x.element_size()
    ok = x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(
        (st * size) % 16 == 0 for st, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)
    return x if ok else x.clone(memory_format=torch.contiguous_format)


def _like_bshd(b, h, s, d, dtype, device) -> torch.Tensor:
    """[B, H, S, d] stored as [B, S, H, d] (the layer's layout)."""
    return torch.empty(b, s, h, d, dtype=dtype, device=device).transpose(1, 2)


def _forward(q, k, v, mode: int, p0: int, p1: int, o_dtype: Optional[torch.dtype] = None):
    """(o, lse); o in o_dtype (default q's: the kernel casts at its store; the selected branch's "band" forced choice
    asks fp32, which it merges with its sparse part before the one cast)."""
    b, h, s, d_k = q.shape
    g, t, d_v = k.shape[1], k.shape[2], v.shape[-1]
    hpg = h // g
    o = _like_bshd(b, h, s, d_v, o_dtype or q.dtype, q.device)
    lse = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
    if s == 0:
        return o, lse
    if t == 0:  # nothing is visible anywhere
        return o.zero_(), lse.fill_(float("-inf"))
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    cfg = fwd_config(d_k, d_v)
    sm_scale = 1.0 / math.sqrt(d_k)
    prec = dot_precision(q.dtype)
    grid = (triton.cdiv(s, cfg.block_m // hpg), b * g)
    _range_fwd_kernel[grid](
        q, k, v, o, lse, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        h, g, hpg, s, t, mode, p0, p1, sm_scale * LOG2E,
        D_K=d_k, D_V=d_v, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, DOT_PREC=prec)
    return o, lse


def _backward(do, q, k, v, lse, o, delta, mode: int, p0: int, p1: int, fp32: bool = False):
    """(dq, dk, dv). Exactly one of o (delta = rowsum(dO * O) is computed) and delta (given) is not None. fp32: all
    three in fp32, uncast (the selected branch's "band" forced choice adds its sparse part's before one cast)."""
    b, h, s, d_k = q.shape
    g, t, d_v = k.shape[1], k.shape[2], v.shape[-1]
    hpg = h // g
    dq = _like_bshd(b, h, s, d_k, torch.float32 if fp32 else q.dtype, q.device)
    if s == 0 or t == 0:
        return dq.zero_(), *(x.new_zeros(x.shape, dtype=torch.float32 if fp32 else x.dtype) for x in (k, v))
    q, k, v, do = _aligned(q), _aligned(k), _aligned(v), _aligned(do)
    n_sm = num_sms(q.device)
    sm_scale = 1.0 / math.sqrt(d_k)
    compute_delta = delta is None
    if compute_delta:
        o = _aligned(o)
        delta = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
    else:
        o = do  # not read
        delta = delta.float().contiguous()
    lse = lse.float().contiguous()
    prec = dot_precision(q.dtype)
    cfg = dq_config(d_k, d_v)
    grid = (triton.cdiv(s, cfg.block_m // hpg), b * g)
    _range_bwd_dq_kernel[grid](
        q, k, v, o, do, lse, delta, dq,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        h, g, hpg, s, t, mode, p0, p1, sm_scale * LOG2E, sm_scale, int(compute_delta),
        D_K=d_k, D_V=d_v, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, DOT_PREC=prec)

    # dK/dV as fp32 partials [NSPLIT, B, G, T, d] (NSPLIT = 1 for the window), summed and cast by torch: one
    # compiled variant per shape instead of two (the cast costs a pass over B*G*T*d elements, small beside the
    # attention itself). With one partial (the window) there is nothing to sum: its only slice is cast (no op at
    # all in fp32), the same values as sum(0) without its launch.
    cfg = dkdv_config(d_k, d_v)
    n_split = dkdv_splits(mode, b, g, t, s, hpg, n_sm, cfg, p1)
    dk_part = torch.empty(n_split, b, g, t, d_k, dtype=torch.float32, device=q.device)
    dv_part = torch.empty(n_split, b, g, t, d_v, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(t, cfg.block_n), b * g, n_split)
    _range_bwd_dkdv_kernel[grid](
        q, k, v, do, lse, delta, dk_part, dv_part,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dk_part.stride(0), dk_part.stride(1), dk_part.stride(2), dk_part.stride(3),
        dv_part.stride(0), dv_part.stride(1), dv_part.stride(2), dv_part.stride(3),
        h, g, hpg, s, t, mode, p0, p1, sm_scale * LOG2E, sm_scale,
        D_K=d_k, D_V=d_v, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, DOT_PREC=prec)
    fused = glue_choice() == "fused"
    if fp32:
        if n_split == 1:
            return dq, dk_part[0], dv_part[0]
        return (dq, *_sum_cast(dk_part, dv_part, torch.float32)) if fused else (dq, dk_part.sum(0), dv_part.sum(0))
    if fused and (n_split > 1 or k.dtype != torch.float32) and k.dtype == v.dtype:
        return (dq, *_sum_cast(dk_part, dv_part, k.dtype))
    if n_split == 1:
        return dq, dk_part[0].to(k.dtype), dv_part[0].to(v.dtype)
    return dq, dk_part.sum(0).to(k.dtype), dv_part.sum(0).to(v.dtype)


# ----------------------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("nsa::range_attention", mutates_args=())
def range_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: int, p0: int,
                       p1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of range attention (module docstring); o is differentiable, lse is not."""
    return _forward(q, k, v, mode, p0, p1)


@range_attention_op.register_fake
def _(q, k, v, mode, p0, p1):
    b, h, s, _ = q.shape
    return (_like_bshd(b, h, s, v.shape[-1], q.dtype, q.device),
            q.new_empty(b, h, s, dtype=torch.float32))


@torch.library.custom_op("nsa::range_attention_bwd", mutates_args=())
def range_attention_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                           o: Optional[torch.Tensor], delta: Optional[torch.Tensor], mode: int, p0: int,
                           p1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) given dO and the softmax's lse; delta = rowsum(dO * O) is computed from o, or given."""
    if (o is None) == (delta is None):
        raise ValueError("range_attention_bwd: give exactly one of o and delta")
    return _backward(do, q, k, v, lse, o, delta, mode, p0, p1)


@range_attention_bwd_op.register_fake
def _(do, q, k, v, lse, o, delta, mode, p0, p1):
    b, h, s, d_k = q.shape
    return _like_bshd(b, h, s, d_k, q.dtype, q.device), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mode, p0, p1 = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.params = (mode, p0, p1)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zero tensor filled for lse's gradient (one launch per call)


def _backward_fn(ctx, do, _dlse):
    if do is None:  # o took no part in the loss
        return None, None, None, None, None, None
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = range_attention_bwd_op(do, q, k, v, lse, o, None, *ctx.params)
    return dq, dk, dv, None, None, None


range_attention_op.register_autograd(_backward_fn, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------------------- public API
def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int) -> torch.Tensor:
    """Sliding-window attention: query t attends keys (t - w, t] of its group. Differentiable in q, k, v."""
    _check(q, k, v, WINDOW, w, 0)
    return range_attention_op(q, k, v, WINDOW, min(w, q.shape[2]) if q.shape[2] else w, 0)[0]


def compressed_attention_lse(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, l: int,
                             d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): attention over the compression blocks visible to each query (i*d + l - 1 <= t), o = 0 where none
    is; lse [B, H, S] fp32, natural log of sum(exp(scores * scale)) over the visible blocks (-inf where none),
    detached. o is differentiable in q, k_cmp, v_cmp."""
    _check(q, k_cmp, v_cmp, COMPRESSED, l, d)
    o, lse = range_attention_op(q, k_cmp, v_cmp, COMPRESSED, l, d)
    return o, lse.detach()


def compressed_attention(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, l: int, d: int) -> torch.Tensor:
    """Attention over the compression blocks visible to each query; exactly 0 (gradient 0) where none is."""
    return compressed_attention_lse(q, k_cmp, v_cmp, l, d)[0]


def _band_params(q, k, v, l_sel: int, sink: bool) -> tuple[int, int]:
    p1 = l_sel if sink else 0
    _check(q, k, v, BAND, l_sel, p1)
    return l_sel, p1


def band_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, l_sel: int, sink: bool = False) -> torch.Tensor:
    """The selected branch's forced local band with its own softmax: query t attends keys
    [max(0, (t // l_sel - 1) * l_sel), t] (its selection block and the one before), plus the sink [0, l_sel) when
    t // l_sel >= 2 and sink is set. Differentiable in q, k, v."""
    return range_attention_op(q, k, v, BAND, *_band_params(q, k, v, l_sel, sink))[0]


def band_attention_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, l_sel: int,
                           sink: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of the band (band_attention) as one part of a softmax shared with other keys, detached (no graph):
    the caller combines parts (lse = logaddexp of the parts', o = sum of o_part * exp(lse_part - lse)) inside its
    own autograd.Function and calls band_attention_partial_bwd from its backward."""
    with torch.no_grad():
        o, lse = range_attention_op(q, k, v, BAND, *_band_params(q, k, v, l_sel, sink))
    return o, lse


def band_attention_partial_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               lse: torch.Tensor, delta: torch.Tensor, l_sel: int,
                               sink: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The band's share of the gradient of a combined attention: do = dL/dO of the combined output O, lse [B, H, S]
    and delta = rowsum(dO * O) [B, H, S] of the combined softmax (fp32). Returns (dq, dk, dv) of the band's keys
    only (p = exp(s - lse) on the band); add the other parts' shares."""
    return range_attention_bwd_op(do, q, k, v, lse, None, delta, BAND, *_band_params(q, k, v, l_sel, sink))


# ----------------------------------------------------------------------------------------------------- AOT cases
_INTS = {
    "fwd": ("sqb", "sqh", "sqs", "skb", "skg", "sks", "svb", "svg", "svs", "sob", "soh", "sos",
            "H", "G", "HPG", "S", "T", "MODE", "P0", "P1"),
    "dq": ("sqb", "sqh", "sqs", "skb", "skg", "sks", "svb", "svg", "svs", "sob", "soh", "sos", "sdob", "sdoh", "sdos",
           "sdqb", "sdqh", "sdqs", "H", "G", "HPG", "S", "T", "MODE", "P0", "P1"),
    "dkdv": ("sqb", "sqh", "sqs", "skb", "skg", "sks", "svb", "svg", "svs", "sdob", "sdoh", "sdos",
             "sdk_split", "sdkb", "sdkg", "sdkt", "sdv_split", "sdvb", "sdvg", "sdvt", "H", "G", "HPG", "S", "T",
             "MODE", "P0", "P1"),
}


def _signature(kernel: str, dtype: str) -> dict:
    ptr, f32 = f"*{dtype}", "*fp32"
    if kernel == "fwd":
        sig = {"Q": ptr, "K": ptr, "V": ptr, "O": ptr, "LSE": f32}
    elif kernel == "dq":
        sig = {"Q": ptr, "K": ptr, "V": ptr, "O": ptr, "DO": ptr, "LSE": f32, "DELTA": f32, "DQ": ptr}
    else:
        sig = {"Q": ptr, "K": ptr, "V": ptr, "DO": ptr, "LSE": f32, "DELTA": f32, "DK": f32, "DV": f32}
    sig.update({name: "i32" for name in _INTS[kernel]})
    sig["qk_scale"] = "fp32"
    if kernel != "fwd":
        sig["sm_scale"] = "fp32"
    if kernel == "dq":
        sig["COMPUTE_DELTA"] = "i32"
    return sig


# (d_k, d_v) pairs compiled ahead of time: the model's d_k = d_v at every supported size, and one d_k != d_v.
AOT_DIMS = ((32, 32), (64, 64), (128, 128), (64, 128))


def _dkdv_configs(d_k: int, d_v: int) -> list:
    """[(tile, choice)]: dkdv_config's pick (choice ""), then every other tile a DKDV_CHOICES entry gives these head
    dims (the shipped tile, cfg None, included), with the first choice that gives it (AotCase.choice)."""
    out = [(dkdv_config(d_k, d_v), "")]
    for name, choice in DKDV_CHOICES.items():
        cfg = choice.cfg if choice.cfg is not None and d_k == d_v <= 64 else (DKDV_MIXED if d_k != d_v else DKDV)
        if all(cfg != seen for seen, _ in out):
            out.append((cfg, f"DKDV_CHOICE {name}"))
    return out


def aot_cases(dims=AOT_DIMS, dtype: str = "bf16") -> list:
    """Every kernel at every configuration the launcher can pick. MODE, hpg, the window/block parameters and
    COMPUTE_DELTA are runtime arguments, so they add no cases; d_k and d_v choose the configuration."""
    cases = []
    kernels = {"fwd": _range_fwd_kernel, "dq": _range_bwd_dq_kernel, "dkdv": _range_bwd_dkdv_kernel}
    for d_k, d_v in dims:
        for kernel, fn in kernels.items():
            # forward and dQ: the launcher's pick only (the other QUERY_CHOICES tiles are compiled by
            # benchmarks/tune_kernels.py --aot --families range_q, reports/aot/range_query_occupancy.md)
            picks = {"fwd": [(fwd_config(d_k, d_v), "")], "dq": [(dq_config(d_k, d_v), "")]}
            for cfg, choice in (_dkdv_configs(d_k, d_v) if kernel == "dkdv" else picks[kernel]):
                constexprs = dict(D_K=d_k, D_V=d_v, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                  DOT_PREC="ieee" if dtype == "fp32" else "tf32")
                sig = _signature(kernel, dtype)
                sig.update({name: "constexpr" for name in constexprs})
                # a dK/dV tile of 32 keys is below wgmma's 64 rows: mma.sync on sm_90 too, a family of its own
                family = f"range_{kernel}" + ("_bn32" if kernel == "dkdv" and cfg.block_n < 64 else "")
                tag = (f"{family}[BLOCK_M={cfg.block_m},BLOCK_N={cfg.block_n},warps={cfg.num_warps},"
                       f"stages={cfg.num_stages},d_k={d_k},d_v={d_v},{dtype}]")
                cases.append(AotCase(name=tag, fn=fn, signature=sig, constexprs=constexprs,
                                     num_warps=cfg.num_warps, num_stages=cfg.num_stages, choice=choice))
    if dims == AOT_DIMS and dtype == "bf16":  # the default list (the compile test's): the glue choice's kernel too
        cases += glue_aot_cases()
    return cases


def glue_aot_cases() -> list:
    """_range_dkdv_sum (GLUE_CHOICES "fused") into each activation dtype: bf16 (its rounding on int16 bits), fp16 and
    fp32 (a GPU run in fp32 sums the cmp branch's partials too). No products: no tensor cores expected."""
    cases = []
    for out, rne in (("*i16", True), ("*fp16", False), ("*fp32", False)):
        sig = {"DKP": "*fp32", "DVP": "*fp32", "DK": out, "DV": out, "NK": "i32", "NV": "i32", "NSPLIT": "i32",
               "BLOCK": "constexpr", "BF16_RNE": "constexpr"}
        label = "bf16" if rne else out[1:]
        cases.append(AotCase(name=f"range_dkdv_sum[{label},BLOCK={SUM_BLOCK}]", fn=_range_dkdv_sum, signature=sig,
                             constexprs={"BLOCK": SUM_BLOCK, "BF16_RNE": rne}, num_warps=4, num_stages=1,
                             tensor_cores=False, choice="GLUE_CHOICE fused"))
    return cases
