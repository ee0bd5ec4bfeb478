"""The pytest kind's reading of what pytest writes (validation.kinds.pytest): its JUnit XML and its exit code.

The JUnit reports are those pytest 9's writer (src/_pytest/junitxml.py, LogXML.pytest_sessionfinish) wrote for the
tests named in each case, their tracebacks shortened: `tests` is passed + failure + skipped + error less
cnt_double_fail_tests (a test whose call failed and whose teardown then raised is written as two testcases, a
<failure> one and an <error> one, and counted once); xfail is a <skipped type="pytest.xfail">, a non-strict xpass a
plain testcase, a strict one a <failure>; a collection error an <error message="collection failure">; a pytest-xdist
worker that died an <error> "worker 'gw1' crashed while running ..." (xdist's DSession.handle_crashitem). The figures
expected are pytest's own summary line for the same run (xfailed counted as skipped, xpassed as passed).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from validation.kinds.pytest import Options, Pytest, file_result, read_junit

HEAD = '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
SUITE = '<testsuite name="pytest" errors="{e}" failures="{f}" skipped="{s}" tests="{t}" time="0.032" ' \
        'timestamp="2026-11-30T10:01:03.833021+00:00" hostname="vm">'
TAIL = "</testsuite></testsuites>"
FAIL_THEN_TEARDOWN_ERROR = (
    '<testcase classname="test_x" name="test_fail_and_teardown_error" time="0.000"><failure message="assert 0">'
    "test_x.py:7: AssertionError</failure></testcase>"
    '<testcase classname="test_x" name="test_fail_and_teardown_error" time="0.000"><error message="failed on '
    'teardown with &quot;RuntimeError: teardown&quot;">test_x.py:5: RuntimeError</error></testcase>')
PASS_THEN_TEARDOWN_ERROR = (
    '<testcase classname="test_x" name="test_pass_teardown_error" time="0.000"><error message="failed on teardown '
    'with &quot;RuntimeError: teardown&quot;">test_x.py:5: RuntimeError</error></testcase>')
OTHERS = ('<testcase classname="test_x" name="test_ok" time="0.000" />'
          '<testcase classname="test_x" name="test_xfail" time="0.000"><skipped type="pytest.xfail" message="" />'
          "</testcase>"
          '<testcase classname="test_x" name="test_xpass" time="0.000" />'
          '<testcase classname="test_x" name="test_xpass_strict" time="0.000"><failure message="[XPASS(strict)] ">'
          "[XPASS(strict)] </failure></testcase>"
          '<testcase classname="test_x" name="test_skip" time="0.000"><skipped type="pytest.skip" message="no">'
          "test_x.py:22: no</skipped></testcase>")
PASSING = HEAD + SUITE.format(e=0, f=0, s=0, t=1) + '<testcase classname="test_ok" name="test_ok" time="0.000" />' \
    + TAIL


def _counts(tmp_path: Path, text: str) -> tuple:
    path = tmp_path / "pytest.xml"
    path.write_text(text)
    m = read_junit(path)
    return m.passed, m.failed, m.skipped, m.errors, m.total


def test_a_test_failing_then_raising_in_teardown_is_one_failure_and_one_error(tmp_path):
    """pytest: "1 failed, 1 error"; its JUnit: tests="1" failures="1" errors="1" (passed was -1 from these)."""
    text = HEAD + SUITE.format(e=1, f=1, s=0, t=1) + FAIL_THEN_TEARDOWN_ERROR + TAIL
    assert _counts(tmp_path, text) == (0, 1, 0, 1, 2)


def test_a_mixed_run_counts_as_pytests_summary_line(tmp_path):
    """pytest: "2 failed, 2 passed, 1 skipped, 1 xfailed, 1 xpassed, 2 errors"; its JUnit: tests="8" failures="2"
    errors="2" skipped="2" (the passed count was one short)."""
    text = HEAD + SUITE.format(e=2, f=2, s=2, t=8) + FAIL_THEN_TEARDOWN_ERROR + PASS_THEN_TEARDOWN_ERROR + OTHERS + TAIL
    assert _counts(tmp_path, text) == (3, 2, 2, 2, 9)


def test_a_test_passing_then_raising_in_teardown_is_one_pass_and_one_error(tmp_path):
    """pytest: "1 passed, 1 error"; its JUnit: tests="2" errors="1", one testcase."""
    text = HEAD + SUITE.format(e=1, f=0, s=0, t=2) + PASS_THEN_TEARDOWN_ERROR + TAIL
    assert _counts(tmp_path, text) == (1, 0, 0, 1, 2)


def test_a_collection_error_and_a_crashed_xdist_worker_are_errors(tmp_path):
    collection = (HEAD + SUITE.format(e=1, f=0, s=0, t=1) + '<testcase classname="" name="test_bad" time="0.000">'
                  '<error message="collection failure">E   SyntaxError: invalid syntax</error></testcase>' + TAIL)
    assert _counts(tmp_path, collection) == (0, 0, 0, 1, 1)
    crashed = (HEAD + SUITE.format(e=1, f=0, s=0, t=3) + '<testcase classname="test_crash" name="test_crash" '
               'time="0.000"><error message="failed on setup with &quot;worker \'gw1\' crashed while running '
               '\'test_crash.py::test_crash\'&quot;">worker \'gw1\' crashed while running \'test_crash.py::test_crash\''
               '</error></testcase><testcase classname="test_crash" name="test_a" time="0.000" />'
               '<testcase classname="test_crash" name="test_b" time="0.000" />' + TAIL)
    assert _counts(tmp_path, crashed) == (2, 0, 0, 1, 3)


def test_a_report_cut_off_or_with_a_count_that_is_no_number_is_unreadable(tmp_path):
    path = tmp_path / "pytest.xml"
    path.write_text(PASSING[:len(PASSING) // 2])
    assert read_junit(path) is None
    path.write_text(PASSING.replace('tests="1"', 'tests=""'))
    assert read_junit(path) is None


def _run_one_process(tmp_path: Path, returncode: int, junit: str):
    """Pytest.run (isolate: none) with a launch that ends with `returncode` and writes `junit`."""
    step_dir = tmp_path / "suite"
    step_dir.mkdir(parents=True)

    def launch(spec, index, total):
        (step_dir / "pytest.xml").write_text(junit)
        return SimpleNamespace(status="ok" if returncode == 0 else "failed", returncode=returncode,
                               reason=f"exit code {returncode}", argv=spec.argv)

    spec = SimpleNamespace(dir="suite", label="", argv=["python", "-m", "pytest"])
    ctx = SimpleNamespace(run_dir=tmp_path, launches=[spec], launch=launch,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    return Pytest().run(Options(tests=["tests"]), ctx)


def test_exit_code_1_with_every_test_passed_fails_the_step(tmp_path):
    """pytest-cov's --cov-fail-under adds to session.testsfailed when coverage is short: pytest exits 1 ("tests
    failed") while its JUnit report, written before, holds one passing test and no failure."""
    result = _run_one_process(tmp_path, 1, PASSING)
    assert result.status == "failed" and "exit code 1" in result.reason
    assert (result.metrics.passed, result.metrics.total) == (1, 1)
    assert _run_one_process(tmp_path / "again", 0, PASSING).status == "passed"


def test_exit_code_1_with_every_test_passed_fails_an_isolated_file(tmp_path):
    (tmp_path / "pytest.xml").write_text(PASSING)
    rec = file_result("tests/test_ok.py", tmp_path, "failed", 1, "exit code 1", 0.5)
    assert rec.status == "failed" and (rec.passed, rec.errors, rec.total) == (1, 1, 2)
    assert file_result("tests/test_ok.py", tmp_path, "ok", 0, "exit code 0", 0.5).status == "passed"
