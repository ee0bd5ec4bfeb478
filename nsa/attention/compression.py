"""phi: the compression of each l-token block of keys or values into one token (paper Eq. 7)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Compressor(nn.Module):
    """Maps every block [i*d, i*d + l) of a [B, G, T, width] sequence to one vector: [B, G, n_blocks, width].

    "avg": the block mean. "mlp": the block mean plus a learnable MLP over the whole block, flattened after adding
    an intra-block position embedding (the paper's "learnable MLP with intra-block position encoding"; the mean
    term keeps the compressed token on the scale of its block from the first step).
    """

    def __init__(self, kind: str, l: int, d: int, width: int):
        super().__init__()
        self.kind, self.l, self.d = kind, l, d
        if kind == "mlp":
            hidden = 2 * width
            self.pos = nn.Parameter(torch.randn(l, width) * 0.02)
            self.fc1 = nn.Linear(l * width, hidden)
            self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, g, t, width = x.shape
        if t < self.l:
            return x.new_zeros(b, g, 0, width)
        blocks = x.unfold(2, self.l, self.d).transpose(-1, -2)  # [B, G, n, l, width]
        mean = blocks.mean(dim=3)
        if self.kind == "avg":
            return mean
        flat = (blocks + self.pos).flatten(3)
        return mean + self.fc2(F.gelu(self.fc1(flat)))
