"""Kernel qualification without a GPU: the pytest step's process isolation (a test file that kills its own process
is one failure naming it, the other file's results still count), the sanitizer step with a fake compute-sanitizer
(one that reports an error, one that reports none, none at all: INCOMPLETE), the verdicts, the plan of
runbooks/gpu_kernels.yaml and h100_single.yaml on this CPU machine, the include that makes the first the second's
first phase (and that the two match), and the kernel driver nsa.attention.kernels.qualify under Triton's
interpreter."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_sanitizer import install as install_fake_sanitizer, path_without_real_sanitizer
from typer.testing import CliRunner

from validation import kinds
from validation.cli import EXIT_CODES, app
from validation.runbook.plan import describe, step_launches
from validation.report import write_reports
from validation.runbook.loader import RunbookError, load_runbook
from validation.execution.runner import RunOptions, Runner
from validation.kinds.pytest.progress import read_progress
from validation.kinds.pytest import isolated_files

REPO = Path(__file__).resolve().parents[3]
KERNEL_TEST_FILES = sorted([*(p.relative_to(REPO).as_posix() for p in (REPO / "tests/nsa/attention/kernels")
                              .glob("test_*.py")), "tests/nsa/attention/test_cuda.py"])

# ------------------------------------------------------------------------------------------ process isolation
PASSES = """
import pytest

def test_one():
    assert 1 + 1 == 2

def test_two():
    assert "a" * 2 == "aa"

@pytest.mark.skip(reason="not here")
def test_three():
    pass
"""
DIES = """
import os
import signal

def test_before():
    assert True

def test_kills_its_process():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_never_reached():
    assert True
"""
EXITS = """
import os

def test_exits():
    os._exit(134)
"""
ISOLATED = """
name: isolated
phases:
  - name: tests
    steps:
      - {name: suite, kind: pytest, isolate: file, tests: [suite_tests], timeout_s: 120}
acceptance:
  - {name: "tests pass", expr: "suite.failed == 0 and suite.errors == 0 and suite.passed > 0"}
