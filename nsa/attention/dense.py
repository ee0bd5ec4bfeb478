"""DenseAttention: the dense twin of NSAAttention, the baseline every NSA figure is compared with.

Same interface and the same query/key/value/output widths (H query heads, G KV groups, d_k, d_v, RoPE), but one
key/value projection and causal scaled-dot-product attention over every earlier token (SDPA with GQA: flash or
cuDNN on a GPU). `ModelConfig(attention="dense")` builds the model with it. RoPE as cfg.rope says (nsa.attention.rope:
the reference, or the fused kernel the NSA path shares).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from nsa.attention.kernels import rotary
from nsa.config import NSAConfig
from nsa.observability import audited_sdpa, span


class DenseAttention(nn.Module):
    def __init__(self, cfg: NSAConfig):
        super().__init__()
        self.cfg = cfg
        h, g, d_k, d_v = cfg.n_heads, cfg.n_kv_groups, cfg.d_k, cfg.d_v
        self.q_proj = nn.Linear(cfg.dim, h * d_k, bias=False)
        self.k_proj = nn.Linear(cfg.dim, g * d_k, bias=False)
        self.v_proj = nn.Linear(cfg.dim, g * d_v, bias=False)
        self.o_proj = nn.Linear(h * d_v, cfg.dim, bias=False)
        self.record_stats = False  # the model's statistics interface: a dense layer has none
        self.stats: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, dim] -> [B, S, dim]."""
        cfg = self.cfg
        if x.dim() != 3 or x.shape[-1] != cfg.dim or x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"DenseAttention expects x of shape [B>=1, S>=1, {cfg.dim}], got {tuple(x.shape)}")
        b, s, _ = x.shape
        heads = lambda t, n: t.view(b, s, n, -1).transpose(1, 2)  # noqa: E731
        q = rotary(heads(self.q_proj(x), cfg.n_heads), cfg.rope_theta, cfg.rope)  # positions 0..S-1
        k = rotary(heads(self.k_proj(x), cfg.n_kv_groups), cfg.rope_theta, cfg.rope)
        v = heads(self.v_proj(x), cfg.n_kv_groups)
        with span("nsa.dense"):
            out = audited_sdpa("dense", F.scaled_dot_product_attention, q, k, v, is_causal=True,
                               enable_gqa=cfg.n_heads != cfg.n_kv_groups)
        return self.o_proj(out.transpose(1, 2).flatten(2))
