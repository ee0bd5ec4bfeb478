"""Byte model and memory model per parallel strategy: pure functions of the model's real parameter list and the
trainer's settings. The trainer counts what it really sends (nsa.training.comm_count); these predictions must
equal those counts exactly, for every strategy.

    specs = param_specs(model, first_use_order(model, probe))  # forward order: shape, bytes, unit of each
    comm_model(specs, "ddp", world_size=2, bucket_cap_mb=25, compress="bf16", accum=2)
    comm_model(specs, "fsdp", world_size=2, reshard_after_forward=False, accum=2)
    memory_model(specs, "fsdp", world_size=2, activations=activation_bytes(model_cfg, 4, 2048, "bf16"))

Strategies (what the trainer does, nsa.training.distributed):

- "ddp": DistributedDataParallel with a comm hook that all-reduces each gradient bucket (fp32, or bf16/fp16 with
  compression: half the bytes) once per optimizer step (no_sync on the other micro-batches). DDP puts every parameter
  that requires grad (the frozen ones in none) in ONE bucket for the first iteration, then rebuilds its buckets from
  the order the gradients became ready, with caps [first_bucket_cap, bucket_cap] (first_bucket_cap = bucket_cap when
  bucket_cap_mb is given, as the trainer does; 1 MiB under torch's default): a bucket closes as soon as it holds >=
  its cap. The ready order is the reverse of the parameter list's order (`ddp_buckets`), so give the list in forward
  order (param_specs with nsa.training.distributed.first_use_order of a probe batch; in registration order the total
  bytes are still exact, bucket sizes can differ where the two orders do).
- "fsdp": FSDP2 fully_shard per transformer block, then the root (distributed.wrap_fsdp). Each parameter is sharded on
  dim 0 into world_size chunks of ceil(dim0 / world_size) rows (padded). Per unit: an all-gather in forward and, with
  reshard_after_forward (full shard), another in backward (never for the root: FSDP2 keeps the root gathered from
  forward to backward); both on every micro-batch. One reduce-scatter of the gradients per unit on the last
  micro-batch of the step (of its parameters that require grad; none for a unit without any).
  reshard_after_forward=False is the SHARD_GRAD_OP equivalent: no backward all-gather.
- "none": one process, nothing communicated.

Message sizes follow nccl-tests (comm_count): all-reduce the buffer, all-gather the gathered output,
reduce-scatter the full input, so that a call takes bytes / algbw, algbw = busbw / the kind's bus factor (2(n-1)/n
for all-reduce, (n-1)/n for all-gather and reduce-scatter). Predicting the time is the orchestrator's job, from each
call's size on its measured bandwidth table (validation.analysis.collectives.predict_seconds, latency included);
`CommPrediction` gives the kind, calls and sizes it needs.

The specs are plain values (param_specs reads them off a module); activation_bytes reads the kernels' chunk and
tile sizes and the loss choice from their own modules (nsa.attention's kernels, nsa.loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from nsa.attention.geometry import num_cmp_blocks, num_sel_blocks
from nsa.attention.kernels.range_attn.naive import WINDOW_CHUNK
from nsa.attention.kernels.selected_attn.naive import SEL_TILE
from nsa.loss import resolve_loss

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
    requires_grad: bool = True  # False: a frozen parameter (no gradient: in no DDP bucket, no FSDP2 reduce-scatter,
    # no AdamW state; FSDP2 still all-gathers it)

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
    return [ParamSpec(name, tuple(int(s) for s in p.shape), int(p.element_size()), fsdp_unit_of(name), str(p.dtype),
                      bool(p.requires_grad)) for name, p in named]


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
    bucket_cap_mb is given), the later ones bucket_cap_mb; buckets still open at the end follow. Parameters that do
    not require grad are in no bucket (DDP leaves them out).
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
        if not specs[i].requires_grad:
            continue
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
             accum: int = 1, first_bucket_cap_mb: float | None = None, rebuilt: bool = False) -> CommPrediction:
    """All-reduce calls and bytes per optimizer step under DDP (see the module docstring). accum does not change
    them: the micro-batches before the last run under no_sync. rebuilt: the first counted step comes after DDP has
    rebuilt its buckets (CUDA graphs: the warm-up runs its first iterations uncounted, nsa.training.graphs), so its
    calls are every step's, not the first iteration's one bucket per dtype."""
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
        if s.requires_grad:
            by_dtype.setdefault(_dtype_key(s), []).append(i)
    first = sizes if rebuilt else [bucket_bytes(ix) for ix in reversed(list(by_dtype.values()))]
    return CommPrediction(
        "ddp", world_size, per_step=_counts(all_reduce=sizes), first_step=_counts(all_reduce=first),
        detail={"bucket_bytes": sizes, "bucket_params": [[specs[i].name for i in b] for b in buckets],
                "compress": compress, "bucket_cap_mb": bucket_cap_mb,
                "first_bucket_cap_mb": bucket_cap_mb if first_bucket_cap_mb is None else first_bucket_cap_mb})


# ---------------------------------------------------------------------- FSDP2
def fsdp_units(specs: Sequence[ParamSpec], world_size: int, grads_only: bool = False) -> dict[str, int]:
    """{unit: bytes of its all-gather output}: world_size x the padded shards, in the order of `specs`. grads_only:
    the bytes of its reduce-scatter input, the padded gradients of the parameters that require grad (units
    without any are left out: they reduce-scatter nothing)."""
    units: dict[str, int] = {}
    for s in specs:
        if grads_only and not s.requires_grad:
            continue
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
    grads = fsdp_units(specs, world_size, grads_only=True)  # frozen parameters: no gradient to reduce-scatter
    scatters = [grads[u] for u in blocks[::-1] + [u for u in units if u == ROOT_UNIT] if u in grads]
    counts = _counts(all_gather=gathers, reduce_scatter=scatters)
    return CommPrediction("fsdp", world_size, per_step=counts, first_step=counts,
                          detail={"unit_bytes": units, "reshard_after_forward": reshard_after_forward,
                                  "backward_all_gather_units": backward, "accum": accum})


def comm_model(specs: Sequence[ParamSpec], strategy: str, *, world_size: int, accum: int = 1,
               bucket_cap_mb: float = 25, compress: str = "none", first_bucket_cap_mb: float | None = None,
               reshard_after_forward: bool = True, rebuilt: bool = False) -> CommPrediction:
    """The prediction for `strategy` ("none" | "ddp" | "fsdp"); settings that do not apply are ignored (rebuilt:
    ddp_comm's)."""
    if strategy == "none":
        _check(world_size, accum)
        return CommPrediction("none", world_size)
    if strategy == "ddp":
        return ddp_comm(specs, world_size=world_size, bucket_cap_mb=bucket_cap_mb, compress=compress, accum=accum,
                        first_bucket_cap_mb=first_bucket_cap_mb, rebuilt=rebuilt)
    if strategy == "fsdp":
        return fsdp_comm(specs, world_size=world_size, reshard_after_forward=reshard_after_forward, accum=accum)
    raise ValueError(f"strategy must be one of {' | '.join(STRATEGIES)}, got {strategy!r}")


# ---------------------------------------------------------------------- memory
ADAMW_STATE_PER_ELEMENT = 2  # exp_avg and exp_avg_sq, in the parameter's dtype
ADAMW_STEP_BYTES = 4  # one float32 `step` tensor per parameter tensor


def memory_model(specs: Sequence[ParamSpec], strategy: str, *, world_size: int, reshard_after_forward: bool = True,
                 activations: int = 0, gradient_as_bucket_view: bool = False) -> dict[str, Any]:
    """Bytes per rank of what training keeps resident, per strategy (AdamW; autocast's weight copies are in the
    activations):

        params, grads, optimizer_state   the persistent state (grads and AdamW state: of the parameters that
                                         require grad only; FSDP2: rank 0's shards, the largest: every rank
                                         holds params and grads padded to ceil(dim0 / world_size) rows; AdamW's
                                         moments take the unpadded shard, fewer rows on the last ranks when
                                         world_size does not divide dim0)
        buffers                          DDP: its flat gradient buckets beside param.grad; none with
                                         gradient_as_bucket_view (the trainer's DDP under CUDA graphs), where each
                                         param.grad is a view of its bucket (counted in grads); FSDP2: the
                                         parameters gathered at the peak (full shard: the root
                                         plus two blocks, the current one and the one prefetched; no reshard:
                                         every unit from forward to backward) and one unit's unsharded gradients
        activations                      passed in (activation_bytes: saved for backward, per micro-batch)
        total                            their sum: an estimate of peak allocated memory (transients such as
                                         the logits' gradient left out), to set beside the measured peak (CUDA
                                         allocated; on CPU the measured figure is the process's resident set,
                                         which also holds the runtime)
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {' | '.join(STRATEGIES)}, got {strategy!r}")
    _check(world_size, 1)
    trained = [s for s in specs if s.requires_grad]  # frozen parameters: no gradient, no AdamW state
    full, full_trained = sum(s.nbytes for s in specs), sum(s.nbytes for s in trained)
    steps = ADAMW_STEP_BYTES * len(trained)
    if strategy == "fsdp" and world_size > 1:
        shard = sum(s.shard_numel(world_size) * s.itemsize for s in specs)
        shard_trained = sum(s.shard_numel(world_size) * s.itemsize for s in trained)
        units = fsdp_units(specs, world_size)
        blocks = sorted((b for u, b in units.items() if u != ROOT_UNIT), reverse=True)
        if reshard_after_forward:
            gathered = units.get(ROOT_UNIT, 0) + sum(blocks[:2])
        else:
            gathered = sum(units.values())
        unsharded_grads = max(fsdp_units(specs, world_size, grads_only=True).values(), default=0)
        params, grads, buffers = shard, shard_trained, gathered + unsharded_grads
        opt = ADAMW_STATE_PER_ELEMENT * shard_trained + steps
    else:
        params, grads = full, full_trained
        buffers = full_trained if strategy == "ddp" and world_size > 1 and not gradient_as_bucket_view else 0
        opt = ADAMW_STATE_PER_ELEMENT * full_trained + steps
    out = {"strategy": strategy, "world_size": world_size, "params": params, "grads": grads,
           "optimizer_state": opt, "buffers": buffers, "activations": int(activations)}
    out["total"] = params + grads + opt + buffers + int(activations)
    return out


def activations_basis(device_type: str, attention_kernel: str | None) -> str:
    """What memory_model's "activations" (activation_bytes) stands for on this run: the exact count on CPU, where
    the PyTorch path runs as counted; elsewhere an estimate (on CUDA the SDPA kernels and the Triton path save other
    tensors than the PyTorch path's on CPU), so "total" is an estimate there too."""
    if device_type == "cpu":
        return "exact: the PyTorch path's tensors saved for backward, as counted on CPU"
    return (f"estimate: the PyTorch path's CPU count; on {device_type} (attention kernel "
            f"{attention_kernel or 'unknown'}) the kernels save other tensors, so activations and total are "
            "estimates")


PARAM_BYTES = 4  # the trainer's parameters (and so the residual stream and the norms) are fp32 at every precision
ACC_BYTES = 4  # fp32: attention log-sum-exps and softmax statistics, the selected branch's band scores, the loss


def _block_weights(model_cfg) -> int:
    """Elements of one block's nn.Linear weights: under autocast each one's cast copy is saved by its matmul."""
    a, h, g, dim = model_cfg.nsa, model_cfg.n_heads, model_cfg.n_kv_groups, model_cfg.dim
    if model_cfg.attention == "dense":
        attn = dim * (h * a.d_k + g * (a.d_k + a.d_v)) + h * a.d_v * dim
    else:
        gate_hidden = max(16, dim // 4)
        attn = (dim * (h * a.d_k + 3 * g * (a.d_k + a.d_v)) + dim * gate_hidden + gate_hidden * 3 * h
                + h * a.d_v * dim)
        if a.phi == "mlp":
            attn += sum(a.l * wd * 2 * wd + 2 * wd * wd for wd in (a.d_k, a.d_v))
    return attn + 3 * dim * model_cfg.hidden


def _nsa_attention_bytes(a, b: int, s: int, c: int) -> int:
    """Bytes one NSA attention layer's batched PyTorch path saves for backward (compute element size c), tensor by
    tensor as the code makes them; the projections' input is counted by the caller."""
    h, g, dk, dv, hpg = a.n_heads, a.n_kv_groups, a.d_k, a.d_v, a.heads_per_group
    n, cast = b * s, c != ACC_BYTES
    gate_hidden = max(16, a.dim // 4)
    out = n * c * 2 * gate_hidden  # the gate MLP: SiLU input, second layer input
    # its gates [B, S, H, 3] (saved by the combine): sigmoid's output; softmax's fp32 output and its cast
    out += n * 3 * h * (c if a.gate == "sigmoid" else ACC_BYTES + (c if cast else 0))
    n_cmp = num_cmp_blocks(s, a.l, a.d)
    out += 2 * ACC_BYTES * dk * (3 * s + n_cmp)  # RoPE's cos and sin tables, per sequence: q, k_sel, k_win, k_cmp
    if a.phi == "mlp" and n_cmp:  # phi's MLP per compressed token: the flattened block, GELU's input, fc2's input
        out += b * g * n_cmp * c * sum(a.l * wd + 4 * wd for wd in (dk, dv))
    # compressed branch: SDPA over the queries padded to n_cmp * d (q, k, v, out, log-sum-exp), then the output
    # padded to S (a copy, saved by the combine)
    if n_cmp:
        rows = n_cmp * a.d
        out += b * h * rows * (c * (dk + dv) + ACC_BYTES) + b * g * n_cmp * c * (dk + dv)
    out += b * h * s * dv * c
    # selected branch (selected_attn.naive): the band of each query block against its key blocks J-1 and J (scaled
    # queries, keys and values of both blocks, the mask, the fp32 scores' exponentials and their cast), the sparse
    # part's inputs (queries, key and value blocks, maxima, its tile rows), the fp32 numerator and denominator and
    # the output copy
    nb = num_sel_blocks(s, a.l_sel)
    sp = nb * a.l_sel
    out += b * h * sp * dk * c + 2 * b * g * sp * (dk + dv) * c + b * g * sp * 2 * a.l_sel
    out += b * h * sp * 2 * a.l_sel * (ACC_BYTES + (c if cast else 0))
    out += (b * g * s + 1) * hpg * (dk * c + ACC_BYTES) + b * g * sp * (dk + dv) * c
    out += b * h * s * ((dv + 1) * ACC_BYTES + dv * c)
    # the tile rows (int64): the (query, block) pairs outside the band, each block's padded to whole tiles (half a
    # tile on average for every block that has pairs)
    pairs = sum(min(a.l_sel, s - j * a.l_sel) * max(0, min(a.n_sel, j + 1) - 2) for j in range(nb))
    out += 8 * b * g * (pairs + max(0, nb - 2) * SEL_TILE // 2)
    # window branch: SDPA (q, k, v, out, log-sum-exp; the output is the branch's, saved by the combine too); past
    # the window, over query chunks with an additive mask in the compute dtype and their key/value windows: the
    # padded keys and values themselves when one sequence lets the windows stay views, else one copy per chunk;
    # the output is a view of SDPA's except below
    if s <= a.w:
        out += b * h * s * ((dk + dv) * c + ACC_BYTES) + b * g * s * (dk + dv) * c
    else:
        chunk = min(WINDOW_CHUNK, s)
        n_chunks = -(-s // chunk)
        sw = n_chunks * chunk
        out += b * h * sw * ((dk + dv) * c + ACC_BYTES) + b * n_chunks * chunk * (a.w + chunk) * c
        out += g * (dk + dv) * c * (sw + a.w if b == 1 else b * n_chunks * (a.w + chunk))
        if b > 1 and sw != s:  # padded queries: the output [B, H, sw, d_v] is a copy of SDPA's, not a view
            out += b * h * sw * dv * c
    return out + n * h * dv * c  # the gated sum of the branches: o_proj's input


def _layer_bytes(model_cfg, b: int, s: int, c: int) -> int:
    """Bytes one transformer block saves for backward: two RMSNorms (input, 1/rms, normalized input, fp32), the
    attention's and the SwiGLU's inputs (under autocast each nn.Linear saves its own cast of the fp32 norm output),
    the attention and the SwiGLU (gate and up outputs, SiLU's output, their product)."""
    a, n, cast = model_cfg.nsa, b * s, c != PARAM_BYTES
    dim, h, g, dk, dv = model_cfg.dim, model_cfg.n_heads, model_cfg.n_kv_groups, a.d_k, a.d_v
    norms = 2 * n * (2 * PARAM_BYTES * dim + ACC_BYTES)
    mlp = n * c * (dim * (2 if cast else 1) + 4 * model_cfg.hidden)
    if model_cfg.attention == "dense":  # q, k, v (their casts), RoPE tables, SDPA's q, k, v, out (o_proj's input), lse
        attn = n * c * dim * (3 if cast else 1) + 2 * 2 * ACC_BYTES * dk * s
        attn += b * h * s * ((dk + dv) * c + ACC_BYTES) + b * g * s * (dk + dv) * c
    else:  # seven projections and the gate's first layer
        attn = n * c * dim * (8 if cast else 1) + _nsa_attention_bytes(a, b, s, c)
    return norms + attn + mlp


def _head_bytes(model_cfg, b: int, s: int, c: int) -> int:
    """Bytes the final norm, the head and the loss save: the reference saves the head's input (its cast under
    autocast, with the head weight's) and the fp32 log-softmax of the whole batch's logits (cross entropy keeps no
    logits, no fp32 copy) and the targets; the chunked and fused losses (nsa.loss) build no batch-wide logits and
    keep the gradients they computed in forward: w.r.t. the hidden states (compute dtype) and the head weight
    (fp32)."""
    n, dim, v = b * s, model_cfg.dim, model_cfg.vocab_size
    out = n * (2 * PARAM_BYTES * dim + ACC_BYTES) + ACC_BYTES  # the final RMSNorm; the loss's scale or total weight
    if resolve_loss(model_cfg.loss) == "reference":
        out += n * (c * dim + ACC_BYTES * v + 8) + (c * v * dim if c != PARAM_BYTES else 0)
    else:
        out += n * c * dim + ACC_BYTES * v * dim
    return out


def activation_bytes(model_cfg, batch_size: int, seq_len: int, precision: str = "fp32",
                     activation_checkpointing: bool | None = None) -> int:
    """The most bytes one micro-batch holds saved for backward (unique tensor storages, parameters excluded): at the
    end of its forward, or, with activation checkpointing, when the last block is recomputed in backward if that
    holds more.

    Counted tensor by tensor as the PyTorch path saves them on CPU (checked there with saved_tensors_hooks), for
    every model.loss choice (the head: _head_bytes) and precision: fp32; bf16/fp16 autocast, under which the
    matmuls save their inputs and the cast weights in the compute dtype (2 bytes: each nn.Linear weight's copy, and
    its own cast of an fp32 input), while the residual stream and the norms stay in the parameters' fp32 and the
    attention statistics, band scores and loss in fp32. Activation checkpointing keeps each block's fp32 input and
    the token ids; the head's tensors are freed by the time the last block is recomputed, so the figure is the
    larger of (inputs + head) and (inputs + one block's other tensors and weight copies). Transient memory (the
    logits' gradient, a chunk's logits, kernel workspaces) is not in it. On CUDA the SDPA kernels and the Triton
    path (no band scores, no padded copies) save other tensors: there this is the PyTorch path's CPU figure.
    """
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be one of fp32 | bf16 | fp16, got {precision!r}")
    c = 2 if precision in ("bf16", "fp16") else PARAM_BYTES
    b, s = batch_size, seq_len
    copies = c if c != PARAM_BYTES else 0  # autocast's cast weights, saved by the matmuls
    layer = _layer_bytes(model_cfg, b, s, c) + copies * _block_weights(model_cfg)
    ids = 8 * b * s  # the embedding's int64 indices
    head = _head_bytes(model_cfg, b, s, c)
    checkpointing = model_cfg.activation_checkpointing if activation_checkpointing is None \
        else activation_checkpointing
    if checkpointing:  # a recomputed block's own input is one of the inputs kept
        block_input = b * s * model_cfg.dim * PARAM_BYTES
        return int(ids + model_cfg.n_layers * block_input + max(head, layer - block_input))
    return int(ids + model_cfg.n_layers * layer + head)
