"""A report file that cannot be written: `nsa-validate report RUN_DIR --write` ends with exit 2 and one line naming
that file (not the temp file beside it, gone again, nor only the run directory) and the OS error; every report is
whole, the ones before it new, the ones after it as they were, and no temp file is left behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from results_records import run_record
from typer.testing import CliRunner

import nsa.training.outputs
from validation.cli import app
from validation.report import render
from validation.results.store import RunDirError, read_results, write_results
from validation.run import replace_earlier_reports


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_results(run_dir, run_record({"steps": {"train": {}}}))
    (run_dir / "report.md").write_text("old md\n")
    (run_dir / "junit.xml").write_text("old junit\n")
    return run_dir


def _temp_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.rglob("*.tmp"))


def test_a_report_path_taken_by_a_directory_is_named(tmp_path):
    run_dir = _run_dir(tmp_path)
    (run_dir / "report.html").mkdir()
    results = read_results(run_dir)
    with pytest.raises(RunDirError) as caught:
        replace_earlier_reports(run_dir, results)
    assert str(caught.value) == f"cannot write {run_dir / 'report.html'}: Is a directory [EISDIR]"
    assert (run_dir / "report.md").read_text() == render(results, "md", run_dir=run_dir)  # replaced whole
    assert (run_dir / "junit.xml").read_text() == "old junit\n"  # not reached: as it was
    assert _temp_files(run_dir) == []


def test_disk_full_writing_a_report_names_that_report(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path)
    real_fsync = os.fsync

    def fsync(fd):
        if ".junit.xml." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(nsa.training.outputs.os, "fsync", fsync)
    result = CliRunner().invoke(app, ["report", str(run_dir), "--write"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert lines == [f"nsa-validate: error: cannot write {run_dir / 'junit.xml'}: No space left on device [ENOSPC]"]
    assert (run_dir / "junit.xml").read_text() == "old junit\n"
    assert (run_dir / "report.md").read_text() == render(read_results(run_dir), "md", run_dir=run_dir)
    assert _temp_files(run_dir) == []
