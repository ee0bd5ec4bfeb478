"""What a run that fails at start-up leaves in its out_dir: status.json says "crashed" ("phase": "start-up"), and
summary.json and timeline.json agree with it (nsa.training.outputs: rank 0 writes summary.json at the end of every
run, crashed included): this run's, with no step and the milestones it reached, never an earlier run's left for
--resume; and the validation suite's collect reads them as this launch's crash. In process, the tiny CPU config."""

from __future__ import annotations

import json
import os
import shutil
import time
from types import SimpleNamespace

import pytest

from train_utils import train_here

from nsa.training import outputs
from validation.kinds import trainer as trainer_kind
from validation.results.codec import decode
from validation.results.trainer_launch import TrainerStatus

CKPT = "checkpoints/step_00000002"



@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A completed 2-step run with its checkpoint at step 2 (copied by each test)."""
    out = tmp_path_factory.mktemp("base") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSA_TB_DISABLE", "1")
        assert train_here(out, "--steps", "2", "--save-every", "2") == 0
    summary, tl = outputs.read_summary(out), outputs.read_timeline(out)
    assert (summary["status"], summary["steps"], summary["steps_planned"]) == ("completed", 2, 2)
    assert tl["time_to_first_step_s"] is not None and tl["missing_milestones"] == []
    return out


@pytest.fixture
def damaged_copy(two_steps, tmp_path, monkeypatch):
    """The 2-step run under tmp_path/s/out (a validation step's out_dir), its only checkpoint cut short."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    out = tmp_path / "s" / "out"
    shutil.copytree(two_steps, out)
    model = out / CKPT / "model_optim.pt"
    model.write_bytes(model.read_bytes()[:1000])
    return out


def _assert_startup_crash(out, steps_planned):
    """status.json, summary.json and timeline.json of one run that failed at start-up, all of it."""
    status = json.loads((out / outputs.STATUS_JSON).read_text())
    assert status["status"] == "crashed" and status["phase"] == "start-up"
    summary = outputs.read_summary(out)  # the contract's reader: the file follows it
    assert (summary["status"], summary["steps"], summary["steps_planned"]) == ("crashed", 0, steps_planned)
    assert summary["first_step"] is None and summary["last_step"] is None
    assert summary["avg_step_time_s"] is None and summary["tokens_per_s"] is None and summary["final_loss"] is None
    # the single process's 1 x 2 sequences x 128 tokens
    assert (summary["tokens_per_step"], summary["samples_per_step"]) == (256, 2)
    tl = outputs.read_timeline(out)
    # the milestones it reached (the model is built before the checkpoint or the loss is looked at), none after
    assert "model_built" in tl["milestones"] and tl["time_to_first_step_s"] is None and tl["ranks"] is None
    assert {"setup_done", "first_forward", "first_logged_step"} <= set(tl["missing_milestones"])
    return status, summary, tl


def test_a_resume_that_fails_at_start_up_replaces_the_earlier_runs_summary_and_timeline(damaged_copy):
    assert train_here(damaged_copy, "--steps", "5", "--resume") == 2
    status, _, _ = _assert_startup_crash(damaged_copy, steps_planned=5)
    assert status["reason"].startswith("start-up: CheckpointError")
    # what the resume continues from is left as it was: the earlier run's two rows
    assert (damaged_copy / outputs.TRAINING_CSV).read_text().count("\n") == 3


def test_a_fresh_run_that_fails_at_start_up_writes_its_own_summary_and_timeline(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    monkeypatch.setenv("NSA_LOSS", "fused")  # the fused loss needs a GPU (or Triton's interpreter): refused here
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "out"
    assert train_here(out, "--steps", "3") == 2
    status, _, _ = _assert_startup_crash(out, steps_planned=3)
    assert "fused loss" in status["reason"]
    assert not (out / outputs.TRAINING_CSV).exists()


@pytest.mark.parametrize("earlier_age_s", [0, 3600], ids=["earlier_launch_just_ended", "earlier_launch_an_hour_ago"])
def test_validation_collects_a_failed_resume_as_this_launchs_crash(damaged_copy, earlier_age_s):
    """The validation suite reads a launch's own files only (validation.kinds.trainer.earlier_files: by their
    time against the launch's start): the failed resume's summary and timeline are this launch's, whether the
    earlier launch ended a moment or an hour before it."""
    if earlier_age_s:
        for path in damaged_copy.iterdir():
            then = path.stat().st_mtime - earlier_age_s
            os.utime(path, (then, then))
    started = time.time()
    assert train_here(damaged_copy, "--steps", "5", "--resume") == 2
    duration = time.time() - started
    ctx = SimpleNamespace(run_dir=damaged_copy.parents[1], results={"environment": {}}, rel=str)
    step = SimpleNamespace(launch=SimpleNamespace(window=10, warmup_steps=0))
    spec = SimpleNamespace(out_dir="s/out", window=None, world_size=1, launcher="local", nnodes=1,
                           step_dir=str(damaged_copy.parent))
    lr = SimpleNamespace(status="failed", reason="exit code 2", nodes=[], job_id=None, duration_s=duration)
    status, reason, m = trainer_kind.collect(ctx, step, spec, lr)
    assert (status, reason, m["trainer_status"]) == ("failed", "exit code 2", "crashed")
    # not the earlier run's "completed" with its 2 steps
    assert (m["summary"].get("status"), m["summary"].get("steps")) == ("crashed", 0)
    assert m["startup"]["time_to_first_step_s"] is None and m["time_to_first_step_s"] is None
    assert "setup_done" in m["startup"]["missing"] and "model_built" in m["startup"]["milestones"]
    # the launch's status.json says the same: how it ended, as the trainer put it
    written = decode(TrainerStatus, json.loads((damaged_copy / outputs.STATUS_JSON).read_text()), lenient=True)
    reason = trainer_kind.not_completed(damaged_copy, set(), written)
    assert reason.startswith("trainer ended crashed: start-up: CheckpointError")
