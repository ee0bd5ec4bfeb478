"""Run orchestration: one runbook run end to end, as one call.

`run_runbook(request, display, warn)` loads and checks the runbook, picks the run directory (a new one, or the
one --resume continues, after validation.execution.runner.check_resume), runs the steps (validation.execution.runner.Runner), adds
the comparison with an earlier run (--against, validation.report.compare.performance_analysis) and writes the reports
(validation.report), and returns a RunOutcome. The reports always come from one results.json as saved: a resume
first re-renders the earlier attempt's reports from its first save (INCOMPLETE, not finished), and an interrupt
at any point after that, even after the verdict while plots and reports are being made, writes them again, whole,
from the results.json saved last. Nothing here prints: progress goes to the reporter `display` opens, warnings
to `warn`, and every error a user can cause is one RunError whose message names the file, key or value (the CLI
prints it and exits 2). The CLI (validation.cli) parses options, calls this and prints.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Optional

from validation import report
from validation.results import reuse
from validation.results.store import (DEFAULT_RUNS, RESULTS_JSON, ResultsError, RunDirError, cannot_write, inside_run_dir,
                                read_results, write_results)
from validation.runbook.loader import Runbook, RunbookError, load_runbook
from validation.execution.runner import (Reporter, ResumeError, RunOptions, Runner, check_resume, left_out,
                                         steps_to_run)
from validation.runbook.plan import skipped_here


class RunError(ValueError):
    """An invalid request (a bad runbook, phase, --resume, --against, or a run directory that cannot be written):
    one line naming the file, key or value."""


@dataclass(frozen=True)
class RunRequest:
    """What `nsa-validate run` was asked to do (its options, one field each)."""

    runbook: Path
    out: Optional[Path] = None  # the run directory (default: DEFAULT_RUNS/<name>-<time>)
    only: tuple[str, ...] = ()  # phases to run
    skip: tuple[str, ...] = ()  # phases to skip
    resume: Optional[Path] = None  # an earlier run directory to continue
    rerun: tuple[str, ...] = ()  # with resume: steps to run again
    overrides: tuple[str, ...] = ()  # --set key=value
    against: Optional[Path] = None  # an earlier run directory to compare with
    no_report: bool = False  # results.json only
    reuse: tuple[str, ...] = ()  # --reuse PHASE[=RUN_DIR]: phases taken from an earlier run of the same source
    cwd: Path = field(default_factory=Path.cwd)


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: its directory, its results (results.json as written), the files the reports wrote, and the
    interrupt that stopped it (None: it ran to its verdict and its reports were written; otherwise `results` holds
    the finished steps, and the verdict too where the interrupt came while the reports were written)."""

    runbook: Runbook
    run_dir: Path
    results: dict
    report_paths: tuple[Path, ...] = ()
    interrupted: Optional[BaseException] = None
    report_error: Optional[str] = None  # an interrupted run whose reports could not be written: why (one line)

    @property
    def verdict(self) -> Optional[str]:
        """GO, NO-GO or INCOMPLETE; None for an interrupted run."""
        return None if self.interrupted is not None else self.results.get("verdict")

    @property
    def interrupted_after_verdict(self) -> bool:
        """Interrupted after the run had reached its verdict (while the comparison or the reports were written)."""
        return (self.interrupted is not None and bool(self.results.get("finished"))
                and not self.results.get("interrupted_by"))


def _quiet() -> ContextManager[Reporter]:
    return contextlib.nullcontext(Reporter())


@dataclass(frozen=True)
class Prepared:
    """A request checked and resolved, nothing launched or written yet: the runbook, the run directory, the earlier
    attempt a --resume continues, the run --against compares with, and the runner's options (--reuse resolved)."""

    runbook: Runbook
    run_dir: Path
    previous: Optional[dict]
    earlier: Optional[dict]
    options: RunOptions


