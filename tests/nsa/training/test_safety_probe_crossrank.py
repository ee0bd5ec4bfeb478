"""The trainer's numbers and stops across ranks, against a float64 recomputation of the full batch in one process.

- grad_norm (what training.csv records and what the trainer clips with) equals the float64 L2 norm of the gradient
  of the mean loss over every micro-batch of every rank, in one process, DDP and FSDP2 (2 ranks, gloo) with
  accumulation 1 and 2: DDP's gradients are already averaged, FSDP2's sharded ones combined across ranks once (a
  second combination would be sqrt(2) too large). The clipped gradients are the reference's times
  min(1, max_norm / (norm + 1e-6)): untouched where the norm is below max_norm.
- the loss of a step (training.csv) is the mean over micro-batches and ranks, each rank's `local_loss` its own mean.
- a NaN loss or an infinite gradient in the SECOND micro-batch of ONE rank stops every rank at that step (exit 3,
  status nonfinite, the reason on each rank's stop record), under fp16 too, where the GradScaler owns a non-finite
  gradient and only the all-reduced loss flag can stop the other rank; a .HALT that only one rank sees and a SIGTERM to one
  rank stop both ranks at the same step with a checkpoint.

The 2-rank cases run in one spawned pair of processes (one gloo process group; a Trainer per case, built the way
nsa-train builds it), rank results saved with torch.save. The reference computes its own float64 cross entropy.
"""

from __future__ import annotations

import datetime
import json
import math
import time
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from train_utils import TINY, heartbeats, read_csv

SEQ, BATCH, EPS = 64, 2, 1e-6  # EPS: torch.nn.utils.clip_grad_norm_'s, in max_norm / (norm + EPS)
NO_CLIP, CLIP = 5.0, 0.05  # the tiny model's first-step gradient norm is near 0.7-1.1: above CLIP, below NO_CLIP

# (name, parallel, accum, grad_clip): one train step, gradients read back
STEP_CASES = [("ddp_a1", "ddp", 1, NO_CLIP), ("ddp_a2", "ddp", 2, CLIP),
              ("fsdp_a1", "fsdp", 1, CLIP), ("fsdp_a2", "fsdp", 2, NO_CLIP)]
# (name, parallel, accum, steps, what goes wrong): the whole loop
LOOP_CASES = [("ddp_loss", "ddp", 2, 1, None), ("fsdp_loss", "fsdp", 2, 1, None),
              ("ddp_nan", "ddp", 2, 2, "nan_loss"), ("fsdp_inf", "fsdp", 2, 2, "inf_grad"),
              ("ddp_fp16_nan", "ddp", 2, 2, "nan_loss"),
              ("ddp_halt", "ddp", 1, 3, "halt"), ("fsdp_term", "fsdp", 1, 3, "sigterm")]


def _cfg(out: Path, parallel: str, accum: int, clip: float = 1.0, steps: int = 1):
    from nsa.training.config import apply_overrides, load_config

    precision = "fp16" if "fp16" in out.name else "fp32"
    return apply_overrides(load_config(TINY), {"train.precision": precision,
        "train.out_dir": str(out), "train.seq_len": SEQ, "train.batch_size": BATCH, "train.accum": accum,
        "train.parallel": parallel, "train.grad_clip": clip, "train.steps": steps, "train.warmup_steps": 0,
        "train.lr_schedule": "constant", "train.save_every": 1000, "train.log_every": 1000})


def _clean_environ(monkeypatch=None) -> None:
    """No NSA_* or CONFIG* variable but NSA_TB_DISABLE=1: in a rank's own process for good, in the test's process
    through `monkeypatch` (undone after the test: the worker's later tests read NSA_* variables too)."""
    for name in [k for k in os.environ if k.startswith(("NSA_", "CONFIG"))]:
        if monkeypatch is None:
            del os.environ[name]
        else:
            monkeypatch.delenv(name)
    if monkeypatch is None:
        os.environ["NSA_TB_DISABLE"] = "1"
    else:
        monkeypatch.setenv("NSA_TB_DISABLE", "1")


