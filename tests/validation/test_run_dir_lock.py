"""Two nsa-validate processes on one run directory: validation.results.store.held_run_dir holds it for one, a
second is refused naming it, and the hold ends with its holder, however it ends (a SIGKILLed run leaves no stale
lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from validation.results.store import RunDirError, held_run_dir

REPO = Path(__file__).resolve().parents[2]

HOLDER = """\
import sys
from validation.results.store import held_run_dir
with held_run_dir(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_holder_of_a_run_directory_is_refused_until_the_first_lets_go(tmp_path):
    with held_run_dir(tmp_path) as held:
        assert held == tmp_path
        with pytest.raises(RunDirError, match=f"^{tmp_path} is in use by another nsa-validate run"):
            with held_run_dir(tmp_path):
                pass
    with held_run_dir(tmp_path):  # let go at the end of the block
        pass
    assert os.listdir(tmp_path) == []  # nothing written into the run directory


def test_a_run_directory_held_by_another_process_is_refused_and_free_once_it_is_killed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "held\n"
        with pytest.raises(RunDirError, match="in use by another nsa-validate run"):
            with held_run_dir(tmp_path):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with held_run_dir(tmp_path):  # no stale lock after SIGKILL
        pass


def test_a_run_directory_that_is_not_one_is_refused_naming_it(tmp_path):
    with pytest.raises(RunDirError, match=f"^cannot open the run directory {tmp_path / 'none'}: .*ENOENT"):
        with held_run_dir(tmp_path / "none"):
            pass


SNAPSHOT_RB = ("name: lock\nrequirements: {gpus: 0, backend: gloo}\nphases:\n  - name: p\n    steps:\n"
               "      - {name: s, kind: snapshot}\n")


def test_a_run_whose_directory_another_run_holds_is_refused_before_it_writes_anything(tmp_path):
    """run_runbook holds its run directory for the whole run: a second `run --out X` (or `--resume X`) while one
    runs is refused naming X, before it ends any launch or writes a file (both ran every step, and each overwrote
    the other's results.json)."""
    from validation.run import RunError, RunRequest, run_runbook

    runbook = tmp_path / "lock.yaml"
    runbook.write_text(SNAPSHOT_RB)
    out = tmp_path / "run"
    out.mkdir()
    with held_run_dir(out):  # another run holds it
        with pytest.raises(RunError, match=f"{out} is in use by another nsa-validate run"):
            run_runbook(RunRequest(runbook=runbook, out=out, cwd=REPO, no_report=True))
    assert os.listdir(out) == []


def test_a_fresh_run_into_a_directory_given_a_results_json_meanwhile_is_refused(tmp_path, monkeypatch):
    """prepare() found no results.json in --out; by the time the run holds the directory another run has written
    one: the run is refused instead of writing over it."""
    from validation import run as run_module
    from validation.run import RunError, RunRequest, run_runbook

    runbook = tmp_path / "lock.yaml"
    runbook.write_text(SNAPSHOT_RB)
    out = tmp_path / "run"
    real = run_module.prepare

    def prepare_then_another_run_writes(request, warn):
        prepared = real(request, warn)
        out.mkdir(exist_ok=True)
        (out / "results.json").write_text("{}")
        return prepared

    monkeypatch.setattr(run_module, "prepare", prepare_then_another_run_writes)
    with pytest.raises(RunError, match="holds a results.json written by another nsa-validate run"):
        run_runbook(RunRequest(runbook=runbook, out=out, cwd=REPO, no_report=True))
    assert (out / "results.json").read_text() == "{}"


def test_report_that_writes_into_a_run_directory_a_run_holds_is_refused_and_changes_nothing(tmp_path):
    """`report --write` (and `--against`, which stores its comparison in results.json) read results.json and write
    it back: while a run holds RUN_DIR (and may save a newer results.json meanwhile) it is refused, naming RUN_DIR,
    and nothing in it changes; printing a report writes nothing and needs no hold."""
    import shutil

    from validation.run import report_run

    run_dir = tmp_path / "run"
    shutil.copytree(REPO / "reports" / "examples" / "cpu_smoke", run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with held_run_dir(run_dir):
        with pytest.raises(RunDirError, match="is in use by another nsa-validate run"):
            report_run(run_dir, write=True)
        with pytest.raises(RunDirError, match="is in use by another nsa-validate run"):
            report_run(run_dir, against=run_dir)
        text, written = report_run(run_dir, fmt="json")
        assert text and written == []
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    _, written = report_run(run_dir, write=True)  # free again: written
    assert run_dir / "report.md" in written
