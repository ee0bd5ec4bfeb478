"""Parameters that do not require grad in the byte and memory models (nsa.training.comm_model): DDP leaves them out
of its buckets, FSDP2 all-gathers them but reduce-scatters no gradient for them, and AdamW keeps no state for them
(nsa.training.optim.build_adamw skips them). Checked by hand and against real DDP (one-rank gloo group) and real
FSDP2 (two gloo ranks, slow)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import yaml

from test_comm_probe_model import _run_ranks  # spawned ranks, results by rank
from train_utils import TINY

from nsa.config import ModelConfig
from nsa.model import NSAModel, lm_loss
from nsa.training import comm_count
from nsa.training.comm_model import ParamSpec, comm_model, ddp_buckets, memory_model, param_specs

MIB = 1024 * 1024


class _PartlyFrozen(torch.nn.Module):
    """Four fp32 parameters used in registration order; b and d frozen."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(100, 8))
        self.b = torch.nn.Parameter(torch.randn(30, 8), requires_grad=False)
        self.c = torch.nn.Parameter(torch.randn(50, 8))
        self.d = torch.nn.Parameter(torch.randn(20, 8), requires_grad=False)

    def forward(self, x):
        return sum((p * x).sum() for p in (self.a, self.b, self.c, self.d))


def _specs(frozen: set[int]) -> list[ParamSpec]:
    """Root (5 x 4), blocks.0 (4 x 4, then 3 x 4), blocks.1 (6,), fp32, frozen where named."""
    shapes = [("tok_emb.weight", (5, 4), "root"), ("blocks.0.a", (4, 4), "blocks.0"),
              ("blocks.0.b", (3, 4), "blocks.0"), ("blocks.1.w", (6,), "blocks.1")]
    return [ParamSpec(name, shape, 4, unit, "torch.float32", i not in frozen)
            for i, (name, shape, unit) in enumerate(shapes)]


def test_param_specs_read_requires_grad():
    specs = param_specs(_PartlyFrozen())
    assert [s.requires_grad for s in specs] == [True, False, True, False]


def test_ddp_model_leaves_frozen_parameters_out_by_hand():
    specs = param_specs(_PartlyFrozen())
    assert ddp_buckets(specs, 1) == [[2, 0]]  # c then a (reverse order), b and d in no bucket
    assert ddp_buckets(specs, 0.001) == [[2], [0]]  # 1,048 B caps: each gradient closes its own bucket
    pred = comm_model(specs, "ddp", world_size=2, bucket_cap_mb=1)
    grad_bytes = (100 + 50) * 8 * 4
    assert pred.per_step == {"all_reduce": {"calls": 1, "bytes": grad_bytes, "sizes": [grad_bytes]}}
    assert pred.first_step == pred.per_step
    half = comm_model(specs, "ddp", world_size=2, bucket_cap_mb=1, compress="bf16")
    assert half.bytes_per_step == grad_bytes // 2


def test_fsdp_model_reduce_scatters_only_gradients_by_hand():
    # world 2: tok_emb 5 rows -> 3 per rank (24 elements), blocks.0 a: 2 rows (8), b: 3 rows -> 2 (8), blocks.1: 3
    root, a, b, w = 2 * 12 * 4, 2 * 8 * 4, 2 * 8 * 4, 2 * 3 * 4
    everything = comm_model(_specs(set()), "fsdp", world_size=2)
    assert everything.per_step["reduce_scatter"]["sizes"] == [w, a + b, root]
    frozen = comm_model(_specs({2, 3}), "fsdp", world_size=2)  # blocks.0.b and the whole of blocks.1 frozen
    assert frozen.per_step["all_gather"] == everything.per_step["all_gather"]  # still gathered for forward/backward
    assert frozen.per_step["all_gather"]["sizes"] == [root, a + b, w, w, a + b]
    assert frozen.per_step["reduce_scatter"] == {"calls": 2, "bytes": a + root, "sizes": [a, root]}


def test_memory_model_counts_no_gradient_or_adamw_state_for_frozen_parameters():
    specs = _specs({2, 3})
    trained_elems, trained_tensors = 5 * 4 + 4 * 4, 2
    for strategy, world in (("none", 1), ("ddp", 2)):
        m = memory_model(specs, strategy, world_size=world)
        assert m["params"] == (20 + 16 + 12 + 6) * 4
        assert m["grads"] == trained_elems * 4
        assert m["optimizer_state"] == 2 * trained_elems * 4 + 4 * trained_tensors
        assert m["buffers"] == (trained_elems * 4 if strategy == "ddp" else 0)
    fsdp = memory_model(specs, "fsdp", world_size=2)
    assert fsdp["params"] == (12 + 8 + 8 + 3) * 4
    assert fsdp["grads"] == (12 + 8) * 4  # rank 0's padded shards of tok_emb and blocks.0.a
    assert fsdp["optimizer_state"] == 2 * (12 + 8) * 4 + 4 * trained_tensors
    # gathered at the peak: root + the two blocks; one unit's unsharded gradients: the root's 24 elements
    assert fsdp["buffers"] == (24 + 32 + 6) * 4 + 24 * 4