"""


def test_each_file_in_its_own_process_a_death_is_one_failure_naming_its_file_and_test(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a directory in `tests` is expanded from the working directory, as `run` does
    (tmp_path / "suite_tests").mkdir()
    (tmp_path / "suite_tests" / "test_passes.py").write_text(PASSES)
    (tmp_path / "suite_tests" / "test_dies.py").write_text(DIES)
    (tmp_path / "suite_tests" / "test_exits.py").write_text(EXITS)
    (tmp_path / "isolated.yaml").write_text(ISOLATED)
    rb = load_runbook(tmp_path / "isolated.yaml", cwd=tmp_path)
    results = Runner(rb, tmp_path / "run", RunOptions(cwd=tmp_path)).run()

    step = results["steps"]["suite"]
    m = step["metrics"]
    by_file = {f["file"]: f for f in m["files"]}
    assert sorted(by_file) == ["suite_tests/test_dies.py", "suite_tests/test_exits.py", "suite_tests/test_passes.py"]
    dead, alive = by_file["suite_tests/test_dies.py"], by_file["suite_tests/test_passes.py"]
    exited = by_file["suite_tests/test_exits.py"]
    assert (exited["status"], exited["returncode"], exited["running"], exited["failed"], exited["total"]) == \
        ("died", 134, "suite_tests/test_exits.py::test_exits", 1, 1)
    assert exited["reason"].startswith("the process died: exit code 134, while running")
    # the dead file: the test that ran before it counts, the death is one failure naming the test that was running
    assert dead["status"] == "died" and dead["returncode"] == -11
    assert dead["running"] == "suite_tests/test_dies.py::test_kills_its_process"
    assert (dead["passed"], dead["failed"], dead["skipped"], dead["total"]) == (1, 1, 0, 2)
    assert "SIGSEGV" in dead["reason"] and "test_kills_its_process" in dead["reason"]
    # the other file ran in its own process: all of its results are there
    assert (alive["status"], alive["passed"], alive["failed"], alive["skipped"]) == ("passed", 2, 0, 1)
    assert (m["passed"], m["failed"], m["skipped"], m["errors"], m["total"]) == (3, 2, 1, 0, 6)
    assert (m["files_failed"], m["died"]) == (2, 2)
    assert step["status"] == "failed"
    assert "2 of 3 test files failed: suite_tests/test_dies.py (" in step["reason"]
    assert "while running suite_tests/test_dies.py::test_kills_its_process" in step["reason"]
    assert results["verdict"] == "NO-GO" and "criteria failed: tests pass" in results["verdict_reason"]
    # each file's own JUnit / progress record / log in its own directory
    assert (tmp_path / "run/suite/suite_tests_test_passes.py/pytest.xml").is_file()
    assert not (tmp_path / "run/suite/suite_tests_test_dies.py/pytest.xml").exists()
    assert "suite/suite_tests_test_dies.py/progress.jsonl" in step["artifacts"]
    write_reports(tmp_path / "run", results)
    md = (tmp_path / "run" / "report.md").read_text()
    assert "| suite_tests/test_dies.py | died | 1 | 1 | 0 | 0 | 2 |" in md
    assert "| suite_tests/test_passes.py | passed | 2 | 0 | 1 | 0 | 3 |" in md
    # the step's time column is the files' sum, and says so (the GPU run's 9m 41s beside a 3m 00s step)
    assert "| Passed | Failed | Skipped | Errors | Total | Files' time (sum; with jobs > 1 more than the step took) |" in md


def test_isolated_files_expands_directories_and_groups_node_ids(tmp_path):
    (tmp_path / "t" / "sub").mkdir(parents=True)
    for name in ("t/test_b.py", "t/test_a.py", "t/sub/x_test.py", "t/helper.py", "u.py"):
        (tmp_path / name).write_text("")
    got = isolated_files(["t", "u.py::test_x", "u.py::test_y", "-x"], cwd=tmp_path)
    assert got == [("t/sub/x_test.py", ["t/sub/x_test.py", "-x"]), ("t/test_a.py", ["t/test_a.py", "-x"]),
                   ("t/test_b.py", ["t/test_b.py", "-x"]), ("u.py", ["u.py::test_x", "u.py::test_y", "-x"])]
    assert isolated_files(["u.py::test_x", "u.py"], cwd=tmp_path) == [("u.py", ["u.py"])]


def test_progress_record_survives_a_line_cut_short(tmp_path):
    path = tmp_path / "progress.jsonl"
    path.write_text('{"event": "start", "nodeid": "a"}\n'
                    '{"event": "report", "nodeid": "a", "when": "setup", "outcome": "passed"}\n'
                    '{"event": "report", "nodeid": "a", "when": "call", "outcome": "failed"}\n'
                    '{"event": "report", "nodeid": "a", "when": "teardown", "outcome": "passed"}\n'
                    '{"event": "start", "nodeid": "b"}\n'
                    '{"event": "report", "nodeid": "b", "when": "setup", "outcome": "failed"}\n'
                    '{"event": "report", "nodeid": "b", "when": "teardown", "outcome": "passed"}\n'
                    '{"event": "start", "nodeid": "c"}\n{"event": "rep')
    assert read_progress(path) == ({"a": "failed", "b": "error"}, "c")
    assert read_progress(tmp_path / "missing.jsonl") == ({}, None)


# ------------------------------------------------------------------------------------------ the sanitizer step
PROGRAM = """
import os, sys
print("program", sys.argv[1:], "caching off:", os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"))
sys.exit(1 if "fails" in sys.argv else 0)
"""
SANITIZED = """
name: sanitized
phases:
  - name: memcheck
    steps:
      - name: check
        kind: sanitizer
        command: [{program}, --method, tiled]
        grids:
          default: {{dtype: [bf16], seq-len: [1024, 2048]}}
          other: {{dtype: [fp32, fails], seq-len: [512]}}
        timeout_s: 60
acceptance:
  - {{name: "memcheck clean", expr: "check.errors == 0 and check.cases_clean == check.cases"}}
"""


@pytest.fixture
def sanitizer():
    """validation.kinds.sanitizer, imported after the registry has loaded every kind in its own order (the
    README's table of kinds follows that order)."""
    kinds.names()
    return importlib.import_module("validation.kinds.sanitizer")


@pytest.fixture
def sanitized(tmp_path, monkeypatch, sanitizer):
    """(runbook path, directory to put a fake compute-sanitizer in): no real one is found, PATH gets the directory."""
    monkeypatch.setattr(sanitizer, "FALLBACK_DIRS", ())
    monkeypatch.delenv("CUDA_HOME", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir) + os.pathsep + path_without_real_sanitizer())
    (tmp_path / "program.py").write_text(PROGRAM)
    path = tmp_path / "sanitized.yaml"
    path.write_text(SANITIZED.format(program=tmp_path / "program.py"))
    return path, bin_dir


def test_sanitizer_reports_an_error_case_by_case_and_the_run_is_no_go(sanitized, tmp_path):
    path, bin_dir = sanitized
    fake = install_fake_sanitizer(bin_dir)
    rb = load_runbook(path, cwd=tmp_path)
    specs = step_launches(rb.step("check"))
    assert [s.label for s in specs] == ["dtype=bf16 seq-len=1024", "dtype=bf16 seq-len=2048"]
    assert specs[0].argv == [str(fake), "--tool", "memcheck", "--target-processes", "application-only",
                             "--launch-timeout", "0", sys.executable, str(tmp_path / "program.py"), "--method", "tiled", "--dtype", "bf16",
                             "--seq-len", "1024"]
    assert specs[0].env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"

    results = Runner(rb, tmp_path / "run", RunOptions(cwd=tmp_path)).run()
    step = results["steps"]["check"]
    m = step["metrics"]
    assert (m["cases"], m["cases_clean"], m["errors"], m["tool"], m["sanitizer"]) == (2, 1, 1, "memcheck", str(fake))
    clean, bad = m["by_case"]
    assert (clean["status"], clean["errors"], clean["returncode"], clean["first_error"]) == ("clean", 0, 0, None)
    assert (bad["case"], bad["dtype"], bad["seq-len"], bad["status"], bad["errors"]) == \
        ("dtype=bf16 seq-len=2048", "bf16", "2048", "errors", 1)
    assert bad["first_error"] == ("Invalid __global__ read of size 4 bytes | at fake_topk_kernel+0x4c80 in "
                                  "fake_selection.py:223 | by thread (0,0,0) in block (60,0,0) | Address 0x7f00 is "
                                  "out of bounds")
    assert step["status"] == "failed"
    assert step["reason"].startswith("1 of 2 cases not clean (memcheck: 1 in all): dtype=bf16 seq-len=2048: 1 error "
                                     "(Invalid __global__ read")
    log = (tmp_path / "run/check/dtype_bf16_seq-len_1024/stdout.log").read_text()
    assert "'--seq-len', '1024'] caching off: 1" in log  # the program ran, with the caching allocator off
    assert results["acceptance"][0]["status"] == "fail" and results["verdict"] == "NO-GO"
    write_reports(tmp_path / "run", results)
    md = (tmp_path / "run" / "report.md").read_text()
    assert "1 of 2 cases clean; errors in all: 1." in md
    assert "| dtype=bf16 seq-len=2048 | errors | 1 |" in md and "at fake_topk_kernel+0x4c80" in md
    assert ("- **compute-sanitizer memcheck (check)**: 1 of 2 cases clean — step `check`, grid default, 1 errors; "
            "first not clean: dtype=bf16 seq-len=2048") in md  # the executive summary


def test_sanitizer_clean_grid_is_go_and_a_failing_program_is_not_clean(sanitized, tmp_path, monkeypatch):
    path, _ = sanitized
    monkeypatch.setenv("PATH", path_without_real_sanitizer())  # found under $CUDA_HOME/bin instead
    fake = install_fake_sanitizer(tmp_path / "cuda" / "bin")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    rb = load_runbook(path, ["steps.check.grids.default.seq-len=[1024]"], cwd=tmp_path)
    results = Runner(rb, tmp_path / "run", RunOptions(cwd=tmp_path)).run()
    m = results["steps"]["check"]["metrics"]
    assert (m["cases"], m["cases_clean"], m["errors"], m["sanitizer"]) == (1, 1, 0, str(fake))
    assert results["steps"]["check"]["status"] == "passed" and results["verdict"] == "GO"

    rb = load_runbook(path, ["steps.check.grid=other"], cwd=tmp_path)
    results = Runner(rb, tmp_path / "run2", RunOptions(cwd=tmp_path)).run()
    by_case = {r["case"]: r for r in results["steps"]["check"]["metrics"]["by_case"]}
    assert by_case["dtype=fp32 seq-len=512"]["status"] == "clean"
    assert (by_case["dtype=fails seq-len=512"]["status"], by_case["dtype=fails seq-len=512"]["errors"]) == ("failed", 0)
    assert "0 errors, but the program failed (exit code 1" in results["steps"]["check"]["reason"]
    assert results["verdict"] == "NO-GO"


def test_without_a_sanitizer_the_run_is_incomplete_naming_why_never_go(sanitized, tmp_path):
    path, _ = sanitized
    rb = load_runbook(path, cwd=tmp_path)
    results = Runner(rb, tmp_path / "run", RunOptions(cwd=tmp_path)).run()
    step = results["steps"]["check"]
    assert step["status"] == "skipped" and step["reason"].startswith("compute-sanitizer not found (looked on PATH")
    assert results["acceptance"][0]["status"] == "skipped"
    assert results["verdict"] == "INCOMPLETE" and EXIT_CODES["INCOMPLETE"] == 3
    assert "memcheck clean" in results["verdict_reason"] and "compute-sanitizer not found" in results["verdict_reason"]
    plan = CliRunner().invoke(app, ["plan", str(path)], env={"COLUMNS": "300"})  # `plan` says so before a run
    assert plan.exit_code == 0 and "SKIPPED here: compute-sanitizer not found (looked on PATH" in plan.output


def test_sanitizer_logs_read_case_by_case(sanitizer):
    assert sanitizer.read_case(Path("/nonexistent/stdout.log"), "failed", -9, "killed by SIGKILL").status == \
        "no summary"
    assert sanitizer.read_case(Path("/nonexistent/stdout.log"), "timeout", None, "timed out").status == "timeout"
    text = "x\n========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 3 errors\n"
    assert sanitizer.first_error(text) is None
    assert sanitizer.cases({"a": ["1", "2"], "b": ["x"]}) == [{"a": "1", "b": "x"}, {"a": "2", "b": "x"}]


def test_racecheck_logs_are_read_by_their_own_summary(sanitizer, tmp_path):
    """racecheck prints no ERROR SUMMARY: its "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)" is the
    summary, each hazard (error or warning) counted; without it every racecheck case read "no summary"."""
    log = tmp_path / "stdout.log"
    clean = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    log.write_text(clean)
    case = sanitizer.read_case(log, "ok", 0, "exit 0")
    assert (case.status, case.errors) == ("clean", 0)
    log.write_text("========= COMPUTE-SANITIZER\n"
                   "========= Error: Race reported between Write access at k+0x10 in a.py:3\n"
                   "=========     and Read access at k+0x20 in a.py:4 [4 hazards]\n"
                   "========= \n"
                   "========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n")
    case = sanitizer.read_case(log, "failed", 1, "exit 1")
    assert (case.status, case.errors) == ("errors", 3)
    assert case.first_error.startswith("Error: Race reported between Write access at k+0x10")


def test_sanitizer_keys_are_checked(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SANITIZED.format(program="p.py").replace("default: {dtype: [bf16], seq-len: [1024, 2048]}",
                                                            "default: {--dtype: [bf16]}"))
    with pytest.raises(RunbookError, match=r"bad.yaml:10: phases\[0\].steps\[0\].grids.default.--dtype: flags are "
                                           r"written without '--'"):
        load_runbook(bad)
    good = tmp_path / "good.yaml"
    good.write_text(SANITIZED.format(program="p.py"))
    with pytest.raises(RunbookError, match=r"grid: 'huge' is not one of default, other"):
        load_runbook(good, ["steps.check.grid=huge"])


# ------------------------------------------------------------------------------------------ the runbooks
def test_gpu_kernels_plans_on_a_cpu(cli):
    proc = cli("plan", "runbooks/gpu_kernels.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "kernels / memcheck_tiled (sanitizer)  SKIPPED here: needs 1 GPU(s), found 0" in proc.stdout
    rb = load_runbook(REPO / "runbooks/gpu_kernels.yaml", cwd=REPO)
    assert [s.name for s in rb.steps()] == ["snapshot", "kernel_tests", "kernel_tests_fused", "memcheck_tiled",
                                            "memcheck_fused", "layer_bench", "layer_profile", "train_bench"]
    tests = step_launches(rb.step("kernel_tests"))
    assert sorted(s.label for s in tests) == KERNEL_TEST_FILES  # one process per file
    fused_tests = step_launches(rb.step("kernel_tests_fused"))  # the fused selection's tests, asked for, apart
    assert [s.env.get("NSA_TEST_FUSED_SELECTION") for s in fused_tests] == ["1"]
    tiled, fused = step_launches(rb.step("memcheck_tiled")), step_launches(rb.step("memcheck_fused"))
    expected = {f"dtype={t} seq-len={s} hpg={h}" for t in ("bf16", "fp16", "fp32") for s in (1024, 2048, 65536)
                for h in (1, 6)}
    assert {s.label for s in tiled} == expected == {s.label for s in fused}
    assert all(s.argv[s.argv.index("-m") + 1:][:3] == ["nsa.attention.kernels.qualify", "--method", "tiled"]
               for s in tiled)
    assert all("fused" in s.argv for s in fused)
    # fp32 cases sanitise the TF32 products (the IEEE ones spill; the runbook says why)
    assert all(s.argv[s.argv.index("--fp32-dots") + 1] == "tf32" for s in tiled + fused)
    deep = load_runbook(REPO / "runbooks/gpu_kernels.yaml", ["steps.memcheck_tiled.grid=deep"])
    assert len(step_launches(deep.step("memcheck_tiled"))) == 3 * 9 * 7
    assert [c.severity for c in rb.acceptance] == ["fail"] * 6 + ["warn", "warn"]


def test_h100_single_plans_on_a_cpu_with_gpu_kernels_as_its_first_phase():
    rb = load_runbook(REPO / "runbooks/h100_single.yaml", cwd=REPO)
    assert [p.name for p in rb.phases[:3]] == ["kernels", "trainer_bench", "preflight"]
    rows = describe(rb)
    assert [r["step"] for r in rows[:8]] == ["snapshot", "kernel_tests", "kernel_tests_fused", "memcheck_tiled",
                                             "memcheck_fused", "layer_bench", "layer_profile", "train_bench"]


def test_h100_single_includes_gpu_kernels_and_the_two_match():
    """The include is the one source: every step of gpu_kernels.yaml runs in h100_single.yaml with the same kind,
    options, requirements, timeout and command; the only difference is h100_single's defaults env added to it."""
    gk = load_runbook(REPO / "runbooks/gpu_kernels.yaml")
    h1 = load_runbook(REPO / "runbooks/h100_single.yaml")
    assert [(p.name, p.title, [s.name for s in p.steps]) for p in gk.phases] == \
        [(p.name, p.title, [s.name for s in p.steps]) for p in h1.phases[:len(gk.phases)]]
    for mine in gk.steps():
        theirs = h1.step(mine.name)
        assert (theirs.kind, theirs.title, theirs.phase, theirs.options, theirs.requires,
                theirs.launch.timeout_s) == \
            (mine.kind, mine.title, mine.phase, mine.options, mine.requires, mine.launch.timeout_s), mine.name
        for a, b in zip(step_launches(mine), step_launches(theirs), strict=True):
            assert (a.argv, a.dir, a.label, a.timeout_s) == (b.argv, b.dir, b.label, b.timeout_s)
            assert b.env == {**h1.defaults.env, **a.env}, mine.name
    assert [(c.name, c.expr.text, c.target, c.severity) for c in gk.acceptance] == \
        [(c.name, c.expr.text, c.target, c.severity) for c in h1.acceptance[:len(gk.acceptance)]]
    assert len(h1.acceptance) > len(gk.acceptance)  # h100_single's own criteria follow
    # the kernel tests now run only in the included phase
    assert not any("kernels" in t or "test_cuda" in t for t in h1.step("sanity_tests").tests)


def test_includes_errors_name_their_file_and_line(tmp_path):
    inner = tmp_path / "inner.yaml"
    inner.write_text("name: inner\nrequirements: {gpus: 1}\ndefaults: {timeout_s: 77, env: {A: '1'}}\nphases:\n"
                     "  - name: one\n    steps:\n      - {name: t, kind: pytest, tests: [x.py]}\n"
                     "      - {name: b, kind: bench, command: [x.py]}\n"
                     "acceptance:\n  - {name: inner ok, expr: 't.passed > 0'}\n")
    outer = tmp_path / "outer.yaml"
    outer.write_text("name: outer\ndefaults: {timeout_s: 5, env: {A: '2', B: '3'}}\nphases:\n"
                     "  - include: inner.yaml\n  - name: two\n    steps:\n"
                     "      - {name: u, kind: pytest, tests: [y.py]}\n"
                     "acceptance:\n  - {name: outer ok, expr: 'u.passed > 0'}\n")
    rb = load_runbook(outer, ["steps.t.timeout_s=9"])
    assert [p.name for p in rb.phases] == ["one", "two"] and [c.name for c in rb.acceptance] == ["inner ok", "outer ok"]
    t, b, u = rb.step("t"), rb.step("b"), rb.step("u")
    assert (t.launch.timeout_s, t.launch.env) == (9.0, {"A": "1", "B": "3"})  # --set reaches an included step
    assert (b.launch.timeout_s, b.requires.gpus, u.launch.timeout_s) == (77.0, 1, 5.0)

    inner.write_text(inner.read_text().replace("kind: bench", "kind: bnech"))
    with pytest.raises(RunbookError, match=r"inner.yaml:8: phases\[0\].steps\[1\].kind: 'bnech' is not one of"):
        load_runbook(outer)
    outer.write_text(outer.read_text().replace("include: inner.yaml", "include: nowhere.yaml"))
    with pytest.raises(RunbookError, match=r"outer.yaml:4: phases\[0\].include: nowhere.yaml: no such runbook"):
        load_runbook(outer)
    outer.write_text(outer.read_text().replace("include: nowhere.yaml", "include: outer.yaml"))
    with pytest.raises(RunbookError, match=r"cycle: .*outer.yaml -> .*outer.yaml"):
        load_runbook(outer)
    outer.write_text(outer.read_text().replace("- include: outer.yaml", "- {include: inner.yaml, title: x}"))
    with pytest.raises(RunbookError, match=r"outer.yaml:4: phases\[0\].title: an include item has only"):
        load_runbook(outer)


# ------------------------------------------------------------------------------------------ the kernel driver
def _qualify(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "nsa.attention.kernels.qualify", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_qualify_runs_every_kernel_forward_and_backward_under_the_interpreter():
    proc = _qualify("--device", "cpu", "--dtype", "fp32", "--seq-len", "96", "--hpg", "2", "--groups", "1",
                    "--d-k", "32", "--l-sel", "32", "--n-sel", "2", "--w", "48")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("qualify: ok ")]
    assert [line.split()[2] for line in lines] == ["cmp", "win", "band", "select", "index", "sel_kv", "sel_query"]
    assert all("forward, backward" in line for i, line in enumerate(lines) if i not in (3, 4))
    assert "forward (tiled)" in lines[3] and "qualify: all 7 kernel(s) ran" in proc.stdout
    assert "Triton build, equal to the torch build" in lines[4]
    assert "qualify: fp32 (ieee dots) B=1 S=96" in proc.stdout  # PyTorch's default precision: IEEE products


def test_qualify_refuses_a_bad_argument_in_one_line():
    proc = _qualify("--hpg", "40")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("error: --hpg must be 1..32 (the Triton kernels' limit), "
                                                         "got 40")
