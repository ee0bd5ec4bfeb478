"""Byte model and memory model per parallel strategy: pure functions of the model's real parameter list and the
trainer's settings. The trainer counts what it really sends (nsa.training.comm_count); these predictions must
equal those counts exactly, for every strategy.

    specs = param_specs(model, first_use_order(model, probe))  # forward order: shape, bytes, unit of each
    comm_model(specs, "ddp", world_size=2, bucket_cap_mb=25, compress="bf16", accum=2)
    comm_model(specs, "fsdp", world_size=2, reshard_after_forward=False, accum=2)
    memory_model(specs, "fsdp", world_size=2, activations=activation_bytes(model_cfg, 4, 2048, "bf16"))

Strategies (what the trainer does, nsa.training.distributed):

- "ddp": DistributedDataParallel with a comm hook that all-reduces each gradient bucket (fp32, or bf16/fp16
  with compression: half the bytes) once per optimizer step (no_sync on the other micro-batches). DDP puts every
  parameter in ONE bucket for the first iteration, then rebuilds its buckets from the order the gradients became
  ready, with caps [first_bucket_cap, bucket_cap] (first_bucket_cap = bucket_cap when bucket_cap_mb is given, as
  the trainer does; 1 MiB under torch's default): a bucket closes as soon as it holds >= its cap. The ready
  order is the reverse of the parameter list's order (`ddp_buckets`), so give the list in forward order
  (param_specs with nsa.training.distributed.first_use_order of a probe batch; in registration order the total
  bytes are still exact, bucket sizes can differ where the two orders do).
- "fsdp": FSDP2 fully_shard per transformer block, then the root (distributed.wrap_fsdp). Each parameter is
  sharded on dim 0 into world_size chunks of ceil(dim0 / world_size) rows (padded). Per unit: an all-gather in
  forward and, with reshard_after_forward (full shard), another in backward (never for the root: FSDP2 keeps the
  root gathered from forward to backward); both on every micro-batch. One reduce-scatter of the gradients per
  unit on the last micro-batch of the step. reshard_after_forward=False is the SHARD_GRAD_OP equivalent: no
  backward all-gather.
- "none": one process, nothing communicated.

Message sizes follow nccl-tests (comm_count): all-reduce the buffer, all-gather the gathered output,
reduce-scatter the full input. A predicted time is bytes / busbw + calls x latency per kind (the orchestrator's
job, with its measured busbw); `CommPrediction` gives the kind, calls and bytes it needs.

No torch import here: the specs are plain values (param_specs reads them off a module).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from nsa.attention.geometry import mean_reads

STRATEGIES = ("none", "ddp", "fsdp")
COMPRESS_BYTES = {"none": None, "bf16": 2, "fp16": 2}
MIB = 1024 * 1024
DDP_DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
ROOT_UNIT = "root"  # the fully_shard unit of the parameters outside the blocks (embedding, final norm, head)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter as the strategies see it."""

    name: str
    shape: tuple[int, ...]
    itemsize: int  # bytes per element of the parameter (and of its gradient)
    unit: str = ROOT_UNIT  # the fully_shard unit that holds it (distributed.fsdp_unit_of)
    dtype: str = ""  # its dtype ("torch.float32"): DDP buckets each dtype apart; "" groups by itemsize alone

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def shard_numel(self, world_size: int) -> int:
        """Elements of one rank's padded FSDP2 shard: ceil(dim0 / world_size) rows of the other dims."""
        dim0, rest = (self.shape[0], math.prod(self.shape[1:])) if self.shape else (1, 1)
        return -(-dim0 // world_size) * rest


def fsdp_unit_of(param_name: str) -> str:
    """The fully_shard unit nsa.training.distributed.wrap_fsdp puts a parameter in: "blocks.<i>" for a transformer
    block's, else ROOT_UNIT (embedding, final norm, head). Names are NSAModel.named_parameters() names."""
    parts = param_name.split(".")
    if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit():
        return f"blocks.{parts[1]}"
    return ROOT_UNIT


def param_specs(model, order: Sequence[str] | None = None) -> list[ParamSpec]:
    """The specs of a module's real parameters (a tied weight once), with the FSDP unit
    nsa.training.distributed.wrap_fsdp puts each in.

    Order: registration order; with `order` (parameter names, nsa.training.distributed.first_use_order: the order
    in which a forward first uses them) that order, which is what DDP's bucketing needs: its gradient-ready order
    is the reverse of it (a layer's gate, say, is registered after its projections but used before them).
    Parameters `order` does not name follow in registration order.
    """
    named = list(model.named_parameters())
    if order is not None:
        rank = {name: i for i, name in enumerate(order)}
        named.sort(key=lambda kv: rank.get(kv[0], len(rank)))  # stable: the unnamed ones keep their order
    return [ParamSpec(name, tuple(int(s) for s in p.shape), int(p.element_size()), fsdp_unit_of(name), str(p.dtype))
            for name, p in named]


@dataclass
class CommPrediction:
    """Predicted collectives of one strategy: per optimizer step in the steady state, and for the first step
    (they differ only for DDP, whose first iteration uses one bucket)."""

    strategy: str
    world_size: int
    per_step: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> {"calls", "bytes", "sizes"}
    first_step: dict[str, dict[str, Any]] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)  # buckets or units, for reading the numbers

    @property
    def bytes_per_step(self) -> int:
        return sum(e["bytes"] for e in self.per_step.values())

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "world_size": self.world_size, "per_step": self.per_step,
                "first_step": self.first_step, "bytes_per_step": self.bytes_per_step, "detail": self.detail}


