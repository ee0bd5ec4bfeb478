"""One Slurm command's output (validation.launch.slurm._run): read when the command ends, whatever it leaves
running, and read whatever its bytes (fake commands on PATH; no Slurm needed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from validation.launch import slurm


def _command(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 4.0)
    return tmp_path / "bin"


def test_a_command_that_leaves_a_process_holding_its_output_answers_when_it_ends(fake_bin, tmp_path):
    """An sbatch wrapper that starts a helper (which inherits its stdout and stderr) and prints the job id: the call
    returns the id when the wrapper exits, not when the helper closes the output (with pipes it waited for the
    helper, then said 'no answer within 4s' and the queued job's id was lost)."""
    _command(fake_bin, "sbatch", f"sleep 6 &\necho $! > {tmp_path}/helper\necho 4242\n")
    start = time.monotonic()
    try:
        assert slurm._run(["sbatch", "job.sh"]).strip() == "4242"
        assert time.monotonic() - start < 3.0  # the helper sleeps 6 s, the timeout is 4 s: neither was waited for
    finally:
        helper = (tmp_path / "helper").read_text().strip()
        if helper.isdigit():
            try:
                os.kill(int(helper), 9)
            except ProcessLookupError:
                pass


def test_output_that_is_not_utf8_is_read_with_replacement_characters(fake_bin):
    """squeue listing another job whose script path is Latin-1 bytes: the call reads it (a raw UnicodeDecodeError
    escaped every caller's `except SlurmError` before), and this user's own job is still found."""
    _command(fake_bin, "squeue", "printf '7|RUNNING|/home/u/caf\\351/job.sh\\n8|PENDING|/tmp/mine.sh\\n'\n")
    out = slurm._run(["squeue", "-h"])
    assert out.splitlines()[0] == "7|RUNNING|/home/u/caf\ufffd/job.sh"
    assert out.splitlines()[1] == "8|PENDING|/tmp/mine.sh"


def test_a_failing_command_names_its_last_line_of_error(fake_bin):
    _command(fake_bin, "scancel", "echo 'scancel: error: \xff bad job' >&2\nexit 1\n")
    with pytest.raises(slurm.SlurmError, match=r"scancel 12: exit 1: scancel: error: .* bad job"):
        slurm._run(["scancel", "12"])
