"""`pytest`: named tests (paths or node ids) run with pytest; the verdict from its JUnit counts.

Own keys: `tests: [paths or node ids]` (required), `pytest_args: [...]` (options that choose pytest's output files
are refused: the JUnit file goes to RUN_DIR/<step>/pytest.xml). Launch keys: env, timeout_s, launcher.
Metrics: {"passed", "failed", "skipped", "errors", "total", "duration_s"}. No test run, a failure or an error
fails the step. (This module is pytest_suite.py so that it never shadows pytest itself.)
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from validation import steps
from validation.report.format import as_dict, fmt_duration, fmt_num
from validation.schema import str_list
from validation.steps.base import COMMAND_LAUNCH_KEYS, StepKind, command_launch, run_path

# pytest options that choose where pytest writes: nsa-validate puts pytest.xml under RUN_DIR/<step> itself, and
# --basetemp would even let pytest empty a directory outside it (pytest refuses abbreviated options).
RESERVED_PYTEST_ARGS = ("--junitxml", "--junit-xml", "--basetemp", "--result-log", "--resultlog", "--debug")


class Pytest(StepKind):
    name = "pytest"
    summary = "named tests with JUnit counts"
    keys = ("tests", "pytest_args")
    metrics = ("passed", "failed", "skipped", "errors", "total", "duration_s")
    launch_keys = COMMAND_LAUNCH_KEYS
    host_only = True  # tests run on any machine (CUDA tests skip themselves); `requires:` makes one need GPUs

    def parse(self, raw: dict, path: tuple, ctx) -> dict[str, Any]:
        tests = str_list(raw.get("tests"), path + ("tests",), ctx)
        args = str_list(raw.get("pytest_args"), path + ("pytest_args",), ctx)
        for i, arg in enumerate(args):
            if arg.split("=", 1)[0] in RESERVED_PYTEST_ARGS:
                raise ctx.error(path + ("pytest_args", i), f"{arg!r}: pytest options that choose output files or "
                                                           "directories are set by nsa-validate itself (outputs go "
                                                           "under RUN_DIR/<step>)")
        if not tests:
            raise ctx.error(path + ("tests",), "a pytest step needs tests: [paths or node ids]")
        return {"tests": tests, "pytest_args": args}

    def input_files(self, step):
        # a node id (path::test) names its file; -k / -m selections are pytest_args, not paths
        return [(("tests", i), test.split("::", 1)[0]) for i, test in enumerate(step.tests)
                if not test.startswith("-")]

    def launches(self, step, winners, run_dir):
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *step.tests,
                "--junitxml", run_path(run_dir, f"{step.name}/pytest.xml"), *step.pytest_args]
        return [command_launch(step, argv, run_dir)]

    def run(self, step, launches, result, ctx) -> None:
        spec = launches[0]
        lr = ctx.launch(spec, 0, 1)
        ctx.record(result, spec, lr)
        counts = junit_counts(ctx.run_dir / spec.dir / "pytest.xml")
        result["metrics"] = counts
        result["artifacts"].append(ctx.rel(ctx.run_dir / spec.dir / "pytest.xml"))
        if lr.status in ("timeout", "hang", "error", "interrupted"):
            result.update(status=lr.status, reason=lr.reason)
        elif counts.get("total", 0) == 0:
            result.update(status="failed", reason=f"no tests ran ({lr.reason})")
        elif counts["failed"] or counts["errors"]:
            result.update(status="failed", reason=f"{counts['failed']} failed, {counts['errors']} errors "
                                                  f"of {counts['total']}")
        else:
            result.update(status="passed", reason=None)

    def view(self, result: dict, view: dict) -> dict:
        metrics = as_dict(result.get("metrics"))
        counts = {k: fmt_num(metrics.get(k)) for k in ("passed", "failed", "skipped", "errors", "total")}
        counts["duration"] = fmt_duration(metrics.get("duration_s"))
        return {"pytest": counts}


def junit_counts(path: Path) -> dict[str, int]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "total": 0}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) for s in suites)
    errors = sum(int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return {"passed": total - failed - errors - skipped, "failed": failed, "skipped": skipped, "errors": errors,
            "total": total, "duration_s": round(sum(float(s.get("time", 0)) for s in suites), 3)}


steps.register(Pytest())
