"""Process-group setup and model wrapping for the trainer: single process, DDP or FSDP2.

Launched by torchrun (RANK / WORLD_SIZE / LOCAL_RANK in the environment) or alone (world size 1, no process
group). Backend: nccl on CUDA, gloo on CPU. The process-group timeout is configurable (train.pg_timeout_s).
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from nsa.training.comm_count import ddp_hook
from nsa.training.outputs import NODE_ENV_PREFIXES, NODE_NAME_VARS

COMPRESS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class LaunchError(RuntimeError):
    """The launch environment cannot run what was asked (e.g. CUDA requested but absent)."""


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: no process group (single process)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"environment variable {name}={raw!r} is not an integer") from None


def init(device: str = "auto", pg_timeout_s: float = 600.0) -> DistInfo:
    """Read the torchrun environment, pick the device and, with more than one rank, start the process group."""
    rank, world, local = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0)
    if device == "cuda" and not torch.cuda.is_available():
        raise LaunchError("train.device is 'cuda' but no CUDA device is available")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if local >= torch.cuda.device_count():
            raise LaunchError(f"LOCAL_RANK={local} but only {torch.cuda.device_count()} CUDA device(s) are visible")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    backend = None
    if world > 1:
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=pg_timeout_s),
                                device_id=dev if use_cuda else None)
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev, backend=backend)


def _this_node(info: DistInfo) -> dict:
    name = next((os.environ[v] for v in NODE_NAME_VARS if os.environ.get(v)), None) or socket.gethostname()
    gpu = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else None
    return {"node": name, "host": socket.gethostname(), "rank": info.rank, "local_rank": info.local_rank,
            "gpu": gpu, "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(NODE_ENV_PREFIXES)}}


def node_records(info: DistInfo) -> list[dict]:
    """Every node of the job (a collective: call it on every rank): [{"node", "host", "ranks", "gpus", "env"}] in
    node order of their lowest rank. "env" holds the node's NCCL / InfiniBand / Slurm variables (of its lowest
    rank). The node name is $NSA_NODE_NAME, else $SLURMD_NODENAME, else the host name."""
    mine = _this_node(info)
    every = [mine]
    if info.distributed:
        every = [None] * info.world_size
        dist.all_gather_object(every, mine)
    nodes: dict[str, dict] = {}
    for rec in sorted(every, key=lambda r: r["rank"]):
        node = nodes.setdefault(rec["node"], {"node": rec["node"], "host": rec["host"], "ranks": [], "gpus": [],
                                              "env": rec["env"]})
        node["ranks"].append(rec["rank"])
        if rec["gpu"]:
            node["gpus"].append(rec["gpu"])
    return list(nodes.values())


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap_ddp(model: nn.Module, info: DistInfo, bucket_mb: int, compress: str, counter=None,
             gradient_as_bucket_view: bool = False) -> nn.Module:
    """DistributedDataParallel with bucket_cap_mb and a comm hook that averages each gradient bucket: in fp32, or
    in bf16/fp16 when compress is not "none" (nsa.training.comm_count.ddp_hook). The hook counts what it sends
    into `counter` (a comm_count.CommCounter), when given. gradient_as_bucket_view: gradients are views of the
    buckets (fixed addresses; train.cuda_graphs sets it)."""
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[info.device.index] if info.device.type == "cuda" else None, bucket_cap_mb=bucket_mb,
        gradient_as_bucket_view=gradient_as_bucket_view)
    ddp.register_comm_hook(None, ddp_hook(counter, None if compress == "none" else COMPRESS_DTYPES[compress]))
    return ddp


def first_use_order(model: nn.Module, probe: torch.Tensor) -> list[str]:
    """The names of the model's parameters (named_parameters(): a tied weight once) in the order a forward on
    `probe` (a small batch of token ids on the model's device) first uses them: module by module as they are
    called, each module's own parameters in registration order; the ones it does not reach are left out. The
    probe forward runs under no_grad and changes nothing. comm_model.param_specs takes this order."""
    names = {id(p): name for name, p in model.named_parameters()}
    order: list[str] = []
    seen: set[int] = set()

    def pre_hook(module, _args):
        for p in module.parameters(recurse=False):
            if id(p) not in seen and id(p) in names:
                seen.add(id(p))
                order.append(names[id(p)])

    handles = [m.register_forward_pre_hook(pre_hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(probe)
    finally:
        for h in handles:
            h.remove()
    return order


def wrap_fsdp(model: nn.Module, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2: every transformer block sharded on its own (comm_model.fsdp_unit_of names them), then the root
    (embedding, final norm, head). reshard_after_forward=False keeps each block's parameters gathered from forward
    to backward (no all-gather in backward: the SHARD_GRAD_OP equivalent). The root is left to FSDP2's default,
    which does not reshard the root after forward (its parameters would be gathered again at once for backward)."""
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward)
    fully_shard(model)
    return model


def all_reduce_sum(values: list[float], info: DistInfo, counter=None) -> list[float]:
    """Element-wise sum of `values` over all ranks (float64; identity without a process group). With `counter`
    (comm_count.CommCounter) the all-reduce is counted as the trainer's own traffic."""
    if not info.distributed:
        return list(values)
    device = info.device if info.backend == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if counter is None:
        dist.all_reduce(t)
    else:
        with counter.paused():
            counter.issue("all_reduce", t.numel() * t.element_size(), source="trainer")
            dist.all_reduce(t)
    return t.tolist()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()
