"""Communication accounting (nsa.training.comm_count) against the byte model (nsa.training.comm_model).

The counts come from the tensors the collectives really send; the model from the parameter list. They must be
equal exactly: per call, in call order. In-process checks use a one-rank gloo group against real DDP and the real
torch.distributed functions; the 2-rank torchrun runs check the trainer end to end (more 2-rank checks ride on the
runs of test_train_ddp.py)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
import yaml

from train_checks import check_counts_equal_model, check_summary_against_csv, check_timeline, independent_prediction
from train_utils import TINY, run

from nsa.config import ModelConfig
from nsa.model import NSAModel, lm_loss
from nsa.training import comm_count
from nsa.training.comm_model import (ParamSpec, comm_model, ddp_buckets, fsdp_comm, memory_model, param_specs)
from nsa.training.distributed import first_use_order

MIB = 1024 * 1024


def _config(tmp_path, vocab=None, **train):
    raw = yaml.safe_load(TINY.read_text())
    if vocab:
        raw["model"]["vocab_size"] = vocab
    raw["train"].update({"steps": 3, "seq_len": 64, "batch_size": 2, "accum": 2, "save_every": 1000,
                         "warmup_steps": 0, **train})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, raw


# ---------------------------------------------------------------------- the model alone
def _specs(shapes, itemsize=4, units=None):
    return [ParamSpec(f"p{i}", shape, itemsize, (units or {}).get(i, "root")) for i, shape in enumerate(shapes)]


def test_ddp_buckets_by_hand():
    # reverse order: p3 (0.5 MiB), p2 (0.75), p1 (0.25), p0 (1.0) with 1 MiB caps
    specs = _specs([(MIB // 4,), (MIB // 16,), (3 * MIB // 16,), (MIB // 8,)])
    assert ddp_buckets(specs, 1) == [[3, 2], [1, 0]]
    assert ddp_buckets(specs, 1, first_bucket_cap_mb=0.25) == [[3], [2, 1], [0]]
    mixed = specs + [ParamSpec("h", (MIB // 2,), 2)]  # a bf16 parameter gets buckets of its own
    assert ddp_buckets(mixed, 1) == [[4], [3, 2], [1, 0]]
    pred = comm_model(specs, "ddp", world_size=4, bucket_cap_mb=1, compress="fp16", accum=3)
    assert pred.per_step == {"all_reduce": {"calls": 2, "bytes": 2 * sum(s.numel for s in specs),
                                            "sizes": [2 * (MIB // 8 + 3 * MIB // 16), 2 * (MIB // 16 + MIB // 4)]}}
    assert pred.first_step["all_reduce"]["calls"] == 1  # DDP's first iteration: one bucket
    assert comm_model(specs, "ddp", world_size=1, bucket_cap_mb=1).per_step == {}
    with pytest.raises(ValueError, match="compress must be one of"):
        comm_model(specs, "ddp", world_size=2, compress="int8")
    with pytest.raises(ValueError, match="strategy must be one of"):
        comm_model(specs, "zero3", world_size=2)


def test_ddp_buckets_equal_torchs_own_assignment():
    """Against torch's compute_bucket_assignment_by_size, given the same order, on random shapes and dtypes."""
    rng = random.Random(0)
    for trial in range(20):
        specs = [ParamSpec(f"p{i}", (rng.randint(1, 4000), rng.randint(1, 64)), rng.choice((2, 4)))
                 for i in range(rng.randint(1, 40))]
        cap_mb = rng.choice((0.05, 0.2, 1.0))
        first_mb = rng.choice((None, 0.01, 0.1))
        tensors = [torch.empty(s.shape, dtype=torch.float32 if s.itemsize == 4 else torch.bfloat16) for s in specs]
        order = list(range(len(specs)))[::-1]
        caps = [int((cap_mb if first_mb is None else first_mb) * MIB), int(cap_mb * MIB)]
        theirs, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], caps, [False] * len(specs),
                                                            order)
        mine = ddp_buckets(specs, cap_mb, first_mb)
        assert sorted(map(list, theirs)) == sorted(mine), trial
        assert [list(b) for b in theirs] == mine or len(set(s.itemsize for s in specs)) > 1, trial


