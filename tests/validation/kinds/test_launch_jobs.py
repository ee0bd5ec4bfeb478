"""`jobs: N` of the pytest (isolate: file) and sanitizer kinds: launches side by side, results as one after another.

Test files and grid cases run up to N at a time (their processes overlap: checked on each record's start and end,
never on wall time), a process that dies is still one failure naming its file, the records, artifacts and verdict
are those of a run with jobs: 1 (in plan order), an interrupt ends every running process, a bad `jobs` is refused
when the runbook is loaded; and a case where compute-sanitizer attached to no process is never clean."""

from __future__ import annotations

import importlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from fake_sanitizer import install as install_fake_sanitizer, path_without_real_sanitizer
from typer.testing import CliRunner

from validation import kinds
from validation.cli import app
from validation.runbook.plan import describe
from validation.report import write_reports
from validation.runbook.loader import RunbookError, load_runbook
from validation.execution.runner import RunOptions, Runner
from validation.kinds.bench import Best

SLEEPS = """
import time

def test_sleeps():
    time.sleep({seconds})
"""
DIES = """
import os
import signal

def test_before():
    assert True

def test_kills_its_process():
    os.kill(os.getpid(), signal.SIGKILL)
"""
WAITS = """
import os
import time

def test_waits():
    open(os.environ["PID_DIR"] + "/" + str(os.getpid()), "w").close()
    time.sleep(120)
"""
SUITE = """
name: jobs
phases:
  - name: tests
    steps:
      - {{name: suite, kind: pytest, isolate: file, jobs: {jobs}, tests: [suite_tests], timeout_s: 120}}
acceptance:
  - {{name: "tests pass", expr: "suite.failed == 0 and suite.errors == 0 and suite.passed > 0"}}
"""


def _suite(tmp_path: Path, files: dict[str, str], jobs: int) -> Path:
    (tmp_path / "suite_tests").mkdir(exist_ok=True)
    for name, text in files.items():
        (tmp_path / "suite_tests" / name).write_text(text)
    path = tmp_path / "jobs.yaml"
    path.write_text(SUITE.format(jobs=jobs))
    return path


def _timeless(value):
    """`value` without what depends on timing: durations, start and end times."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in ("duration_s", "started", "ended")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _step_as_recorded(step: dict) -> dict:
    return _timeless({k: v for k, v in step.items() if k not in ("started",)})


def test_test_files_run_side_by_side_and_the_results_are_those_of_one_after_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = {"test_a_sleeps.py": SLEEPS.format(seconds=1.0), "test_b_sleeps.py": SLEEPS.format(seconds=1.0),
             "test_c_dies.py": DIES}
    path = _suite(tmp_path, files, jobs=2)
    rb = load_runbook(path, cwd=tmp_path)
    results = Runner(rb, tmp_path / "run", RunOptions(cwd=tmp_path)).run()
    step = results["steps"]["suite"]
    m = step["metrics"]
    assert [f["file"] for f in m["files"]] == ["suite_tests/test_a_sleeps.py", "suite_tests/test_b_sleeps.py",
                                               "suite_tests/test_c_dies.py"]  # plan order
    a, b, dead = m["files"]
    assert max(a["started"], b["started"]) < min(a["ended"], b["ended"])  # the two processes overlapped
    assert (a["status"], a["passed"], b["status"], b["passed"]) == ("passed", 1, "passed", 1)
    # the file that killed its process: one failure naming it and the test it was running; the others still count
    assert (dead["status"], dead["returncode"], dead["passed"], dead["failed"], dead["total"]) == \
        ("died", -9, 1, 1, 2)
    assert dead["running"] == "suite_tests/test_c_dies.py::test_kills_its_process"
    assert (m["passed"], m["failed"], m["files_failed"], m["died"]) == (3, 1, 1, 1)
    assert step["status"] == "failed" and step["reason"].startswith("1 of 3 test files failed: "
                                                                    "suite_tests/test_c_dies.py (the process died")
    assert results["verdict"] == "NO-GO"
    for name in ("test_a_sleeps.py", "test_b_sleeps.py", "test_c_dies.py"):  # each its own directory and log
        assert (tmp_path / f"run/suite/suite_tests_{name}/stdout.log").is_file()

    # the same runbook with jobs: 1 records the same step, file for file and artifact for artifact
    one = load_runbook(path, ["steps.suite.jobs=1"], cwd=tmp_path)
    sequential = Runner(one, tmp_path / "run1", RunOptions(cwd=tmp_path)).run()["steps"]["suite"]
    assert _step_as_recorded(step) == _step_as_recorded(sequential)
    assert step["artifacts"] == sequential["artifacts"] and "suite/suite_tests_test_c_dies.py/progress.jsonl" in \
        step["artifacts"]


def test_an_interrupt_ends_every_running_test_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PID_DIR", str(tmp_path / "pids"))
    (tmp_path / "pids").mkdir()
    path = _suite(tmp_path, {"test_a_waits.py": WAITS, "test_b_waits.py": WAITS, "test_c_waits.py": WAITS}, jobs=2)
    rb = load_runbook(path, cwd=tmp_path)

    # Ctrl-C only while the run is running: the run ending first (its files failing at once) must fail this test,
    # never interrupt the test session after it
    ended, lock = threading.Event(), threading.Lock()

    def interrupt_once_both_run():
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path / "pids")) < 2 and time.monotonic() < deadline and not ended.is_set():
            time.sleep(0.05)
        with lock:
            if not ended.is_set():
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: a KeyboardInterrupt in the main thread

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Thread(target=interrupt_once_both_run, daemon=True)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            try:
                Runner(rb, tmp_path / "run", RunOptions(cwd=tmp_path)).run()
            finally:
                with lock:  # a SIGINT sent before this lands inside pytest.raises
                    ended.set()
    finally:
        ended.set()
        timer.join(timeout=70)
        signal.signal(signal.SIGINT, previous)
    pids = [int(p) for p in os.listdir(tmp_path / "pids")]
    assert len(pids) == 2  # the third file never started
    for pid in pids:  # every launched process is gone (ended and reaped), none left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    logs = [(tmp_path / f"run/suite/suite_tests_test_{x}_waits.py/stdout.log").read_text() for x in "ab"]
    assert all("interrupted (Ctrl-C to the launcher): ending the run's processes" in log for log in logs)
    results = json.loads((tmp_path / "run/results.json").read_text())
    assert results["steps"]["suite"]["status"] == "interrupted" and results["interrupted_by"] == "Ctrl-C"


# ------------------------------------------------------------------------------------------ the sanitizer
PROGRAM = """
import sys, time
time.sleep(0.5)
print("program", sys.argv[1:])
"""
SANITIZED = """
name: sanitized
phases:
  - name: memcheck
    steps:
      - name: check
        kind: sanitizer
        command: [{program}]
        jobs: 3
        grids:
          default: {{dtype: [bf16, fp32], seq-len: [1024, 2048, 999]}}
        timeout_s: 60
