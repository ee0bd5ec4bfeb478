"""collect() of one trainer launch against hand-computed figures from files written here: the window's tokens/s
from training.csv, imports/init/first step from timeline.json, how the trainer ended from status.json; and files an
earlier launch left in the same out_dir (a --rerun whose trainer died before it wrote its own) read as absent, never
as this launch's figures."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.kinds import trainer

CSV = ("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
       "1,5.0,0.001,100,0.40,1.0,1.0,2.0\n"
       "2,4.5,0.001,200,0.20,1.0,1.0,2.0\n"
       "3,4.0,0.001,300,0.10,1.0,1.0,2.5\n"
       "4,3.5,0.001,400,0.10,1.0,1.0,2.0\n")
TIMELINE = {"schema": 1, "process_start_source": "/proc/self/stat", "process_start_unix": 1000.0, "world_size": 1,
            "milestones": {"process_start": 0.0, "imports_done": 6.0, "setup_done": 6.5, "first_logged_step": 8.0},
            "ranks": None, "slowest": None, "time_to_first_step_s": 8.0}


def _write(out: Path, age_s: float = 0.0) -> None:
    out.mkdir(parents=True)
    (out / "training.csv").write_text(CSV)
    (out / "timeline.json").write_text(json.dumps(TIMELINE))
    (out / "status.json").write_text(json.dumps({"status": "completed", "step": 4}))
    (out / "summary.json").write_text(json.dumps({"schema": 1, "status": "completed", "steps": 4}))
    (out / "env.json").write_text(json.dumps({"world_size": 1, "device_name": "cpu"}))
    if age_s:
        then = time.time() - age_s
        for path in out.iterdir():
            os.utime(path, (then, then))


def _collect(tmp_path, lr):
    ctx = SimpleNamespace(run_dir=tmp_path, results={"environment": {}}, rel=lambda p: str(p))
    step = SimpleNamespace(launch=SimpleNamespace(window=3, warmup_steps=0))
    spec = SimpleNamespace(out_dir="s/out", window=None, world_size=1, launcher="local", nnodes=1,
                           step_dir=str(tmp_path / "s"))
    return trainer.collect(ctx, step, spec, lr)


def test_a_launch_reads_its_own_files_by_hand(tmp_path):
    _write(tmp_path / "s" / "out")
    lr = SimpleNamespace(status="ok", reason=None, nodes=[], job_id=None, duration_s=30.0)
    status, reason, m = _collect(tmp_path, lr)
    assert (status, reason) == ("passed", None)
    # the last 3 rows: 200, 300, 400 tokens/s, the same tokens a step: 3 steps in 1/200 + 1/300 + 1/400 of a
    # token's time each, 3,600 / 13 = 276.9 tokens/s over the window's time
    assert m["toks_per_s"]["mean"] == pytest.approx(3600 / 13) and m["toks_per_s"]["n"] == 3
    assert m["window"]["first_step"] == 2 and m["window"]["last_step"] == 4
    assert m["mem_peak_gb"] == 2.5 and m["loss_drop"] == pytest.approx(1.5)
    st = m["startup"]
    # imports: process start -> imports_done; init: imports_done -> setup_done; first step: setup_done -> logged
    assert (st["imports_s"], st["init_s"], st["first_step_s"]) == (6.0, 0.5, 1.5)
    assert m["time_to_first_step_s"] == 8.0 and m["trainer_status"] == "completed"


@pytest.mark.parametrize("lr_status", ["failed", "timeout"])
def test_an_earlier_launchs_files_are_not_this_launchs_figures(tmp_path, lr_status):
    """The same files, last written an hour before this 30 s launch started (its trainer died before writing any):
    no tokens/s, no start-up, no summary, no trainer status of its own; the launch's own failure is what it says."""
    _write(tmp_path / "s" / "out", age_s=3600.0)
    lr = SimpleNamespace(status=lr_status, reason="exited 1 before its first step", nodes=[], job_id=None,
                         duration_s=30.0)
    status, reason, m = _collect(tmp_path, lr)
    assert (status, reason) == (lr_status, "exited 1 before its first step")
    assert m["status"] == "missing" and "earlier launch" in m["reason"]
    assert m.get("toks_per_s") is None and m["mem_peak_gb"] is None and m["final_loss"] is None
    assert m["startup"] == {} and m["time_to_first_step_s"] is None
    assert m["summary"] == {} and m["trainer_status"] is None and m["context"] == {}


def test_an_earlier_training_csv_fails_a_launch_that_exited_cleanly(tmp_path):
    """A launch that exited 0 with only an earlier launch's training.csv beside it did not train: it fails."""
    _write(tmp_path / "s" / "out", age_s=3600.0)
    lr = SimpleNamespace(status="ok", reason=None, nodes=[], job_id=None, duration_s=5.0)
    status, reason, m = _collect(tmp_path, lr)
    assert status == "failed" and m.get("toks_per_s") is None
