"""Block selection: importance from compressed attention (Eq. 9, 10), top-n_sel with forced blocks, and ranges.

Selection is not differentiable (the paper trains the selected branch through its attention, not through the
choice of blocks), so everything here runs on detached fp32 tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nsa.config import resolve_auto


def importance_from_cmp(p_cmp_group: torch.Tensor, n_blocks: int, l: int, d: int, l_sel: int) -> torch.Tensor:
    """Eq. 9 for every query at once: [..., n_cmp] compressed probabilities -> [..., n_blocks] block importance.

    p_slc[j] = sum_{m < l_sel/d} sum_{n < l/d} p_cmp[(l_sel/d) * j + m - n]: every compression block counts once per
    stride-d chunk it shares with selection block j. The paper prints Eq. 9's index as (l_sel/d) * j - m - n; read
    literally with our 0-based blocks that would credit block j mostly with the compression blocks of block j - 1,
    so we use the same double sum aligned to the overlap the paper describes (same weights 1, 2, ..., 2, 1).
    The inner sum is the mass of stride-d chunk k = (l_sel/d) * j + m (the l/d compression blocks that contain it),
    the outer sum adds the chunks of selection block j: shifted adds, then one reshape-sum. `p_cmp_group` already
    holds Eq. 10's head sum.
    """
    a, b = l_sel // d, l // d
    n_cmp = p_cmp_group.shape[-1]
    length = a * n_blocks
    if length < n_cmp:
        raise ValueError(f"{n_cmp} compression blocks do not fit in {n_blocks} selection blocks")
    padded = F.pad(p_cmp_group, (b - 1, length - n_cmp))
    chunks = padded[..., b - 1: b - 1 + length].clone()
    for n in range(1, b):  # chunk k also lies in compression block k - n
        chunks += padded[..., b - 1 - n: b - 1 - n + length]
    return chunks.view(*chunks.shape[:-1], n_blocks, a).sum(dim=-1)


def overlap_weights(n_cmp: int, n_blocks: int, l: int, d: int, l_sel: int) -> torch.Tensor:
    """[n_cmp, n_blocks] matrix: stride-d chunks that compression block i and selection block j share.

    The plain interval form of Eq. 9: the tests' independent reference for importance_from_cmp's weights (every
    path computes the importance with importance_from_cmp, so that equal blocks tie alike on each).
    """
    weights = torch.zeros(n_cmp, n_blocks)
    for i in range(n_cmp):
        c_start, c_end = i * d, i * d + l
        for j in range(n_blocks):
            s_start, s_end = j * l_sel, (j + 1) * l_sel
            shared = min(c_end, s_end) - max(c_start, s_start)
            if shared > 0:
                weights[i, j] = shared / d
    return weights


# How choose_blocks finds the top n_sel of a row (issue 31 item 2.2), side by side until a GPU run qualifies one:
#   "sort"  a full stable sort of every row (torch.sort: a radix sort of all n_blocks keys), then a sort of the
#           n_sel kept indices: the shipped path.
#   "topk"  packed int64 keys, unique per row and ordered like (score desc, index asc), and torch.topk(n_sel) on
#           them (no full sort), then the same sort of the n_sel kept indices. The Triton tiled selection
#           (kernels/selection/host.py) writes these keys from its importance kernel and calls blocks_from_keys.
# Both give the same blocks (tests/nsa/attention/test_selection_topk.py). A choice becomes QUALIFIED_TOPK once a
# GPU run qualifies it: its tests on the GPU, memcheck clean, and faster than the other in an alternated A/B
# (benchmarks/bench_selection.py --topk-ab; benchmarks/bench_ops.py --topk-choice counts its ops).
TOPK_CHOICES = ("sort", "topk")
QUALIFIED_TOPK = "sort"  # what "auto" picks: the choice a GPU run has qualified
TOPK_CHOICE = "auto"  # "auto" or one of TOPK_CHOICES (the benchmarks set it for an A/B), read at each call

# Packed keys: key = (monotone_int32(score) << 32) | (KEY_LOW - j). monotone_int32 maps fp32 order to int32 order
# (the bits when >= 0, bits ^ 0x7FFFFFFF when negative; -0.0 is made +0.0 and every NaN the one NaN first, so that
# NaN ranks above +inf as in torch.sort); the low half makes keys unique with ties to the lower index.
KEY_LOW = 0xFFFFFFFF
MONO_POS_INF = 0x7F800000  # monotone_int32(+inf): the forced blocks' score
MONO_NEG_INF = -0x800000 ^ 0x7FFFFFFF  # monotone_int32(-inf): bits(-inf) (int32 -0x800000) ^ 0x7FFFFFFF = -2139095041
# every key below this one has a -inf score (not started, or -inf importance): an empty slot, -1
EMPTY_LIMIT = (MONO_NEG_INF + 1) << 32


def topk_choice() -> str:
    """The top-n_sel choice in effect (TOPK_CHOICE, "auto" = QUALIFIED_TOPK)."""
    name = resolve_auto("selection: TOPK_CHOICE", TOPK_CHOICE, tuple(TOPK_CHOICES), QUALIFIED_TOPK)
    return name


def _scores(importance: torch.Tensor, positions: torch.Tensor, l_sel: int) -> torch.Tensor:
    """fp32 scores: +inf for the forced blocks, -inf for blocks not started, the importance elsewhere."""
    n_blocks = importance.shape[-1]
    j = torch.arange(n_blocks, device=importance.device)
    current = torch.div(positions, l_sel, rounding_mode="floor").unsqueeze(-1)
    scores = importance.float()
    forced = (j == 0) | (j == current) | (j == current - 1)
    scores = torch.where(forced, torch.full_like(scores, float("inf")), scores)
    return torch.where(j > current, torch.full_like(scores, float("-inf")), scores)


def packed_keys(importance: torch.Tensor, positions: torch.Tensor, l_sel: int) -> torch.Tensor:
    """[..., n_blocks] importance -> [..., n_blocks] int64 keys, unique per row, ordered like (score desc, index
    asc), with choose_blocks' forced (+inf) and not-started (-inf) blocks: the keys its "topk" choice ranks."""
    n_blocks = importance.shape[-1]
    scores = _scores(importance, positions, l_sel) + 0.0  # -0.0 -> +0.0
    scores = torch.where(torch.isnan(scores), float("nan"), scores)  # one NaN (0x7FC00000): above +inf
    bits = scores.view(torch.int32)
    mono = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    low = KEY_LOW - torch.arange(n_blocks, device=importance.device, dtype=torch.int64)
    return (mono.to(torch.int64) << 32) | low


