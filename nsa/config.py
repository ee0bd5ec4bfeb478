"""NSAConfig: the shape and options of one Native Sparse Attention layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from nsa import toggles

PHI_CHOICES = ("mlp", "avg")
GATE_CHOICES = ("sigmoid", "softmax")
PREFILL_CHOICES = ("batched", "sequential")
SELECTION_CHOICES = ("v2", "v1")


@dataclass(frozen=True)
class NSAConfig:
    """Native Sparse Attention (Yuan et al., 2025) hyper-parameters.

    dim          model width (input and output of the layer)
    n_heads      query heads H
    n_kv_groups  KV groups G (GQA); the H/G heads of a group share keys, values and one block selection
    d_k, d_v     per-head query/key and value widths
    l, d         compression block length and stride: block i covers tokens [i*d, i*d + l)
    l_sel        selection block length: block j covers tokens [j*l_sel, (j+1)*l_sel)
    n_sel        selection blocks kept per query (block 0 and the two local blocks included)
    w            sliding-window length: query t sees tokens (t - w, t]
    phi          compression function: "mlp" (learnable, intra-block position embedding) or "avg" (block mean)
    gate         "sigmoid" (the paper's per-head, per-branch sigmoid gate) or "softmax" (over the three branches)
    rope_theta   RoPE base
    prefill      "batched" (vectorized) or "sequential" (the per-token oracle loop)
    selection    "v2" (vectorized selection ranges) or "v1" (simple loop)
    """

    dim: int
    n_heads: int
    n_kv_groups: int
    d_k: int
    d_v: int
    l: int = 32
    d: int = 16
    l_sel: int = 64
    n_sel: int = 16
    w: int = 512
    phi: str = "mlp"
    gate: str = "sigmoid"
    rope_theta: float = 10000.0
    prefill: str = "batched"
    selection: str = "v2"

    def __post_init__(self) -> None:
        for name in ("dim", "n_heads", "n_kv_groups", "d_k", "d_v", "l", "d", "l_sel", "n_sel", "w"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"NSAConfig.{name} must be an integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"NSAConfig.{name} must be positive, got {value}")
        for name, choices in (("phi", PHI_CHOICES), ("gate", GATE_CHOICES), ("prefill", PREFILL_CHOICES),
                              ("selection", SELECTION_CHOICES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"NSAConfig.{name} must be one of {' | '.join(choices)}, got {getattr(self, name)!r}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 0:
            raise ValueError(f"NSAConfig.rope_theta must be a positive number, got {self.rope_theta!r}")
        if self.n_heads % self.n_kv_groups:
            raise ValueError(f"NSAConfig.n_kv_groups={self.n_kv_groups} must divide n_heads={self.n_heads}")
        if self.l % self.d:
            raise ValueError(f"NSAConfig.d={self.d} must divide l={self.l}")
        if self.l_sel % self.d:
            raise ValueError(f"NSAConfig.d={self.d} must divide l_sel={self.l_sel}")
        if self.n_sel < 3:
            raise ValueError(f"NSAConfig.n_sel must be >= 3 (block 0 and two local blocks), got {self.n_sel}")
        if self.d_k % 2:
            raise ValueError(f"NSAConfig.d_k must be even (RoPE rotates pairs), got {self.d_k}")

    @property
    def heads_per_group(self) -> int:
        return self.n_heads // self.n_kv_groups

    def with_env_overrides(self, environ: Mapping[str, str] | None = None) -> "NSAConfig":
        """This config with NSA_PREFILL_BATCHED / NSA_SEL_RANGES_V2 applied (see nsa.toggles)."""
        changes = {}
        batched = toggles.parse("NSA_PREFILL_BATCHED", environ)
        if batched is not None:
            changes["prefill"] = "batched" if batched else "sequential"
        v2 = toggles.parse("NSA_SEL_RANGES_V2", environ)
        if v2 is not None:
            changes["selection"] = "v2" if v2 else "v1"
        return dataclasses.replace(self, **changes) if changes else self
