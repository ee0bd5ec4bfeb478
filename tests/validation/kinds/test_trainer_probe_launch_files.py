"""A trainer launch's out_dir, written here by hand as the trainer writes it (training.csv, status.json,
summary.json, env.json), collected into a step's status and metrics (validation.kinds.trainer.collect): the window's
figures against hand recomputations (tokens over time, per GPU and per node, MFU and TFLOP/s, loss, memory), and how
each status.json the trainer writes (nsa.training.outputs.STATUSES), or its absence, becomes the step's status and
a reason that says why."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from nsa.training.outputs import STATUSES
from validation.kinds import trainer
from validation.results.codec import decode
from validation.results.trainer_launch import LaunchMetrics, TrainerStatus

HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb,comm_bytes,comm_time_s,mfu"
TOKENS_PER_STEP = 4000  # world 4 x batch 5 x accum 2 x seq_len 100
FLOPS_PER_TOKEN, PEAK, WORLD = 6e9, 1e14, 4
STEP_TIMES = (40.0, 8.0, 4.0, 16.0, 4.0, 8.0)  # tokens/s 100, 500, 1000, 250, 1000, 500
LOSSES = (5.0, 4.75, 4.5, 4.25, 4.0, 3.5)
RESERVED = (2.0, 2.5, 3.25, 3.0, 3.0, 3.0)


def _write(out: Path, status: dict | None = None) -> None:
    out.mkdir(parents=True)
    rows = [HEADER]
    for i, (dt, loss, mem) in enumerate(zip(STEP_TIMES, LOSSES, RESERVED), 1):
        tps = TOKENS_PER_STEP / dt
        rows.append(f"{i},{loss},0.001,{tps},{dt},1.0,1.5,{mem},0,,{FLOPS_PER_TOKEN * tps / (WORLD * PEAK)}")
    (out / "training.csv").write_text("\n".join(rows) + "\n")
    if status is not None:
        (out / "status.json").write_text(json.dumps({"steps_planned": 6, "checkpoint_step": 6, "world_size": WORLD,
                                                     "parallel": "ddp", "updated": time.time(), "notes": [],
                                                     **status}))
    (out / "env.json").write_text(json.dumps({
        "world_size": WORLD, "flops_per_token": FLOPS_PER_TOKEN, "peak_flops": PEAK, "device_name": "H100",
        "config": {"train": {"seq_len": 100, "batch_size": 5, "accum": 2, "precision": "bf16"}}}))


def _collect(tmp_path: Path, lr_status: str = "ok", window: int = 4, warmup: int = 1):
    ctx = SimpleNamespace(run_dir=tmp_path, results={"environment": {}}, rel=lambda p: str(p))
    step = SimpleNamespace(launch=SimpleNamespace(window=window, warmup_steps=warmup))
    spec = SimpleNamespace(out_dir="s/out", window=None, world_size=WORLD, launcher="torchrun", nnodes=2,
                           step_dir=str(tmp_path / "s"))
    lr = SimpleNamespace(status=lr_status, reason="exit code 1" if lr_status != "ok" else None, nodes=[],
                         job_id=None, duration_s=60.0)
    return trainer.collect(ctx, step, spec, lr)


def test_the_window_figures_are_its_tokens_over_its_time(tmp_path):
    _write(tmp_path / "s" / "out", {"status": "completed", "reason": None, "step": 6})
    status, reason, m = _collect(tmp_path)
    assert (status, reason) == ("passed", None)
    # warm-up 1 then the last 4 rows: steps 3-6, 4 x 4,000 tokens in 4 + 16 + 4 + 8 = 32 s
    assert m["window"] == {"last": 4, "warmup": 1, "n": 4, "first_step": 3, "last_step": 6}
    assert m["toks_per_s"]["mean"] == pytest.approx(16_000 / 32)
    assert m["toks_per_s_per_gpu"] == pytest.approx(500 / 4) and m["toks_per_s_per_node"] == pytest.approx(500 / 2)
    assert m["tflops_per_s"] == pytest.approx(6e9 * 500 / 1e12)  # 3 TFLOP/s, all ranks
    assert m["mfu"]["mean"] == pytest.approx(6e9 * 500 / (4 * 1e14))  # 0.0075 of four devices' peak
    # the loss of the file's first and last rows; the peak of mem_reserved_gb over every row (step 3's)
    assert (m["first_loss"], m["final_loss"], m["loss_drop"]) == (5.0, 3.5, 1.5)
    assert m["mem_peak_gb"] == 3.25 and m["trainer_status"] == "completed"


def test_a_run_shorter_than_its_window_is_measured_short(tmp_path):
    _write(tmp_path / "s" / "out", {"status": "completed", "reason": None, "step": 6})
    status, reason, m = _collect(tmp_path, window=10, warmup=2)
    # steps 3-6 after the warm-up: the same 4 steps as above, 4 of the 10 asked
    assert status == "passed" and m["status"] == "short" and m["window"]["n"] == 4
    assert m["toks_per_s"]["mean"] == pytest.approx(500.0)


@pytest.mark.parametrize("ended, why", [
    ("halted", "halt requested: .HALT"),
    ("terminated", "SIGTERM received"),
    ("nonfinite", "non-finite loss on 1 of 4 rank(s) at step 6"),
    ("crashed", "start-up: RuntimeError: boom"),
])
def test_a_clean_exit_that_did_not_complete_fails_with_the_trainers_word(tmp_path, ended, why):
    _write(tmp_path / "s" / "out", {"status": ended, "reason": why, "step": 5})
    status, reason, m = _collect(tmp_path)
    assert (status, reason) == ("failed", f"trainer ended {ended}: {why}")
    assert m["trainer_status"] == ended


def test_a_completed_status_json_does_not_override_a_failed_exit(tmp_path):
    _write(tmp_path / "s" / "out", {"status": "completed", "reason": None, "step": 6})
    assert _collect(tmp_path, lr_status="failed")[:2] == ("failed", "exit code 1")


def _no_status(out: Path) -> None:
    (out / "status.json").unlink()


def _cut_status(out: Path) -> None:
    (out / "status.json").write_text('{"status": "compl')


def _earlier_status(out: Path) -> None:
    then = time.time() - 3600
    os.utime(out / "status.json", (then, then))


def _numeric_status(out: Path) -> None:
    (out / "status.json").write_text(json.dumps({"status": 3, "reason": None, "step": 6}))


@pytest.mark.parametrize("damage, says", [
    (_no_status, "wrote no status.json"),
    (_cut_status, "status.json cannot be read"),
    (_earlier_status, "an earlier launch's"),
    (_numeric_status, "status.json cannot be read"),
])
def test_a_clean_exit_without_a_status_of_its_own_says_so(tmp_path, damage, says):
    """training.csv and env.json are this launch's; status.json is not there, is cut short, or is an hour old."""
    out = tmp_path / "s" / "out"
    _write(out, {"status": "completed", "reason": None, "step": 6})
    damage(out)
    status, reason, m = _collect(tmp_path)
    assert status == "failed" and m["trainer_status"] is None
    assert says in reason and "status.json" in reason and "None" not in reason, reason
    decode(LaunchMetrics, m, "metrics")  # the step's record, as launch_one and run_all make it


def test_a_status_json_still_running_is_not_an_ending(tmp_path):
    _write(tmp_path / "s" / "out", {"status": "running", "reason": None, "step": 0})
    status, reason, _ = _collect(tmp_path)
    assert status == "failed" and "still says running" in reason and "None" not in reason, reason


def test_the_status_record_names_the_statuses_the_trainer_writes():
    named = set(re.findall(r'"([a-z-]+)"', TrainerStatus.__doc__ or ""))
    assert set(STATUSES) <= named
    assert "failed" not in named  # a launch's status, never the trainer's
