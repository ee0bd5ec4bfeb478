"""The block selection's importance (Eq. 10's head-summed compressed attention probabilities) in plain PyTorch:
the CPU path, and the reference of the Triton selection (host.py, jit.py) with nsa.attention.selection's
importance_from_cmp and choose_blocks."""

from __future__ import annotations

import math

import torch

from nsa.attention.geometry import num_cmp_blocks as num_cmp_visible
from nsa.attention.kernels import common
from nsa.attention.kernels.range_attn.naive import cmp_mask


def cmp_group_probabilities(q, k_cmp, l: int, d: int, first: int):
    """Eq. 10's head-summed compressed attention probabilities for queries first..S-1, in query chunks.

    Yields (start, probs) with probs [B, G, rows, n_vis] fp32 (no gradient) for queries start..start+rows-1, where
    n_vis is the number of blocks the chunk's last query sees: each row is a softmax over the blocks visible to its
    query (later blocks 0; rows that see none are all 0). Chunks hold at most common.SCORE_CHUNK scores and read only the
    blocks they can see, so no S x n_cmp tensor is ever built.
    """
    b, h, s, d_k = q.shape
    g, n_cmp = k_cmp.shape[1], k_cmp.shape[2]
    hpg = h // g
    rows_per_chunk = max(1, common.SCORE_CHUNK // (b * h * max(n_cmp, 1)))
    with torch.no_grad():
        kf = k_cmp.float().reshape(b * g, n_cmp, d_k)
        for r0 in range(first, s, rows_per_chunk):
            r1 = min(s, r0 + rows_per_chunk)
            n_vis = num_cmp_visible(r1, l, d)
            rows = r1 - r0
            if n_vis == 0:
                yield r0, torch.zeros(b, g, rows, 0, device=q.device)
                continue
            qs = (q[:, :, r0:r1].float() * (1.0 / math.sqrt(d_k))).reshape(b * g, hpg * rows, d_k)
            scores = torch.bmm(qs, kf[:, :n_vis].transpose(1, 2)).view(b * g, hpg, rows, n_vis)
            mask = cmp_mask(r1, n_vis, l, d, q.device)[r0:]
            seen = mask[:, 0].clone()  # block 0 is the first to become visible (a copy: the next line writes it)
            mask[:, 0] = True  # rows that see nothing: a harmless softmax, zeroed below
            probs = torch.softmax(scores.masked_fill_(~mask, float("-inf")), dim=-1).sum(dim=1)
            yield r0, probs.mul_(seen.view(1, rows, 1).to(probs.dtype)).view(b, g, rows, n_vis)