def prepare(request: RunRequest, warn: Callable[[str], None] = lambda message: None) -> Prepared:
    """Every check run_runbook makes before it launches anything (the runbook and the files it names: configs,
    tests, benchmark scripts; --only/--skip, --resume/--rerun, --out, --against, --reuse); RunError naming the first
    problem. Reads, never writes."""
    rb = load(request.runbook, request.overrides, request.cwd)
    for note in rb.notes:
        warn(note)
    phases = [p.name for p in rb.phases]
    for name in [*request.only, *request.skip]:
        if name not in phases:
            raise RunError(f"no phase {name!r} in {request.runbook} (phases: {', '.join(phases)})")
    previous = None
    if request.rerun and request.resume is None:
        raise RunError("--rerun needs --resume RUN_DIR: the run whose steps to run again")
    if request.resume is not None:
        try:
            previous = read_results(request.resume)
            check_resume(rb, previous, request.resume, request.rerun)
        except (ResultsError, ResumeError) as exc:
            raise RunError(str(exc)) from None
        if previous["runbook"].get("sha256") != rb.sha256:
            warn(f"{request.runbook} changed since {request.resume} was started; finished steps are kept as they are")
        run_dir = request.resume
    else:
        run_dir = request.out if request.out is not None else default_run_dir(rb.name)
        if (run_dir / RESULTS_JSON).exists():
            raise RunError(f"{run_dir} already holds a run: use --resume {run_dir} to continue it, or another --out")
    earlier = read_against(request.against)
    try:
        reused = reuse.resolve(rb, reuse.parse(request.reuse), request.overrides, request.cwd)
    except reuse.ReuseError as exc:
        raise RunError(str(exc)) from None
    for phase in reused:
        if phase in request.skip:
            raise RunError(f"--reuse {phase} and --skip {phase}: a phase is either taken from an earlier run or "
                           "skipped")
        warn(reused[phase].note())
    options = RunOptions(only=tuple(request.only), skip=tuple(request.skip), overrides=tuple(request.overrides),
                         cwd=request.cwd, rerun=tuple(dict.fromkeys(request.rerun)), reuse=reused)
    return Prepared(rb, run_dir, previous, earlier, options)


def not_run(prepared: Prepared) -> dict[str, str]:
    """{step: why a run of `prepared` would not launch it}: its phase left out by --only or --skip, taken from an
    earlier run by --reuse, with its result in the run --resume continues (and not named by --rerun), or a requirement
    this machine does not meet (validation.runbook.plan.skipped_here). What `run --dry-run` shows."""
    rb, opt = prepared.runbook, prepared.options
    todo = None if prepared.previous is None else set(steps_to_run(rb, prepared.previous, opt.rerun))
    here = skipped_here(rb)
    reasons = {}
    for step in rb.steps():
        if reason := left_out(step, opt):
            reasons[step.name] = reason
        elif step.phase in opt.reuse:
            reasons[step.name] = f"taken from {opt.reuse[step.phase].source} (--reuse)"
        elif todo is not None and step.name not in todo:
            reasons[step.name] = (f"its result in {prepared.run_dir} is kept (--resume; --rerun {step.name} runs it "
                                  "again)")
        elif step.name in here:
            reasons[step.name] = here[step.name]
    return reasons


