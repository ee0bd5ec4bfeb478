"""NSA_FAULT's model faults (nsa.toggles.MODEL_FAULT_KINDS): a real suspect made slow on purpose, for the triage
tests. The trainer installs one into its model once it is built (``install``); the model's own code knows nothing
of them.

sel_v1_quadratic@SEQ: selection v1's range builder (NSA_SEL_RANGES_V2=0; the batched PyTorch path) first runs
``pairwise_block_overlap`` over a forward's sequence when it is longer than SEQ tokens: O(S^2) redundant work whose
result is not used, so the output is unchanged. Selection v2, the per-token path (one query position per call) and
the Triton kernels (no range builder) are unaffected.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from nsa.attention import NSAAttention
from nsa.toggles import Fault


def pairwise_block_overlap(blocks: torch.Tensor, max_elements: int = 1 << 24) -> tuple[torch.Tensor, int]:
    """For every query, the number of (query, slot) pairs of its own sequence that selected one of its blocks:
    every query's n_sel blocks compared with every other query's, S^2 * n_sel^2 comparisons per sequence.

    blocks [..., S, n_sel] (-1: empty slot, never equal to anything). Returns (counts [..., S], comparisons made).
    It is the work NSA_FAULT=sel_v1_quadratic@SEQ adds to selection v1 (a redundant pairwise pass, real
    arithmetic on the blocks' device), in chunks of queries so that memory stays at `max_elements` booleans.
    """
    *lead, s, n = blocks.shape
    rows = blocks.reshape(-1, s, n)
    r = rows.shape[0]
    counts = torch.zeros(r, s, dtype=torch.long, device=blocks.device)
    chunk = max(1, max_elements // max(1, r * s * n * n))
    other = rows[:, None, :, None, :]  # [R, 1, S, 1, n]
    for start in range(0, s, chunk):
        mine = rows[:, start: start + chunk, None, :, None]  # [R, c, 1, n, 1]
        same = (mine == other) & (mine >= 0)
        counts[:, start: start + chunk] = same.sum(dim=(2, 3, 4))
    return counts.reshape(*lead, s), r * s * s * n * n


class QuadraticAbove:
    """A selection-range builder wrapped by sel_v1_quadratic@SEQ: a call over a whole sequence (positions [S], the
    batched path) of more than `seq_len` query positions first runs pairwise_block_overlap; the ranges are the
    wrapped builder's."""

    def __init__(self, builder, seq_len: int):
        self.builder, self.seq_len = builder, seq_len

    def __call__(self, blocks: torch.Tensor, positions: torch.Tensor, l_sel: int) -> torch.Tensor:
        if positions.dim() == 1 and positions.numel() > self.seq_len and blocks.dim() >= 2:
            pairwise_block_overlap(blocks)
        return self.builder(blocks, positions, l_sel)


def install(model: nn.Module, fault: Fault | None) -> int:
    """Put a model fault (NSA_FAULT) into `model`; how many layers took it. sel_v1_quadratic goes into every NSA
    layer whose selection is v1; a step fault, or none, changes nothing (0)."""
    if fault is None or fault.kind != "sel_v1_quadratic":
        return 0
    layers = [m for m in model.modules() if isinstance(m, NSAAttention) and m.cfg.selection == "v1"]
    for layer in layers:
        layer.range_builder = QuadraticAbove(layer.range_builder, fault.seq_len)
    return len(layers)
