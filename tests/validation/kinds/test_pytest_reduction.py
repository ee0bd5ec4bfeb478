"""The pytest kind's reduction of what its processes leave (validation.kinds.pytest): a JUnit report counts only when
the pytest process ended as pytest ends (its own exit codes); a process that died after its report, or a launch that
wrote none while an earlier attempt's report lies in the directory, never passes; the progress record of a test
file starts afresh in each process, so that an earlier attempt's tests are never counted as this run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.kinds.pytest import Options, Pytest, file_result
from validation.kinds.pytest import progress

REPO = Path(__file__).resolve().parents[3]
PASSING_JUNIT = ('<testsuites><testsuite tests="4" failures="0" errors="0" skipped="1" time="2.5"/>'
                 '</testsuites>')


def _spec(directory: str) -> SimpleNamespace:
    return SimpleNamespace(dir=directory, label="", argv=["python", "-m", "pytest"])


def _run_one_process(tmp_path: Path, status: str, returncode: int, writes_junit: str | None,
                     old_junit: str | None = None):
    """Pytest.run (isolate: none) with a launch that ends with (status, returncode) and writes `writes_junit`
    into the step directory (None: writes nothing), where `old_junit` lies from an earlier attempt."""
    step_dir = tmp_path / "suite"
    step_dir.mkdir()
    if old_junit is not None:
        (step_dir / "pytest.xml").write_text(old_junit)

    def launch(spec, index, total):
        if writes_junit is not None:
            (step_dir / "pytest.xml").write_text(writes_junit)
        return SimpleNamespace(status=status, returncode=returncode, reason=f"exit code {returncode}",
                               argv=spec.argv)

    ctx = SimpleNamespace(run_dir=tmp_path, launches=[_spec("suite")], launch=launch,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    return Pytest().run(Options(tests=["tests"]), ctx)


def test_a_passing_report_of_a_process_that_ended_normally_passes(tmp_path):
    result = _run_one_process(tmp_path, "ok", 0, PASSING_JUNIT)
    m = result.metrics
    assert result.status == "passed"
    assert (m.passed, m.failed, m.skipped, m.errors, m.total) == (3, 0, 1, 0, 4)  # 4 - 0 - 0 - 1 passed


def test_a_process_killed_after_writing_a_passing_report_fails(tmp_path):
    """SIGSEGV at interpreter exit (after pytest wrote its JUnit file): the step fails naming the death."""
    result = _run_one_process(tmp_path, "failed", -11, PASSING_JUNIT)
    assert result.status == "failed"
    assert "the process died" in result.reason and "SIGSEGV" in result.reason


def test_an_earlier_attempts_report_is_never_read_as_this_launchs(tmp_path):
    """--rerun of a step whose earlier attempt passed: this launch dies before pytest writes anything."""
    result = _run_one_process(tmp_path, "failed", -9, None, old_junit=PASSING_JUNIT)
    assert result.status == "failed" and "no JUnit report" in result.reason
    assert result.metrics.total == 0 and result.metrics.passed == 0
    assert (tmp_path / "suite" / "pytest.prev1.xml").read_text() == PASSING_JUNIT  # kept, renamed


def test_no_report_says_so_instead_of_no_tests_ran(tmp_path):
    result = _run_one_process(tmp_path, "failed", 4, None)  # a usage error: pytest writes no report
    assert result.status == "failed"
    assert "no JUnit report" in result.reason and "no tests ran" not in result.reason


def test_an_internal_error_with_a_clean_report_fails(tmp_path):
    result = _run_one_process(tmp_path, "failed", 3, PASSING_JUNIT)
    assert result.status == "failed" and "exit code 3" in result.reason


def test_zero_tests_collected_fails_as_no_tests_ran(tmp_path):
    result = _run_one_process(tmp_path, "failed", 5, '<testsuite tests="0" failures="0" errors="0" skipped="0"/>')
    assert result.status == "failed" and result.reason.startswith("no tests ran")


def test_the_progress_record_starts_afresh_in_each_process(tmp_path):
    """An earlier attempt's record (test_a failed, test_b passed) must not survive into this process's, which ran
    test_a to a pass and died inside test_b."""
    path = tmp_path / "progress.jsonl"
    earlier = [{"event": "start", "nodeid": "t.py::test_a"},
               {"event": "report", "nodeid": "t.py::test_a", "when": "call", "outcome": "failed"},
               {"event": "report", "nodeid": "t.py::test_a", "when": "teardown", "outcome": "passed"},
               {"event": "start", "nodeid": "t.py::test_b"},
               {"event": "report", "nodeid": "t.py::test_b", "when": "call", "outcome": "passed"},
               {"event": "report", "nodeid": "t.py::test_b", "when": "teardown", "outcome": "passed"}]
    path.write_text("".join(json.dumps(e) + "\n" for e in earlier))
    config = SimpleNamespace(getoption=lambda name: str(path))
    progress.pytest_configure(config)
    try:
        progress.pytest_runtest_logstart("t.py::test_a", None)
        progress.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::test_a", when="call", outcome="passed"))
        progress.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::test_a", when="teardown", outcome="passed"))
        progress.pytest_runtest_logstart("t.py::test_b", None)
    finally:
        progress.pytest_unconfigure(config)
    outcomes, running = progress.read_progress(path)
    assert outcomes == {"t.py::test_a": "passed"} and running == "t.py::test_b"
    # the file's record of the death: 1 finished (passed) + the death, not 2 finished
    rec = file_result("t.py", tmp_path, "failed", -11, "killed", 1.0)
    assert (rec.status, rec.passed, rec.failed, rec.total, rec.running) == ("died", 1, 1, 2, "t.py::test_b")


def test_progress_record_of_a_run_with_xdist_workers_holds_every_test(tmp_path):
    # `-n 2` in a step's pytest_args: every worker loads the plugin too; the controller hears all their events, and
    # a worker that opened the file as well cut it short and wrote over the controller's lines
    pytest.importorskip("xdist")
    (tmp_path / "test_many.py").write_text("import pytest\n\n@pytest.mark.parametrize('i', range(8))\n"
                                           "def test_ok(i):\n    pass\n")
    record = tmp_path / "progress.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "validation.kinds.pytest.progress", progress.OPTION, str(record), "test_many.py", "-n", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    outcomes, running = progress.read_progress(record)
    assert outcomes == {f"test_many.py::test_ok[{i}]": "passed" for i in range(8)} and running is None
    assert len(record.read_text().splitlines()) == 8 * 4  # start, setup, call, teardown: each line once


def test_progress_record_names_every_test_still_running_side_by_side(tmp_path):
    # with xdist workers two tests run at once: one that finished after another started leaves that one running
    path = tmp_path / "progress.jsonl"
    events = [("start", "a", None), ("start", "b", None), ("report", "b", "call"), ("report", "b", "teardown"),
              ("start", "c", None), ("report", "a", "setup")]
    path.write_text("".join(json.dumps({"event": e, "nodeid": n, **({"when": w, "outcome": "passed"} if w else {})})
                            + "\n" for e, n, w in events))
    assert progress.read_progress(path) == ({"b": "passed"}, "a, c")
