"""`pytest`: named tests (paths or node ids) run with pytest; the verdict from its JUnit counts.

Own keys: `tests: [paths or node ids]` (required), `pytest_args: [...]` (options that choose pytest's output files
are refused: the JUnit file goes to RUN_DIR/<step>/pytest.xml), `isolate: none | file` (default none), `jobs: N`
(with isolate: file, how many test files run at a time; default 1).
Launch keys: env, timeout_s, launcher.

isolate: none runs every test in one pytest process. isolate: file runs each test file in its own process (a
directory in `tests` stands for its test_*.py / *_test.py files, found from the working directory, sorted; node ids
of one file run together; an entry starting with "-" is passed to every process), so that a process that dies (a
CUDA illegal memory access, SIGSEGV, os._exit, its timeout: timeout_s is per file) is one failure naming its file,
and the test that was running when the plugin validation.kinds.pytest.progress recorded it, while every other
file's results still count. Each file's JUnit, progress record and log go to RUN_DIR/<step>/<file as a name>/.
A file whose process died is counted from its progress record (the tests that finished before it died) plus one
failure.

jobs: N (isolate: file only) runs up to N files' processes at a time, in plan order (the files sorted as above),
each starting as soon as one ends. The results are those of a run one after another: one record per file in plan
order, each file in its own process and directory, a death one failure naming its file, results.json saved as each
file ends (the files that ended so far, in plan order). A Ctrl-C / SIGTERM ends every running process. The
processes share the machine: their durations (duration_s) are longer than alone (e.g. Triton compiles compete for
the cores), and a test that measures time should not run beside others.

Metrics: {"passed", "failed", "skipped", "errors", "total", "duration_s"}; with isolate: file also "files" (one
record per file: file, status passed | failed | died | no tests, the counts, started and ended (seconds since the
epoch), duration_s, returncode, running: the test that was running when the process died, reason),
"files_failed" (files with a failure, an error or a death) and "died" (files whose process died); "duration_s" is
the sum over the files (with jobs > 1, more than the step took). No test run, a failure, an error or a death fails
the step; so does an exit code other than 0 and 5 (no tests collected) with a JUnit report that counts no failure:
exit code 1 with every test passed is a plugin that failed the session (pytest-cov's --cov-fail-under adds to
pytest's count of failed tests), 2 to 4 an interruption, an internal or a usage error.

Options: the keys above. Result: the step record, its metrics a Metrics (the counts; with isolate: file a
FileResult per file). The package is validation.kinds.pytest: an absolute `import pytest` anywhere still finds pytest
itself (nothing puts validation/kinds on sys.path); progress.py is the plugin an isolated file's process loads.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from validation import kinds
from validation.launch.diagnosis import _exit_text as exit_text
from validation.launch.local import set_aside
from validation.formatting import first_of, fmt_duration, fmt_num
from validation.runbook.schema import str_list, typed
from validation.kinds.pytest.progress import OPTION as PROGRESS_OPTION
from validation.kinds.pytest.progress import read_progress
from validation.launch.spec import LaunchResult, LaunchSpec, safe_name
from validation.kinds.base import (COMMAND_LAUNCH_KEYS, EachEnded, StepKind, command_launch, launch_each, run_path,
                                   step_dir)
from validation.kinds.blocks import Block, Column, Paragraph, Table
from validation.results.codec import absent, blank
from validation.results.run import Step as StepRecord


@dataclasses.dataclass(frozen=True)
class Options:
    tests: list[str]  # paths or node ids (an entry starting with "-" goes to pytest as is)
    pytest_args: list[str] = dataclasses.field(default_factory=list)
    isolate: str = "none"  # or "file": a process per test file
    jobs: int = 1  # test files' processes at a time (isolate: file)


@dataclasses.dataclass(frozen=True)
class FileResult:
    """One test file run in its own process (isolate: file)."""
    file: str
    status: str  # passed, failed, no tests, died
    returncode: int | None = None
    running: str | None = None  # the test that was running when the process died
    duration_s: float | None = None
    passed: int | None = None  # None: not known (a damaged record)
    failed: int | None = None
    skipped: int | None = None
    errors: int | None = None
    total: int | None = None
    reason: str | None = None
    started: float | None = absent()  # epoch seconds (jobs > 1: when the files ran side by side)
    ended: float | None = absent()


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's metrics: the counts of the whole run, and with isolate: file each file's record."""
    passed: int | None = None  # None: not known (a damaged record; a run writes every count)
    failed: int | None = None
    skipped: int | None = None
    errors: int | None = None
    total: int | None = None
    duration_s: float | None = absent()  # the JUnit report's time; with isolate: file the files' sum
    files: list[FileResult] = absent([])
    files_failed: int | None = absent()
    died: int | None = absent()


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A pytest step's record: its metrics the counts (None: {}, a step that never ran)."""
    metrics: Metrics | None = blank()


