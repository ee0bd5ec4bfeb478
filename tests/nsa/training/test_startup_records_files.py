"""What a launch that fails at start-up leaves for its readers: the failing rank's error_rank{r}.txt (its traceback,
as a failure in the loop leaves one), from which the validation suite's diagnosis names the rank and the error; and,
for a --resume, the run's config.yaml and env.json as they were (those of the run whose checkpoint and rows are
there, which the next --resume compares its config with), not the failed launch's. In process, the tiny CPU
config."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import yaml

from train_utils import heartbeats, train_here

from nsa.training import outputs
from validation.contracts import error_files
from validation.launch.diagnosis import failure_excerpt

CKPT = "checkpoints/step_00000002"



@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A completed 2-step run with its checkpoint at step 2, the tiny config's lr (3e-3) (copied by each test)."""
    out = tmp_path_factory.mktemp("base") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSA_TB_DISABLE", "1")
        assert train_here(out, "--steps", "2", "--save-every", "2") == 0
    assert not list(out.glob("error_rank*.txt"))
    return out


@pytest.fixture
def earlier(two_steps, tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    out = tmp_path / "out"
    shutil.copytree(two_steps, out)
    return out


def _error_line(out, since):
    """(rank, exception line) of the failure as the validation suite's diagnosis reads it from the error files
    alone (no log)."""
    found = error_files(out, since)
    assert len(found) == 1, found
    excerpt = failure_excerpt(out / "no-such.log", {}, out, since)
    assert excerpt is not None and excerpt.startswith("Traceback (most recent call last):"), excerpt
    return found[0][1], excerpt.splitlines()[-1]


def _status(out):
    return json.loads((out / outputs.STATUS_JSON).read_text())


def test_a_fresh_run_that_fails_at_start_up_names_its_rank_and_error_in_an_error_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    monkeypatch.setenv("NSA_LOSS", "fused")  # the fused loss needs a GPU (or Triton's interpreter): refused here
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "out"
    since = time.time()
    assert train_here(out, "--steps", "3") == 2
    status = _status(out)
    assert (status["status"], status["phase"]) == ("crashed", "start-up")
    rank, line = _error_line(out, since)
    # the error file's exception is the one status.json names ("start-up: <Type>: <message>")
    kind, message = status["reason"].removeprefix("start-up: ").split(": ", 1)
    assert rank == 0 and line.split(": ", 1)[0].endswith(kind) and line.endswith(message), (line, status["reason"])
    assert "fused loss" in line
    assert heartbeats(out, 0)[-1]["msg"] == "error"


def test_a_resume_from_a_damaged_checkpoint_names_its_rank_and_error_in_an_error_file(earlier):
    model = earlier / CKPT / "model_optim.pt"
    model.write_bytes(model.read_bytes()[:1000])
    since = time.time()
    assert train_here(earlier, "--steps", "5", "--resume") == 2
    rank, line = _error_line(earlier, since)
    assert rank == 0 and line.startswith("nsa.training.checkpoint.CheckpointError: "), line
    assert _status(earlier)["reason"] == "start-up: " + line.removeprefix("nsa.training.checkpoint.")


def test_a_resume_that_fails_at_start_up_leaves_the_runs_config_and_env_as_they_were(earlier):
    """The resume changes the learning rate (3e-3 -> 2e-3) and fails at start-up: its val.csv cannot be read (a
    directory in its place). config.yaml and env.json stay the earlier run's, byte for byte, so the resume after
    it (the file repaired, the same new learning rate) still names the change from the run it continues."""
    config_before = (earlier / outputs.CONFIG_YAML).read_bytes()
    env_before = (earlier / outputs.ENV_JSON).read_bytes()
    assert yaml.safe_load(config_before)["train"]["lr"] == 0.003
    (earlier / outputs.VAL_CSV).mkdir()
    with pytest.raises(IsADirectoryError):
        train_here(earlier, "--steps", "4", "--resume", "--lr", "0.002")
    assert (_status(earlier)["status"], _status(earlier)["phase"]) == ("crashed", "start-up")
    assert (earlier / outputs.CONFIG_YAML).read_bytes() == config_before
    assert (earlier / outputs.ENV_JSON).read_bytes() == env_before

    (earlier / outputs.VAL_CSV).rmdir()
    assert train_here(earlier, "--steps", "3", "--resume", "--lr", "0.002") == 0
    status = _status(earlier)
    assert (status["status"], status["step"]) == ("completed", 3)
    assert any("train.lr 0.003 -> 0.002" in note for note in status["notes"]), status["notes"]
    assert yaml.safe_load((earlier / outputs.CONFIG_YAML).read_text())["train"]["lr"] == 0.002
    env = json.loads((earlier / outputs.ENV_JSON).read_text())
    assert env["resumed_from_step"] == 2 and env["config"]["train"]["lr"] == 0.002
