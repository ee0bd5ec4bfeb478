"""What one NSA layer's attention kernels must do at a shape, and their floor on a device: the roofline.

For a shape (NSAConfig: H heads, G KV groups, d_k, d_v, compression block l and stride d, selection block l_sel,
n_sel selected blocks, window w), a sequence length S, a batch B and an element size, `kernel_costs` gives per
kernel family (the Triton kernels of nsa.attention.kernels, named as a profiler names them, see `family`) and per
pass (forward; backward) three counts: matmul FLOPs, exponentials and minimal HBM bytes. A kernel's floor on a
device is max(FLOPs / peak FLOP/s, exps / peak exp/s, bytes / peak bytes/s) (`Cost.floor_s`); its efficiency is
floor / measured time.

What is counted
---------------
(query, key) pairs: per head, the keys each query t (0-based) attends in each branch, summed over t, from
nsa.attention.geometry (the FLOP model's count, nsa.model.flops_per_token): cmp = visible compression blocks,
num_cmp_blocks(t + 1); win = min(w, t + 1); sel = decode_reads(t + 1) - cmp - win, the tokens <= t of the n_sel
chosen blocks (all of them while at most n_sel blocks have started). Masked keys inside a computed tile are NOT
counted: the floor is the work the function needs, not what a tiling does.

FLOPs (multiply-add = 2) per pair and per head, the products each kernel's algorithm needs (its design in
nsa/attention/kernels/*/host.py), recomputation included where the design recomputes:
- forward, one pass over keys (_range_fwd, _sel_fwd_query): Q K^T + P V = 2 * (d_k + d_v), one exp. This is
  nsa.model.flops_per_token's attention count (2 * (d_k + d_v) per key read, per head).
- _sel_fwd_kv_stats (Q K^T, log-sum-exp): 2 * d_k, one exp; _sel_fwd_kv_out (Q K^T again, P V): 2 * (d_k + d_v), one
  exp. The kv-outer forward thus does 1.5x a single pass's products and two exps per pair.
- range backward, split FA2-style in two kernels: dQ (recompute S, dP = dO V^T, dQ = dS K) 2 * (2 d_k + d_v), one
  exp; dK/dV (recompute S, dV += P^T dO, dP, dK += dS^T Q) 2 * (2 d_k + 2 d_v), one exp: 3.5x forward in all.
- _sel_bwd_kv, one kernel: S, dV, dP, dK, dQ = 2 * (3 d_k + 2 d_v) (2.5x forward, the FlashAttention convention),
  one exp.
- the selected backward's "query" dQ choice (selected_attn.host.DQ_CHOICES) splits it FA2-style in two kernels:
  _sel_bwd_dq_query (recompute S, dP = dO V^T, dQ = dS K) 2 * (2 d_k + d_v), one exp, and _sel_bwd_kv launched
  without dQ (family sel_bwd_kv_dkdv: S, dV, dP, dK) 2 * (2 d_k + 2 d_v), one exp: together S and dP twice, the
  unsplit kernel's products plus 2 * (d_k + d_v) and one exp more per pair. A profile names both _sel_bwd_kv
  launches alike: `families` tells them apart by the presence of _sel_bwd_dq_query.
- the kv forward's "partial" output choice (selected_attn.host.OUT_CHOICES): _sel_fwd_kv_part does
  _sel_fwd_kv_out's products and exp (2 * (d_k + d_v), one exp) and stores each pair's p V in fp32 instead of
  adding it; _sel_fwd_reduce sums a query's slots (no products, no exps): the same FLOPs and exps as the atomic
  output, other bytes.
- the fused host glue (selected_attn.host.HOST_CHOICES): _sel_fwd_lse (the slots' log-sum-exp, zero fills),
  _sel_bwd_delta_zero (delta, zero fills) and _sel_cast (the backward's fp32 dQ, dK and dV read, written in the
  activation dtype: the casts torch would launch one by one) are memory-bound glue: bytes only; so is the range
  backward's fused glue (range_attn.host.GLUE_CHOICES), _range_dkdv_sum: dK/dV's fp32 partials summed and written
  in the activation dtype (counted as one partial read: the split's other partials are the tiling's, not the
  function's).
- the band forced choice (selected_attn.host.FORCED_CHOICES): _sel_band_rest (each row's listed blocks without its
  forced ones, packed: int32 lists in and out) and _sel_band_merge (the band's and the sparse part's fp32 outputs
  and lse in, the output and the lse in two layouts out) are memory-bound glue: bytes only. The forced pairs it
  sends through a third range launch are not moved from the selected families to the range ones: profile_layer
  profiles the shipped choices, so a profile under "band" would show its band launch under range_fwd /
  range_bwd_* above their floors.
- selection importance (Eq. 8-10, _blocksel_importance_kernel / _blocksel_topk_kernel): Q K_cmp^T for every
  visible compressed key and head, 2 * d_k, and p = exp(s - lse), one exp; the small P @ W and head-sum products
  (Eq. 9, 10) are not counted. This is flops_per_token's forward-only "importance" term.
- dense causal SDPA (the dense twin's floor, `dense_costs`): (t + 1) keys at position t; forward 2 * (d_k + d_v)
  and one exp per pair, backward 2.5x forward (FlashAttention's five products in one kernel) and one exp.

Minimal HBM bytes: compulsory traffic of each kernel as designed, every tensor it must read read once and every
tensor it must write written once (no re-reads of a tile from HBM; L2 is assumed to hold what is shared):
activations q [B, S, H, d_k], o [B, S, H, d_v], keys/values [B, G, S, d] (window, selected) or [B, G, n_cmp, d]
(compressed) in the element size; softmax statistics (lse, delta) fp32; where the design accumulates in fp32
(selected output and dQ/dK/dV through atomics), those buffers in fp32; the partial output choice's per-pair
buffer [(query, selection block) pairs, hpg, d_v] fp32, written by _sel_fwd_kv_part and read by _sel_fwd_reduce.
The selected branch's index (block lists, pair_t, tile tables) is not counted. torch's radix sort of the tiled
selection's importance rows reads fp32 keys and writes fp32 keys and int64 indices: 16 bytes a (query, group,
selection block) element. The tiled selection's "topk" choice (nsa.attention.selection.TOPK_CHOICES):
_blocksel_keys_kernel does the importance kernel's products and exps and writes an int64 key for every (query,
group, selection block) element; torch.topk's kernels (family selection_select) read those keys and write the
n_sel kept keys and their indices; _blocksel_finish_kernel reads the kept keys and writes the int64 blocks. Exps and
FLOPs of memory-bound glue are 0.

The layer's floor (`layer_floor_s`) is the sum of the floors of the kernels an ideal implementation of this
design runs: forward the range forward (cmp and window), the selection importance (fused with its top-n: no sort
and no importance buffer), the selected branch's two kv passes; backward the range dQ and dK/dV kernels and the
selected branch's delta and kv backward. Glue (projections' GEMMs, RoPE and layout copies, gate combine, the
tiled selection's sort) is left out, as it is left out of the dense twin's floor (SDPA only), so that
layer floor / dense floor compares the attention designs. Measured profiles list every kernel: glue that has no
model here (aten kernels, GEMMs) gets no floor and counts as time above the floor.

Torch-free: profile readers and the trainer's FLOP count import it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple

from nsa.attention.geometry import decode_reads, mean_reads, num_cmp_blocks, num_sel_blocks
from nsa.config import NSAConfig

FWD, BWD = "fwd", "bwd"
FP32 = 4
INDEX = 8  # int64 indices (torch.sort, choose_blocks)


class Peaks(NamedTuple):
    """A device's peaks per second: dense matmul FLOP/s at the precision, exponentials/s, HBM bytes/s."""

    flops: float
    exps: float
    bytes: float


