"""`sanitizer`: a program run under NVIDIA compute-sanitizer (memcheck by default), one process per case of a grid;
0 errors in every case to pass. runbooks/gpu_kernels.yaml runs every NSA kernel forward and backward this way
(nsa.attention.kernels.qualify), the "fused" and the "tiled" selection in two steps.

Own keys:
    command: [args...]                the program after this Python, e.g. [-m, nsa.attention.kernels.qualify,
                                      --method, tiled] (required)
    grids: {NAME: {FLAG: [values]}}   named grids (required); a case is one value of each flag, passed as
                                      `--FLAG value` (the cartesian product, in the order written)
    grid: NAME                        the grid that runs (default: `default` if there is one, else the first);
                                      e.g. --set steps.memcheck_tiled.grid=deep
    tool: memcheck | racecheck | initcheck | synccheck   (default memcheck)
    jobs: N                           how many cases run at a time (default 1); see below
Launch keys: env, timeout_s (per case: every case is its own process), launcher.

compute-sanitizer is looked for on PATH, then in $CUDA_HOME/bin and $CUDA_HOME/compute-sanitizer, then in
/usr/local/cuda/bin (PATH and CUDA_HOME as the step's env leaves them). Without it the step is skipped, saying where
it looked: a criterion on the step is then not evaluated and the run ends INCOMPLETE, never GO.
Each case runs `compute-sanitizer --tool TOOL --target-processes application-only --launch-timeout 0 python COMMAND
--FLAG value ...` in RUN_DIR/<step>/<case>/ with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (PyTorch's caching allocator would
hide an access past a tensor that lands inside another block of its pool). `--launch-timeout 0`: the sanitizer waits
as long as the program takes to start instead of its default 10 s (Python + torch + Triton imports on a loaded
machine take longer: "No attachable process found. compute-sanitizer timed-out."); the step's timeout_s still bounds
each case. The case's "ERROR SUMMARY: N errors" line (racecheck's "RACECHECK SUMMARY: N hazards displayed (E errors,
W warnings)": E + W; past the print limit, not the "N errors were not printed" line that follows it) and its first
error lines are read from its log; a fault in one case cannot hide the others.

jobs: N runs up to N cases at a time, each starting as soon as one ends, in grid order: the records, the step's
entry and its verdict are those of a run one after another (by_case in grid order; results.json saved as each
case ends, holding the cases ended so far in grid order), each case in its own process and directory; a Ctrl-C /
SIGTERM ends every running case. Each case's duration_s can then be longer than alone (the cases share the cores and
the GPU).

Metrics: {"tool", "grid", "sanitizer" (the executable's path), "cases", "cases_clean", "errors" (the sum over
cases), "by_case": [{"case", each FLAG: its value, "status", "errors", "returncode", "duration_s", "first_error"}]}.
A case's status: clean (the summary says 0 errors and the program exited 0), errors (N > 0), failed (0 errors but
the program failed), not attached (the sanitizer found no process to attach to: "No attachable process found",
"compute-sanitizer timed-out"; nothing was checked), no summary (the sanitizer printed none: it did not run to its
end), untracked (0 errors, but the sanitizer reported an "Internal Sanitizer Error": it did not track some kernel
launch, e.g. out of memory for its tracking data, and errors there went undetected), timeout. Only clean counts as
clean: a case without a summary never does. The step passes when every case is clean; criteria:
`STEP.errors == 0 and STEP.cases_clean == STEP.cases`.

Options: the keys above. Result: the step record, its metrics a Metrics (the keys above; a CaseResult per case, its
flags' values kept in `extra`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

from validation import kinds
from validation.launch.spec import LOG_NAME, LaunchResult, LaunchSpec, safe_name
from validation.formatting import first_of, fmt_duration, fmt_num
from validation.runbook.schema import mapping, str_list, typed
from validation.kinds.blocks import Block, Column, Paragraph, Table, code
from validation.results.codec import blank
from validation.results.run import Step as StepRecord
from validation.kinds.base import (COMMAND_LAUNCH_KEYS, EachEnded, KeyFigure, StepKind, command_launch, launch_each,
                                   step_dir)


@dataclasses.dataclass(frozen=True)
class Options:
    command: list[str]  # script or -m module, and its args
    grids: Mapping[str, Mapping[str, list[str]]]  # {name: {flag: values}}: every combination is a case
    grid: str  # the grid to run
    tool: str = "memcheck"
    jobs: int = 1  # cases run at a time


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One case of the grid (its flags' values are kept in `extra`): how the sanitizer judged it."""
    case: str
    status: str  # clean, errors, failed, not attached, no summary, untracked, timeout
    errors: int | None = None  # the ERROR SUMMARY's count; None: no summary
    returncode: int | None = None
    first_error: str | None = None
    reason: str | None = None  # how the process ended, unless clean
    duration_s: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's metrics (the module docstring)."""
    tool: str | None = None
    grid: str | None = None
    sanitizer: str | None = None  # the executable's path
    cases: int | None = None
    cases_clean: int | None = None
    errors: int | None = None  # over the cases
    by_case: list[CaseResult] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A sanitizer step's record: its metrics the grid's cases (None: {}, a step that never ran)."""
    metrics: Metrics | None = blank()


SANITIZER = "compute-sanitizer"
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
FALLBACK_DIRS = ("/usr/local/cuda/bin",)  # after PATH and $CUDA_HOME
NO_CACHING_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
# no limit on the program's start-up (the default 10 s failed to attach under load); timeout_s bounds each case
LAUNCH_TIMEOUT_ARGS = ("--launch-timeout", "0")
# what compute-sanitizer prints (on its "=========" lines) when it never attached to the program: nothing was checked
_NOT_ATTACHED_RE = re.compile(r"No attachable process found|compute-sanitizer timed-out", re.IGNORECASE)
_FLAG_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
# past the print limit (100 by default) the summary is followed by "ERROR SUMMARY: M errors were not printed. Use
# --print-limit option to adjust the number of printed errors": M is part of N, not more errors
_SUMMARY_RE = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?\b(?!\s+were not printed)")
# what compute-sanitizer prints when it could not instrument a kernel launch (e.g. out of memory for its tracking
# data): "Internal Sanitizer Error: The Sanitizer encountered an error while launching KERNEL and didn't track the
# launch. Errors might go undetected. (...)"; the ERROR SUMMARY can still say 0 errors
_UNTRACKED_RE = re.compile(r"Internal Sanitizer Error", re.IGNORECASE)
# racecheck prints no ERROR SUMMARY but "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"; a hazard
# it calls a warning is a possible race: both count
_RACECHECK_RE = re.compile(r"RACECHECK SUMMARY:\s*\d+\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
_PREFIX = "========="
FIRST_ERROR_LINES = 4


class Sanitizer(StepKind):
    name = "sanitizer"
    summary = "a program under compute-sanitizer (memcheck), one process per case of a grid; 0 errors to pass"
    keys = ("command", "grids", "grid", "tool", "jobs")
    metrics = ("tool", "grid", "sanitizer", "cases", "cases_clean", "errors", "by_case.<i>.*")
    launch_keys = COMMAND_LAUNCH_KEYS
    result_type = Result

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        command = str_list(raw.get("command"), path + ("command",), ctx)
        if not command:
            raise ctx.error(path + ("command",), "a sanitizer step needs command: [script or -m module, args...]")
        if "grids" not in raw:
            raise ctx.error(path, "a sanitizer step needs grids: {NAME: {FLAG: [values]}}")
        grids_raw = mapping(raw["grids"], path + ("grids",), ctx,
                            tuple(raw["grids"]) if isinstance(raw["grids"], dict) else ())
        if not grids_raw:
            raise ctx.error(path + ("grids",), "expected at least one grid, e.g. default: {dtype: [bf16]}")
        grids: dict[str, dict[str, list[str]]] = {}
        for name, grid in grids_raw.items():
            gpath = path + ("grids", name)
            if not isinstance(name, str) or not _FLAG_RE.fullmatch(name):
                raise ctx.error(gpath, "grid names are words (letters, digits, _ and -)")
            flags = mapping(grid, gpath, ctx, tuple(grid) if isinstance(grid, dict) else ())
            if not flags:
                raise ctx.error(gpath, "expected {FLAG: [values]} with at least one flag")
            grids[name] = {}
            for flag, values in flags.items():
                if not isinstance(flag, str) or not _FLAG_RE.fullmatch(flag):
                    raise ctx.error(gpath + (flag,), "flags are written without '--' (letters, digits, _ and -)")
                values = values if isinstance(values, list) else [values]
                if not values or len(set(map(str, values))) != len(values):
                    raise ctx.error(gpath + (flag,), "expected a non-empty list of distinct values")
                grids[name][flag] = str_list(values, gpath + (flag,), ctx)
        grid = typed(raw.get("grid", "default" if "default" in grids else next(iter(grids))), str,
                     path + ("grid",), ctx, choices=tuple(grids))
        tool = typed(raw.get("tool", "memcheck"), str, path + ("tool",), ctx, choices=TOOLS)
        jobs = typed(raw.get("jobs", 1), int, path + ("jobs",), ctx, minimum=1)
        return Options(command=command, grids=grids, grid=grid, tool=tool, jobs=jobs)

    def concurrency(self, step) -> int:
        return step.jobs

    def input_files(self, step):
        script = step.command[0]  # `python SCRIPT ...`; -m module names no file
        return [] if script.startswith("-") else [(("command", 0), script)]

    def skip_reason(self, step) -> str | None:
        found, looked = find_sanitizer({**os.environ, **step.launch.env})
        if found is None:
            return (f"{SANITIZER} not found (looked on PATH, in {', '.join(looked)}): the kernels cannot be checked "
                    "here; install the CUDA toolkit's compute-sanitizer or set CUDA_HOME")
        return None

    def launches(self, step, winners, run_dir):
        found, _ = find_sanitizer({**os.environ, **step.launch.env})
        out = []
        for case in cases(step.grids[step.grid]):
            label = case_label(case)
            flags = [part for flag, value in case.items() for part in (f"--{flag}", value)]
            argv = [found or SANITIZER, "--tool", step.tool, "--target-processes", "application-only",
                    *LAUNCH_TIMEOUT_ARGS, sys.executable, *step.command, *flags]
            spec = command_launch(step, argv, run_dir, label=label)
            out.append(dataclasses.replace(spec, step_dir=step_dir(run_dir, f"{step.name}/{safe_name(label)}"),
                                           env={**NO_CACHING_ENV, **spec.env}))
        return out

    def run(self, options: Options, ctx) -> Result:
        """Every case of the grid (up to options.jobs at a time); the record is that of a run one after another: the
        cases in grid order, the excerpt (and, when stopped, the command) of the last in grid order."""
        launches = ctx.launches
        grid = options.grids[options.grid]
        grid_cases = cases(grid)  # launches() builds them in this order
        base = Metrics(tool=options.tool, grid=options.grid, sanitizer=launches[0].argv[0] if launches else None)

        def partial(each: EachEnded) -> Result:  # the cases that ended, in grid order
            return Result(metrics=totals(base, each.records), excerpt=each.excerpt)

        def collect(i: int, spec: LaunchSpec, lr: LaunchResult) -> CaseResult:
            return dataclasses.replace(
                read_case(ctx.run_dir / spec.dir / LOG_NAME, lr.status, lr.returncode, lr.reason),
                case=spec.label, duration_s=round(lr.duration_s, 3), extra=dict(grid_cases[i]))

        each = launch_each(ctx, options.jobs, collect, partial)
        record = partial(each)
        stopped = each.interrupted(record)
        if stopped is not None:
            return stopped
        m = record.metrics or base
        records = m.by_case
        # the command without one case's flags
        command = [*launches[0].argv[:len(launches[0].argv) - 2 * len(grid)],
                   f"<each of {len(launches)} cases: {' '.join(f'--{f} X' for f in grid)}>"] if launches else None
        bad = [r for r in records if r.status != "clean"]
        if not records:
            status, reason = "failed", "the grid has no case"
        elif bad:
            shown = first_of((f"{r.case}: {case_problem(r)}" for r in bad), 4)
            status, reason = "failed", (f"{len(bad)} of {m.cases} cases not clean ({options.tool}: {m.errors} in "
                                        f"all): {shown}")
        else:
            status, reason = "passed", None
        return dataclasses.replace(record, status=status, reason=reason, command=command)

    def summary_line(self, result: Result) -> str:
        m = result.metrics or Metrics()
        if not m.cases:
            return ""
        return f" ({m.cases_clean} of {m.cases} cases clean, {m.errors} {m.tool} errors)"

    def key_figures(self, steps: list) -> list[KeyFigure]:
        """One line per sanitizer step that ran: cases clean of the grid, errors, the first case that was not."""
        out = []
        for step in steps:
            m = step.metrics if isinstance(step, Result) else None
            if m is None or not m.cases:
                continue
            bad = next((r for r in m.by_case if r.status != "clean"), None)
            note = f"step `{step.name}`, grid {m.grid}, {fmt_num(m.errors)} errors"
            out.append(KeyFigure("sanitizer_cases_clean", f"compute-sanitizer {m.tool} ({step.name})",
                                 f"{fmt_num(m.cases_clean)} of {fmt_num(m.cases)} cases clean",
                                 note + (f"; first not clean: {bad.case}" if bad else ""), order=12,
                                 steps=(str(step.name),)))
        return out

    def blocks(self, result: Result) -> list[Block]:
        """The tool and grid, how many cases ran clean, and one row per case with its first error."""
        m = result.metrics
        if m is None:
            return []
        return [Paragraph(f"{m.tool} ({m.sanitizer}), grid {code(m.grid)}: {fmt_num(m.cases_clean)} of "
                          f"{fmt_num(m.cases)} cases clean; errors in all: {fmt_num(m.errors)}."),
                Table((Column("Case"), Column("Result"), Column("Errors", numeric=True), Column("Duration", numeric=True),
                       Column("First error / note")),
                      [(str(r.case), str(r.status), fmt_num(r.errors), fmt_duration(r.duration_s),
                        str(r.first_error or (case_problem(r) if r.status != "clean" else ""))) for r in m.by_case])]


def find_sanitizer(env: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """(the compute-sanitizer executable, or None; the directories looked in besides PATH)."""
    found = shutil.which(SANITIZER, path=env.get("PATH", os.defpath))
    cuda_home = env.get("CUDA_HOME")
    dirs = []
    if cuda_home:
        dirs += [str(Path(cuda_home) / "bin"), str(Path(cuda_home) / "compute-sanitizer")]
    dirs += [d for d in FALLBACK_DIRS if d not in dirs]
    looked = dirs if cuda_home else ["$CUDA_HOME (not set)", *dirs]
    if found:
        return found, looked
    for d in dirs:
        candidate = Path(d) / SANITIZER
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate), looked
    return None, looked


def cases(grid: Mapping[str, list[str]]) -> list[dict[str, str]]:
    """Every case of a grid: one value per flag, the first flag varying slowest."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def case_label(case: Mapping[str, str]) -> str:
    return " ".join(f"{flag}={value}" for flag, value in case.items())