acceptance:
  - {{name: "memcheck clean", expr: "check.errors == 0 and check.cases_clean == check.cases"}}
"""


@pytest.fixture
def sanitizer():
    kinds.names()  # every kind registered in the registry's own order first
    return importlib.import_module("validation.kinds.sanitizer")


@pytest.fixture
def sanitized(tmp_path, monkeypatch, sanitizer):
    monkeypatch.setattr(sanitizer, "FALLBACK_DIRS", ())
    monkeypatch.delenv("CUDA_HOME", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_fake_sanitizer(bin_dir)
    monkeypatch.setenv("PATH", str(bin_dir) + os.pathsep + path_without_real_sanitizer())
    (tmp_path / "program.py").write_text(PROGRAM)
    path = tmp_path / "sanitized.yaml"
    path.write_text(SANITIZED.format(program=tmp_path / "program.py"))
    return path


def test_sanitizer_cases_side_by_side_give_the_records_of_one_after_another(sanitized, tmp_path):
    rb = load_runbook(sanitized, cwd=tmp_path)
    assert rb.step("check").jobs == 3
    results = Runner(rb, tmp_path / "run", RunOptions(cwd=tmp_path)).run()
    step = results["steps"]["check"]
    m = step["metrics"]
    assert [r["case"] for r in m["by_case"]] == [f"dtype={t} seq-len={s}" for t in ("bf16", "fp32")
                                                 for s in ("1024", "2048", "999")]  # grid order
    assert [r["status"] for r in m["by_case"]] == ["clean", "errors", "not attached"] * 2
    assert (m["cases"], m["cases_clean"], m["errors"]) == (6, 2, 2)
    # a case the sanitizer never attached to is its own failure, not "0 errors"
    unattached = m["by_case"][2]
    assert unattached["errors"] is None and unattached["first_error"].startswith("Error: No attachable process")
    assert "dtype=bf16 seq-len=999: compute-sanitizer attached to no process: nothing was checked" in step["reason"]
    assert results["verdict"] == "NO-GO"
    for case in ("dtype_bf16_seq-len_1024", "dtype_fp32_seq-len_999"):  # each case its own directory and log
        assert (tmp_path / f"run/check/{case}/stdout.log").is_file()

    one = load_runbook(sanitized, ["steps.check.jobs=1"], cwd=tmp_path)
    sequential = Runner(one, tmp_path / "run1", RunOptions(cwd=tmp_path)).run()["steps"]["check"]
    assert _step_as_recorded(step) == _step_as_recorded(sequential)


def test_a_case_without_a_summary_or_not_attached_is_never_clean(sanitizer, tmp_path):
    log = tmp_path / "stdout.log"
    log.write_text("========= COMPUTE-SANITIZER\nprogram ran\n")
    assert sanitizer.read_case(log, "ok", 0, "exit code 0").status == "no summary"
    log.write_text("========= COMPUTE-SANITIZER\n========= Error: No attachable process found. compute-sanitizer "
                   "timed-out.\n========= ERROR SUMMARY: 0 errors\n")
    assert sanitizer.read_case(log, "ok", 0, "exit code 0").status == "not attached"
    log.write_text("program says: compute-sanitizer timed-out\n========= ERROR SUMMARY: 0 errors\n")
    assert sanitizer.read_case(log, "ok", 0, "exit code 0").status == "clean"  # the program's own words


def test_jobs_is_checked_when_the_runbook_is_loaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _suite(tmp_path, {"test_a.py": SLEEPS.format(seconds=0)}, jobs=2)
    rows = describe(load_runbook(path, cwd=tmp_path))
    assert rows[0]["jobs"] == 2
    for value, message in (("0", "jobs: must be >= 1, got 0"), ("two", "jobs: must be an integer, got 'two'"),
                           ("1.5", "jobs: must be an integer, got 1.5")):
        with pytest.raises(RunbookError, match=message):
            load_runbook(path, [f"steps.suite.jobs={value}"], cwd=tmp_path)
    with pytest.raises(RunbookError, match=r"jobs: jobs: 2 runs test files side by side: it needs isolate: file"):
        load_runbook(path, ["steps.suite.isolate=none"], cwd=tmp_path)
    bad = CliRunner().invoke(app, ["plan", str(path), "--set", "steps.suite.jobs=0"], env={"COLUMNS": "300"})
    assert bad.exit_code == 2 and "steps[0].jobs: must be >= 1, got 0" in bad.output
    assert "Traceback" not in bad.output
    good = CliRunner().invoke(app, ["plan", str(path)], env={"COLUMNS": "300"})
    assert good.exit_code == 0 and "its launches run up to 2 at a time (jobs: 2)" in good.output


# ------------------------------------------------------------------------------------------ the trainer benchmark
FAKE_BENCH_TRAIN = """
import json, sys
# bench_train.py's JSON: a list of rows, one per case, in no order a criterion may rely on; a failed case is a row
# with an "error" and makes the script exit 1
rows = [
    {"case": "m7c_125m_s2048_bf16_dense+graphs", "model": "dense", "mode": "graphs", "ranks": 1,
     "toks_per_s": 200000.0},
    {"case": "m7c_125m_s2048_bf16", "model": "nsa", "mode": "eager", "ranks": 1, "toks_per_s": 90000.0},
    {"case": "m7c_125m_s2048_bf16_dense", "model": "dense", "mode": "eager", "ranks": 1, "toks_per_s": 150000.0},
]
graphs = {"case": "m7c_125m_s2048_bf16+graphs", "model": "nsa", "mode": "graphs", "ranks": 1}
failed = "--fail" in sys.argv
rows.append({**graphs, "error": "CUDA error: an illegal memory access"} if failed
            else {**graphs, "toks_per_s": 120000.0})
