"""DenseAttention: the dense twin of NSAAttention, the baseline every NSA figure is compared with.

Same interface and the same query/key/value/output widths (H query heads, G KV groups, d_k, d_v, RoPE), but one
key/value projection and causal scaled-dot-product attention over every earlier token (SDPA with GQA: flash or
cuDNN on a GPU). `ModelConfig(attention="dense")` builds the model with it. RoPE as cfg.rope says (nsa.attention.rope:
the reference, or the fused kernel the NSA path shares). For inference, `prefill` and `decode_step` keep every
token's keys and values in a DenseCache.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from nsa.attention.cache import DenseCache
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

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.cfg.dim or x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"DenseAttention expects x of shape [B>=1, S>=1, {self.cfg.dim}], got {tuple(x.shape)}")

    def _project(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, H, S, d_k], k [B, G, S, d_k] (both rotated at positions start..start+S-1), v [B, G, S, d_v]."""
        cfg = self.cfg
        b, s, _ = x.shape
        heads = lambda t, n: t.view(b, s, n, -1).transpose(1, 2)  # noqa: E731
        q = rotary(heads(self.q_proj(x), cfg.n_heads), cfg.rope_theta, cfg.rope, start=start)
        k = rotary(heads(self.k_proj(x), cfg.n_kv_groups), cfg.rope_theta, cfg.rope, start=start)
        return q, k, heads(self.v_proj(x), cfg.n_kv_groups)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        """o_proj(SDPA(q, k, v)) -> [B, S_q, dim]; causal: query s sees keys 0..s (q and k of the same tokens)."""
        cfg = self.cfg
        with span("nsa.dense"):
            out = audited_sdpa("dense", F.scaled_dot_product_attention, q, k, v, is_causal=causal,
                               enable_gqa=cfg.n_heads != cfg.n_kv_groups)
        return self.o_proj(out.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, dim] -> [B, S, dim]."""
        self._check_input(x)
        return self._attend(*self._project(x, 0), causal=True)

    # ------------------------------------------------------------------ decoding (inference only)
    def new_cache(self, batch_size: int) -> DenseCache:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"new_cache expects a batch size >= 1, got {batch_size!r}")
        return DenseCache(batch_size=batch_size)

    @torch.no_grad()
    def prefill(self, x: torch.Tensor, cache: DenseCache) -> torch.Tensor:
        """forward(x) for a prompt x [B, S, dim] -> [B, S, dim], keeping its keys and values in an empty `cache`."""
        self._check_input(x)
        if not isinstance(cache, DenseCache):
            raise ValueError(f"prefill expects a DenseCache (this layer's new_cache), got {type(cache).__name__}")
        if cache.length or x.shape[0] != cache.batch_size:
            raise ValueError(f"prefill expects an empty cache for {x.shape[0]} sequences, got one holding "
                             f"{cache.length} tokens of {cache.batch_size}")
        q, k, v = self._project(x, 0)
        cache.k.append(k)
        cache.v.append(v)
        cache.length = x.shape[1]
        return self._attend(q, k, v, causal=True)

    @torch.no_grad()
    def decode_step(self, x_t: torch.Tensor, cache: DenseCache) -> torch.Tensor:
        """One token for every sequence: x_t [B, 1, dim] -> [B, 1, dim], attending over every cached token and
        itself; appends to `cache`."""
        if not isinstance(cache, DenseCache):
            raise ValueError(f"decode_step expects a DenseCache (this layer's new_cache), got {type(cache).__name__}")
        if x_t.dim() != 3 or x_t.shape[1] != 1 or x_t.shape[2] != self.cfg.dim or x_t.shape[0] != cache.batch_size:
            raise ValueError(f"decode_step expects x_t of shape [{cache.batch_size}, 1, {self.cfg.dim}], "
                             f"got {tuple(x_t.shape)}")
        q, k, v = self._project(x_t, cache.length)
        cache.k.append(k)
        cache.v.append(v)
        cache.length += 1
        return self._attend(q, cache.k.last(), cache.v.last(), causal=False)  # one query: every key is visible
