"""The byte and memory models (nsa.training.comm_model) and the collective counts (nsa.training.comm_count) against
what torch itself does: DDP's own bucket assignment and first iteration, the bytes torch allocates for parameters,
gradients and AdamW state on each rank, and the collectives torch's dispatcher sees (c10d ops, below the Python
wrappers comm_count installs), on real gloo process groups of 2 and 3 ranks with uneven FSDP2 shards."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from train_utils import TINY

from nsa.config import ModelConfig
from nsa.model import NSAModel, lm_loss
from nsa.training import comm_count
from nsa.training.comm_model import comm_model, ddp_buckets, memory_model, param_specs

MIB = 1024 * 1024


class _ThreeDtypes(torch.nn.Module):
    """fp32, bf16 and fp16 parameters (registration order a, b, c, d), each used in forward."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(100, 8))
        self.b = torch.nn.Parameter(torch.randn(30, 8, dtype=torch.bfloat16))
        self.c = torch.nn.Parameter(torch.randn(50, 8, dtype=torch.float16))
        self.d = torch.nn.Parameter(torch.randn(20, 8, dtype=torch.bfloat16))

    def forward(self, x):
        return sum((p.float() * x).sum() for p in (self.a, self.b, self.c, self.d))


class _TwoDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(100, 8))
        self.b = torch.nn.Parameter(torch.randn(30, 8, dtype=torch.bfloat16))

    def forward(self, x):
        return (self.a * x).sum() + (self.b.float() * x).sum()


def test_ddp_buckets_keep_bf16_and_fp16_apart_like_torch():
    """torch buckets by dtype, not by element size: bf16 and fp16 gradients never share a bucket."""
    module = _ThreeDtypes()
    specs = param_specs(module)
    params = list(module.parameters())
    order = list(range(len(params)))[::-1]
    for cap_mb in (1.0, 0.001):
        caps = [int(cap_mb * MIB)] * 2
        theirs, _ = dist._compute_bucket_assignment_by_size([params[i] for i in order], caps, [False] * len(params),
                                                            order)
        assert sorted(sorted(b) for b in theirs) == sorted(sorted(b) for b in ddp_buckets(specs, cap_mb)), cap_mb
    # by hand, 1 MiB caps (nothing closes): fp32 {a}, bf16 {b, d}, fp16 {c}
    assert sorted(ddp_buckets(specs, 1)) == [[0], [2], [3, 1]]
    pred = comm_model(specs, "ddp", world_size=2, bucket_cap_mb=1)
    assert sorted(pred.per_step["all_reduce"]["sizes"]) == sorted([100 * 8 * 4, (30 + 20) * 8 * 2, 50 * 8 * 2])
    assert pred.first_step["all_reduce"]["calls"] == 3


def _ddp_records(module, steps=2):
    counter = comm_count.CommCounter(measure_time=False)
    ddp = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=1)
    ddp.register_comm_hook(None, comm_count.ddp_hook(counter))
    records = []
    for _ in range(steps):
        counter.begin_step()
        ddp(torch.ones(8)).backward()
        records.append(counter.end_step()["model"])
    return records


def test_ddp_first_iteration_with_two_dtypes_in_real_ddps_order(one_rank_group):
    """DDP's first iteration: one bucket per dtype, the dtype of the last-registered first parameter first (DDP
    reverses its initial buckets): fp32 a then bf16 b are all-reduced as [bf16, fp32]."""
    module = _TwoDtypes()
    first, steady = _ddp_records(module)
    pred = comm_model(param_specs(module), "ddp", world_size=2, bucket_cap_mb=1)
    assert first["all_reduce"]["sizes"] == [30 * 8 * 2, 100 * 8 * 4]  # by hand
    assert pred.first_step == first
    assert sorted(pred.per_step["all_reduce"]["sizes"]) == sorted(steady["all_reduce"]["sizes"])