@dataclass(frozen=True)
class Cost:
    """What a kernel must do: matmul FLOPs, exponentials and minimal HBM bytes."""

    flops: float = 0.0
    exps: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.exps + other.exps, self.bytes + other.bytes)

    def times(self, peaks: Peaks) -> dict[str, float]:
        """Seconds each resource needs at the device's peak."""
        return {"flops": self.flops / peaks.flops, "exps": self.exps / peaks.exps, "bytes": self.bytes / peaks.bytes}

    def floor_s(self, peaks: Peaks) -> float:
        """The kernel's floor on the device: the slowest of its three resources at peak."""
        return max(self.times(peaks).values())

    def bound(self, peaks: Peaks) -> str:
        """Which resource sets the floor: "flops", "exps" or "bytes"."""
        times = self.times(peaks)
        return max(times, key=times.get)


# ----------------------------------------------------------------------------------------------- pair counts
def window_pairs(w: int, seq_len: int) -> int:
    """Sum over t of min(w, t + 1): (query, key) pairs of the sliding window per head and sequence."""
    if seq_len <= w:
        return seq_len * (seq_len + 1) // 2
    return w * (w + 1) // 2 + (seq_len - w) * w


def branch_pairs(cfg: NSAConfig, seq_len: int) -> dict[str, int]:
    """(query, key) pairs each branch visits per head and sequence of seq_len tokens: {"cmp", "sel", "win"}.

    From geometry.mean_reads (total keys read and compressed keys read per query, summed here), the window's
    closed form, and sel = total - cmp - win."""
    reads, cmp_reads = mean_reads(cfg, seq_len)
    total, cmp = round(reads * seq_len), round(cmp_reads * seq_len)
    win = window_pairs(cfg.w, seq_len)
    return {"cmp": cmp, "sel": total - cmp - win, "win": win}