def _counts(**kinds: list[int]) -> dict[str, dict[str, Any]]:
    """{kind: {"calls", "bytes", "sizes"}} from each kind's message sizes in call order."""
    return {k: {"calls": len(sizes), "bytes": sum(sizes), "sizes": list(sizes)} for k, sizes in kinds.items() if sizes}


def _check(world_size: int, accum: int) -> None:
    for name, value in (("world_size", world_size), ("accum", accum)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


# ---------------------------------------------------------------------- DDP
def _dtype_key(spec: ParamSpec) -> tuple[int, str]:
    """What DDP buckets a parameter by: its dtype (element size first, for specs that do not name the dtype)."""
    return spec.itemsize, spec.dtype


def ddp_buckets(specs: Sequence[ParamSpec], bucket_cap_mb: float, first_bucket_cap_mb: float | None = None,
                order: Iterable[int] | None = None) -> list[list[int]]:
    """DDP's rebuilt buckets as lists of indices into `specs`, in the order they are all-reduced.

    torch's compute_bucket_assignment_by_size: walk the parameters in gradient-ready order (`order`; default
    the reverse of `specs`, which is right when specs are in forward order), one open bucket per dtype (two dtypes
    of one element size, bf16 and fp16, are buckets apart), close a bucket once it holds >= its cap;
    the first bucket of each dtype has cap first_bucket_cap_mb (None: bucket_cap_mb, which is what DDP uses when
    bucket_cap_mb is given), the later ones bucket_cap_mb; buckets still open at the end follow.
    """
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
    caps = [int((bucket_cap_mb if first_bucket_cap_mb is None else first_bucket_cap_mb) * MIB),
            int(bucket_cap_mb * MIB)]
    sequence = list(range(len(specs)))[::-1] if order is None else list(order)
    open_buckets: dict[tuple[int, str], tuple[list[int], int]] = {}
    next_cap: dict[tuple[int, str], int] = {}
    done: list[list[int]] = []
    for i in sequence:
        key = _dtype_key(specs[i])
        indices, size = open_buckets.get(key, ([], 0))
        indices, size = indices + [i], size + specs[i].nbytes
        cap = caps[min(next_cap.get(key, 0), len(caps) - 1)]
        if size >= cap:
            done.append(indices)
            open_buckets.pop(key, None)
            next_cap[key] = next_cap.get(key, 0) + 1
        else:
            open_buckets[key] = (indices, size)
    done.extend(indices for indices, _ in open_buckets.values())
    return done


def ddp_comm(specs: Sequence[ParamSpec], *, world_size: int, bucket_cap_mb: float, compress: str = "none",
             accum: int = 1, first_bucket_cap_mb: float | None = None) -> CommPrediction:
    """All-reduce calls and bytes per optimizer step under DDP (see the module docstring). accum does not change
    them: the micro-batches before the last run under no_sync."""
    _check(world_size, accum)
    if compress not in COMPRESS_BYTES:
        raise ValueError(f"compress must be one of {' | '.join(COMPRESS_BYTES)}, got {compress!r}")
    if world_size == 1:
        return CommPrediction("ddp", 1, detail={"note": "one rank: the trainer does not wrap in DDP"})
    wire = COMPRESS_BYTES[compress]

    def bucket_bytes(indices: list[int]) -> int:
        return sum(specs[i].numel * (wire or specs[i].itemsize) for i in indices)

    buckets = ddp_buckets(specs, bucket_cap_mb, first_bucket_cap_mb)
    sizes = [bucket_bytes(b) for b in buckets]
    # the first iteration: one bucket per dtype, in the reverse order of each dtype's first parameter (DDP sorts its
    # initial buckets by their first parameter and reverses them); exact when specs are in registration order
    by_dtype: dict[tuple[int, str], list[int]] = {}
    for i, s in enumerate(specs):
        by_dtype.setdefault(_dtype_key(s), []).append(i)
    first = [bucket_bytes(ix) for ix in reversed(list(by_dtype.values()))]
    return CommPrediction(
        "ddp", world_size, per_step=_counts(all_reduce=sizes), first_step=_counts(all_reduce=first),
        detail={"bucket_bytes": sizes, "bucket_params": [[specs[i].name for i in b] for b in buckets],
                "compress": compress, "bucket_cap_mb": bucket_cap_mb,
                "first_bucket_cap_mb": bucket_cap_mb if first_bucket_cap_mb is None else first_bucket_cap_mb})


# ---------------------------------------------------------------------- FSDP2
def fsdp_units(specs: Sequence[ParamSpec], world_size: int) -> dict[str, int]:
    """{unit: bytes of its all-gather output (= its reduce-scatter input)}: world_size x the padded shards."""
    units: dict[str, int] = {}
    for s in specs:
        units[s.unit] = units.get(s.unit, 0) + world_size * s.shard_numel(world_size) * s.itemsize
    return units


def fsdp_comm(specs: Sequence[ParamSpec], *, world_size: int, reshard_after_forward: bool = True,
              accum: int = 1) -> CommPrediction:
    """All-gather and reduce-scatter calls and bytes per optimizer step under FSDP2 (see the module docstring)."""
    _check(world_size, accum)
    if world_size == 1:
        return CommPrediction("fsdp", 1, detail={"note": "one rank: the trainer does not wrap in FSDP2"})
    units = fsdp_units(specs, world_size)  # in the order of `specs`: forward order when specs are
    blocks = [u for u in units if u != ROOT_UNIT]
    forward = list(units)  # the root is entered first when it holds the first parameter used
    backward = blocks[::-1] if reshard_after_forward else []
    gathers = [units[u] for u in forward + backward] * accum
    scatters = [units[u] for u in blocks[::-1] + [u for u in units if u == ROOT_UNIT]]
    counts = _counts(all_gather=gathers, reduce_scatter=scatters)
    return CommPrediction("fsdp", world_size, per_step=counts, first_step=counts,
                          detail={"unit_bytes": units, "reshard_after_forward": reshard_after_forward,
                                  "backward_all_gather_units": backward, "accum": accum})


def comm_model(specs: Sequence[ParamSpec], strategy: str, *, world_size: int, accum: int = 1,
               bucket_cap_mb: float = 25, compress: str = "none", first_bucket_cap_mb: float | None = None,
               reshard_after_forward: bool = True) -> CommPrediction:
    """The prediction for `strategy` ("none" | "ddp" | "fsdp"); settings that do not apply are ignored."""
    if strategy == "none":
        _check(world_size, accum)
        return CommPrediction("none", world_size)
    if strategy == "ddp":
        return ddp_comm(specs, world_size=world_size, bucket_cap_mb=bucket_cap_mb, compress=compress, accum=accum,
                        first_bucket_cap_mb=first_bucket_cap_mb)
    if strategy == "fsdp":
        return fsdp_comm(specs, world_size=world_size, reshard_after_forward=reshard_after_forward, accum=accum)
    raise ValueError(f"strategy must be one of {' | '.join(STRATEGIES)}, got {strategy!r}")


# ---------------------------------------------------------------------- memory
ADAMW_STATE_PER_ELEMENT = 2  # exp_avg and exp_avg_sq, in the parameter's dtype
ADAMW_STEP_BYTES = 4  # one float32 `step` tensor per parameter tensor


def memory_model(specs: Sequence[ParamSpec], strategy: str, *, world_size: int, reshard_after_forward: bool = True,
                 activations: int = 0) -> dict[str, Any]:
    """Bytes per rank of what training keeps resident, per strategy (AdamW, no mixed-precision copies):

        params, grads, optimizer_state   the persistent state (FSDP2: rank 0's shards, the largest: every rank
                                         holds params and grads padded to ceil(dim0 / world_size) rows; AdamW's
                                         moments take the unpadded shard, fewer rows on the last ranks when
                                         world_size does not divide dim0)
        buffers                          DDP: its flat gradient buckets beside param.grad (gradient_as_bucket_view
                                         is off); FSDP2: the parameters gathered at the peak (full shard: the root
                                         plus two blocks, the current one and the one prefetched; no reshard:
                                         every unit from forward to backward) and one unit's unsharded gradients
        activations                      passed in (activation_bytes), per micro-batch
        total                            their sum: an estimate of peak allocated memory, to set beside the
                                         measured peak (CUDA allocated; on CPU the measured figure is the
                                         process's resident set, which also holds the runtime)
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {' | '.join(STRATEGIES)}, got {strategy!r}")
    _check(world_size, 1)
    full = sum(s.nbytes for s in specs)
    steps = ADAMW_STEP_BYTES * len(specs)
    if strategy == "fsdp" and world_size > 1:
        shard = sum(s.shard_numel(world_size) * s.itemsize for s in specs)
        units = fsdp_units(specs, world_size)
        blocks = sorted((b for u, b in units.items() if u != ROOT_UNIT), reverse=True)
        if reshard_after_forward:
            gathered = units.get(ROOT_UNIT, 0) + sum(blocks[:2])
        else:
            gathered = sum(units.values())
        params, grads, buffers = shard, shard, gathered + max(units.values(), default=0)
        opt = ADAMW_STATE_PER_ELEMENT * shard + steps
    else:
        params, grads = full, full
        buffers = full if strategy == "ddp" and world_size > 1 else 0
        opt = ADAMW_STATE_PER_ELEMENT * full + steps
    out = {"strategy": strategy, "world_size": world_size, "params": params, "grads": grads,
           "optimizer_state": opt, "buffers": buffers, "activations": int(activations)}
    out["total"] = params + grads + opt + buffers + int(activations)
    return out


def activation_bytes(model_cfg, batch_size: int, seq_len: int, precision: str = "fp32",
                     activation_checkpointing: bool | None = None) -> int:
    """A coarse estimate (within a factor ~1.5) of the activations one micro-batch keeps for backward.

    Per layer and token: the block input and norms, the gate MLP, queries and every branch's keys and values
    (with their RoPE copies), one attention probability per key read (NSA: compressed + selected + window keys,
    averaged over positions; dense: none, as flash attention keeps only its log-sum-exp), the branch outputs and
    the SwiGLU intermediates. The head: logits, their fp32 copy and the log-softmax. Activation checkpointing
    keeps one block input per layer plus one layer's activations during its recomputation. Element size: 2
    under bf16/fp16 autocast, else 4; probabilities and the loss in fp32.
    """
    e = 2 if precision in ("bf16", "fp16") else 4
    a, h, g = model_cfg.nsa, model_cfg.n_heads, model_cfg.n_kv_groups
    dim, hidden = model_cfg.dim, model_cfg.hidden
    gate_hidden = max(16, dim // 4)
    if model_cfg.attention == "dense":
        proj = h * a.d_k * 2 + g * (a.d_k * 2 + a.d_v)
        probs, branches = 0.0, h * a.d_v
    else:
        proj = h * a.d_k * 2 + 3 * g * (a.d_k + a.d_v) + 2 * g * a.d_k + gate_hidden + 2 * 3 * h
        probs, branches = h * mean_reads(a, seq_len)[0], 4 * h * a.d_v
    per_layer = e * (3 * dim + proj + branches + 4 * hidden + dim) + 4 * probs
    head = e * dim + model_cfg.vocab_size * (e + 4 + 4)
    checkpointing = model_cfg.activation_checkpointing if activation_checkpointing is None \
        else activation_checkpointing
    layers = (model_cfg.n_layers * e * dim + per_layer) if checkpointing else model_cfg.n_layers * per_layer
    return int(batch_size * seq_len * (layers + head))
