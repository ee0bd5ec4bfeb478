"""A KeyboardInterrupt in the training loop (a second Ctrl-C while a stop is already requested, or one raised before
the stop handlers catch the signal) ends the run as one at start-up does (nsa.training.outputs, status.json: a run
stopped by a signal is "terminated"): status.json and summary.json "terminated" at the last step recorded, the
heartbeat ends with "stop", no error_rank file (an interrupt is no failing rank), no checkpoint of the step it cut
short, and the interrupt propagates (the process ends by SIGINT, as at start-up). In process, the tiny CPU config;
the signals' default action is replaced by an exception for the test, so that a signal the trainer does not handle
fails the test instead of ending it."""

from __future__ import annotations

import json
import os
import signal

import pytest

from train_utils import heartbeats, in_step, read_csv, train_here

from nsa.training import outputs, trainer



def _interrupt():
    raise KeyboardInterrupt


def _second_ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)  # a stop requested
    os.kill(os.getpid(), signal.SIGINT)  # and insisted on: KeyboardInterrupt



@pytest.mark.parametrize("act", [_interrupt, _second_ctrl_c], ids=["KeyboardInterrupt", "second_ctrl_c"])
def test_a_keyboard_interrupt_in_the_loop_is_recorded_as_terminated_not_crashed(tmp_path, monkeypatch, ending, act):
    in_step(monkeypatch, 4, act)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train_here(out, "--steps", "6", "--save-every", "2")
    status = json.loads((out / outputs.STATUS_JSON).read_text())
    # steps 1-3 trained and recorded, step 4 cut short; the checkpoint of step 2 is where --resume continues
    assert (status["status"], status["step"], status["checkpoint_step"]) == ("terminated", 3, 2)
    assert "KeyboardInterrupt" in status["reason"] and "during step 4" in status["reason"]
    assert "phase" not in status  # in the loop, not at start-up
    summary = outputs.read_summary(out)
    assert (summary["status"], summary["steps"], summary["first_step"], summary["last_step"]) == \
        ("terminated", 3, 1, 3)
    beats = heartbeats(out, 0)
    assert [b["msg"] for b in beats if b["msg"] != "step"] == ["boot", *["starting"] * 6, "saving", "checkpoint",
                                                                      "stop"]
    assert (beats[-1]["step"], beats[-1]["reason"]) == (3, status["reason"])
    assert [int(r["step"]) for r in read_csv(out / outputs.TRAINING_CSV)] == [1, 2, 3]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]
    assert not list(out.glob("error_rank*.txt"))  # an interrupt, not an error: the diagnosis has no failing rank
    assert signal.getsignal(signal.SIGINT) is ending  # the handlers the process had before, restored


def test_a_keyboard_interrupt_while_the_stop_saves_its_checkpoint_keeps_the_last_complete_one(tmp_path, monkeypatch,
                                                                                                ending):
    """The first Ctrl-C asks for a stop at the end of step 2; the second comes while that stop saves step 2's
    checkpoint: step 2 was recorded, its checkpoint never completed, and the run is "terminated" at step 2 with
    no checkpoint to continue from."""
    in_step(monkeypatch, 2, lambda: os.kill(os.getpid(), signal.SIGINT))
    save = trainer.checkpoint.save

    def saving(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while the checkpoint is written
        return save(*args, **kwargs)

    monkeypatch.setattr(trainer.checkpoint, "save", saving)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train_here(out, "--steps", "6")
    status = json.loads((out / outputs.STATUS_JSON).read_text())
    assert (status["status"], status["step"], status["checkpoint_step"]) == ("terminated", 2, None)
    assert "after step 2" in status["reason"] and "--resume starts again at step 0" in status["reason"]
    assert outputs.read_summary(out)["status"] == "terminated"
    # the stop asked for (not an end while its checkpoint is written), then the interrupt's end
    assert [b["msg"] for b in heartbeats(out, 0)][-3:] == ["stopping", "saving", "stop"]
    assert not list(out.glob("error_rank*.txt"))
    assert signal.getsignal(signal.SIGINT) is ending