# pytest options that choose where pytest writes: nsa-validate puts pytest.xml under RUN_DIR/<step> itself, and
# --basetemp would even let pytest empty a directory outside it (pytest refuses abbreviated options).
RESERVED_PYTEST_ARGS = ("--junitxml", "--junit-xml", "--basetemp", "--result-log", "--resultlog", "--debug",
                        PROGRESS_OPTION)
ISOLATE = ("none", "file")
COUNTS = ("passed", "failed", "skipped", "errors", "total")
# pytest's exit codes that mean it ran to its end (0 all passed, 1 some failed, 2 interrupted or a collection
# error, 3 internal error, 4 usage error, 5 no tests collected); anything else, or a signal, is a process that died.
PYTEST_EXIT_CODES = range(0, 6)


class Pytest(StepKind):
    name = "pytest"
    listing = 50
    summary = "named tests with JUnit counts; `isolate: file` runs each test file in its own process"
    keys = ("tests", "pytest_args", "isolate", "jobs")
    metrics = ("passed", "failed", "skipped", "errors", "total", "duration_s", "files.<i>.*", "files_failed", "died")
    launch_keys = COMMAND_LAUNCH_KEYS
    host_only = True  # tests run on any machine (CUDA tests skip themselves); `requires:` makes one need GPUs
    result_type = Result

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        tests = str_list(raw.get("tests"), path + ("tests",), ctx)
        args = str_list(raw.get("pytest_args"), path + ("pytest_args",), ctx)
        for key, values in (("tests", tests), ("pytest_args", args)):  # a "-..." test entry goes to pytest as is
            for i, arg in enumerate(values):
                if arg.split("=", 1)[0] in RESERVED_PYTEST_ARGS:
                    raise ctx.error(path + (key, i), f"{arg!r}: pytest options that choose output files or "
                                                     "directories are set by nsa-validate itself (outputs go under "
                                                     "RUN_DIR/<step>)")
        if not tests:
            raise ctx.error(path + ("tests",), "a pytest step needs tests: [paths or node ids]")
        isolate = typed(raw.get("isolate", "none"), str, path + ("isolate",), ctx, choices=ISOLATE)
        jobs = typed(raw.get("jobs", 1), int, path + ("jobs",), ctx, minimum=1)
        if jobs > 1 and isolate != "file":
            raise ctx.error(path + ("jobs",), f"jobs: {jobs} runs test files side by side: it needs isolate: file "
                                              "(isolate: none runs every test in one process)")
        return Options(tests=tests, pytest_args=args, isolate=isolate, jobs=jobs)

    def concurrency(self, step) -> int:
        return step.jobs

    def input_files(self, step):
        # a node id (path::test) names its file; -k / -m selections are pytest_args, not paths
        return [(("tests", i), test.split("::", 1)[0]) for i, test in enumerate(step.tests)
                if not test.startswith("-")]

    def launches(self, step, winners, run_dir):
        if step.isolate == "file":
            return [self._file_launch(step, file, entries, run_dir) for file, entries in isolated_files(step.tests)]
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *step.tests,
                "--junitxml", run_path(run_dir, f"{step.name}/pytest.xml"), *step.pytest_args]
        return [command_launch(step, argv, run_dir)]

    @staticmethod
    def _file_launch(step, file: str, entries: list[str], run_dir):
        rel = f"{step.name}/{safe_name(file)}"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "-p", "validation.kinds.pytest.progress", PROGRESS_OPTION, run_path(run_dir, f"{rel}/progress.jsonl"),
                *entries, "--junitxml", run_path(run_dir, f"{rel}/pytest.xml"), *step.pytest_args]
        spec = command_launch(step, argv, run_dir, label=file)
        # unbuffered: the log holds every line written before a process dies
        return dataclasses.replace(spec, step_dir=step_dir(run_dir, rel), env={**spec.env, "PYTHONUNBUFFERED": "1"})

    def run(self, options: Options, ctx) -> Result:
        if options.isolate == "file":
            return self._run_isolated(options, ctx)
        spec = ctx.launches[0]
        xml = ctx.run_dir / spec.dir / "pytest.xml"
        set_aside_outputs(ctx.run_dir / spec.dir)
        lr = ctx.launch(spec, 0, 1)
        junit = read_junit(xml)
        counts = junit or Metrics(0, 0, 0, 0, 0)
        ended = lr.status in ("ok", "failed") and lr.returncode in PYTEST_EXIT_CODES
        if lr.status in ("timeout", "hang", "error", "interrupted"):
            status, reason = lr.status, lr.reason
        elif not ended:  # a signal or an exit code pytest never uses: whatever its report says, the process died
            status, reason = "failed", (f"the process died: {exit_text(lr.returncode)}"
                                        + (f" (its JUnit report: {_count_text(counts)})" if junit is not None
                                           else "; no JUnit report"))
        elif junit is None:
            status, reason = "failed", f"pytest wrote no JUnit report ({xml.name} missing or unreadable): {lr.reason}"
        elif counts.failed or counts.errors:
            status, reason = "failed", _count_text(counts)
        elif lr.returncode not in (0, 5):  # tests failed with none counted (a plugin failed the session, e.g.
            # pytest-cov's --cov-fail-under adds to session.testsfailed), interrupted, internal or usage error
            status, reason = "failed", (f"pytest ended with exit code {lr.returncode} ({lr.reason}); "
                                        f"{_count_text(counts)}")
        elif counts.total == 0:
            status, reason = "failed", f"no tests ran ({lr.reason})"
        else:
            status, reason = "passed", None
        return Result(status=status, reason=reason, metrics=counts, artifacts=[ctx.rel(xml)])

    def _run_isolated(self, options: Options, ctx) -> Result:
        """Each test file in its own process (up to options.jobs at a time); the record is that of a run one after
        another: the files in plan order, the excerpt (and, when stopped, the command) of the last in plan order."""
        launches = ctx.launches
        for spec in launches:
            set_aside_outputs(ctx.run_dir / spec.dir)

        def partial(each: EachEnded) -> Result:
            """The files that ended, in plan order: their metrics, JUnit files and progress records."""
            files = [ctx.run_dir / e.spec.dir for e in each.ended if e.record is not None]
            return Result(metrics=isolated_metrics(each.records),
                          artifacts=[ctx.rel(d / name) for d in files for name in ("pytest.xml", "progress.jsonl")
                                     if (d / name).is_file()],
                          excerpt=each.excerpt)

        def collect(i: int, spec: LaunchSpec, lr: LaunchResult) -> FileResult:
            now = time.time()
            return file_result(spec.label, ctx.run_dir / spec.dir, lr.status, lr.returncode, lr.reason,
                               lr.duration_s, started=round(now - lr.duration_s, 3), ended=round(now, 3))

        each = launch_each(ctx, options.jobs, collect, partial)
        record = partial(each)
        stopped = each.interrupted(record)
        if stopped is not None:
            return stopped
        files = each.records
        m = record.metrics or Metrics()
        command = [launches[0].argv[0], "-m", "pytest", f"<each of {len(launches)} files>"] if launches else None
        bad = [f for f in files if f.status in ("failed", "died")]
        if m.total == 0 and not bad:
            status, reason = "failed", f"no tests ran in any of {len(files)} file(s)"
        elif bad:
            shown = first_of((f"{f.file} ({f.reason})" for f in bad), 4)
            status, reason = "failed", (f"{len(bad)} of {len(files)} test files failed: {shown}; "
                                        f"{m.failed} failed, {m.errors} errors of {m.total}")
        else:
            status, reason = "passed", None
        return dataclasses.replace(record, status=status, reason=reason, command=command)

    def blocks(self, result: Result) -> list[Block]:
        """The counts of the whole step, then (a test file per process) one row per file."""
        m = result.metrics or Metrics()
        counts = tuple(Column(k.capitalize(), numeric=True) for k in COUNTS)
        last = "Files' time (sum; with jobs > 1 more than the step took)" if m.files else "Duration"
        out: list[Block] = [Table((*counts, Column(last, numeric=True)),
                                  [(*map(fmt_num, _counts(m)), fmt_duration(m.duration_s))])]
        if m.files:
            out += [Paragraph("Each test file in its own process:"),
                    Table((Column("File"), Column("Result"), *counts, Column("Duration", numeric=True), Column("Note")),
                          [(str(f.file), str(f.status), *map(fmt_num, _counts(f)), fmt_duration(f.duration_s),
                            str(f.reason or "")) for f in m.files])]
        return out