def test_fsdp_model_by_hand():
    # world 2: dim0 5 pads to 6 (3 rows of 4 per rank); units: root, blocks.0, blocks.1
    specs = [ParamSpec("tok_emb.weight", (5, 4), 4, "root"), ParamSpec("blocks.0.w", (4, 4), 4, "blocks.0"),
             ParamSpec("blocks.1.w", (3,), 4, "blocks.1"), ParamSpec("head.weight", (2, 4), 4, "root")]
    root, b0, b1 = 2 * (3 * 4 + 1 * 4) * 4, 2 * 2 * 4 * 4, 2 * 2 * 4
    full = fsdp_comm(specs, world_size=2, accum=2)
    assert full.per_step["all_gather"]["sizes"] == [root, b0, b1, b1, b0] * 2
    assert full.per_step["reduce_scatter"]["sizes"] == [b1, b0, root]
    no_reshard = fsdp_comm(specs, world_size=2, reshard_after_forward=False, accum=2)
    assert no_reshard.per_step["all_gather"]["sizes"] == [root, b0, b1] * 2
    assert no_reshard.per_step["reduce_scatter"] == full.per_step["reduce_scatter"]
    assert fsdp_comm(specs, world_size=1).per_step == {}


def test_memory_model_per_strategy():
    specs = _specs([(1000, 8), (8,)], units={0: "blocks.0"})
    full = 8008 * 4
    none = memory_model(specs, "none", world_size=1, activations=10)
    ddp = memory_model(specs, "ddp", world_size=4)
    fsdp = memory_model(specs, "fsdp", world_size=4)
    assert none["params"] == none["grads"] == full and none["optimizer_state"] == 2 * full + 2 * 4
    assert none["buffers"] == 0 and none["total"] == 4 * full + 8 + 10
    assert ddp["buffers"] == full  # DDP's flat buckets beside param.grad
    assert fsdp["params"] == (250 * 8 + 2) * 4 and fsdp["optimizer_state"] == 2 * fsdp["params"] + 8
    assert fsdp["total"] < ddp["total"]


