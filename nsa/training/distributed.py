"""Process-group setup and model wrapping for the trainer: single process, DDP or FSDP2.

Launched by torchrun (RANK / WORLD_SIZE / LOCAL_RANK in the environment) or alone (world size 1, no process
group). Backend: nccl on CUDA, gloo on CPU. The process-group timeout is configurable (train.pg_timeout_s).

Teardown (``shutdown``): the process group's backend is destroyed there, in the main thread, while the interpreter
is whole: its worker threads are joined and its connections closed before the process exits. For FSDP2 that takes
one more step than destroy_process_group: the DeviceMesh FSDP2 shards over holds the process group, and torch's
DTensor caches keep the mesh alive until the interpreter exits, so without it the gloo backend (two worker threads,
a socket-loop thread, its connections to the other ranks) outlived destroy_process_group and was torn down only by
the process's own exit, concurrently with the other ranks' exits (in that teardown an FSDP rank of a CI run on a
loaded machine aborted with "terminate called without an active exception", its run completed). ``wrap_fsdp``
builds the one mesh itself and ``shutdown`` releases it (tests/nsa/training/test_distributed_shutdown.py checks that
no gloo thread is left once nsa-train's main() returns).
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from nsa.training.comm_count import ddp_hook
from nsa.training.outputs import NODE_ENV_PREFIXES, NODE_NAME_VARS

log = logging.getLogger("nsa.training")

COMPRESS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# The DeviceMeshes wrap_fsdp built: each holds the process group until shutdown releases it (see the module doc).
_MESHES: list[DeviceMesh] = []


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


def check_launch(rank: int, world: int, local: int, local_world: int | None = None) -> None:
    """LaunchError unless RANK / WORLD_SIZE / LOCAL_RANK (and LOCAL_WORLD_SIZE, when the launcher sets it) describe
    a rank that can exist: at least one rank, RANK from 0 to WORLD_SIZE - 1, LOCAL_RANK not negative and below
    LOCAL_WORLD_SIZE, which is from 1 to WORLD_SIZE (a rank outside its world would neither write the run's files,
    rank 0's, nor find its data shard; a local rank outside its node's would take a device no rank of the node
    should)."""
    if world < 1:
        raise LaunchError(f"environment variable WORLD_SIZE={world}: the number of ranks must be at least 1")
    if not 0 <= rank < world:
        raise LaunchError(f"environment variable RANK={rank} is outside the launch's ranks 0 to {world - 1} "
                          f"(WORLD_SIZE={world})")
    if local < 0:
        raise LaunchError(f"environment variable LOCAL_RANK={local} must not be negative")
    if local_world is None:
        return
    if not 1 <= local_world <= world:
        raise LaunchError(f"environment variable LOCAL_WORLD_SIZE={local_world}: the number of ranks on this node "
                          f"must be from 1 to WORLD_SIZE={world}")
    if local >= local_world:
        raise LaunchError(f"environment variable LOCAL_RANK={local} is outside this node's local ranks 0 to "
                          f"{local_world - 1} (LOCAL_WORLD_SIZE={local_world})")


def check_master_port(raw: str | None) -> None:
    """LaunchError unless MASTER_PORT (`raw`; read by the process group's env:// rendezvous when there are several
    ranks) is a TCP port from 1 to 65535. Unset is left to the rendezvous, which names it. Port 0 would let rank 0
    listen on a port the OS picks, which the other ranks cannot know: every rank would wait out the process-group
    timeout; a non-integer would fail in the rendezvous with int()'s message, naming no variable."""
    if raw is None or raw == "":
        return
    try:
        port = int(raw)
    except ValueError:
        raise LaunchError(f"environment variable MASTER_PORT={raw!r} is not an integer") from None
    if not 1 <= port <= 65535:
        raise LaunchError(f"environment variable MASTER_PORT={raw!r} is not a TCP port from 1 to 65535 (the port "
                          "rank 0 listens on for the other ranks)")


def init(device: str = "auto", pg_timeout_s: float = 600.0) -> DistInfo:
    """Read the torchrun environment, pick the device and, with more than one rank, start the process group."""
    rank, world, local = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0)
    # LOCAL_WORLD_SIZE: torchrun sets it; a process started alone need not
    local_world = _env_int("LOCAL_WORLD_SIZE", 0) if os.environ.get("LOCAL_WORLD_SIZE") else None
    check_launch(rank, world, local, local_world)
    if world > 1:
        check_master_port(os.environ.get("MASTER_PORT"))
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


def shutdown(synchronize: bool = False) -> None:
    """End the process group, if there is one, and with it its backend (threads and connections): now, not at exit.

    synchronize: every rank ended the run together (the trainer's loop stops all ranks at the same step) and calls
    this too: a barrier first, so that no rank closes its connections while another is still in a collective.
    Leave it False on an error path, where another rank may never get here (the barrier would wait out the
    process-group timeout). The meshes wrap_fsdp built let go of the process group, so once the caller has let go
    of the model too (DDP's reducer and FSDP2's state hold the group as well), destroy_process_group destroys the
    backend here, in the main thread: gloo joins its worker threads and closes its connections to the other ranks."""
    meshes = list(_MESHES)
    _MESHES.clear()
    if not (dist.is_available() and dist.is_initialized()):
        return
    if synchronize:
        try:
            dist.barrier()
        except (RuntimeError, OSError) as exc:  # a rank that left after all (its run failed late): end ours anyway
            log.warning("barrier before ending the process group failed (%s: %s)", type(exc).__name__, exc)
    dist.destroy_process_group()
    for mesh in meshes:
        _release(mesh)
    if meshes:
        gc.collect()  # FSDP2's module state holds reference cycles: the last holders of the backend go with them


def _release(mesh: DeviceMesh) -> None:
    """Drop `mesh`'s references to its process groups (torch 2.x keeps them by name in the mesh's _pg_registry;
    after destroy_process_group nothing may use them): the mesh itself lives on in torch's DTensor caches until the
    interpreter exits, the process group must not."""
    registry = getattr(mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        registry.clear()


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
    which does not reshard the root after forward (its parameters would be gathered again at once for backward).
    All of them shard over one 1-D mesh of every rank, built here on the model's device type and released by
    shutdown (the module doc says why)."""
    device_type = next(model.parameters()).device.type
    mesh = init_device_mesh(device_type, (dist.get_world_size() if dist.is_initialized() else 1,))
    _MESHES.append(mesh)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)
    return model


def reshard_fsdp(model: nn.Module) -> None:
    """Free the gathered parameters of every FSDP2 module of `model` (nothing for a model without any). A forward
    outside autograd (evaluation under no_grad) leaves some of them gathered, since only a backward reshards what
    forward does not: the root (FSDP2 never reshards it after forward) and, with reshard_after_forward=False, every
    block. Left so, the next training step would skip their all-gathers (its collectives then differ from the
    strategy's byte model, nsa.training.comm_model, and summary.json says the model DIFFERS) and their full
    parameters would stay in memory until that step's backward."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


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
