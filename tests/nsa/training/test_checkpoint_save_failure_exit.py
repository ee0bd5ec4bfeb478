"""nsa-train when a checkpoint cannot be written mid-run (a full disk: fsync of the checkpoint's file fails with
ENOSPC): the documented exit 1 ("crashed"), one line on stderr naming the checkpoint's path and the OS error, no
traceback there; status.json "crashed", summary.json, the heartbeat's last record "error" and error_rank0.txt with
the traceback (validation.launch.diagnosis reads it). In process, the tiny CPU config shortened to 2 sequences of 128
tokens, 2 steps, a save at every step."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from nsa.toggles import TOGGLES

TINY = Path(__file__).resolve().parents[3] / "configs" / "tiny_cpu.yaml"
ENOSPC_TEXT = os.strerror(errno.ENOSPC)  # "No space left on device"


@pytest.fixture
def full_disk(monkeypatch):
    """The run's environment (no override toggles, no TensorBoard) and a disk that fills up at the first checkpoint:
    fsync of its first file fails with ENOSPC; from then on (`state["full"]`) the files given to `state["refuse"]`
    fail too."""
    for name, toggle in TOGGLES.items():
        if toggle.affects_run:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    from nsa.training import checkpoint, outputs

    state = {"full": False, "refuse": set()}
    real_sync, real_write_json = checkpoint._sync, outputs.write_json

    def sync(path, *, directory=False):
        if not directory:
            state["full"] = True
            raise OSError(errno.ENOSPC, ENOSPC_TEXT, str(path))
        real_sync(path, directory=directory)

    def write_json(path, data, indent=2):
        if state["full"] and Path(path).name in state["refuse"]:
            raise OSError(errno.ENOSPC, ENOSPC_TEXT, str(path))
        return real_write_json(path, data, indent)

    monkeypatch.setattr(checkpoint, "_sync", sync)
    monkeypatch.setattr(outputs, "write_json", write_json)
    return state


def _train(out: Path) -> int:
    from nsa.training import cli

    return cli.main(["--config", str(TINY), "--out-dir", str(out), "--seq-len", "128", "--batch-size", "2",
                     "--steps", "2", "--save-every", "1"])


def _error_line(err: str, out: Path) -> str:
    """The one line nsa-train wrote to stderr: the checkpoint, its path and the OS error."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err  # was: a Python traceback
    assert "Traceback" not in err
    line = lines[0]
    tmp = out / "checkpoints" / "step_00000001.tmp"
    assert line.startswith("nsa-train: error: the checkpoint of step 1 is not saved: "), line
    assert f"{tmp}: cannot be written" in line and ENOSPC_TEXT in line, line
    return line


def _last_heartbeat(out: Path) -> dict:
    lines = (out / "heartbeat_rank0.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def test_a_checkpoint_that_cannot_be_written_ends_the_run_exit_1_with_one_line_and_every_record(
        tmp_path, full_disk, capsys):
    out = tmp_path / "out"
    assert _train(out) == 1  # was: the CheckpointError raised out of main (a traceback, exit 1 from Python)
    _error_line(capsys.readouterr().err, out)
    status = json.loads((out / "status.json").read_text())
    assert (status["status"], status["step"], status["checkpoint_step"]) == ("crashed", 1, None)
    assert status["reason"].startswith("CheckpointError: the checkpoint of step 1 is not saved: ")
    assert json.loads((out / "summary.json").read_text())["status"] == "crashed"
    last = _last_heartbeat(out)
    assert (last["msg"], last["step"]) == ("error", 1) and ENOSPC_TEXT in last["error"]
    error_file = (out / "error_rank0.txt").read_text()
    assert error_file.startswith("Traceback (most recent call last):") and "CheckpointError" in error_file
    assert not (out / "checkpoints").exists() or list((out / "checkpoints").iterdir()) == []  # no step_1.tmp left


def test_status_json_that_cannot_be_written_either_neither_hides_the_failure_nor_stops_the_other_records(
        tmp_path, full_disk, capsys):
    full_disk["refuse"].update({"status.json", "summary.json"})
    out = tmp_path / "out"
    assert _train(out) == 1  # was: the OSError of status.json raised out of main, over the CheckpointError
    captured = capsys.readouterr()
    _error_line(captured.err, out)
    assert f"status.json not written after the crash: OSError: [Errno {errno.ENOSPC}]" in captured.out
    assert json.loads((out / "status.json").read_text())["status"] == "running"  # the last one written
    last = _last_heartbeat(out)  # was: "step" (the "error" record and the error file were never written)
    assert (last["msg"], last["step"]) == ("error", 1)
    assert "CheckpointError" in (out / "error_rank0.txt").read_text()