def test_ddp_three_dtypes_counted_as_predicted(one_rank_group):
    module = _ThreeDtypes()
    first, steady = _ddp_records(module)
    pred = comm_model(param_specs(module), "ddp", world_size=2, bucket_cap_mb=1)
    assert pred.first_step == first
    assert sorted(pred.per_step["all_reduce"]["sizes"]) == sorted(steady["all_reduce"]["sizes"])
    assert pred.per_step["all_reduce"]["bytes"] == steady["all_reduce"]["bytes"]


# ---------------------------------------------------------------------- several ranks, gloo
_C10D_KINDS = {"_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter", "allreduce_": "all_reduce"}


class _DispatcherCount(TorchDispatchMode):
    """Message sizes of the c10d ops torch's dispatcher runs (nccl-tests convention: all-gather its output,
    reduce-scatter its input, all-reduce its buffer), found without comm_count's wrappers."""

    def __init__(self):
        super().__init__()
        self.sizes: dict[str, list[int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented
        namespace, _, name = func._schema.name.partition("::")
        kind = _C10D_KINDS.get(name) if namespace == "c10d" else None
        if kind is not None:
            tensor = args[1] if kind == "reduce_scatter" else args[0]
            tensor = tensor[0] if isinstance(tensor, list) else tensor
            self.sizes.setdefault(kind, []).append(tensor.numel() * tensor.element_size())
        return func(*args, **(kwargs or {}))


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def _allocated(net, optimizer) -> dict[str, int]:
    """Bytes torch holds for the parameters and gradients (their storages: FSDP2's padded shards) and AdamW's
    state (its tensors), on this rank."""
    def storages(tensors):
        return sum({_local(t).untyped_storage().data_ptr(): _local(t).untyped_storage().nbytes()
                    for t in tensors}.values())

    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"params": storages(net.parameters()), "grads": storages(p.grad for p in net.parameters()),
            "optimizer_state": sum(_local(v).numel() * _local(v).element_size() for v in state)}


def _model_cfg():
    raw = yaml.safe_load(TINY.read_text())["model"]
    # uneven on 2 and 3 ranks: 251 embedding rows, 107-wide SwiGLU, 40-wide norms (on 3)
    return ModelConfig.from_flat({**raw, "vocab_size": 251, "dim": 40, "ffn_hidden": 107})


def _rank_main(rank: int, world: int, store: str, results) -> None:
    from nsa.training.distributed import wrap_fsdp
    from nsa.training.optim import build_adamw

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    out: dict = {}
    try:
        x = torch.randint(0, 251, (1, 32), generator=torch.Generator().manual_seed(rank))
        # comm_count's wrappers against a hand count
        counter = comm_count.CommCounter(measure_time=True)
        with comm_count.patch_collectives(counter):
            counter.begin_step()
            dist.all_reduce(torch.ones(10))
            dist.all_gather_into_tensor(torch.empty(world * 5), torch.ones(5))
            dist.all_gather([torch.empty(4, dtype=torch.bfloat16) for _ in range(world)],
                            torch.ones(4, dtype=torch.bfloat16))
            dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world))
            dist.broadcast(torch.ones(3, dtype=torch.float64), src=0, async_op=True).wait()
            out["hand"] = counter.end_step()["model"]
        # FSDP2, full shard and no reshard
        for reshard, accum in ((True, 2), (False, 1)):
            torch.manual_seed(0)
            net = NSAModel(_model_cfg())
            specs = param_specs(net)
            model = wrap_fsdp(net, reshard_after_forward=reshard)
            optimizer = build_adamw(net, 1e-3, 0.01, (0.9, 0.95), False)
            counter = comm_count.CommCounter(measure_time=False)
            with comm_count.patch_collectives(counter):
                counter.begin_step()
                seen = _DispatcherCount()
                for micro in range(accum):
                    model.set_requires_gradient_sync(micro == accum - 1)
                    with seen:
                        (lm_loss(model(x), x) / accum).backward()
                counted = counter.end_step()["model"]
            out[("fsdp", reshard)] = {"counted": counted, "dispatcher": seen.sizes,
                                      "predicted": comm_model(specs, "fsdp", world_size=world, accum=accum,
                                                              reshard_after_forward=reshard).per_step}
            if reshard:
                optimizer.step()
                out["fsdp_memory"] = (_allocated(net, optimizer), memory_model(specs, "fsdp", world_size=world))
            model.reshard()
        # DDP with bf16 compression and accumulation under no_sync
        torch.manual_seed(0)
        net = NSAModel(_model_cfg())
        from nsa.training.distributed import first_use_order

        specs = param_specs(net, first_use_order(net, torch.zeros(1, 32, dtype=torch.long)))
        ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.05)
        counter = comm_count.CommCounter(measure_time=False)
        ddp.register_comm_hook(None, comm_count.ddp_hook(counter, torch.bfloat16))
        optimizer = build_adamw(net, 1e-3, 0.01, (0.9, 0.95), False)
        records = []
        for _ in range(2):
            counter.begin_step()
            for micro in range(2):
                with ddp.no_sync() if micro == 0 else contextlib.nullcontext():
                    lm_loss(ddp(x), x).backward()
            records.append(counter.end_step()["model"])
        optimizer.step()
        logged = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        out["ddp"] = {"records": records, "logged_fp32": [int(s) for s in logged.split(",")],
                      "predicted": comm_model(specs, "ddp", world_size=world, bucket_cap_mb=0.05, compress="bf16",
                                              accum=2),
                      "memory": (_allocated(net, optimizer), memory_model(specs, "ddp", world_size=world))}
    finally:
        results.put((rank, out))
        dist.destroy_process_group()


