"""nsa-validate: run validation runbooks and report, with evidence, whether a node trains NSA correctly and fast.

Thin commands over the library (validation.run, validation.kinds; a run's progress: validation.report.progress); their
--help is the manual. Exit codes: 0 GO, 1 NO-GO, 2 invalid input, 3 INCOMPLETE (a required criterion not evaluated),
128 + N interrupted by signal N (130 SIGINT, 129 SIGHUP, 143 SIGTERM). Start-up stays light: `--help`, `list`,
`kinds`, `plan` of a CPU runbook and `report` import none of torch, pandas or matplotlib.
"""

from __future__ import annotations

from validation.launch import interrupts  # first, and light (os, signal, threading)

interrupts.catch_early()  # a SIGINT to a background run while the imports below load is kept for `run`, not lost

import json
import logging
from pathlib import Path
from typing import List, Optional

import typer

from nsa.process import exit_without_teardown
from validation import kinds as step_kinds
from validation.formatting import printable
from validation.launch import session
from validation.runbook.plan import text_lines
from validation.report import ReportError
from validation.report.console import echo, end_output, make_console, print_lines, print_summary, print_table
from validation.report.progress import display
from validation.report.view import CONSOLE_ACCEPTANCE_COLUMNS, console_summary
from validation.results.codec import decode
from validation.results.run import PerformanceAnalysis
from validation.results.store import DEFAULT_RUNS, ResultsError, RunDirError
from validation.run import (RunError, RunRequest, compare_run_dirs, dry_run_lines, list_runbooks, list_runs,
                            listing_dirs, plan_rows, report_run, run_runbook)
from validation.version import version_line

EXIT_GO, EXIT_NOGO, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = {"GO": EXIT_GO, "NO-GO": EXIT_NOGO, "INCOMPLETE": EXIT_INCOMPLETE}

app = typer.Typer(help="Validate that a GPU node (or a CPU machine, with runbooks/cpu_smoke.yaml) trains NSA models "
                  "correctly and fast: run declarative runbooks, reduce the trainer's outputs to statistics, check "
                  "acceptance criteria, write GO/NO-GO reports. Exit codes: 0 GO, 1 NO-GO, 2 invalid input, 3 "
                  "INCOMPLETE, 130/129/143 interrupted by SIGINT/SIGHUP/SIGTERM.",
                  add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_show_locals=False)
console = make_console()  # not a terminal: nothing wrapped or cut (validation.report.console)
err = make_console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        echo(version_line())
        end_output(err, code=0)  # exit 0, or 2 when the line could not be written


@app.callback()
def _options(ctx: typer.Context, version: bool = typer.Option(False, "--version", callback=_print_version,
             is_eager=True, help="print the version and the git sha of the source tree, then exit")) -> None:
    ctx.call_on_close(lambda: end_output(err, keep_code=ctx.invoked_subcommand == "run"))  # output lost: exit 2


def _say(message: str) -> None:
    err.print(printable(message), markup=False, soft_wrap=True)  # progress beside the output: stderr; escapes taken out


def _warn(message: str) -> None:
    _say(f"warning: {message}")


def _fail(message: str, code: int = EXIT_USAGE):
    _say(f"nsa-validate: error: {message}")
    raise typer.Exit(code)


def _call(function, *args, errors: tuple[type[Exception], ...] = (RunError,), **kwargs):
    """function(*args, **kwargs); an invalid input (one of `errors`) ends the command: its message, exit 2."""
    try:
        return function(*args, **kwargs)
    except errors as exc:
        _fail(str(exc))


@app.command()
def plan(runbook: Path = typer.Argument(..., metavar="RUNBOOK", help="runbook YAML, e.g. runbooks/cpu_smoke.yaml"),
         set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="override a runbook key, e.g. "
                                        "defaults.args.steps=20"),
         as_json: bool = typer.Option(False, "--json", help="print the plan as JSON")) -> None:
    """Dry run: every step with its exact argv, environment and timeout; nothing is launched. Files the runbook
    names (configs, tests, benchmark scripts) are checked to exist; a --set default that a step's own value
    overrides is noted under the step."""
    rb, rows = _call(plan_rows, runbook, set_, Path.cwd())
    if as_json:
        console.print_json(json.dumps(rows))
        return
    print_lines(console, text_lines(rb, rows))


