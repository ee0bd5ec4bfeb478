"""`nsa-validate` whose stdout cannot be written (`nsa-validate report RUN > report.html` on a full disk or over a
quota, an I/O error): one line on stderr naming the stream and the OS error, exit 2, never a traceback, and never
the exit code of a finding (`compare` exits 1 only for a regression: a CI gate must not read a lost output as one,
nor as 0). The run directory is left as it was.

Each command runs as a user's would (`python -m validation.cli`), its stdout /dev/full: every write to it fails
with ENOSPC."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests/validation/fixtures/results_example.json"
LOST = "nsa-validate: error: cannot write standard output: No space left on device [ENOSPC]"

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) to fill a disk")


def full_disk_cli(*args) -> subprocess.CompletedProcess:
    """`python -m validation.cli ARGS` with stdout /dev/full; stderr captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["COLUMNS"] = "200"
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "validation.cli", *map(str, args)], cwd=REPO, env=env,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)


def run_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    shutil.copy(EXAMPLE, path / "results.json")
    return path


def test_report_to_a_full_disk_is_one_line_and_exit_2(tmp_path):
    run = run_dir(tmp_path, "run ü")
    before = sorted(p.name for p in run.iterdir()), (run / "results.json").read_bytes()
    proc = full_disk_cli("report", run, "--format", "json")
    assert proc.stderr.splitlines() == [LOST], proc.stderr[-3000:]
    assert proc.returncode == 2
    assert (sorted(p.name for p in run.iterdir()), (run / "results.json").read_bytes()) == before


def test_compare_to_a_full_disk_exits_2_not_its_gate(tmp_path):
    run = run_dir(tmp_path, "a")
    proc = full_disk_cli("compare", run, run)
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1] == LOST and all(line.startswith("warning: ") for line in lines[:-1]), lines
    assert proc.returncode == 2


def test_a_table_to_a_full_disk_is_one_line_and_exit_2():
    proc = full_disk_cli("kinds")  # a table, printed by rich (report and compare print through typer.echo)
    assert proc.stderr.splitlines() == [LOST], proc.stderr[-3000:]
    assert proc.returncode == 2