def _count_text(counts: Metrics) -> str:
    return f"{counts.failed} failed, {counts.errors} errors of {counts.total}"


def set_aside_outputs(directory: Path) -> None:
    """Rename what an earlier attempt of the step left in a launch's directory (its JUnit file and progress record:
    the step run again by --resume or --rerun) before the launch, so that a process that writes none is never judged
    by the old ones; the old files are kept (pytest.prev1.xml, ...)."""
    for name in ("pytest.xml", "progress.jsonl"):
        set_aside(directory / name, "prev")


def _counts(r: Metrics | FileResult) -> tuple:
    return r.passed, r.failed, r.skipped, r.errors, r.total


def isolated_files(tests: list[str], cwd: Path | None = None) -> list[tuple[str, list[str]]]:
    """(file, the arguments its process gets) for each test file of `tests`, in order: a directory stands for its
    test_*.py and *_test.py files (recursively, sorted), node ids of one file go together, an entry starting with
    "-" goes to every file. Paths relative to `cwd` (default: the working directory)."""
    base = Path.cwd() if cwd is None else Path(cwd)
    shared = [t for t in tests if t.startswith("-")]
    by_file: dict[str, list[str]] = {}
    for test in tests:
        if test.startswith("-"):
            continue
        path = test.split("::", 1)[0]
        full = Path(path) if Path(path).is_absolute() else base / path
        if "::" not in test and full.is_dir():
            found = sorted({p for pattern in ("test_*.py", "*_test.py") for p in full.rglob(pattern)})
            for p in found:
                name = str(Path(path) / p.relative_to(full))
                by_file.setdefault(name, [name])
            continue
        entries = by_file.setdefault(path, [])
        if path in entries:  # the whole file is already listed: a node id adds nothing
            continue
        entries[:] = [path] if "::" not in test else entries + [test]
    return [(file, entries + shared) for file, entries in by_file.items()]