@app.command()
def run(runbook: Path = typer.Argument(..., metavar="RUNBOOK", help="runbook YAML, e.g. runbooks/cpu_smoke.yaml"),
        out: Optional[Path] = typer.Option(None, "--out", metavar="RUN_DIR", help="run directory (default "
                                           "artifacts/validate/<name>-<time>)"),
        only: List[str] = typer.Option([], "--only", metavar="PHASE", help="run only this phase (repeatable)"),
        skip: List[str] = typer.Option([], "--skip", metavar="PHASE", help="skip this phase (repeatable)"),
        resume: Optional[Path] = typer.Option(None, "--resume", metavar="RUN_DIR", help=(
            "continue an interrupted run in RUN_DIR: its finished steps are kept, the others run (a run of another "
            "runbook, a finished one without --rerun, or --out another directory, is refused: exit 2); give the run's "
            "--set again: a resume runs with its own (recorded in results.json resumes, warned when they differ)")),
        rerun: List[str] = typer.Option([], "--rerun", metavar="STEP", help="with --resume: run this step again into "
                                        "RUN_DIR, replacing its result (repeatable)"),
        set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="override a runbook key, e.g. "
                                       "defaults.args.steps=20 (repeatable; a --resume needs it given again)"),
        against: Optional[Path] = typer.Option(None, "--against", metavar="RUN_DIR", help=(
            "an earlier run directory: compare this run with it (the statistics of `compare`) in the report's "
            "Performance analysis (the run's own directory: exit 2)")),
        no_report: bool = typer.Option(False, "--no-report", help="write results.json only"),
        reuse: List[str] = typer.Option([], "--reuse", metavar="PHASE[=RUN_DIR]", help=(
            "PHASE or PHASE=RUN_DIR: take the phase's results from an earlier run of this same source (the newest "
            "match under reports/, or RUN_DIR) instead of running it; the report names that run (repeatable)")),
        dry_run: bool = typer.Option(False, "--dry-run", help=(
            "check everything a run checks before it launches (the runbook and the files it names, the phases, "
            "--resume, --reuse, --out) and print the plan, each step that would not run saying why; launch nothing, "
            "write nothing (--out is checked by making a directory there under a temporary name and removing it at "
            "once)"))) -> None:
    """Run every phase of RUNBOOK; write RUN_DIR/results.json, report.md, report.html, junit.xml and plots.
    Exit 0 GO, 1 NO-GO, 2 invalid input, 3 INCOMPLETE; SIGINT, SIGTERM or SIGHUP end every launched process,
    keep the finished steps (--resume continues) and exit 130, 143 or 129."""
    request = RunRequest(runbook=runbook, out=out, only=tuple(only), skip=tuple(skip), resume=resume,
                         rerun=tuple(rerun), overrides=tuple(set_), against=against, no_report=no_report,
                         cwd=Path.cwd(), reuse=tuple(reuse))

    began: list[bool] = []  # the progress display opened: the runner began, and says itself what it kept

    def shown():
        began.append(True)
        return display(console)

    def body() -> int:
        try:
            return _dry_run(request) if dry_run else _run(request, shown)
        except typer.Exit as exc:  # _fail: invalid input
            return exc.exit_code

    raise typer.Exit(session.guarded(  # an interrupt before the run began: nothing launched, no results.json
        body, on_interrupt=lambda exc: _say(request.interrupt_text(exc, began=bool(dry_run or began))),
        on_left=lambda pids: _warn(f"ended {len(pids)} process(es) still running after the run: {pids}")))


def _dry_run(request: RunRequest) -> int:
    lines, last = _call(dry_run_lines, request, warn=_warn)
    print_lines(console, lines)
    console.print(last, markup=False, soft_wrap=True)
    return EXIT_GO


def _run(request: RunRequest, shown) -> int:
    outcome = _call(run_runbook, request, shown, warn=_warn, say=_say)
    if outcome.interrupted is not None:
        _say(outcome.interrupt_text(request))
        if outcome.report_error:
            _fail(outcome.report_error)
        if outcome.reports_unwritten:
            _say(f"nsa-validate: error: {outcome.reports_unwritten}")
        return interrupts.exit_code(outcome.interrupted)
    print_summary(console, CONSOLE_ACCEPTANCE_COLUMNS, *console_summary(outcome.results, outcome.run_dir,
                                                                        list(outcome.report_paths)), title="acceptance")
    return EXIT_CODES.get(outcome.verdict, EXIT_NOGO)


