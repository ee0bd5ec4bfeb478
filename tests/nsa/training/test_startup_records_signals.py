"""A SIGTERM or Ctrl-C while the trainer starts up (after its boot heartbeat, before the loop: model, wrapping,
optimizer, data, resume) is a stop like one in the loop (README, Safety: the current step finishes, a checkpoint is
saved, exit 0, status "terminated"), not the end of the rank with nothing recorded; and a KeyboardInterrupt there (a
second Ctrl-C) is recorded as "terminated" at start-up, not as a crash. In process, the tiny CPU config; the
signals' default action (ending the process) is replaced by an exception for the test, so that a signal the
trainer does not handle fails the test instead of ending it."""

from __future__ import annotations

import json
import os
import signal

import pytest

from train_utils import heartbeats, train_here

from nsa.training import outputs, trainer



def _during_setup(monkeypatch, act):
    """`act()` in the middle of the trainer's start-up: as it builds its data source (the model and optimizer
    built, the resume and the run's files still to come)."""
    build = trainer.build_source

    def building(*args, **kwargs):
        act()
        return build(*args, **kwargs)

    monkeypatch.setattr(trainer, "build_source", building)



def _files(out):
    status = json.loads((out / outputs.STATUS_JSON).read_text())
    return status, outputs.read_summary(out), heartbeats(out, 0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_during_start_up_stops_the_run_at_its_first_step_with_a_checkpoint(tmp_path, monkeypatch, ending,
                                                                                    signum):
    _during_setup(monkeypatch, lambda: os.kill(os.getpid(), signum))
    out = tmp_path / "out"
    assert train_here(out, "--steps", "5") == trainer.EXIT_OK
    status, summary, beats = _files(out)
    name = signal.Signals(signum).name
    assert (status["status"], status["reason"], status["step"], status["checkpoint_step"]) == \
        ("terminated", f"{name} received", 1, 1)
    assert (summary["status"], summary["steps"], summary["last_step"]) == ("terminated", 1, 1)
    assert (out / "checkpoints" / "step_00000001").is_dir()
    assert [b["msg"] for b in beats] == ["boot", *["starting"] * 6, "step", "stopping", "saving", "checkpoint", "stop"]
    assert (out / outputs.TRAINING_CSV).read_text().count("\n") == 2  # the header and step 1
    assert not list(out.glob("error_rank*.txt"))
    assert signal.getsignal(signum) is ending  # the handlers the process had before, restored


def _interrupt():
    raise KeyboardInterrupt


def _second_ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)  # a stop requested
    os.kill(os.getpid(), signal.SIGINT)  # and insisted on: KeyboardInterrupt


@pytest.mark.parametrize("act", [_interrupt, _second_ctrl_c], ids=["KeyboardInterrupt", "second_ctrl_c"])
def test_a_keyboard_interrupt_during_start_up_is_recorded_as_terminated_not_crashed(tmp_path, monkeypatch, ending,
                                                                                   act):
    _during_setup(monkeypatch, act)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train_here(out, "--steps", "5")
    status, summary, beats = _files(out)
    assert (status["status"], status["phase"], status["step"]) == ("terminated", "start-up", 0)
    assert "KeyboardInterrupt" in status["reason"]
    assert (summary["status"], summary["steps"], summary["first_step"]) == ("terminated", 0, None)
    assert [b["msg"] for b in beats] == ["boot", *["starting"] * 4, "stop"] and beats[-1]["phase"] == "start-up"
    assert not list(out.glob("error_rank*.txt"))  # an interrupt, not an error: the diagnosis has no failing rank
    assert signal.getsignal(signal.SIGINT) is ending