def test_summary_compares_the_first_step_with_ddps_first_iteration():
    """A one-step DDP run counts one bucket: it matches the model's first_step, not its steady state."""
    from nsa.training.summary import SummaryAccumulator

    specs = _specs([(MIB // 4,), (MIB // 4,)])
    prediction = comm_model(specs, "ddp", world_size=2, bucket_cap_mb=1).to_dict()
    assert prediction["per_step"]["all_reduce"]["calls"] == 2

    def summary(step_sizes: list[list[int]]) -> dict:
        counter = comm_count.CommCounter(measure_time=False)
        acc = SummaryAccumulator(parallel="ddp", world_size=2, device_type="cuda", tokens_per_step=1,
                                 samples_per_step=1, steps_planned=3)
        for i, sizes in enumerate(step_sizes):
            counter.begin_step()
            for size in sizes:
                counter.issue("all_reduce", size)
            counter.end_step()
            acc.add(i + 1, 1.0, 1.0, 1.0, 0.0, 0.0)
        return acc.build("completed", counter, "ddp_comm_hook", prediction, None)

    whole = [2 * MIB]
    assert summary([whole])["comm_model_matches"] is True
    assert summary([whole, [MIB, MIB], [MIB, MIB]])["comm_model_matches"] is True
    assert summary([whole, [MIB, MIB], [MIB + 4, MIB - 4]])["comm_model_matches"] is False
    assert summary([[MIB, MIB]])["comm_model_matches"] is False
    cuda = summary([whole])
    assert cuda["comm_time_s"] is None and cuda["comm_share"] is None and "profiler" in cuda["comm_time_method"]


# ---------------------------------------------------------------------- counting, in this process (one rank)

def test_ddp_hook_counts_the_real_buckets_of_real_ddp(one_rank_group):
    """The counting hook inside real DDP: bucket sizes, in order, equal the model's, for several caps."""
    raw = yaml.safe_load(TINY.read_text())
    for vocab, cap in ((256, 0.05), (512, 0.02)):
        torch.manual_seed(0)
        model = NSAModel(ModelConfig.from_flat({**raw["model"], "vocab_size": vocab}))
        specs = param_specs(model, first_use_order(model, torch.zeros(1, 64, dtype=torch.long)))
        counter = comm_count.CommCounter(measure_time=True)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
        ddp.register_comm_hook(None, comm_count.ddp_hook(counter))
        x = torch.randint(0, vocab, (2, 64))
        records = []
        for _ in range(2):
            counter.begin_step()
            lm_loss(ddp(x), x).backward()
            records.append(counter.end_step())
        predicted = comm_model(specs, "ddp", world_size=2, bucket_cap_mb=cap)
        assert [r["model"] for r in records] == [predicted.first_step, predicted.per_step], (vocab, cap)
        assert predicted.per_step["all_reduce"]["calls"] > 1
        registration = comm_model(param_specs(model), "ddp", world_size=2, bucket_cap_mb=cap)
        assert registration.bytes_per_step == predicted.bytes_per_step  # bytes never depend on the order


@pytest.mark.filterwarnings("ignore:`torch.distributed.*` is deprecated:FutureWarning")
def test_collective_wrappers_count_once_and_are_removed(one_rank_group):
    counter = comm_count.CommCounter(measure_time=True)
    # all_gather_single (what all_gather_into_tensor calls since torch 2.12) is wrapped where torch has it: the GPU
    # image's torch 2.11 has not
    inner = hasattr(dist, "all_gather_single")
    originals = {name: getattr(dist, name) for name in ("all_gather_single", "all_gather_into_tensor", "all_reduce")
                 if hasattr(dist, name)}
    x, out = torch.ones(6), torch.empty(6)
    with comm_count.patch_collectives(counter) as names:
        assert ("all_gather_single" in names) == inner and dist.all_reduce is not originals["all_reduce"]
        assert "all_gather_into_tensor" in names and "reduce_scatter_tensor" in names
        dist.all_reduce(x)  # not armed: not counted
        counter.begin_step()
        dist.all_gather_into_tensor(out, x)  # calls all_gather_single inside: counted once
        dist.reduce_scatter_tensor(torch.empty(6), torch.ones(6))
        dist.all_reduce(torch.ones(3, dtype=torch.float64), async_op=True).wait()
        with counter.paused():
            dist.all_reduce(x)
        record = counter.end_step()
    assert record["model"] == {"all_gather": {"calls": 1, "bytes": 24, "sizes": [24]},
                               "reduce_scatter": {"calls": 1, "bytes": 24, "sizes": [24]},
                               "all_reduce": {"calls": 1, "bytes": 24, "sizes": [24]}}
    assert record["time_s"] > 0
    assert {name: getattr(dist, name) for name in originals} == originals
    with pytest.raises(RuntimeError, match="boom"):
        with comm_count.patch_collectives(counter):
            raise RuntimeError("boom")
    assert {name: getattr(dist, name) for name in originals} == originals
    from torch.distributed import distributed_c10d as c10d

    assert not inner or c10d.all_gather_single is originals["all_gather_single"]


# ---------------------------------------------------------------------- the trainer, 2 ranks (gloo)
def test_ddp_two_buckets_with_accumulation_counted_exactly(tmp_path):
    cfg, raw = _config(tmp_path, vocab=2048)
    code, out = run(tmp_path / "out", "--ddp", "1", nproc=2, config=cfg,
                    env={"NSA_DDP_BUCKET_MB": "1", "NSA_TB_DISABLE": "1"})
    assert code == 0, out[-3000:]
    check_summary_against_csv(tmp_path / "out", world_size=2, batch=2, accum=2, seq_len=64)
    summary = check_counts_equal_model(tmp_path / "out", raw, "ddp", bucket_cap_mb=1)
    assert summary["comm"]["per_step"][0]["calls"] == 2 and summary["comm"]["first_step"][0]["calls"] == 1
    assert summary["comm"]["counted_by"] == "ddp_comm_hook"
    assert "communication_share:" in out and "byte model: matches the counted bytes" in out
    check_timeline(tmp_path / "out", world_size=2)


def test_fsdp_without_reshard_counted_exactly(tmp_path):
    cfg, raw = _config(tmp_path)
    code, out = run(tmp_path / "out", "--fsdp-no-reshard", nproc=2, config=cfg, env={"NSA_TB_DISABLE": "1"})
    assert code == 0, out[-3000:]
    assert "no reshard after forward" in out
    summary = check_counts_equal_model(tmp_path / "out", raw, "fsdp", reshard_after_forward=False)
    assert summary["fsdp_reshard"] is False and summary["comm"]["counted_by"] == "fsdp2_collective_wrappers"
    full = independent_prediction(raw, "fsdp", reshard_after_forward=True)
    gathered = summary["comm"]["per_step"][0]
    assert gathered["kind"] == "all_gather" and gathered["calls"] == 2 * 3  # accum x (root + 2 blocks), forward only
    assert gathered["bytes"] < full.per_step["all_gather"]["bytes"]
    norm = summary["comm"]["trainer"]["per_step"][0]  # DTensor's gradient-norm all-reduce, counted as the trainer's
    assert norm["calls"] == 2 and norm["sizes"][0] > 0
    check_summary_against_csv(tmp_path / "out", world_size=2, batch=2, accum=2, seq_len=64)