@app.command()
def report(run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory holding results.json"),
           fmt: str = typer.Option("md", "--format", metavar="md|html|json|junit", help="the output's format"),
           write: bool = typer.Option(False, "--write", help="(re)write report.md/.html, junit.xml and plots in "
                                                            "RUN_DIR instead of printing"),
           against: Optional[Path] = typer.Option(None, "--against", metavar="EARLIER", help=(
               "an earlier run directory: store this run's comparison with it in results.json (Performance "
               "analysis; RUN_DIR itself: exit 2)"))) -> None:
    """Re-render a run's report from RUN_DIR/results.json alone (nothing is re-run); with --against, the comparison
    with an earlier run is computed from the two runs' files and stored in RUN_DIR/results.json first."""
    text, written = _call(report_run, run_dir, fmt, write, against,
                          errors=(RunError, ResultsError, ReportError, RunDirError))
    for p in written:
        console.print(str(p), markup=False)
    if text is not None:
        echo(text, nl=False)


@app.command()
def compare(run_a: Path = typer.Argument(..., metavar="RUN_A", help="baseline run directory"),
            run_b: Path = typer.Argument(..., metavar="RUN_B", help="candidate run directory"),
            noise: Optional[float] = typer.Option(None, "--noise", metavar="FRACTION", help=(
                "relative change a difference must exceed to count (0.02 = 2%); default: the noise floor measured "
                "from the runs")),
            as_json: bool = typer.Option(False, "--json", help="print every row and statistic as JSON")) -> None:
    """RUN_B against RUN_A, per trainer run and metric: the relative difference with its 95% confidence interval and
    p-value, on block means of each run's window plus the run-to-run variation measured from repeated runs, with
    Holm's correction over all rows; a warning when the two runs' environments or settings differ, and for every
    trainer launch of one run with none of the same step and label in the other (a step added, renamed or failed: not
    compared); RUN_A and RUN_B one directory (two paths to it) is compared, with a warning and a line saying so. A CI
    gate: exit 1 when a metric regresses significantly beyond the noise floor, else 0 (2: invalid input)."""
    out, lines = _call(compare_run_dirs, run_a, run_b, noise)
    if decode(PerformanceAnalysis, out, "compare").same_run:  # allowed (a probe of the statistics), never unsaid
        _warn(f"{run_a} and {run_b} are one run directory: it is compared with itself, every change is 0 by "
              "construction")
    if as_json:
        echo(json.dumps(out, indent=2, allow_nan=False))
        raise typer.Exit(out["exit_code"])
    for warning in out["warnings"]:
        _warn(warning)
    for line in lines:
        echo(printable(line))  # a runbook or step name from a results.json, never a terminal escape
    raise typer.Exit(out["exit_code"])


@app.command("list")
def list_(runbooks_dir: Optional[Path] = typer.Option(None, "--runbooks", metavar="DIR", help=(
              "where runbooks live (default runbooks; a directory given that is not there: exit 2)")),
          runs_dir: Optional[Path] = typer.Option(None, "--runs", metavar="DIR", help=(
              f"where runs live (default {DEFAULT_RUNS}; a directory given that is not there: exit 2)"))) -> None:
    """Runbooks available, and past runs with their verdicts."""
    runbooks_dir, runs_dir = _call(listing_dirs, runbooks_dir, runs_dir)
    print_table(console, ("file", "name", "description"), list_runbooks(runbooks_dir), title="runbooks")
    runs = list_runs(runs_dir)
    print_table(console, ("run", "runbook", "verdict", "started"), runs, title=f"runs under {runs_dir}")


@app.command()
def kinds(markdown: bool = typer.Option(False, "--markdown", help="print the Markdown table README.md shows")) -> None:
    """The step kinds a runbook can use (the step registry, validation.kinds): what each does and its own keys."""
    for why in step_kinds.load_errors().values():  # an installed plugin's kind that did not load
        _warn(why)
    if markdown:
        echo(step_kinds.table_markdown(), nl=False)
        return
    print_table(console, ("kind", "what it does", "its own keys", "module"), step_kinds.table_rows(),
                title="step kinds")


def main() -> None:  # console script
    logging.basicConfig(level=logging.WARNING, format="nsa-validate: %(message)s")
    try:
        app()
    except KeyboardInterrupt as exc:  # one that came in outside the run's own handling (e.g. while loading)
        raise SystemExit(getattr(exc, "exit_code", EXIT_INTERRUPTED)) from None
    except SystemExit as done:  # every command's end: without the interpreter's teardown, 0.9 s after a run
        exit_without_teardown(done.code)


if __name__ == "__main__":
    main()