def keys_visited(cfg: NSAConfig, t: int) -> dict[str, int]:
    """Keys query t (0-based) attends per head in each branch: the per-query form of branch_pairs."""
    cmp, win = num_cmp_blocks(t + 1, cfg.l, cfg.d), min(cfg.w, t + 1)
    return {"cmp": cmp, "sel": decode_reads(t + 1, cfg) - cmp - win, "win": win}


def block_pairs(cfg: NSAConfig, seq_len: int) -> int:
    """(query, selection block) pairs per KV group and sequence: sum over t of min(n_sel, t // l_sel + 1), the
    entries of the selected branch's inverted index."""
    total = 0
    for j in range(num_sel_blocks(seq_len, cfg.l_sel)):  # block j holds queries [j*l_sel, min((j+1)*l_sel, S))
        rows = min(cfg.l_sel, seq_len - j * cfg.l_sel)
        total += rows * min(cfg.n_sel, j + 1)
    return total


def started_blocks(cfg: NSAConfig, seq_len: int) -> int:
    """Sum over t of t // l_sel + 1: the selection blocks each query may choose from (the importance it scores)."""
    return sum(min(cfg.l_sel, seq_len - j * cfg.l_sel) * (j + 1) for j in range(num_sel_blocks(seq_len, cfg.l_sel)))


# ----------------------------------------------------------------------------------------------- kernel costs
# family -> pass. The layer's floor sums LAYER_FAMILIES (see the module docstring for what is left out).
FAMILY_PASS = {
    "range_fwd": FWD, "selection_importance": FWD, "selection_topk": FWD, "selection_sort": FWD,
    "selection_sort_blocks": FWD, "selection_keys": FWD, "selection_select": FWD, "selection_finish": FWD,
    "sel_fwd_kv_stats": FWD, "sel_fwd_kv_out": FWD, "sel_fwd_query": FWD,
    "combine_fwd": FWD,
    "sel_fwd_kv_part": FWD, "sel_fwd_reduce": FWD, "sel_fwd_lse": FWD, "sel_band_rest": FWD, "sel_band_merge": FWD,
    "range_bwd_dq": BWD, "range_bwd_dkdv": BWD, "sel_bwd_delta": BWD, "sel_bwd_kv": BWD, "combine_bwd": BWD,
    "sel_bwd_dq_query": BWD, "sel_bwd_kv_dkdv": BWD, "sel_bwd_delta_zero": BWD, "sel_cast": BWD,
    "range_dkdv_sum": BWD,
    "dense_fwd": FWD, "dense_bwd": BWD,
}
LAYER_FAMILIES = {FWD: ("range_fwd", "selection_topk", "sel_fwd_kv_stats", "sel_fwd_kv_out"),
                  BWD: ("range_bwd_dq", "range_bwd_dkdv", "sel_bwd_delta", "sel_bwd_kv")}
