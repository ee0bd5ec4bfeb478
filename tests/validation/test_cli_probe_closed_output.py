"""`nsa-validate` whose stdout nobody reads any more (`nsa-validate run X | head -1`, a pager quit early): what it
still prints is dropped and the command goes on to its own end. A run is not cut off mid-step (rich's default
exited 1 at the first line printed after the reader left: NO-GO by the exit-code table, the step left `running` in
results.json, no message), `compare` exits by its own gate (not 1, a regression) and the other commands exit 0; no
traceback either way.

Each command runs as a user's would (`python -m validation.cli`, as tests/validation/conftest.py's `cli`), its
stdout the write end of a pipe whose read end is closed before it starts: every write to it fails with EPIPE."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.validation.test_cli_promises import EXAMPLE, RUNBOOK  # two bench steps in two phases, the example run

REPO = Path(__file__).resolve().parents[2]
# README.md, "Exit codes of `nsa-validate run`"
EXIT = {"GO": 0, "NO-GO": 1, "INCOMPLETE": 3}


def unread_cli(*args) -> subprocess.CompletedProcess:
    """`python -m validation.cli ARGS` with stdout a pipe nobody reads (its read end closed); stderr captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["COLUMNS"] = "200"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "validation.cli", *map(str, args)], cwd=REPO, env=env,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    for text in ("Traceback", "BrokenPipeError", "Exception ignored"):
        assert text not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("only, verdict", [((), "GO"), (("--only", "p1"), "INCOMPLETE")], ids=["go", "incomplete"])
def test_a_run_whose_output_is_not_read_runs_to_its_verdict(tmp_path, only, verdict):
    runbook = tmp_path / "unread.yaml"
    runbook.write_text(RUNBOOK)
    proc = unread_cli("run", runbook, "--out", tmp_path / "run", "--no-report", *only)
    no_traceback(proc)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    statuses = {name: step["status"] for name, step in results["steps"].items()}
    assert statuses["first"] == "passed"
    assert statuses["second"] == ("passed" if verdict == "GO" else "skipped")
    assert results["verdict"] == verdict
    assert proc.returncode == EXIT[verdict], proc.stderr[-3000:]


def test_compare_whose_output_is_not_read_exits_by_its_gate(tmp_path):
    """Two copies of one run (results.json alone): nothing regresses, so the gate is 0 (README: exit 1 only when a
    metric regresses significantly), whether or not the table is read."""
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        shutil.copy(EXAMPLE, tmp_path / side / "results.json")
    proc = unread_cli("compare", tmp_path / "a", tmp_path / "b")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("argv", [["plan", "RUNBOOK"], ["plan", "RUNBOOK", "--json"], ["report", "RUN"],
                                  ["list", "--runs", "RUN"], ["kinds"], ["--version"]],
                         ids=["plan", "plan-json", "report", "list", "kinds", "version"])
def test_commands_whose_output_is_not_read_exit_0(tmp_path, argv):
    runbook = tmp_path / "unread.yaml"
    runbook.write_text(RUNBOOK)
    (tmp_path / "run").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "run" / "results.json")
    paths = {"RUNBOOK": runbook, "RUN": tmp_path / "run"}
    proc = unread_cli(*[paths.get(a, a) for a in argv])
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr[-3000:]