def _gradients(net) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, whole (FSDP2's shards gathered: a collective, every rank calls it)."""
    out = {}
    for name, p in net.named_parameters():
        g = p.grad
        out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


class _InfGrad(torch.autograd.Function):
    """Identity forward (the loss stays finite), infinite gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * math.inf


def _loop_case(trainer_mod, safety_mod, rank, fault):
    """Patches that make `fault` happen on rank 1 only (the second micro-batch's loss NaN or its gradient infinite;
    a .HALT only rank 1 sees from step 2; a SIGTERM to rank 1 during step 2); returns a function undoing them."""
    Trainer, RunControl = trainer_mod.Trainer, safety_mod.RunControl
    saved = [(Trainer, "_micro_step", Trainer._micro_step), (Trainer, "_loss", Trainer._loss),
             (Trainer, "train_step", Trainer.train_step), (RunControl, "halt_requested", RunControl.halt_requested)]
    calls = {"micro": 0, "loss": 0}
    micro_step, loss_fn, train_step = Trainer._micro_step, Trainer._loss, Trainer.train_step

    def nan_second(self, inputs, targets, last, loss_factor=None):
        calls["micro"] += 1
        return micro_step(self, inputs, targets, last, math.nan if calls["micro"] == 2 else loss_factor)

    def inf_second(self, inputs, targets):
        calls["loss"] += 1
        loss = loss_fn(self, inputs, targets)
        return _InfGrad.apply(loss) if calls["loss"] == 2 else loss

    def term_in_step_2(self, step, record_stats):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler RunControl installed records it
        return train_step(self, step, record_stats)

    if rank == 1 and fault == "nan_loss":
        Trainer._micro_step = nan_second
    elif rank == 1 and fault == "inf_grad":
        Trainer._loss = inf_second
    elif rank == 1 and fault == "halt":
        RunControl.halt_requested = lambda self: self.step >= 2
    elif rank == 1 and fault == "sigterm":
        Trainer.train_step = term_in_step_2

    def undo():
        for owner, name, value in saved:
            setattr(owner, name, value)
    return undo


def _rank_main(rank: int, world: int, store: str, root: str) -> None:
    _clean_environ()
    torch.set_num_threads(1)
    from nsa.toggles import Toggles
    from nsa.training import distributed, safety, trainer

    # a rank left alone in a collective fails within a minute, not the default half hour
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    info = distributed.DistInfo(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"),
                                backend="gloo")
    results: dict = {}
    try:
        for name, parallel, accum, clip in STEP_CASES:
            tr = trainer.Trainer(_cfg(Path(root) / name, parallel, accum, clip), str(TINY), info, Toggles.read(),
                                 False, ["nsa-train"])
            out = tr.train_step(1, False)
            results[name] = {"grad_norm": float(out["grad_norm"]), "loss_sum": float(out["loss_sum"]),
                             "grads": _gradients(tr.net)}
            tr._close()
            del tr
        for name, parallel, accum, steps, fault in LOOP_CASES:
            undo = _loop_case(trainer, safety, rank, fault)
            try:
                tr = trainer.Trainer(_cfg(Path(root) / name, parallel, accum, steps=steps), str(TINY), info,
                                     Toggles.read(), False, ["nsa-train"])
                results[name] = {"code": tr.run()}
                del tr
            finally:
                undo()
    finally:
        torch.save(results, Path(root) / f"rank{rank}.pt")
        distributed.shutdown(synchronize=True)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("crossrank")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, 2, str(root / "store"), str(root))) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 150
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    return root, [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(2)]


# ---------------------------------------------------------------------- the float64 reference
def _batches(world: int, accum: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each rank's micro-batches of step 1, as the trainer's source gives them to that rank."""
    from nsa.training.data import build_source

    cfg = _cfg(Path("unused"), "none", accum)
    out = []
    for rank in range(world):
        src = build_source(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=SEQ, batch_size=BATCH, rank=rank,
                           world_size=world, seed=cfg.train.seed)
        out.append([src.next_batch() for _ in range(accum)])
    return out


def _reference(world: int, accum: int) -> dict:
    """The first step in float64, in one process: the initial weights (the trainer's seed), every rank's
    micro-batches, the mean cross entropy over all of them, its gradient and the gradient's L2 norm."""
    from nsa.model import NSAModel

    cfg = _cfg(Path("unused"), "none", accum)
    torch.manual_seed(cfg.train.seed)
    net = NSAModel(cfg.model).double()
    per_rank, n = [], world * accum
    for batches in _batches(world, accum):
        losses = []
        for x, y in batches:
            assert int(y.min()) >= 0  # no ignored targets: every token counts in the mean
            logits = net(x).double()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            (loss / n).backward()
            losses.append(loss.item())
        per_rank.append(sum(losses) / accum)
    grads = {name: p.grad.clone() for name, p in net.named_parameters()}
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    return {"norm": norm, "loss": sum(per_rank) / world, "rank_loss": per_rank, "grads": grads}


_REFS: dict = {}


def reference(world: int, accum: int) -> dict:
    if (world, accum) not in _REFS:
        _REFS[world, accum] = _reference(world, accum)
    return _REFS[world, accum]


def _assert_clipped(grads: dict, ref: dict, max_norm: float) -> None:
    coef = min(1.0, max_norm / (ref["norm"] + EPS))
    assert set(grads) == set(ref["grads"])
    for name, want in ref["grads"].items():
        want = want * coef
        err = float((grads[name].double() - want).abs().max())
        assert err <= 1e-5 * float(want.abs().max()) + 1e-12, (name, err, coef)


# ---------------------------------------------------------------------- gradient norm and clipping
@pytest.mark.parametrize("accum, clip", [(1, CLIP), (2, CLIP), (2, NO_CLIP)])
def test_single_process_grad_norm_and_clipping_match_the_float64_full_batch(tmp_path, monkeypatch, accum, clip):
    _clean_environ(monkeypatch)
    from nsa.toggles import Toggles
    from nsa.training import distributed, trainer

    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    tr = trainer.Trainer(_cfg(tmp_path / "run", "none", accum, clip), str(TINY), info, Toggles.read(), False, ["x"])
    try:
        out = tr.train_step(1, False)
        ref = reference(1, accum)
        assert float(out["grad_norm"]) == pytest.approx(ref["norm"], rel=1e-5)
        assert float(out["loss_sum"]) / accum == pytest.approx(ref["loss"], rel=1e-6)
        _assert_clipped(_gradients(tr.net), ref, clip)
    finally:
        tr._close()


@pytest.mark.parametrize("name, parallel, accum, clip", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_two_rank_grad_norm_is_the_full_batch_norm_combined_once_and_clipping_uses_it(ranks, name, parallel, accum,
                                                                                      clip):
    _, results = ranks
    ref = reference(2, accum)
    for rank in (0, 1):
        got = results[rank][name]
        # FSDP2's shards combined twice would read sqrt(2) x the norm; not at all, a shard's own
        assert got["grad_norm"] == pytest.approx(ref["norm"], rel=1e-5), (rank, got["grad_norm"], ref["norm"])
        assert got["loss_sum"] / accum == pytest.approx(ref["rank_loss"][rank], rel=1e-6)
        _assert_clipped(got["grads"], ref, clip)


# ---------------------------------------------------------------------- the loss a step reports
@pytest.mark.parametrize("name", ["ddp_loss", "fsdp_loss"])
def test_the_reported_loss_is_the_mean_over_micro_batches_and_ranks(ranks, name):
    root, results = ranks
    ref = reference(2, 2)
    assert [results[r][name]["code"] for r in (0, 1)] == [0, 0]
    (row,) = read_csv(root / name / "training.csv")
    assert float(row["loss"]) == pytest.approx(ref["loss"], rel=1e-5)  # the csv keeps 6 decimals
    assert float(row["grad_norm"]) == pytest.approx(ref["norm"], rel=1e-5)
    for rank in (0, 1):
        (beat,) = [h for h in heartbeats(root / name, rank) if h["msg"] == "step"]
        assert beat["loss"] == pytest.approx(ref["loss"], rel=1e-6)
        assert beat["local_loss"] == pytest.approx(ref["rank_loss"][rank], rel=1e-6)
        assert beat["grad_norm"] == pytest.approx(ref["norm"], rel=1e-5)


# ---------------------------------------------------------------------- stops every rank agrees on
def _stops(root: Path, name: str) -> list[dict]:
    return [[h for h in heartbeats(root / name, rank) if h["msg"] == "stop"] for rank in (0, 1)]


@pytest.mark.parametrize("name, what", [("ddp_nan", "non-finite loss on 1 of 2 rank(s) at step 1"),
                                        ("ddp_fp16_nan", "non-finite loss on 1 of 2 rank(s) at step 1"),
                                        ("fsdp_inf", "non-finite gradient norm (loss finite) at step 1")])
def test_a_nonfinite_second_micro_batch_on_one_rank_stops_every_rank_at_that_step(ranks, name, what):
    root, results = ranks
    assert [results[r][name]["code"] for r in (0, 1)] == [3, 3]
    status = json.loads((root / name / "status.json").read_text())
    assert status["status"] == "nonfinite" and status["step"] == 0 and status["reason"].startswith(what), status
    for rank, stops in enumerate(_stops(root, name)):
        assert [s["step"] for s in stops] == [1], (rank, stops)
        assert stops[0]["reason"] == status["reason"]
    assert read_csv(root / name / "training.csv") == []  # no row, no optimizer step, no checkpoint
    assert not (root / name / "checkpoints").exists() or not list((root / name / "checkpoints").iterdir())


def test_the_stop_record_of_a_nonfinite_step_keeps_the_ranks_mean_loss(ranks):
    root, _ = ranks
    ref = reference(2, 2)
    stops = _stops(root, "fsdp_inf")
    for rank in (0, 1):  # the loss stayed finite on both ranks (only the gradient was infinite)
        assert stops[rank][0]["local_loss"] == pytest.approx(ref["rank_loss"][rank], rel=1e-6), rank


@pytest.mark.parametrize("name, status_name, reasons", [
    ("ddp_halt", "halted", (".HALT file", ".HALT file")),  # nobody wrote the file: its reason is the fallback
    ("fsdp_term", "terminated", ("signal received", "SIGTERM received")),  # rank 0 learns only that some rank was
])
def test_a_stop_that_one_rank_sees_stops_both_at_the_same_step_with_a_checkpoint(ranks, name, status_name, reasons):
    root, results = ranks
    assert [results[r][name]["code"] for r in (0, 1)] == [0, 0]
    status = json.loads((root / name / "status.json").read_text())
    assert status["status"] == status_name and status["step"] == 2 and status["checkpoint_step"] == 2, status
    for rank, stops in enumerate(_stops(root, name)):
        assert [(s["step"], s.get("reason")) for s in stops if s.get("reason")] == [(2, reasons[rank])], stops
        assert stops[-1]["status"] == status_name
    assert [int(r["step"]) for r in read_csv(root / name / "training.csv")] == [1, 2]
    assert (root / name / "checkpoints" / "step_00000002").is_dir()