def blocks_from_keys(keys: torch.Tensor, n_sel: int) -> torch.Tensor:
    """[..., n_blocks] packed keys -> [..., n_sel] block indices: the n_sel largest keys (torch.topk, no full sort),
    ascending, -1 for empty slots (keys below EMPTY_LIMIT, and the padding when n_blocks < n_sel), -1 last."""
    n_blocks = keys.shape[-1]
    k = min(n_sel, n_blocks)
    top, idx = torch.topk(keys, k, dim=-1, sorted=False)
    idx.masked_fill_(top < EMPTY_LIMIT, n_blocks)  # in place (topk's own output): one kernel, no scalar tensor
    idx, _ = torch.sort(idx, dim=-1)  # the n_sel kept indices only
    # padded to n_sel columns (a zero-width pad when n_blocks >= n_sel: the same ops at every length)
    idx = F.pad(idx, (0, n_sel - k), value=n_blocks)
    return idx.masked_fill_(idx == n_blocks, -1)


def choose_blocks(importance: torch.Tensor, positions: torch.Tensor, n_sel: int, l_sel: int,
                  method: str | None = None) -> torch.Tensor:
    """Top-n_sel selection blocks per query: [..., n_blocks] importance -> [..., n_sel] block indices.

    `positions` broadcasts against importance.shape[:-1]. Candidates are blocks that have started (j <= t //
    l_sel). Block 0, the block holding t and the one before it are always kept; the rest go by importance,
    ties to the lower index. The result is sorted ascending and padded with -1 when fewer than n_sel blocks exist.
    A started block of importance -inf is never kept (-1); NaN ranks above every number, as in torch.sort.
    method: "sort" or "topk" (TOPK_CHOICES; the same blocks), default topk_choice().
    """
    method = method or topk_choice()
    if method == "topk":
        return blocks_from_keys(packed_keys(importance, positions, l_sel), n_sel)
    if method != "sort":
        raise ValueError(f"choose_blocks: method must be one of {', '.join(TOPK_CHOICES)}, got {method!r}")
    n_blocks = importance.shape[-1]
    scores = _scores(importance, positions, l_sel)
    top_scores, top = torch.sort(scores, dim=-1, descending=True, stable=True)
    # padded to n_sel columns (a zero-width pad when n_blocks >= n_sel: the same ops at every length)
    pad = (0, max(0, n_sel - n_blocks))
    top = F.pad(top[..., :n_sel], pad, value=-1)
    top_scores = F.pad(top_scores[..., :n_sel], pad, value=float("-inf"))
    top = torch.where(top_scores == float("-inf"), torch.full_like(top, -1), top)
    # ascending, -1 last
    key = torch.where(top < 0, torch.full_like(top, n_blocks), top)
    key, _ = torch.sort(key, dim=-1)
    return torch.where(key == n_blocks, torch.full_like(key, -1), key)


def selection_ranges_v2(blocks: torch.Tensor, positions: torch.Tensor, l_sel: int) -> torch.Tensor:
    """Token ranges of the chosen blocks, vectorized: [..., n_sel] -> [..., n_sel, 2] of [start, end).

    Each block j becomes [j*l_sel, min((j+1)*l_sel, t+1)): inside a selected block only tokens <= t are attended.
    Empty slots (-1) become [0, 0).
    """
    start = blocks * l_sel
    end = torch.minimum(start + l_sel, positions.unsqueeze(-1) + 1)
    empty = blocks < 0
    start = torch.where(empty, torch.zeros_like(start), start)
    end = torch.where(empty, torch.zeros_like(end), end)
    return torch.stack((start, end), dim=-1)


def selection_ranges_v1(blocks: torch.Tensor, positions: torch.Tensor, l_sel: int) -> torch.Tensor:
    """The same ranges as selection_ranges_v2, built by a plain Python loop over every query and slot."""
    n_sel = blocks.shape[-1]
    rows = blocks.reshape(-1, n_sel).tolist()
    ts = positions.expand(blocks.shape[:-1]).reshape(-1).tolist()
    out = []
    for row, t in zip(rows, ts):
        for j in row:
            if j < 0:
                out.append((0, 0))
            else:
                out.append((j * l_sel, min((j + 1) * l_sel, t + 1)))
    return torch.tensor(out, dtype=torch.long, device=blocks.device).reshape(*blocks.shape, 2)


RANGE_BUILDERS = {"v1": selection_ranges_v1, "v2": selection_ranges_v2}
