"""Typed configs of the model: NSAConfig (one Native Sparse Attention layer) and ModelConfig (the language model);
and how a config field declares its values and the nsa-train flags that set it (`setting`, `Flag`).

No torch here: the orchestrator reads and validates configs without loading it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from nsa.toggles import TOGGLES, Toggles

PHI_CHOICES = ("mlp", "avg")
GATE_CHOICES = ("sigmoid", "softmax")
PREFILL_CHOICES = ("batched", "sequential")
SELECTION_CHOICES = ("v2", "v1")
KERNEL_CHOICES = ("auto", "torch", "triton")
INDEX_BUILD_CHOICES = TOGGLES["NSA_INDEX_BUILD"].choices  # what model.index_build and NSA_INDEX_BUILD take
ROPE_CHOICES = TOGGLES["NSA_ROPE"].choices  # what model.rope and NSA_ROPE take
LOSS_CHOICES = TOGGLES["NSA_LOSS"].choices  # what model.loss and NSA_LOSS take
ATTENTION_CHOICES = ("nsa", "dense")

CHOICES, FLAGS = "choices", "flags"  # the metadata entries `setting` gives a config field

# the largest size a tensor dimension takes (torch's int64): a larger vocab_size or dim failed inside torch's C++
MAX_SIZE = 2 ** 63 - 1


def _positive_number(value) -> bool:
    """A number above 0 that is a finite float (an infinite norm_eps zeroed every normalised activation, init_std
    every weight: both passed a `> 0` check; an integer past a float's range is none either)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return 0 < float(value) < math.inf
    except OverflowError:
        return False


@dataclass(frozen=True)
class Flag:
    """An nsa-train flag that sets the config field it is declared on (`setting(..., flags=Flag(...))`).
    nsa.training.flags builds the trainer's parser, its `--help` and the table a runbook's trainer `args` are
    checked against from these declarations, and nothing else.

    name     the flag without its dashes: "seq-len"
    help     what it does; `--help` adds the key it sets, e.g. "(train.seq_len)"
    values   {flag value: field value}, e.g. {0: "none", 1: "ddp"}; its keys are the flag's choices. None: the flag
             takes the field's own type and choices
    switch   a flag without a value: given, it sets values[True] (or True)
    implies  other dotted keys the flag also sets, e.g. {"train.parallel": "fsdp"}
    metavar  the value's name in `--help`
    """

    name: str
    help: str
    values: Mapping[Any, Any] | None = None
    switch: bool = False
    implies: Mapping[str, Any] = field(default_factory=dict)
    metavar: str | None = None


def resolve_auto(name: str, choice: str, impls: tuple[str, ...], qualified: str) -> str:
    """The implementation a config choice runs: "auto" is `qualified` (the one a GPU A/B has shown faster), a name
    of `impls` is itself; anything else is an error naming the setting."""
    if choice == "auto":
        return qualified
    if choice not in impls:
        raise ValueError(f"{name} must be one of auto | {' | '.join(impls)}, got {choice!r}")
    return choice


def setting(default: Any = dataclasses.MISSING, *, choices: tuple = (), flags: Flag | tuple[Flag, ...] = ()) -> Any:
    """A config field: its default, the values it takes (`choices`; the dataclass checks them) and the nsa-train
    flags that set it."""
    return field(default=default, metadata={CHOICES: tuple(choices),
                                            FLAGS: (flags,) if isinstance(flags, Flag) else tuple(flags)})


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
    rope_theta   RoPE base, at least 1
    prefill      "batched" (vectorized) or "sequential" (the per-token oracle loop)
    selection    "v2" (vectorized selection ranges) or "v1" (simple loop)
    kernel       the batched path's kernels: "torch" (PyTorch, CPU and CUDA), "triton" (the GPU kernels), "auto"
                 (triton on CUDA when importable, else torch)
    index_build  the Triton path's inverted index of the selected blocks: "triton" (a counting sort in 6 Triton
                 launches), "torch" (53 aten ops, the same tensors) or "auto" (triton, except under Triton's
                 interpreter, whose tl.sort is slow); nsa.attention.kernels.index_build
    rope         the RoPE implementation (nsa.attention.rope.rope): "reference", "fused" (on CUDA the Triton path's
                 fused kernel, elsewhere torch ops on the halves) or "auto" (the reference for now); the dense twin
                 reads it
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
    kernel: str = "auto"
    index_build: str = "auto"
    rope: str = "auto"

    def __post_init__(self) -> None:
        for name in ("dim", "n_heads", "n_kv_groups", "d_k", "d_v", "l", "d", "l_sel", "n_sel", "w"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"NSAConfig.{name} must be an integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"NSAConfig.{name} must be positive, got {value}")
            if value > MAX_SIZE:
                raise ValueError(f"NSAConfig.{name} must be at most 2**63 - 1 (a tensor size), got {value}")
        for name, choices in (("phi", PHI_CHOICES), ("gate", GATE_CHOICES), ("prefill", PREFILL_CHOICES),
                              ("selection", SELECTION_CHOICES), ("kernel", KERNEL_CHOICES),
                              ("index_build", INDEX_BUILD_CHOICES), ("rope", ROPE_CHOICES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"NSAConfig.{name} must be one of {' | '.join(choices)}, got {getattr(self, name)!r}")
        if not _positive_number(self.rope_theta):
            raise ValueError(f"NSAConfig.rope_theta must be a positive finite number, got {self.rope_theta!r}")
        if self.rope_theta < 1:  # 1e-300: 0 in fp32, every frequency inf and every score NaN from the first step
            raise ValueError(f"NSAConfig.rope_theta must be at least 1 (the RoPE base: its frequencies "
                             f"theta^(-2j/d_k) lie in (0, 1]), got {self.rope_theta!r}")
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

    def with_toggles(self, tg: Toggles) -> "NSAConfig":
        """This config with the toggles that change a layer applied: NSA_PREFILL_BATCHED, NSA_SEL_RANGES_V2,
        NSA_KERNEL, NSA_INDEX_BUILD and NSA_ROPE, as read once at start-up (nsa.toggles.Toggles); an unset toggle
        leaves its field as it is."""
        changes = {}
        if tg.prefill_batched is not None:
            changes["prefill"] = "batched" if tg.prefill_batched else "sequential"
        if tg.sel_ranges_v2 is not None:
            changes["selection"] = "v2" if tg.sel_ranges_v2 else "v1"
        if tg.kernel is not None:
            changes["kernel"] = tg.kernel
        if tg.index_build is not None:
            changes["index_build"] = tg.index_build
        if tg.rope is not None:
            changes["rope"] = tg.rope
        return dataclasses.replace(self, **changes) if changes else self


@dataclass(frozen=True)
class ModelConfig:
    """Shape of an NSAModel: the NSA layer's config `nsa` plus the language model around it.

    attention     "nsa" (Native Sparse Attention) or "dense": the dense twin, the same model with causal SDPA
                  (GQA) in place of NSA, i.e. the baseline every NSA figure is compared with
    ffn_hidden    SwiGLU width; None: LLaMA's 8/3 * dim rounded up to a multiple of 64
    loss          the cross entropy of NSAModel(input_ids, targets) (nsa.loss): "reference" (the whole batch's
                  logits, then cross entropy on their fp32 copy), "chunked" (the head matmul fused with the cross
                  entropy over chunks of tokens), "fused" (chunked, each chunk's loss and logit gradient in one
                  Triton kernel; where the Triton kernels run) or "auto" (the reference for now)

    In YAML the `model` section is flat: NSAConfig's fields (dim, n_heads, ..., l, d, l_sel, n_sel, w, phi, ...)
    beside the fields below (`from_flat` / `flat`).
    """

    vocab_size: int
    n_layers: int
    nsa: NSAConfig
    attention: str = setting("nsa", choices=ATTENTION_CHOICES,
                             flags=Flag("attention", "nsa, or dense (the dense twin: causal SDPA)"))
    ffn_hidden: int | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    activation_checkpointing: bool = setting(False, flags=Flag(
        "activation-checkpointing", "1: recompute each block's activations in backward", values={0: False, 1: True}))
    loss: str = setting("auto", choices=LOSS_CHOICES)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
            if value > MAX_SIZE:
                raise ValueError(f"ModelConfig.{name} must be at most 2**63 - 1 (a tensor size), got {value}")
        if not isinstance(self.nsa, NSAConfig):
            raise ValueError(f"ModelConfig.nsa must be an NSAConfig, got {type(self.nsa).__name__}")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"ModelConfig.attention must be one of {' | '.join(ATTENTION_CHOICES)}, "
                             f"got {self.attention!r}")
        if self.ffn_hidden is not None and (isinstance(self.ffn_hidden, bool) or not isinstance(self.ffn_hidden, int)
                                            or not 0 < self.ffn_hidden <= MAX_SIZE):
            raise ValueError(f"ModelConfig.ffn_hidden must be a positive integer or None, got {self.ffn_hidden!r}")
        for name in ("norm_eps", "init_std"):
            value = getattr(self, name)
            if not _positive_number(value):
                raise ValueError(f"ModelConfig.{name} must be a positive finite number, got {value!r}")
        if self.loss not in LOSS_CHOICES:
            raise ValueError(f"ModelConfig.loss must be one of {' | '.join(LOSS_CHOICES)}, got {self.loss!r}")
        for name in ("tie_embeddings", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be true or false, got {getattr(self, name)!r}")

    # the flat YAML form
    @staticmethod
    def flat_fields() -> dict[str, Any]:
        """{key: dataclass field} of the flat `model` section: the model's own fields, then NSAConfig's."""
        own = {f.name: f for f in dataclasses.fields(ModelConfig) if f.name != "nsa"}
        return {**own, **{f.name: f for f in dataclasses.fields(NSAConfig)}}

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> "ModelConfig":
        """ModelConfig from a flat mapping (the YAML `model` section); unknown keys are a ValueError."""
        nsa_names = {f.name for f in dataclasses.fields(NSAConfig)}
        own_names = {f.name for f in dataclasses.fields(cls)} - {"nsa"}
        unknown = [k for k in values if k not in nsa_names | own_names]
        if unknown:
            raise ValueError(f"unknown model key {unknown[0]!r}")
        nsa = NSAConfig(**{k: v for k, v in values.items() if k in nsa_names})
        return cls(nsa=nsa, **{k: v for k, v in values.items() if k in own_names})

    def flat(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "nsa"}
        nsa = dataclasses.asdict(self.nsa)
        return {"vocab_size": own.pop("vocab_size"), **nsa, **own}

    def replace(self, **changes) -> "ModelConfig":
        """A copy with flat keys changed (model fields or NSAConfig fields)."""
        return ModelConfig.from_flat({**self.flat(), **changes})

    def with_toggles(self, tg: Toggles) -> "ModelConfig":
        """The model a run builds: this config with the layer toggles applied (NSAConfig.with_toggles) and
        NSA_LOSS (model.loss), as read once at start-up; an unset toggle leaves its field as it is."""
        changes = {}
        nsa = self.nsa.with_toggles(tg)
        if nsa is not self.nsa:
            changes["nsa"] = nsa
        if tg.loss is not None:
            changes["loss"] = tg.loss
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def dim(self) -> int:
        return self.nsa.dim

    @property
    def n_heads(self) -> int:
        return self.nsa.n_heads

    @property
    def n_kv_groups(self) -> int:
        return self.nsa.n_kv_groups

    @property
    def hidden(self) -> int:
        return self.ffn_hidden or 64 * math.ceil(8 * self.dim / 3 / 64)