def test_real_ddp_sends_what_the_model_predicts_with_frozen_parameters(one_rank_group):
    """NSAModel with two norms frozen, under real DDP with the counting hook: every step's all-reduces (the first
    iteration's single bucket and the rebuilt ones) equal the prediction, call by call."""
    from nsa.training.distributed import first_use_order
    from nsa.training.optim import build_adamw

    torch.manual_seed(0)
    raw = yaml.safe_load(TINY.read_text())["model"]
    net = NSAModel(ModelConfig.from_flat({**raw, "vocab_size": 512}))
    net.blocks[0].attn_norm.weight.requires_grad_(False)
    net.norm.weight.requires_grad_(False)
    specs = param_specs(net, first_use_order(net, torch.zeros(1, 64, dtype=torch.long)))
    counter = comm_count.CommCounter(measure_time=False)
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.05)
    ddp.register_comm_hook(None, comm_count.ddp_hook(counter))
    optimizer = build_adamw(net, 1e-3, 0.01, (0.9, 0.95), False)
    x = torch.randint(0, 512, (1, 64))
    records = []
    for _ in range(2):
        counter.begin_step()
        lm_loss(ddp(x), x).backward()
        records.append(counter.end_step()["model"])
    optimizer.step()
    pred = comm_model(specs, "ddp", world_size=2, bucket_cap_mb=0.05)
    trained = sum(p.numel() * 4 for p in net.parameters() if p.requires_grad)
    assert records[0]["all_reduce"]["bytes"] == records[1]["all_reduce"]["bytes"] == trained
    assert records == [pred.first_step, pred.per_step] and pred.per_step["all_reduce"]["calls"] > 1
    memory = memory_model(specs, "ddp", world_size=2)
    assert memory["grads"] == sum(p.grad.numel() * 4 for p in net.parameters() if p.grad is not None)
    assert memory["optimizer_state"] == sum(v.numel() * v.element_size() for s in optimizer.state.values()
                                            for v in s.values() if torch.is_tensor(v))


# ---------------------------------------------------------------------- FSDP2, two gloo ranks
def _fsdp_rank(rank: int, world: int, store: str, results) -> None:
    from torch.distributed.tensor import DTensor

    from nsa.training.distributed import wrap_fsdp
    from nsa.training.optim import build_adamw

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    out: dict = {}
    try:
        raw = yaml.safe_load(TINY.read_text())["model"]
        torch.manual_seed(0)
        net = NSAModel(ModelConfig.from_flat({**raw, "vocab_size": 251, "dim": 40, "ffn_hidden": 107}))
        net.blocks[0].attn_norm.weight.requires_grad_(False)
        net.norm.weight.requires_grad_(False)
        for p in net.blocks[1].parameters():
            p.requires_grad_(False)
        specs = param_specs(net)
        model = wrap_fsdp(net)
        optimizer = build_adamw(net, 1e-3, 0.01, (0.9, 0.95), False)
        counter = comm_count.CommCounter(measure_time=False)
        x = torch.randint(0, 251, (1, 32))
        with comm_count.patch_collectives(counter):
            counter.begin_step()
            lm_loss(model(x), x).backward()
            out["counted"] = counter.end_step()["model"]
        optimizer.step()

        def local(t):
            return t._local_tensor if isinstance(t, DTensor) else t

        grads = [local(p.grad) for p in net.parameters() if p.grad is not None]
        out["grads"] = sum({g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}.values())
        out["optimizer_state"] = sum(local(v).numel() * local(v).element_size() for s in optimizer.state.values()
                                     for v in s.values() if torch.is_tensor(v))
        out["predicted"] = comm_model(specs, "fsdp", world_size=world).per_step
        out["memory"] = memory_model(specs, "fsdp", world_size=world)
        model.reshard()
    finally:
        results.put((rank, out))
        dist.destroy_process_group()


@pytest.mark.slow
def test_real_fsdp2_with_frozen_parameters_on_two_ranks(tmp_path):
    for rank, out in enumerate(_run_ranks(2, tmp_path, _fsdp_rank)):
        assert out["counted"] == out["predicted"], rank
        assert out["counted"]["reduce_scatter"]["calls"] == 2  # blocks.1 frozen whole: no reduce-scatter
        assert out["grads"] == out["memory"]["grads"], rank
        # AdamW's moments follow the unpadded shard: rank 0's is the prediction, rank 1's no more
        assert (out["optimizer_state"] == out["memory"]["optimizer_state"] if rank == 0
                else out["optimizer_state"] <= out["memory"]["optimizer_state"]), rank