def read_case(log: Path, status: str, returncode: int | None, reason: str) -> CaseResult:
    """status, errors, returncode, first_error and reason of one case from its log and how its process ended."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    found = [int(n) for n in _SUMMARY_RE.findall(text)]
    found += [int(e) + int(w) for e, w in _RACECHECK_RE.findall(text)]
    errors = sum(found) if found else None  # one summary per tracked process
    first = first_error(text)
    own = [line for line in text.splitlines() if line.lstrip().startswith(_PREFIX)]  # the sanitizer's lines
    not_attached = any(_NOT_ATTACHED_RE.search(line) for line in own)
    untracked = any(_UNTRACKED_RE.search(line) for line in own)
    if status == "timeout":
        state = "timeout"
    elif errors:
        state = "errors"
    elif not_attached:  # even beside an "ERROR SUMMARY: 0 errors": the program was not checked
        state = "not attached"
    elif errors is None:
        state = "no summary"
    elif untracked:  # even beside an "ERROR SUMMARY: 0 errors": some kernels were not checked
        state = "untracked"
    elif returncode != 0:
        state = "failed"
    else:
        state = "clean"
    return CaseResult(case="", status=state, errors=errors, returncode=returncode, first_error=first,
                      reason=None if state == "clean" else reason)


def first_error(text: str) -> str | None:
    """The first error the sanitizer reported: its first lines ("Invalid __global__ read ...", "at KERNEL+0x.. in
    FILE:LINE", "by thread (..) in block (..)"), joined by " | "; None when it reported none."""
    lines = []
    for line in text.splitlines():
        body = line.strip()
        if not body.startswith(_PREFIX):
            if lines:
                break
            continue
        body = body[len(_PREFIX):].strip()
        if not body or body.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "LEAK SUMMARY", "RACECHECK SUMMARY")):
            if lines:
                break
            continue
        lines.append(" ".join(body.split()))
        if len(lines) == FIRST_ERROR_LINES:
            break
    return " | ".join(lines) if lines else None


def case_problem(record: CaseResult) -> str:
    status = record.status
    if status == "errors":
        n, first = record.errors, record.first_error
        return f"{n} error{'s' if n != 1 else ''}" + (f" ({first})" if first else "")
    if status == "failed":
        return f"0 errors, but the program failed ({record.reason})"
    if status == "not attached":
        return f"compute-sanitizer attached to no process: nothing was checked ({record.reason})"
    if status == "no summary":
        return f"no sanitizer summary in its log ({record.reason})"
    if status == "untracked":
        return (f"compute-sanitizer did not track every kernel launch (Internal Sanitizer Error): errors might go "
                f"undetected ({record.reason})")
    if status == "timeout":
        return str(record.reason or "timed out")
    return str(status)


def totals(base: Metrics, records: list[CaseResult]) -> Metrics:
    return dataclasses.replace(base, cases=len(records), cases_clean=sum(r.status == "clean" for r in records),
                               errors=sum(int(r.errors or 0) for r in records), by_case=list(records))


kinds.register(Sanitizer())