def _run_ranks(world: int, tmp_path, target=None) -> list[dict]:
    """What `target(rank, world, store path, results queue)` (default _rank_main) put on the queue, rank by rank,
    each rank a spawned process."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target or _rank_main, args=(r, world, str(tmp_path / "store"), results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [got[r] for r in range(world)]


def _check_ranks(world: int, tmp_path) -> None:
    ranks = _run_ranks(world, tmp_path)
    for rank, out in enumerate(ranks):
        hand = out["hand"]
        assert hand == {"all_reduce": {"calls": 1, "bytes": 40, "sizes": [40]},
                        "all_gather": {"calls": 2, "bytes": world * 28, "sizes": [world * 20, world * 8]},
                        "reduce_scatter": {"calls": 1, "bytes": world * 12, "sizes": [world * 12]},
                        "broadcast": {"calls": 1, "bytes": 24, "sizes": [24]}}, rank
        for reshard in (True, False):
            fsdp = out[("fsdp", reshard)]
            assert fsdp["counted"] == fsdp["predicted"], (rank, reshard)
            assert fsdp["dispatcher"] == {k: v["sizes"] for k, v in fsdp["predicted"].items()}, (rank, reshard)
        measured, predicted = out["fsdp_memory"]
        assert measured["params"] == predicted["params"] and measured["grads"] == predicted["grads"], rank
        # AdamW's moments follow the unpadded shard: rank 0's (the largest) is the prediction, the others no more
        assert (measured["optimizer_state"] == predicted["optimizer_state"] if rank == 0
                else measured["optimizer_state"] <= predicted["optimizer_state"]), rank
        ddp = out["ddp"]
        predicted = ddp["predicted"]
        assert ddp["records"] == [predicted.first_step, predicted.per_step], rank
        assert [2 * s for s in predicted.per_step["all_reduce"]["sizes"]] == ddp["logged_fp32"], rank  # bf16: half
        measured, predicted = ddp["memory"]
        assert {k: predicted[k] for k in measured} == measured, rank
    # the last rank's shards are short: its AdamW state is smaller than rank 0's
    assert ranks[-1]["fsdp_memory"][0]["optimizer_state"] < ranks[0]["fsdp_memory"][0]["optimizer_state"]


@pytest.mark.slow
def test_two_ranks_memory_and_collectives_equal_torchs(tmp_path):
    _check_ranks(2, tmp_path)


@pytest.mark.slow
def test_three_ranks_memory_and_collectives_equal_torchs(tmp_path):
    _check_ranks(3, tmp_path)