def run_runbook(request: RunRequest, display: Callable[[], ContextManager[Reporter]] = _quiet,
                warn: Callable[[str], None] = lambda message: None) -> RunOutcome:
    """Run `request.runbook` end to end; `display()` opens the progress display the runner reports to while the
    steps run. Raises RunError on invalid input; an interrupt (SIGINT, SIGTERM, SIGHUP) while the steps run ends
    every launched process and comes back as RunOutcome.interrupted, with the finished steps saved and reported."""
    prepared = prepare(request, warn)
    rb, run_dir, previous, earlier, options = (prepared.runbook, prepared.run_dir, prepared.previous,
                                               prepared.earlier, prepared.options)
    first_saved = None if request.no_report else (lambda saved: replace_earlier_reports(run_dir, saved))
    try:  # the run directory cannot be written (disk full, permission) or leads outside itself: one RunError
        try:
            with display() as reporter:
                results = Runner(rb, run_dir, options, reporter, previous=previous).run(first_saved)
            if earlier is not None:
                add_performance_analysis(run_dir, results, request.against, earlier)
            paths = [] if request.no_report else write_all_reports(run_dir, results)
        except KeyboardInterrupt as exc:
            # Ctrl-C, SIGINT, SIGTERM, SIGHUP while the steps ran (the processes are already ended) or after the
            # verdict, while the comparison or the reports were being written: the reports are written again,
            # whole, from the results.json saved last, so none is left from before that save
            saved: dict = {}
            paths: list[Path] = []
            try:
                if (run_dir / RESULTS_JSON).is_file():
                    saved = read_results(run_dir)
                    paths = [] if request.no_report else write_all_reports(run_dir, saved)
            except (RunDirError, ResultsError) as error:  # told after the interrupt itself
                return RunOutcome(rb, run_dir, saved, interrupted=exc, report_error=str(error))
            return RunOutcome(rb, run_dir, saved, tuple(paths), interrupted=exc)
    except (RunDirError, ResultsError) as exc:
        raise RunError(str(exc)) from None
    return RunOutcome(rb, run_dir, results, tuple(paths))


def default_run_dir(name: str, runs_dir: Path = DEFAULT_RUNS) -> Path:
    """runs_dir/<name>-<time>, the run directory without --out: one directory directly in runs_dir (DEFAULT_RUNS,
    where `nsa-validate list` finds it), checked like every path derived from the runbook (inside_run_dir; the
    runbook's name is checked when it is read: validation.runbook.loader). RunError otherwise."""
    rel = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        if len(Path(rel).parts) != 1:
            raise RunDirError(f"{rel!r} would not be one directory in {runs_dir}")
        return inside_run_dir(runs_dir, rel)
    except RunDirError as exc:
        raise RunError(f"runbook name {name!r}: {exc}") from None


def load(runbook: Path, overrides: tuple[str, ...] | list[str], cwd: Optional[Path] = None) -> Runbook:
    """The runbook, validated (with `cwd`: the files it names checked to exist there); RunError otherwise."""
    try:
        return load_runbook(runbook, list(overrides), cwd=cwd)
    except RunbookError as exc:
        raise RunError(str(exc)) from None


def read_against(against: Optional[Path]) -> Optional[dict]:
    """The earlier run of --against (RunError when it is not a run directory), or None."""
    if against is None:
        return None
    try:
        return read_results(against)
    except ResultsError as exc:
        raise RunError(f"--against: {exc}") from None


def _compare():
    import validation.report.compare  # start-up: numpy and the statistics only for a comparison (compare, --against)

    return validation.report.compare


def compare_run_dirs(run_a: Path, run_b: Path, noise: float | None = None) -> tuple[dict, list[str]]:
    """`nsa-validate compare RUN_A RUN_B`: (validation.report.compare.compare_runs of the two runs' results, its table
    lines). RunError naming what is wrong for a bad --noise, an unreadable results.json, or two runs with no
    trainer run in common."""
    if noise is not None and not (math.isfinite(noise) and noise >= 0):
        raise RunError(f"--noise {noise!r}: expected a non-negative fraction, e.g. 0.02 for 2%")
    try:
        a, b = read_results(run_a), read_results(run_b)
    except ResultsError as exc:
        raise RunError(str(exc)) from None
    compare = _compare()
    out = compare.compare_runs(a, b, run_a, run_b, noise=noise)
    if not out["rows"]:
        raise RunError(f"{run_b} and {run_a} have no trainer run in common (same step and label): nothing to compare")
    return out, compare.table_lines(out)


def add_performance_analysis(run_dir: Path, results: dict, against: Path, earlier: dict) -> None:
    """results["performance_analysis"]: this run against the earlier one (validation.report.compare.performance_analysis),
    written to results.json."""
    results["performance_analysis"] = _compare().performance_analysis(results, earlier, run_dir, against)
    write_results(run_dir, results)