def file_result(file: str, directory: Path, status: str, returncode: int | None, reason: str,
                duration_s: float, **times: float) -> FileResult:
    """One test file's record (see the module docstring) from its JUnit file, its progress record and how its
    process ended (the LaunchResult's status, returncode and reason)."""
    junit = read_junit(directory / "pytest.xml")
    ended = status in ("ok", "failed") and returncode in PYTEST_EXIT_CODES
    base = FileResult(file=file, status="", returncode=returncode, duration_s=round(duration_s, 3), **times)
    if junit is not None and ended:
        counts = junit
        if returncode not in (0, 5) and not (junit.failed or junit.errors):
            # exit code 1 with no failure counted (a plugin failed the session, e.g. pytest-cov's --cov-fail-under),
            # interrupted, internal or usage error: no test result says so
            counts = dataclasses.replace(junit, errors=junit.errors + 1, total=junit.total + 1)
        bad = counts.failed or counts.errors
        return dataclasses.replace(
            base, passed=counts.passed, failed=counts.failed, skipped=counts.skipped, errors=counts.errors,
            total=counts.total, status="failed" if bad else "no tests" if counts.total == 0 else "passed",
            reason=f"{counts.failed} failed, {counts.errors} errors of {counts.total}" if bad else None)
    outcomes, running = read_progress(directory / "progress.jsonl")
    died = not ended  # a signal, an exit code pytest never uses, or the launch's timeout
    how = (reason if status in ("timeout", "hang", "error") else f"the process died: {exit_text(returncode)}" if died
           else f"pytest wrote no JUnit report: {reason}")
    values = list(outcomes.values())
    return dataclasses.replace(
        base, passed=values.count("passed"), failed=values.count("failed") + 1,  # the death itself
        skipped=values.count("skipped"), errors=values.count("error"), total=len(outcomes) + 1,
        status="died" if died else "failed", running=running,
        reason=f"{how}" + (f", while running {running}" if running else ", outside any test")
               + f"; {len(outcomes)} test(s) finished before")


