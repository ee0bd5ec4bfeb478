"""A run directory that cannot be written (disk full, permission denied, not a directory): results.json is only
ever replaced whole (temp file, fsync, rename; the temp file removed on failure), and `nsa-validate run` ends with
exit 2 and one line naming the path and the OS error, no traceback, the previous results.json intact and readable.

Disk full is simulated by making fsync of the temp file fail with ENOSPC (in-process); the other errors are real.
Tests run as root in CI, where a chmod does not stop writes, so the permission case also uses paths a root process
cannot write through (a regular file where a directory must be) and the chmod variant runs only as another user.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from results_records import run_record
from typer.testing import CliRunner

import nsa.training.outputs
from nsa.training.outputs import atomic_write_text
from validation.cli import app
from validation.results.store import RESULTS_JSON, RunDirError, read_results, write_results

REPO = Path(__file__).resolve().parents[2]
ENOSPC_TEXT = "No space left on device [ENOSPC]"
pytestmark = pytest.mark.reliability


def runbook(tmp_path: Path, marks: Path) -> Path:
    """Two tiny bench steps; each leaves a file in `marks` when it runs."""
    marks.mkdir(exist_ok=True)

    def step(name):
        code = (f"import json, pathlib, sys; pathlib.Path({str(marks / name)!r}).touch(); "
                "open(sys.argv[2], 'w').write(json.dumps({'x': 1}))")
        return f"      - {{name: {name}, kind: bench, command: [-c, {json.dumps(code)}]}}\n"

    path = tmp_path / "rb.yaml"
    path.write_text("name: disk\nphases:\n  - name: p\n    steps:\n" + step("one") + step("two"))
    return path


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert "Traceback" not in text, text
    errors = [line for line in lines if line.startswith("nsa-validate: error:")]
    assert len(errors) == 1, text
    return errors[0]


def no_space(monkeypatch, when=lambda path: True):
    """fsync of a temp file for results.json fails with ENOSPC while when(temp path) holds."""
    real_fsync = os.fsync

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if f".{RESULTS_JSON}." in target and when(Path(target)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(nsa.training.outputs.os, "fsync", fsync)


# ---------------------------------------------------------------------- the atomic writer
def test_disk_full_leaves_the_previous_results_and_no_temp_file(tmp_path, monkeypatch, reliability):
    write_results(tmp_path, run_record({"verdict": "GO", "n": 1}))
    before = (tmp_path / RESULTS_JSON).read_bytes()
    no_space(monkeypatch)
    with pytest.raises(RunDirError) as info:
        write_results(tmp_path, run_record({"verdict": "NO-GO", "n": 2, "big": "x" * 100_000}))
    message = str(info.value)
    reliability.record_fault("disk full writing results.json", "RunDirError naming the file and ENOSPC",
                             "RunDirError naming the file and ENOSPC"
                             if str(tmp_path / RESULTS_JSON) in message and ENOSPC_TEXT in message else message)
    intact = (tmp_path / RESULTS_JSON).read_bytes() == before
    reliability.record_results(lost=0 if intact else 1, checked=1)
    assert message == (f"cannot write {tmp_path / RESULTS_JSON}: {ENOSPC_TEXT} (the previous results.json, if any, "
                       "is unchanged)")
    assert intact and json.loads(before)["verdict"] == "GO"
    assert leftovers(tmp_path) == []


def test_failure_at_any_point_of_the_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "f.json"
    path.write_text("old\n")
    for name in ("fsync", "replace"):
        with monkeypatch.context() as m:
            m.setattr(nsa.training.outputs.os, name, lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
            with pytest.raises(OSError) as raised:
                atomic_write_text(path, "new\n")
        # named as the file written: not its temp file (gone), not a path-less error
        assert raised.value.filename == str(path) and raised.value.errno == errno.EIO, name
        assert path.read_text() == "old\n" and leftovers(tmp_path) == [], name
    (tmp_path / "d.json").mkdir()  # the path taken by a directory: the rename fails, and says which path
    with pytest.raises(IsADirectoryError) as raised:
        atomic_write_text(tmp_path / "d.json", "new\n")
    assert raised.value.filename == str(tmp_path / "d.json") and leftovers(tmp_path) == []
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and leftovers(tmp_path) == []


# ---------------------------------------------------------------------- nsa-validate run
def test_disk_full_mid_run_exits_2_and_resume_finishes(cli, tmp_path, monkeypatch, reliability):
    marks = tmp_path / "marks"
    path, run_dir = runbook(tmp_path, marks), tmp_path / "run"

    def second_step_started(tmp: Path) -> bool:  # the save that marks step two running
        return json.loads(tmp.read_text())["steps"]["two"]["status"] == "running"

    no_space(monkeypatch, second_step_started)
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(run_dir)])
    output = result.output  # stdout and stderr, as a terminal shows them
    line = one_error_line(output)
    on_disk = read_results(run_dir)  # readable, not half written
    reliability.record_fault("disk full mid-run", f"exit 2: {ENOSPC_TEXT}",
                             f"exit {result.exit_code}: {ENOSPC_TEXT}" if ENOSPC_TEXT in line else line)
    assert result.exit_code == 2, output
    assert line == (f"nsa-validate: error: cannot write {run_dir / RESULTS_JSON}: {ENOSPC_TEXT} (the previous "
                    "results.json, if any, is unchanged)")
    assert on_disk["steps"]["one"]["status"] == "passed" and on_disk["steps"]["two"]["status"] == "pending"
    assert leftovers(run_dir) == [] and sorted(p.name for p in marks.iterdir()) == ["one"]
    monkeypatch.undo()  # space again: --resume finishes without repeating step one
    (marks / "one").unlink()
    resumed = cli("run", path, "--resume", run_dir, "--no-report")
    final = read_results(run_dir)
    kept = final["steps"]["one"] == on_disk["steps"]["one"]
    reliability.record_results(lost=0 if kept else 1, checked=1)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert kept and final["verdict"] == "GO" and sorted(p.name for p in marks.iterdir()) == ["two"]


def test_disk_full_writing_the_reports_exits_2_with_results_kept(tmp_path, monkeypatch):
    path, run_dir = runbook(tmp_path, tmp_path / "marks"), tmp_path / "run"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_dir / "report.md"))

    monkeypatch.setattr("validation.report.write_reports", full)
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(run_dir)])
    output = result.output  # stdout and stderr, as a terminal shows them
    assert result.exit_code == 2, output
    assert one_error_line(output) == f"nsa-validate: error: cannot write {run_dir / 'report.md'}: {ENOSPC_TEXT}"
    assert read_results(run_dir)["verdict"] == "GO"


def test_run_dir_under_a_regular_file_exits_2(cli, tmp_path, reliability):
    (tmp_path / "file").write_text("not a directory\n")
    run_dir = tmp_path / "file" / "run"
    proc = cli("run", runbook(tmp_path, tmp_path / "marks"), "--out", run_dir)
    line = one_error_line(proc.stderr)
    reliability.record_fault("RUN_DIR not writable (not a directory)", "exit 2: Not a directory [ENOTDIR]",
                             f"exit {proc.returncode}: Not a directory [ENOTDIR]" if "[ENOTDIR]" in line else line)
    assert proc.returncode == 2
    assert line == f"nsa-validate: error: cannot write {run_dir}: Not a directory [ENOTDIR]"
    assert not list((tmp_path / "marks").iterdir())


def test_step_directory_that_cannot_be_created_exits_2_with_results_intact(cli, tmp_path, reliability):
    """Real, and effective as root too: where the next step's directory must go there is a regular file."""
    marks = tmp_path / "marks"
    path, run_dir = runbook(tmp_path, marks), tmp_path / "run"
    assert cli("run", path, "--out", run_dir, "--no-report").returncode == 0
    results = read_results(run_dir)
    results["steps"]["two"].update(status="pending", reason=None)  # as if the run had stopped before step two
    results["verdict"] = "INCOMPLETE"
    write_results(run_dir, results)
    import shutil

    shutil.rmtree(run_dir / "two")
    (run_dir / "two").write_text("a file where the step directory goes\n")
    for mark in marks.iterdir():
        mark.unlink()
    proc = cli("run", path, "--resume", run_dir, "--no-report")
    line = one_error_line(proc.stderr)
    reliability.record_fault("step directory not writable", "exit 2: File exists [EEXIST]",
                             f"exit {proc.returncode}: File exists [EEXIST]" if "[EEXIST]" in line else line)
    assert proc.returncode == 2
    assert line == f"nsa-validate: error: cannot write {run_dir / 'two'}: File exists [EEXIST]"
    after = read_results(run_dir)
    reliability.record_results(lost=0 if after["steps"]["one"] == results["steps"]["one"] else 1, checked=1)
    assert after["steps"]["one"] == results["steps"]["one"] and not list(marks.iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_read_only_run_dir_exits_2_with_results_intact(cli, tmp_path):
    path, run_dir = runbook(tmp_path, tmp_path / "marks"), tmp_path / "run"
    assert cli("run", path, "--out", run_dir, "--no-report").returncode == 0
    results = read_results(run_dir)
    results["steps"]["two"].update(status="pending", reason=None)  # something to resume (a finished run is refused)
    write_results(run_dir, results)
    before = (run_dir / RESULTS_JSON).read_bytes()
    run_dir.chmod(0o555)
    try:
        proc = cli("run", path, "--resume", run_dir, "--no-report")
    finally:
        run_dir.chmod(0o755)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 2 and "Permission denied [EACCES]" in line and str(run_dir) in line
    assert (run_dir / RESULTS_JSON).read_bytes() == before and leftovers(run_dir) == []