def replace_earlier_reports(run_dir: Path, results: dict) -> list[Path]:
    """The reports an earlier attempt left in run_dir (a --resume), rendered again from `results` as just saved
    (not finished: INCOMPLETE) with the plots already there; nothing when run_dir holds no report. Each file is
    replaced whole (validation.report.write_reports). Raises RunDirError when a file cannot be written."""
    if not any((run_dir / name).exists() for name in report.REPORT_FILES.values()):
        return []
    try:
        return report.write_reports(run_dir, results, plots=False)
    except OSError as exc:
        raise cannot_write(run_dir, exc) from None


def kept_plots(previous: list, drawn: list[dict], run_dir: Path) -> list[dict]:
    """The plot records of a report re-rendered from a finished run's results.json: each plot it recorded, as drawn
    again, or as it was where it could not be drawn again (its source, a training.csv say, no longer in the run
    directory: a copy without its bulky files) but its PNG is still there; then any newly drawn, in their order."""
    fresh = {p["path"]: p for p in drawn}
    out = []
    for old in (p for p in previous if isinstance(p, dict) and isinstance(p.get("path"), str)):
        if old["path"] in fresh:
            out.append(fresh.pop(old["path"]))
        elif (Path(run_dir) / old["path"]).is_file():
            out.append(old)
    return out + list(fresh.values())


def write_all_reports(run_dir: Path, results: dict, keep_plots: bool = False) -> list[Path]:
    """Plots first, recorded in results.json (so `report` re-renders the same text), then the reports. With
    keep_plots (`report --write`: the results are the finished run's), a recorded plot that cannot be drawn again
    but whose PNG is there is kept (kept_plots). Raises RunDirError when a file cannot be written."""
    try:
        drawn = report.make_plots(results, run_dir)
        results["plots"] = kept_plots(results.get("plots") or [], drawn, run_dir) if keep_plots else drawn
        write_results(run_dir, results)
        return [run_dir / p["path"] for p in results["plots"]] + report.write_reports(run_dir, results, plots=False)
    except OSError as exc:
        raise cannot_write(run_dir, exc) from None


def report_run(run_dir: Path, fmt: str = "md", write: bool = False, against: Path | None = None
               ) -> tuple[str | None, list[Path]]:
    """`nsa-validate report RUN_DIR`: (the report in `fmt`, []) or with `write` (None, the files (re)written in
    RUN_DIR); with `against`, the comparison with that earlier run is stored in results.json first. RunError for
    bad input, ResultsError, ReportError or RunDirError from the files."""
    if fmt not in report.FORMATS:
        raise RunError(f"--format {fmt!r}: expected one of {', '.join(report.FORMATS)}")
    earlier = read_against(against)
    results = read_results(run_dir)
    if earlier is not None:
        add_performance_analysis(run_dir, results, against, earlier)
    if write:
        return None, write_all_reports(run_dir, results, keep_plots=True)
    return report.render(results, fmt, run_dir=run_dir), []


def list_runbooks(runbooks_dir: Path) -> list[tuple]:
    """(file, name, description) of every runbook in `runbooks_dir`; an invalid one: (file, "invalid", error)."""
    rows = []
    for path in sorted(Path(runbooks_dir).glob("*.yaml")):
        try:
            rb = load_runbook(path)
            rows.append((path, rb.name, rb.description))
        except RunbookError as exc:
            rows.append((path, "invalid", exc))
    return rows


def list_runs(runs_dir: Path) -> list[tuple]:
    """(run directory, runbook name, verdict, started) of every run under `runs_dir`, from its results.json as it
    is (not checked against the schema: a listing shows runs of any version); an unreadable one: "unreadable"."""
    runs = []
    for results_path in sorted(Path(runs_dir).glob("*/results.json")):
        try:
            data = json.loads(results_path.read_text())
            runs.append((results_path.parent, data["runbook"]["name"], data["verdict"], data["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            runs.append((results_path.parent, "?", "unreadable", ""))
    return runs
