"""A signal while the trainer writes a run's last records, once its loop has ended (its files closed, status.json,
summary.json and timeline.json, the heartbeat's last line): it is held, not acted on, so that the records end
complete and consistent, and the run ends as its loop decided (README, Safety: a run stopped by SIGTERM or Ctrl-C
is "terminated", exit 0, with its checkpoint). A second Ctrl-C there (the first having asked for the stop) does
not cut those writes short, leaving status.json "running", no summary or no last heartbeat line. In
process, the tiny CPU config; the signals' default action is replaced by an exception for the test, so that a
signal the trainer does not handle fails the test instead of ending it."""

from __future__ import annotations

import json
import os
import signal

import pytest

from train_utils import heartbeats, in_step, read_csv, train_here

from nsa.training import outputs, trainer


class HungUp(Exception):
    """What SIGHUP's default action would have done: end the process."""


@pytest.fixture
def hangup():
    """SIGHUP raises HungUp while the test runs (its handler restored after it)."""
    def end(signum, frame):
        raise HungUp(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGHUP, end)
    yield end
    signal.signal(signal.SIGHUP, previous)


def _ctrl_c_twice():
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)


def _during(monkeypatch, place: str, act):
    """`act()` at one of the final writes, once the loop has ended: as the run's files are closed, as status.json
    gets the run's end, as summary.json is written, or as the heartbeat's last line is being made."""
    if place == "close":
        target, name = trainer.Trainer, "_close"
    elif place == "status":
        target, name = trainer.Trainer, "_status"
    elif place == "summary":
        target, name = trainer.Trainer, "_finish_files"
    else:
        target, name = trainer.checkpoint, "param_digest"
    original = getattr(target, name)

    def acting(*args, **kwargs):
        if place != "status" or args[1] != "running":  # status.json's start-up "running" is no final write
            act()
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, acting)


def _train(out, *flags) -> int:
    try:
        return train_here(out, *flags)
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C during the run's final writes cut them short (KeyboardInterrupt out of the run)")


@pytest.mark.parametrize("place", ["close", "status", "summary", "heartbeat"])
def test_a_second_ctrl_c_during_the_final_writes_of_a_stopped_run_leaves_complete_records(tmp_path, monkeypatch,
                                                                                         ending, place):
    """The first Ctrl-C stops the run after step 2 with its checkpoint; the second comes while the run's last
    records are written: the run still ends "terminated" at step 2 with exit 0, every record says so."""
    in_step(monkeypatch, 2, lambda: os.kill(os.getpid(), signal.SIGINT))
    _during(monkeypatch, place, lambda: os.kill(os.getpid(), signal.SIGINT))
    out = tmp_path / "out"
    assert _train(out, "--steps", "6") == trainer.EXIT_OK
    status = json.loads((out / outputs.STATUS_JSON).read_text())
    assert (status["status"], status["reason"], status["step"], status["checkpoint_step"]) == \
        ("terminated", "SIGINT received", 2, 2)
    summary = outputs.read_summary(out)
    assert (summary["status"], summary["steps"], summary["last_step"]) == ("terminated", 2, 2)
    assert outputs.read_timeline(out)["missing_milestones"] == []
    beats = heartbeats(out, 0)
    assert [b["msg"] for b in beats] == ["boot", *["starting"] * 6, "step", "step", "stopping", "saving", "checkpoint",
                                          "stop"]
    assert (beats[-1]["step"], beats[-1]["status"]) == (2, "terminated") and beats[-1]["params_sha256"]
    assert [int(r["step"]) for r in read_csv(out / outputs.TRAINING_CSV)] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]
    assert not list(out.glob("error_rank*.txt"))
    assert signal.getsignal(signal.SIGINT) is ending  # the handlers the process had before, restored


def test_signals_during_the_final_writes_of_a_completed_run_are_held(tmp_path, monkeypatch, ending, hangup):
    """Ctrl-C twice, SIGTERM and SIGHUP as status.json gets the run's end: the run completed all its steps, and
    its records and exit code say so."""
    def signals():
        _ctrl_c_twice()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)

    _during(monkeypatch, "status", signals)
    out = tmp_path / "out"
    assert _train(out, "--steps", "3") == trainer.EXIT_OK
    status = json.loads((out / outputs.STATUS_JSON).read_text())
    assert (status["status"], status["reason"], status["step"], status["checkpoint_step"]) == \
        ("completed", None, 3, 3)
    summary = outputs.read_summary(out)
    assert (summary["status"], summary["steps"]) == ("completed", 3)
    beats = heartbeats(out, 0)
    assert [b["msg"] for b in beats] == ["boot", *["starting"] * 6, "step", "step", "step", "saving", "checkpoint",
                                          "done"]
    assert beats[-1]["status"] == "completed"
    assert not list(out.glob("error_rank*.txt"))
    assert signal.getsignal(signal.SIGINT) is ending
    assert signal.getsignal(signal.SIGHUP) is hangup


def test_a_second_ctrl_c_during_the_final_checkpoint_after_the_loop_keeps_the_last_complete_one(tmp_path,
                                                                                             monkeypatch, ending):
    """The final checkpoint after the loop (the last step was not a save step) is the loop's last act, as the stop's
    checkpoint in it: a second Ctrl-C while it is written ends the run at once (README, Safety), recorded as
    "terminated" with the latest complete checkpoint, the half-written one never taken for complete."""
    save, torch_save = trainer.checkpoint.save, trainer.checkpoint.torch.save
    writing = []

    def saving(out_dir, step, *args, **kwargs):
        writing[:] = [step]
        return save(out_dir, step, *args, **kwargs)

    def file_saving(*args, **kwargs):
        torch_save(*args, **kwargs)
        if writing == [3]:  # the last step, not a save step: saved after the loop; its first file is written
            _ctrl_c_twice()

    monkeypatch.setattr(trainer.checkpoint, "save", saving)
    monkeypatch.setattr(trainer.checkpoint.torch, "save", file_saving)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train_here(out, "--steps", "3", "--save-every", "2")
    status = json.loads((out / outputs.STATUS_JSON).read_text())
    assert (status["status"], status["step"], status["checkpoint_step"]) == ("terminated", 3, 2)
    assert "after step 3" in status["reason"]
    assert outputs.read_summary(out)["status"] == "terminated"
    assert heartbeats(out, 0)[-1]["msg"] == "stop"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002", "step_00000003.tmp"]
    assert not list(out.glob("error_rank*.txt"))
    assert signal.getsignal(signal.SIGINT) is ending