open(sys.argv[sys.argv.index("--json") + 1], "w").write(json.dumps(rows))
sys.exit(1 if failed else 0)
"""


def test_the_trainer_criteria_find_each_models_fastest_row_by_its_fields(tmp_path):
    """gpu_kernels.yaml's train_bench criteria, on rows in another order and with a failed case."""
    repo = Path(__file__).resolve().parents[3]
    real = load_runbook(repo / "runbooks/gpu_kernels.yaml")
    assert real.step("train_bench").best == Best(by="model", field="toks_per_s", largest=True)
    assert real.step("train_bench").command[-2:] == ["--modes", "eager,graphs"]
    criteria = [c for c in real.acceptance if "train_bench" in c.expr.names]
    assert len(criteria) == 2
    (tmp_path / "fake_bench_train.py").write_text(FAKE_BENCH_TRAIN)
    runbook = {"name": "trainer", "phases": [{"name": "bench", "steps": [
        {"name": "train_bench", "kind": "bench", "command": ["fake_bench_train.py"],
         "best": {"by": "model", "max": "toks_per_s"}}]}],
        "acceptance": [{"name": c.name, "expr": c.expr.text, "severity": c.severity} for c in criteria]}
    path = tmp_path / "trainer.yaml"
    path.write_text(json.dumps(runbook))

    results = Runner(load_runbook(path, cwd=tmp_path), tmp_path / "run", RunOptions(cwd=tmp_path)).run()
    best = results["steps"]["train_bench"]["metrics"]["best"]
    assert (best["nsa"]["mode"], best["dense"]["mode"]) == ("graphs", "graphs")  # each model's fastest row
    assert [row["status"] for row in results["acceptance"]] == ["pass", "pass"]  # 120k >= 0.55 * 200k
    write_reports(tmp_path / "run", results)
    assert "| nsa | m7c_125m_s2048_bf16+graphs | graphs | nsa | 1 | 120,000.0 |" in \
        (tmp_path / "run/report.md").read_text()  # the report's table of each model's fastest row

    path.write_text(json.dumps({**runbook, "phases": [{"name": "bench", "steps": [
        {**runbook["phases"][0]["steps"][0], "command": ["fake_bench_train.py", "--fail"]}]}]}))
    results = Runner(load_runbook(path, cwd=tmp_path), tmp_path / "run2", RunOptions(cwd=tmp_path)).run()
    step = results["steps"]["train_bench"]
    assert step["status"] == "failed" and step["metrics"]["best"]["nsa"]["mode"] == "eager"  # the failed row is no best
    assert [row["status"] for row in results["acceptance"]] == ["fail", "warn"]  # 90k < 0.55 * 200k