def isolated_metrics(files: list[FileResult]) -> Metrics:
    return Metrics(*(sum(getattr(f, k) or 0 for f in files) for k in COUNTS),
                  duration_s=round(sum(f.duration_s or 0.0 for f in files), 3), files=list(files),
                  files_failed=sum(f.status in ("failed", "died") for f in files),
                  died=sum(f.status == "died" for f in files))


def junit_counts(path: Path) -> Metrics:
    """Counts of a JUnit XML file; all zeros when it is missing or unreadable."""
    return read_junit(path) or Metrics(0, 0, 0, 0, 0)


def read_junit(path: Path) -> Metrics | None:
    """Counts and duration of a JUnit XML file, or None when it is missing or unreadable (cut off, or a count that is
    not a number). The counts are pytest's summary line's (xfailed among the skipped, xpassed among the passed): a
    test whose call failed and whose teardown then raised is one failure and one error, and pytest's JUnit writer
    lists it as two testcases but counts it once in `tests` (its cnt_double_fail_tests); counted from the attributes
    alone, such a test left the passed count one short (-1 for a run of that one test)."""
    try:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        total = sum(int(s.get("tests", 0)) + _failed_then_errored(s) for s in suites)
        failed = sum(int(s.get("failures", 0)) for s in suites)
        errors = sum(int(s.get("errors", 0)) for s in suites)
        skipped = sum(int(s.get("skipped", 0)) for s in suites)
        duration = round(sum(float(s.get("time", 0)) for s in suites), 3)
    except (OSError, ET.ParseError, ValueError):
        return None
    return Metrics(passed=total - failed - errors - skipped, failed=failed, skipped=skipped, errors=errors,
                  total=total, duration_s=duration)


def _failed_then_errored(suite: ET.Element) -> int:
    """The tests of a suite listed both with a <failure> (their call) and an <error> (their teardown)."""
    def named(child: str) -> set:
        return {(c.get("classname"), c.get("name")) for c in suite.findall("testcase") if c.find(child) is not None}
    return len(named("failure") & named("error"))


kinds.register(Pytest())