DENSE_FAMILIES = {FWD: ("dense_fwd",), BWD: ("dense_bwd",)}


def kernel_costs(cfg: NSAConfig, seq_len: int, batch: int, elem: int = 2) -> dict[str, Cost]:
    """{family: Cost} of the NSA layer's attention kernels at this shape, summed over their launches in one pass
    (the range kernels run once for cmp and once for the window; the cmp launch only once a compression block has
    ended, S >= l: before that range_attn.host fills its zero output and -inf lse without a kernel). elem: bytes of
    an activation element."""
    s, b, h, g = seq_len, batch, cfg.n_heads, cfg.n_kv_groups
    dk, dv, hpg = cfg.d_k, cfg.d_v, cfg.n_heads // cfg.n_kv_groups
    pairs = {k: v * b * h for k, v in branch_pairs(cfg, s).items()}  # (query, key) pairs, all heads and sequences
    rng = pairs["cmp"] + pairs["win"]
    sel = pairs["sel"]
    n_cmp = num_cmp_blocks(s, cfg.l, cfg.d)
    launches = 2 if n_cmp else 1  # range kernel launches per pass: the window's, and the cmp one where it has keys
    q, o = b * s * h * dk * elem, b * s * h * dv * elem
    k_tok, v_tok = b * g * s * dk * elem, b * g * s * dv * elem
    k_cmp, v_cmp = b * g * n_cmp * dk * elem, b * g * n_cmp * dv * elem
    stat = b * h * s * FP32  # one fp32 per (query, head): lse, delta
    qb = block_pairs(cfg, s) * b * g  # (query, selection block) pairs
    n_blocks = num_sel_blocks(s, cfg.l_sel)
    kept = min(cfg.n_sel, n_blocks)  # the keys torch.topk keeps per row under the "topk" choice
    costs = {
        "range_fwd": Cost(2 * (dk + dv) * rng, rng, launches * (q + o + stat) + k_cmp + v_cmp + k_tok + v_tok),
        "range_bwd_dq": Cost(2 * (2 * dk + dv) * rng, rng,
                             launches * (2 * q + 2 * o + 2 * stat) + k_cmp + v_cmp + k_tok + v_tok),
        "range_bwd_dkdv": Cost(2 * (2 * dk + 2 * dv) * rng, rng,
                               launches * (q + o + 2 * stat) + 2 * (k_cmp + v_cmp + k_tok + v_tok)),
        # importance of every visible compressed key (written per started block) vs fused with the top-n_sel
        "selection_importance": Cost(2 * dk * pairs["cmp"], pairs["cmp"],
                                     q + k_cmp + stat + b * g * started_blocks(cfg, s) * FP32),
        "selection_topk": Cost(2 * dk * pairs["cmp"], pairs["cmp"], q + k_cmp + stat + b * g * s * cfg.n_sel * INDEX),
        # torch.sort of the importance rows [B, G, S, n_blocks]: fp32 keys in, fp32 keys and int64 indices out;
        # then choose_blocks' sort of the n_sel chosen indices (int64 keys and indices)
        "selection_sort": Cost(0, 0, b * g * s * n_blocks * (FP32 + FP32 + INDEX)),
        "selection_sort_blocks": Cost(0, 0, b * g * s * cfg.n_sel * 3 * INDEX),
        # the "topk" choice: the importance's work with an int64 key written per element, torch.topk reading every
        # key and writing the kept keys and indices, the finish reading the kept keys and writing the blocks
        "selection_keys": Cost(2 * dk * pairs["cmp"], pairs["cmp"], q + k_cmp + stat + b * g * s * n_blocks * INDEX),
        "selection_select": Cost(0, 0, b * g * s * (n_blocks + 2 * kept) * INDEX),
        "selection_finish": Cost(0, 0, b * g * s * (kept + cfg.n_sel) * INDEX),
        "sel_fwd_kv_stats": Cost(2 * dk * sel, sel, q + k_tok + qb * hpg * FP32),
        "sel_fwd_kv_out": Cost(2 * (dk + dv) * sel, sel, q + k_tok + v_tok + stat + b * s * h * dv * FP32),
        "sel_fwd_query": Cost(2 * (dk + dv) * sel, sel, q + k_tok + v_tok + o + stat),
        # the partial output choice: every pair's p V stored in fp32 ([pairs, hpg, d_v]), then summed per query
        "sel_fwd_kv_part": Cost(2 * (dk + dv) * sel, sel, q + k_tok + v_tok + stat + qb * hpg * dv * FP32),
        "sel_fwd_reduce": Cost(0, 0, qb * hpg * dv * FP32 + o),
        # the fused host glue (selected_attn.host.HOST_CHOICES): the per-pair statistics in, lse and the zeroed fp32
        # output out; delta with the zeroed fp32 dQ, dK and dV the backward's atomics add into
        "sel_fwd_lse": Cost(0, 0, qb * hpg * FP32 + stat + b * s * h * dv * FP32),
        "sel_bwd_delta_zero": Cost(0, 0, 2 * o + stat + (b * s * h * dk + b * g * s * (dk + dv)) * FP32),
        "sel_bwd_delta": Cost(0, 0, 2 * o + stat),
        # ... and the one launch that casts the fp32 dQ, dK and dV to the activation dtype (under the query dQ choice
        # dQ is stored in q's dtype already and only dK, dV are cast: the atomic choice's bytes are the upper bound)
        "sel_cast": Cost(0, 0, (b * s * h * dk + b * g * s * (dk + dv)) * (FP32 + elem)),
        # the range backward's fused glue, both branches: dK/dV read in fp32 (one partial), written in elem
        "range_dkdv_sum": Cost(0, 0, (k_cmp + v_cmp + k_tok + v_tok) // elem * (FP32 + elem)),
        # the band forced choice: the block lists [B*G*S, n_sel] in, the other blocks' [B*G*S, n_sel - 3] out (int32);
        # the merge: two fp32 outputs and two lse in, the output and the lse in two layouts out
        "sel_band_rest": Cost(0, 0, b * g * s * (2 * cfg.n_sel - 3) * 4),
        "sel_band_merge": Cost(0, 0, 2 * b * s * h * dv * FP32 + o + 4 * stat),
        "sel_bwd_kv": Cost(2 * (3 * dk + 2 * dv) * sel, sel,
                           q + k_tok + v_tok + o + 2 * stat + (b * s * h * dk + b * g * s * (dk + dv)) * FP32),
        # the query dQ choice: dQ query-outer, stored once in q's dtype; _sel_bwd_kv without dQ (fp32 dK, dV atomics)
        "sel_bwd_dq_query": Cost(2 * (2 * dk + dv) * sel, sel, 2 * q + k_tok + v_tok + o + 2 * stat),
        "sel_bwd_kv_dkdv": Cost(2 * (2 * dk + 2 * dv) * sel, sel,
                                q + k_tok + v_tok + o + 2 * stat + b * g * s * (dk + dv) * FP32),
        # the gates: three branch outputs and three logits per (query, head) in, one output out; backward twice that
        "combine_fwd": Cost(0, 0, 4 * o + b * s * h * 3 * elem),
        "combine_bwd": Cost(0, 0, 7 * o + 2 * b * s * h * 3 * elem),
    }
    return costs


def dense_costs(cfg: NSAConfig, seq_len: int, batch: int, elem: int = 2) -> dict[str, Cost]:
    """{"dense_fwd", "dense_bwd"}: causal SDPA with GQA over the same heads (the dense twin's attention)."""
    s, b, h, g, dk, dv = seq_len, batch, cfg.n_heads, cfg.n_kv_groups, cfg.d_k, cfg.d_v
    pairs = b * h * s * (s + 1) // 2
    q, o, kv = b * s * h * dk * elem, b * s * h * dv * elem, b * g * s * (dk + dv) * elem
    stat = b * h * s * FP32
    return {"dense_fwd": Cost(2 * (dk + dv) * pairs, pairs, q + kv + o + stat),
            "dense_bwd": Cost(2 * (3 * dk + 2 * dv) * pairs, pairs, 2 * q + 2 * kv + 2 * o + 2 * stat)}


def all_costs(cfg: NSAConfig, seq_len: int, batch: int, elem: int = 2) -> dict[str, Cost]:
    """kernel_costs and dense_costs in one mapping: every family `family` can name."""
    return {**kernel_costs(cfg, seq_len, batch, elem), **dense_costs(cfg, seq_len, batch, elem)}


def layer_floor_s(costs: Mapping[str, Cost], peaks: Peaks, families: Mapping[str, Iterable[str]] = LAYER_FAMILIES
                  ) -> dict[str, float]:
    """{"fwd", "bwd", "total"}: seconds, the sum of the listed families' floors per pass."""
    out = {p: sum(costs[f].floor_s(peaks) for f in fams) for p, fams in families.items()}
    out["total"] = out[FWD] + out[BWD]
    return out


def attention_flops_per_token(cfg: NSAConfig, seq_len: int) -> dict[str, float]:
    """Forward FLOPs per token of one layer's attention, in nsa.model.flops_per_token's convention: "attention"
    (2 * (d_k + d_v) per key read, all heads) and "importance" (2 * d_k per visible compressed key, all heads)."""
    p = branch_pairs(cfg, seq_len)
    return {"attention": 2.0 * (cfg.d_k + cfg.d_v) * cfg.n_heads * sum(p.values()) / seq_len,
            "importance": 2.0 * cfg.d_k * cfg.n_heads * p["cmp"] / seq_len}


# ----------------------------------------------------------------------------------------------- kernel names
# (substring of a kernel's profiler name, family); first match wins. Names from nsa/attention/kernels/*/jit.py and
# from the profiles in reports/gpu/ (torch's radix sort; flash / cuDNN / efficient SDPA of the dense twin).
KERNEL_FAMILIES = (
    ("_range_fwd_kernel", "range_fwd"),
    ("_range_bwd_dq_kernel", "range_bwd_dq"),
    ("_range_bwd_dkdv_kernel", "range_bwd_dkdv"),
    ("_range_dkdv_sum", "range_dkdv_sum"),
    ("_blocksel_importance_kernel", "selection_importance"),
    ("_blocksel_topk_kernel", "selection_topk"),
    ("_blocksel_keys_kernel", "selection_keys"),
    ("_blocksel_finish_kernel", "selection_finish"),
    ("sbtopk::", "selection_select"),  # torch.topk's single-block and multi-block radix select kernels
    ("mbtopk::", "selection_select"),
    ("_sel_fwd_kv_stats", "sel_fwd_kv_stats"),
    ("_sel_fwd_kv_out", "sel_fwd_kv_out"),
    ("_sel_fwd_query", "sel_fwd_query"),
    ("_sel_fwd_kv_part", "sel_fwd_kv_part"),
    ("_sel_fwd_reduce", "sel_fwd_reduce"),
    ("_sel_fwd_lse", "sel_fwd_lse"),
    ("_sel_bwd_delta_zero", "sel_bwd_delta_zero"),
    ("_sel_cast", "sel_cast"),
    ("_sel_band_rest", "sel_band_rest"),
    ("_sel_band_merge", "sel_band_merge"),
    ("_sel_bwd_delta", "sel_bwd_delta"),
    ("_sel_bwd_dq_query", "sel_bwd_dq_query"),
    ("_sel_bwd_kv", "sel_bwd_kv"),  # with dQ; without it (the query dQ choice) "sel_bwd_kv_dkdv": see `families`
    ("_combine_fwd_kernel", "combine_fwd"),
    ("_combine_bwd_kernel", "combine_bwd"),
    ("flash_fwd", "dense_fwd"),
    ("fmha_cutlassF", "dense_fwd"),
    ("flash_bwd_dq_dk_dv", "dense_bwd"),
    ("fmha_cutlassB", "dense_bwd"),
)
GEMM_MARKERS = ("nvjet", "gemm", "cutlass", "xmma", "cublas")
# torch's in-place key-value sorts of rows of at most 4,096 (aten's sortKeyValueInplace): bitonic for an
# unstable sort of at most 32 (choose_blocks' sort of the n_sel kept indices), warp merge for at most 128 where
# torch is built with it, radix otherwise (the importance rows' stable sort)
INPLACE_SORTS = ("radixSortKVInPlace", "bitonicSortKVInPlace", "warpMergeSortKVInPlace")


def family(kernel_name: str) -> str:
    """The cost family of a kernel as the profiler names it; "gemm" (cuBLAS / CUTLASS matmuls: the projections)
    and "glue" (any other kernel: aten elementwise, copies, reductions, the other Triton glue) have no model."""
    for marker, fam in KERNEL_FAMILIES:
        if marker in kernel_name:
            return fam
    if any(sort in kernel_name for sort in INPLACE_SORTS):
        # template args name the key type, importance (float) or blocks (long), then the value type (long)
        args = kernel_name.replace(" ", "")
        if ",float,long," in args:
            return "selection_sort"
        if ",long,long," in args:
            return "selection_sort_blocks"
    if "sdpa" in kernel_name.lower() and ("fprop" in kernel_name or "bprop" in kernel_name):
        return "dense_fwd" if "fprop" in kernel_name else "dense_bwd"
    if any(m in kernel_name.lower() for m in GEMM_MARKERS):
        return "gemm"
    return "glue"


def families(kernel_names: Iterable[str]) -> dict[str, str]:
    """{name: family} of the kernels of one profile: `family` of each, except that _sel_bwd_kv is "sel_bwd_kv_dkdv"
    (dK and dV only) where the profile also has _sel_bwd_dq_query: the query dQ choice launches _sel_bwd_kv without
    its dQ under the same name."""
    names = list(kernel_names)
    fams = {name: family(name) for name in names}
    if "sel_bwd_dq_query" in fams.values():
        fams = {name: "sel_bwd_kv_dkdv" if fam == "sel_bwd_kv" else fam for name, fam in fams.items()}
    return fams


# ----------------------------------------------------------------------------------------------- a profile
MIN_SHARE = 0.01  # the layer's efficiency counts the kernels that take at least this share of its time


def efficiency(rows: Iterable[Mapping], min_share: float = MIN_SHARE) -> dict[str, float | None]:
    """The layer's efficiency from per-kernel rows {"ms": measured, "floor_ms": floor or None (no model: 0)}:
    sum of the floors over the sum of the measured times, over the rows that take at least min_share of all the
    rows' time (glue included). Returns {"efficiency", "floor_ms", "ms", "kernels"} (efficiency None without time)."""
    rows = list(rows)
    total = sum(r["ms"] for r in rows)
    kept = [r for r in rows if total > 0 and r["ms"] >= min_share * total]
    ms = sum(r["ms"] for r in kept)
    floor = sum(r.get("floor_ms") or 0.0 for r in kept)
    return {"efficiency": floor / ms if ms > 0 else None, "floor_ms": floor, "ms": ms, "kernels": len(kept)}
