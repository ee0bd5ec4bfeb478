"""The decode caches: what one attention layer keeps between decode steps.

    NSACache    an NSA layer's (NSAAttention.new_cache; filled by its prefill or decode_step)
    DenseCache  the dense twin's: every key and value so far (DenseAttention.new_cache)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class _Buffer:
    """A [B, G, len, width] sequence grown by appending (amortized O(1)); `keep` bounds what is retained."""

    def __init__(self, keep: int | None = None):
        self.keep = keep
        self.data: torch.Tensor | None = None
        self.len = 0

    def append(self, x: torch.Tensor) -> None:
        """Append x [B, G, n, width]: of the batch, groups, width, dtype and device of what the buffer holds (an
        error before anything changes otherwise: a copy into the buffer would cast a float64 step's keys to the
        prefill's float32, or move them across devices, without a word)."""
        if self.data is not None and (x.dim() != 4 or x.shape[:2] != self.data.shape[:2]
                                      or x.shape[3] != self.data.shape[3] or x.dtype != self.data.dtype
                                      or x.device != self.data.device):
            held = self.data
            raise ValueError(f"decode cache: it holds [{held.shape[0]}, {held.shape[1]}, len, {held.shape[3]}] "
                             f"{held.dtype} on {held.device}, got {tuple(x.shape)} {x.dtype} on {x.device}; decode "
                             f"with the layer in the dtype and on the device it was prefilled with, or start a new "
                             f"cache")
        n = x.shape[2]
        if self.data is None:
            self.data = x.new_empty(*x.shape[:2], max(16, 2 * n), x.shape[3])
        if self.len + n > self.data.shape[2]:
            if self.keep is not None and self.len > self.keep:  # drop what can never be read again
                self.data[:, :, : self.keep] = self.data[:, :, self.len - self.keep: self.len].clone()
                self.len = self.keep
            if self.len + n > self.data.shape[2]:
                grown = x.new_empty(*x.shape[:2], 2 * (self.len + n), x.shape[3])
                grown[:, :, : self.len] = self.data[:, :, : self.len]
                self.data = grown
        self.data[:, :, self.len: self.len + n] = x
        self.len += n

    def last(self, n: int | None = None) -> torch.Tensor:
        """The last n entries (all when n is None)."""
        if self.data is None:
            raise RuntimeError("empty cache buffer")
        n = self.len if n is None else min(n, self.len)
        return self.data[:, :, self.len - n: self.len]


@dataclass(eq=False)  # a cache is its tensors: two with the same counts but other keys are not equal (identity)
class NSACache:
    """Keys/values of one layer for decoding: full history for the selected branch, the last w tokens for the
    window, the last l raw tokens for compressing the next block, and every compressed token so far.

    `reads[k]` is the number of KV tokens decode step k gathered per sequence and KV group (compressed + selected +
    window), counted from the tensors the step attended over (a prefill adds none: it reads as the batched forward).
    `length` is the number of tokens the cache holds (prefill and decode steps together): the next token's position.
    """

    batch_size: int
    w: int
    l: int
    length: int = 0
    reads: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.k_sel, self.v_sel = _Buffer(), _Buffer()
        self.k_win, self.v_win = _Buffer(keep=self.w), _Buffer(keep=self.w)
        self.k_raw, self.v_raw = _Buffer(keep=self.l), _Buffer(keep=self.l)
        self.k_cmp, self.v_cmp = _Buffer(), _Buffer()

    @property
    def n_cmp(self) -> int:
        return self.k_cmp.len


@dataclass(eq=False)  # as NSACache: compared by identity, never by its counts alone
class DenseCache:
    """Keys (rotated at their positions) and values of every token so far, for the dense twin's decode steps."""

    batch_size: int
    length: int = 0

    def __post_init__(self) -> None:
        self.k, self.v = _Buffer(), _Buffer()
