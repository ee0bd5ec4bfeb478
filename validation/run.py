"""Run orchestration: one runbook run end to end, as one call.

`run_runbook(request, display, warn)` loads and checks the runbook, picks the run directory (a new one, or the
one --resume continues, after validation.execution.runner.check_resume), runs the steps (validation.execution.runner.Runner), adds
the comparison with an earlier run (--against, validation.report.compare.performance_analysis) and writes the reports
(validation.report), and returns a RunOutcome. The reports always come from one results.json as saved: a resume
first re-renders the earlier attempt's reports from its first save (INCOMPLETE, not finished), and an interrupt
at any point after that writes them again, whole, from the results.json saved last. A signal that comes while the
reports are being written (after the verdict, or the earlier attempt's at a resume's first save) does not cut them
short: they are finished (validation.launch.interrupts.held; an exception raised inside an import would leave that
module half imported, the next report failing on it), and then the run ends as interrupted. An interrupt during a
step may still have cut an import short: the modules it left half imported are forgotten before the reports are
written again (forget_half_imported), and a report that still cannot be written is one line saying so and how to
write it (`nsa-validate report RUN_DIR --write`). An interrupt before the run saved its first results.json leaves
no empty run directory it created behind (RunOutcome.nothing_saved). A --resume first ends what an earlier attempt
killed with nsa-validate left running, found by the launch ids in its command.json files. Nothing here prints:
progress goes to the reporter `display` opens, warnings to `warn`, and every error a user can cause is one
RunError whose message names the file, key or value (the CLI prints it and exits 2). The CLI (validation.cli)
parses options, calls this and prints.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.machinery import ExtensionFileLoader
from pathlib import Path
from types import ModuleType
from typing import Callable, ContextManager, Optional

from validation import report
from validation.formatting import run_command
from validation.launch import interrupts
from validation.launch.attempt import recorded_launch_ids
from validation.launch.processes import end_launches
from validation.launch.spec import TERM_GRACE_S
from validation.results import reuse
from validation.results.run import Step as StepRecord, read_run
from validation.results.store import (DEFAULT_RUNS, FAILED_STEP_STATUSES, RESULTS_JSON, ResultsError, RunDirError,
                                      cannot_write, held_run_dir, inside_run_dir, load_json, not_regular_file,
                                      read_results, write_results)
from validation.runbook.loader import Runbook, RunbookError, load_runbook
from validation.execution import evidence
from validation.execution.runner import (NOT_REACHED, Reporter, ResumeError, RunOptions, Runner, check_resume, chosen,
                                         judge_resume, kept_if_not_rerun, left_out, no_winner_reason, steps_to_run,
                                         stopped_reason, winner_refs)
from validation.runbook.plan import describe, skipped_here, text_lines


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

    def command(self, run_dir: Path | None = None, rerun: tuple[str, ...] = ()) -> str:
        """This request as a shell-quoted command line, with --resume RUN_DIR in place of --out when `run_dir` is
        given: the command that continues the run as it ran (its --only, --skip, --set, --reuse, --against and
        --no-report; steps named by --rerun are interrupted or pending then, and run without being named, but for
        `rerun`: those the interrupt came before, which kept their earlier results)."""
        if run_dir is not None:
            return run_command(self.runbook, resume=run_dir, rerun=rerun, only=self.only, skip=self.skip,
                               overrides=self.overrides, reuse=self.reuse, against=self.against,
                               no_report=self.no_report)
        return run_command(self.runbook, out=self.out, resume=self.resume, rerun=self.rerun, only=self.only,
                           skip=self.skip, overrides=self.overrides, reuse=self.reuse, against=self.against,
                           no_report=self.no_report)

    def interrupt_text(self, exc: BaseException, began: bool) -> str:
        """What an interrupt `exc` says on stderr when the run's own handling did not (a run that `began` says what it
        kept itself); before it began, while the runbook and its files were checked, nothing was launched or saved."""
        how = interrupts.describe(exc)
        if began:
            return f"interrupted ({how})"
        return f"interrupted ({how}) before the run began: nothing was launched or saved; run it again with " \
               f"{self.command()}"


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
    # what else kept an interrupted run's reports from being written (an import the interrupt cut short): why, and
    # the command that writes them; unlike report_error, not the run directory's fault (no exit 2)
    reports_unwritten: Optional[str] = None
    nothing_saved: bool = False  # interrupted before the run saved its first results.json: nothing to --resume
    run_dir_removed: bool = False  # ... and the empty run directory it made is gone again

    @property
    def verdict(self) -> Optional[str]:
        """GO, NO-GO or INCOMPLETE; None for an interrupted run."""
        return None if self.interrupted is not None else self.results.get("verdict")

    @property
    def interrupted_after_verdict(self) -> bool:
        """Interrupted after the run had reached its verdict (while the comparison or the reports were written)."""
        return (self.interrupted is not None and bool(self.results.get("finished"))
                and not self.results.get("interrupted_by"))

    def interrupt_text(self, request: RunRequest) -> str:
        """What an interrupted run of `request` says on stderr: what was kept, and the command that goes on."""
        how = interrupts.describe(self.interrupted)
        if self.interrupted_after_verdict:
            return (f"interrupted ({how}) after the run reached its verdict ({self.results.get('verdict')}): the "
                    f"reports in {self.run_dir} were written, whole, from its results.json")
        if self.nothing_saved:
            where = (f"the empty run directory {self.run_dir} was removed" if self.run_dir_removed else
                     f"{self.run_dir} holds no results.json")
            return (f"interrupted ({how}) before the run saved anything: nothing was saved ({where}); start it again "
                    f"with {request.command()}")
        resumes = read_run(self.results).resumes if self.results else []
        kept = tuple(n for n, why in (resumes[-1].not_rerun.items() if resumes else ()) if why == NOT_REACHED)
        return (f"interrupted ({how}): every launched process was ended; finished steps are saved in "
                f"{self.run_dir}" + (f" ({', '.join(kept)} not reached: {'its' if len(kept) == 1 else 'their'} "
                                     "earlier results kept)" if kept else "")
                + f"; continue with {request.command(self.run_dir, rerun=kept)}")


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
    both = [n for n in request.only if n in request.skip]
    if both:
        raise RunError(f"--only {both[0]} and --skip {both[0]}: a phase is either selected or skipped, not both")
    previous, judged = None, None
    if request.rerun and request.resume is None:
        raise RunError("--rerun needs --resume RUN_DIR: the run whose steps to run again")
    if request.resume is not None and request.out is not None and not _same_path(request.out, request.resume):
        raise RunError(f"--out {request.out} and --resume {request.resume}: a resumed run stays in its own "
                       f"directory; drop --out to continue {request.resume}, or drop --resume to start a new run in "
                       f"{request.out}")
    own = request.resume if request.resume is not None else request.out
    if request.against is not None and own is not None and _same_path(request.against, own):
        raise RunError(against_itself(request.against, own))
    if request.resume is not None:
        try:
            previous = read_results(request.resume)
            check_resume(rb, previous, request.resume, request.rerun)
        except (ResultsError, ResumeError) as exc:
            raise RunError(str(exc)) from None
        judged = judge_resume(rb, previous, tuple(dict.fromkeys(request.rerun)))
        if judged.runbook_changed:
            warn(f"{request.runbook} changed since {request.resume} was started; finished steps are kept as they are")
        changed = judged.kept_changed
        if changed:
            warn(f"{request.resume}: kept step(s) measured under other settings than {request.runbook} and this "
                 f"--set give them now: {'; '.join(f'{n} ({why})' for n, why in changed.items())}; their results "
                 f"stay as measured (the report and the verdict's reason say so); --rerun {' --rerun '.join(changed)} "
                 "measures them again")
        ran = read_run(previous).overrides()
        if ran != list(request.overrides):
            warn(f"{request.resume} last ran with {_sets(ran)}, this resume with {_sets(request.overrides)}: a resume "
                 "runs with the --set it is given (give the run's own again to run its steps as they ran)")
        run_dir = request.resume
    else:
        run_dir = request.out if request.out is not None else default_run_dir(rb.name)
        if (run_dir / RESULTS_JSON).exists():
            raise RunError(f"{run_dir} already holds a run: use --resume {run_dir} to continue it, or another --out")
    check_writable(run_dir)
    earlier = read_against(request.against)
    try:
        reused = reuse.resolve(rb, reuse.parse(request.reuse), request.overrides, request.cwd)
    except reuse.ReuseError as exc:
        raise RunError(str(exc)) from None
    for phase in reused:
        if phase in request.skip:
            raise RunError(f"--reuse {phase} and --skip {phase}: a phase is either taken from an earlier run or "
                           "skipped")
        if previous is not None:
            _check_reuse_of_kept(rb, previous, reused[phase], run_dir, request.rerun)
        warn(reused[phase].note())
    rerun = tuple(dict.fromkeys(request.rerun))
    steps = {s.name: s for s in rb.steps()}
    if previous is not None and rerun:
        rerun = _with_recomputed(rb, previous, rerun, request, reused, warn)
    options = RunOptions(only=tuple(request.only), skip=tuple(request.skip), overrides=tuple(request.overrides),
                         cwd=request.cwd, rerun=rerun, reuse=reused, resume=judged)
    for name in options.rerun:  # a step run again is first set back to pending: left out, its result would be lost
        step = steps[name]  # check_resume refused a name the runbook lacks
        why = left_out(step, options) or (f"phase {step.phase} taken from an earlier run (--reuse {step.phase})"
                                          if step.phase in reused else None)
        if why:
            raise RunError(f"--rerun {name} and {why}: step {name} would not run again and its result in {run_dir} "
                           "would be lost; drop one of them")
    return Prepared(rb, run_dir, previous, earlier, options)


def _with_recomputed(rb: Runbook, previous: dict, rerun: tuple[str, ...], request, reused, warn) -> tuple[str, ...]:
    """`rerun` and the kept steps with a figure computed from what one of them measures (evidence.recomputed: a train
    step's scaling efficiency over its scaling_baseline step's tokens/s): run again without them, that figure would
    keep standing on the earlier measurement. A step --only, --skip or --reuse leaves out is not added: it keeps its
    figure, and a warning says so."""
    steps = {s.name: s for s in rb.steps()}
    probe = RunOptions(only=tuple(request.only), skip=tuple(request.skip))
    added, kept = [], []
    for name in evidence.recomputed(previous["steps"], rerun):
        if name in rerun or name not in steps:
            continue
        if left_out(steps[name], probe) or steps[name].phase in reused:
            kept.append(name)
        else:
            added.append(name)
    if added:
        warn(f"--rerun {' --rerun '.join(rerun)} also runs {', '.join(added)} again: "
             f"{'it computes a figure' if len(added) == 1 else 'they compute figures'} from what "
             f"{'it' if len(rerun) == 1 else 'they'} measure (a scaling efficiency over its baseline)")
    if kept:
        warn(f"{', '.join(kept)} {'computes' if len(kept) == 1 else 'compute'} a figure from what --rerun "
             f"{' --rerun '.join(rerun)} measures again, but --only, --skip or --reuse leaves "
             f"{'it' if len(kept) == 1 else 'them'} out: that figure keeps standing on the earlier measurement")
    return rerun + tuple(added)


def _check_reuse_of_kept(rb: Runbook, previous: dict, taken: reuse.Reuse, run_dir: Path, rerun) -> None:
    """RunError when a --resume would keep a step of phase `taken.phase` whose result is not the one --reuse takes
    (the step ran there, or was skipped, or came from another run): the runner keeps every step with a result, so the
    phase would hold that result while the run recorded it as taken from `taken.source` ("nothing of it ran here")."""
    todo = set(steps_to_run(rb, previous, rerun))
    before = read_run(previous).steps
    for step in rb.steps():
        if step.phase != taken.phase or step.name in todo:
            continue
        record = before.get(step.name) or StepRecord()
        if not (record.reused is not None and record.reused.source == str(taken.source)):
            raise RunError(f"--reuse {taken.phase} and --resume {run_dir}: step {step.name} of phase {taken.phase} "
                           f"has its own result there ({record.status}), which a resume keeps, so the phase would "
                           f"not be taken from {taken.source}; drop --reuse {taken.phase}, or start a new run with "
                           "--out")


def _same_path(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False


def against_itself(against: Path, run_dir: Path) -> str:
    """Why --against RUN_DIR of the run in `run_dir` itself is refused."""
    return (f"--against {against} is {run_dir} itself: a run compared with itself changes nothing by construction; "
            "give an earlier run's directory (`nsa-validate compare RUN RUN` probes a run against itself)")


def _sets(overrides) -> str:
    """"--set 'a=b c' --set d=e" (shell-quoted), or "no --set"."""
    return " ".join(f"--set {shlex.quote(str(o))}" for o in overrides) or "no --set"


def check_writable(run_dir: Path) -> None:
    """RunError unless the run could make and write `run_dir`: it is a directory, or the nearest path above it that
    exists is one (not a regular file), and that directory can be written: not read-only, writable by its mode, and
    a directory made in it (under a temporary name, removed at once: nothing is left) can be made, which a
    pseudo-filesystem refuses whatever the mode says (/proc: ENOENT, /sys: EPERM, even to root). The message is the
    one the run itself would end with (`cannot write PATH: Not a directory [ENOTDIR]`), naming the directory the run
    would make first (or `run_dir` when it exists)."""
    path = Path(run_dir)
    existing, first = path, path
    while not os.path.lexists(existing) and existing.parent != existing:
        existing, first = existing.parent, existing
    if not existing.is_dir():
        raise RunError(str(cannot_write(path, NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))))
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    if read_only:
        raise RunError(str(cannot_write(existing, OSError(errno.EROFS, os.strerror(errno.EROFS)))))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunError(str(cannot_write(existing, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))))
    try:
        probe = tempfile.mkdtemp(prefix=".nsa-validate-", dir=existing)
    except OSError as exc:
        code = exc.errno or errno.EACCES
        raise RunError(str(cannot_write(first, OSError(code, os.strerror(code))))) from None
    with contextlib.suppress(OSError):
        os.rmdir(probe)


def not_run(prepared: Prepared) -> dict[str, str]:
    """{step: why a run of `prepared` would not launch it}, as the runner decides it, step by step in order (what
    `run --dry-run` shows): its result in the run --resume continues kept (not named by --rerun; run again after
    all, as the run reaches it, where it uses the winner of a step this run decides again and that winner's
    settings then differ from those it ran with, which only the run can tell); not run because a
    step with on_failure: stop has failed there; its phase taken from an earlier run by --reuse; left out by --only
    or --skip; a requirement this machine does not meet (validation.runbook.plan.skipped_here); or a
    ${STEP.winner...} it uses that the run will not have: STEP's record kept, taken from an earlier run or
    skipped in this one has no winner (the runner's "needs the winner of STEP, which has none (STATUS)"). A step
    --rerun names that does not run keeps its earlier result, winner included (said after the reason). A step
    that launches may still end without a winner; the plan says which winners a launch uses."""
    rb, opt = prepared.runbook, prepared.options
    before = {} if prepared.previous is None else read_run(prepared.previous).steps
    todo = None if prepared.previous is None else set(steps_to_run(rb, prepared.previous, opt.rerun))
    here = skipped_here(rb)
    reasons: dict[str, str] = {}
    # each step's record once the run has passed it, as far as it is known before the run: (status, has a winner);
    # a step that launches is taken to have one
    known: dict[str, tuple[Optional[str], bool]] = {}
    stopped_by: Optional[tuple[str, str]] = None  # (step, status): a step with on_failure: stop that failed
    for step in rb.steps():
        if todo is not None and step.name not in todo:
            record = before.get(step.name) or StepRecord()
            reasons[step.name] = (f"its result in {prepared.run_dir} is kept (--resume; --rerun {step.name} runs it "
                                  "again)")
            deciding = [ref for ref in winner_refs(step) if ref in todo]
            if deciding:  # the runner decides as it reaches the step (Runner._rerun_if_superseded)
                reasons[step.name] += (f"; it runs again if the choice of {', '.join(deciding)}, which this run "
                                       "decides again, gives it other settings than it ran with")
            known[step.name] = (record.status, chosen(record) is not None)
            if stopped_by is None and step.on_failure == "stop" and record.status in FAILED_STEP_STATUSES:
                stopped_by = (step.name, record.status)
            continue
        earlier = before.get(step.name) or StepRecord()
        if step.name not in opt.rerun or not kept_if_not_rerun(earlier):
            earlier = None  # a --rerun step that does not run keeps its earlier result (Runner._keep_earlier)
        if stopped_by is not None:
            reasons[step.name] = stopped_reason(*stopped_by)
            known[step.name] = ("skipped", False)
            if earlier is not None:
                reasons[step.name] += f"; its earlier result ({earlier.status}) is kept"
                known[step.name] = (earlier.status, chosen(earlier) is not None)
            continue
        if step.phase in opt.reuse:
            reused = opt.reuse[step.phase]
            record = reused.run.steps.get(step.name) or StepRecord()
            reasons[step.name] = f"taken from {reused.source} (--reuse)"
            known[step.name] = (record.status, chosen(record) is not None)
            continue
        reason = left_out(step, opt) or here.get(step.name)
        if reason is None:
            for ref in winner_refs(step):
                status, has = known.get(ref, (None, False))
                if not has:
                    reason = no_winner_reason(ref, status)
                    break
        if reason and earlier is not None:
            reasons[step.name] = f"{reason}; its earlier result ({earlier.status}) is kept"
            known[step.name] = (earlier.status, chosen(earlier) is not None)
            if step.on_failure == "stop" and earlier.status in FAILED_STEP_STATUSES:
                stopped_by = (step.name, earlier.status)
        elif reason:
            reasons[step.name] = reason
            known[step.name] = ("skipped", False)
        else:
            known[step.name] = (None, True)
    return reasons


def dry_run_lines(request: RunRequest, warn: Callable[[str], None] = lambda message: None
                  ) -> tuple[list[tuple[str, Optional[str]]], str]:
    """What `run --dry-run` prints once prepare's checks pass (RunError naming the first problem otherwise): the
    plan's (text, style) lines, each step the run would not launch saying why (not_run), and its last line: nothing
    launched or written, and the run directory the run would write or continue. Reads, never writes."""
    prepared = prepare(request, warn)
    how = "continue" if prepared.previous is not None else "write"
    return (text_lines(prepared.runbook, describe(prepared.runbook, not_run(prepared))),
            f"\ndry run: nothing launched, nothing written; the run would {how} {prepared.run_dir}")


def run_runbook(request: RunRequest, display: Callable[[], ContextManager[Reporter]] = _quiet,
                warn: Callable[[str], None] = lambda message: None,
                say: Callable[[str], None] = lambda message: None) -> RunOutcome:
    """Run `request.runbook` end to end; `display()` opens the progress display the runner reports to while the
    steps run. Raises RunError on invalid input; an interrupt (SIGINT, SIGTERM, SIGHUP) while the steps run ends
    every launched process and comes back as RunOutcome.interrupted, with the finished steps saved and reported
    (`say` is told first that the reports are being written again, which can take a while on a busy machine)."""
    prepared = prepare(request, warn)
    run_dir = prepared.run_dir
    if not request.no_report:  # loaded whole now (matplotlib, jinja2), so no interrupt can leave them half imported
        _held(lambda: (report.make_plots, report.write_reports))
    modules = set(sys.modules)
    made = _first_missing(run_dir)  # what the run creates (None: run_dir is there already)
    with _holding(run_dir, made, fresh=prepared.previous is None):
        return _run_held(request, prepared, display, warn, modules, made, say)


@contextlib.contextmanager
def _holding(run_dir: Path, made: Path | None, fresh: bool):
    """RUN_DIR made and held (store.held_run_dir) for the whole run, so that a second nsa-validate on it (two
    `--resume RUN_DIR`, two runs given one --out) is refused before it ends or writes anything: it would end this
    run's launches as an earlier attempt's and overwrite its results.json. A fresh run also checks, holding it, that
    no other run wrote results.json since prepare looked."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(str(cannot_write(run_dir, exc))) from None
    try:
        with held_run_dir(run_dir):
            if fresh and (run_dir / RESULTS_JSON).exists():
                raise RunDirError(f"{run_dir} holds a results.json written by another nsa-validate run since this "
                                  "one started: --resume it, or give another --out")
            yield
    except RunDirError as exc:
        if made is not None:
            _remove_empty(run_dir, made)
        raise RunError(str(exc)) from None


def _run_held(request: RunRequest, prepared, display, warn, modules: set, made: Path | None,
              say: Callable[[str], None] = lambda message: None) -> RunOutcome:
    """run_runbook's run, RUN_DIR held."""
    rb, run_dir, previous, earlier = prepared.runbook, prepared.run_dir, prepared.previous, prepared.earlier
    options = prepared.options
    if previous is not None:  # an attempt killed with nsa-validate (its sentinel too) may have left some running
        left = end_launches(recorded_launch_ids(run_dir), grace_s=TERM_GRACE_S)
        if left:
            warn(f"ended {len(left)} process(es) an earlier attempt of {run_dir} left running: {left}")
    first_saved = None if request.no_report else (lambda saved: _held(replace_earlier_reports, run_dir, saved))
    try:  # the run directory cannot be written (disk full, permission) or leads outside itself: one RunError
        try:
            with display() as reporter:
                results = Runner(rb, run_dir, options, reporter, previous=previous).run(first_saved)
            with interrupts.held() as hold:  # the reports are finished, whole, whatever signal comes meanwhile
                if earlier is not None:
                    add_performance_analysis(run_dir, results, request.against, earlier)
                paths = [] if request.no_report else write_all_reports(run_dir, results)
            if hold.interrupt is not None:
                return RunOutcome(rb, run_dir, results, tuple(paths), interrupted=hold.interrupt)
        except KeyboardInterrupt as exc:
            # Ctrl-C, SIGINT, SIGTERM, SIGHUP while the steps ran (the processes are already ended) or after the
            # verdict, before the reports were begun: the reports are written again, whole, from the results.json
            # saved last, so none is left from before that save
            forget_half_imported(modules)
            if not (run_dir / RESULTS_JSON).is_file():
                return RunOutcome(rb, run_dir, {}, interrupted=exc, nothing_saved=True,
                                  run_dir_removed=made is not None and _remove_empty(run_dir, made))
            return _rewrite_reports(rb, run_dir, request.no_report, exc, say)
    except (RunDirError, ResultsError) as exc:
        raise RunError(str(exc)) from None
    return RunOutcome(rb, run_dir, results, tuple(paths))


def _held(write: Callable, *args):
    """write(*args) to its end whatever signal comes meanwhile (interrupts.held); then that signal's Interrupted."""
    with interrupts.held() as hold:
        out = write(*args)
    hold.raise_it()
    return out


def _rewrite_reports(rb: Runbook, run_dir: Path, no_report: bool, exc: BaseException,
                     say: Callable[[str], None] = lambda message: None) -> RunOutcome:
    """The outcome of a run interrupted after its first save: its reports written again from results.json (`say`
    told so first: on a busy machine that takes a while, and the run would seem to hang)."""
    saved: dict = {}
    try:
        with interrupts.held():  # a later signal does not cut these short either
            if not no_report:
                with contextlib.suppress(OSError):  # a console gone (a closed pipe) does not stop the reports
                    say(f"writing the reports from {run_dir / RESULTS_JSON} ...")
            saved = read_results(run_dir)
            paths = [] if no_report else write_all_reports(run_dir, saved)
    except (RunDirError, ResultsError) as error:  # told after the interrupt itself
        return RunOutcome(rb, run_dir, saved, interrupted=exc, report_error=str(error))
    except Exception as error:  # noqa: BLE001 - the interrupt cut something short (an import); results.json is whole
        return RunOutcome(rb, run_dir, saved, interrupted=exc, reports_unwritten=(
            f"the reports could not be written after the interrupt ({type(error).__name__}: {error}); "
            f"{run_dir / RESULTS_JSON} is whole, and `nsa-validate report {shlex.quote(str(run_dir))} --write` "
            "writes them from it"))
    return RunOutcome(rb, run_dir, saved, tuple(paths), interrupted=exc)


def forget_half_imported(before: set[str]) -> list[str]:
    """Forget (remove from sys.modules) the modules imported since `before` whose package is no longer there: what
    an import cut short by an interrupt leaves. Python removes the module that raised, and each package above it
    that was still being imported, but keeps the submodules they had imported whole, which still refer to the
    half-built package (`module 'matplotlib' has no attribute 'get_data_path'` on the next use). Forgotten, they
    are imported again, whole, with their package. Returns their names."""
    present = set(sys.modules)
    gone = []
    for name, module in list(sys.modules.items()):
        parts = name.split(".")
        spec = module.__spec__ if isinstance(module, ModuleType) else None  # sys.modules may hold other objects
        compiled = spec is not None and isinstance(spec.loader, ExtensionFileLoader)
        if (name not in before and not compiled  # an extension module cannot be loaded twice (numpy's)
                and any(".".join(parts[:i]) not in present for i in range(1, len(parts)))):
            gone.append(name)
    for name in gone:
        sys.modules.pop(name, None)
    return gone


def _first_missing(path: Path) -> Path | None:
    """The outermost of `path` and the directories above it that do not exist (what making `path` creates first),
    or None when `path` exists."""
    missing = None
    current = Path(path)
    while not os.path.lexists(current) and current.parent != current:
        missing, current = current, current.parent
    return missing


def _remove_empty(path: Path, top: Path) -> bool:
    """Remove `path` and the directories above it up to `top`, each only while it is empty (what a run interrupted
    before its first save made); True when `path` is gone."""
    current = Path(path)
    try:
        while True:
            current.rmdir()
            if current == top or current.parent == current:
                break
            current = current.parent
    except OSError:
        pass
    return not os.path.lexists(path)


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
    """The runbook, validated (with `cwd`: the files it names checked to exist there); RunError otherwise (a path
    that is there but is not a regular file: a directory, /dev/null, is named as such)."""
    path = Path(runbook)
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "a device, pipe or socket"
        raise RunError(f"runbook {runbook}: not a regular file ({what}); a runbook is a YAML file, e.g. "
                       "runbooks/cpu_smoke.yaml")
    try:
        return load_runbook(runbook, list(overrides), cwd=cwd)
    except RunbookError as exc:
        raise RunError(str(exc)) from None


def plan_rows(runbook: Path, overrides: tuple[str, ...] | list[str], cwd: Path) -> tuple[Runbook, list[dict]]:
    """What `nsa-validate plan` shows: the runbook, loaded with `overrides` and the files it names checked to exist
    in `cwd` (load: RunError otherwise), and its plan's rows (validation.runbook.plan.describe), each step this
    machine cannot run saying why (skipped_here)."""
    rb = load(runbook, overrides, cwd)
    return rb, describe(rb, skipped_here(rb))


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
    _refuse_nothing_compared(out, f"{run_b} and {run_a}")
    return out, compare.table_lines(out)


def _refuse_nothing_compared(out: dict, runs: str) -> None:
    """RunError when the comparison `out` of `runs` has no row (no trainer run in common)."""
    if not out["rows"]:
        raise RunError(f"{runs} have no trainer run in common (same step and label): nothing to compare")


def add_performance_analysis(run_dir: Path, results: dict, against: Path, earlier: dict,
                             refuse_empty: bool = False) -> None:
    """results["performance_analysis"]: this run against the earlier one (validation.report.compare.performance_analysis),
    written to results.json. With `refuse_empty` (`report --against`, where nothing was run), two runs with no
    trainer run in common are a RunError, as for `compare`, and results.json is left as it was; a run's own
    --against keeps its comparison of nothing (the report says so) rather than lose the run."""
    analysis = _compare().performance_analysis(results, earlier, run_dir, against)
    if refuse_empty:
        _refuse_nothing_compared(analysis, f"--against {against}: it and {run_dir}")
    results["performance_analysis"] = analysis
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
    directory: a copy without its bulky files) but its PNG is still there; then any newly drawn, in their order.

    Each path is listed once. A run recorded before the plots of steps "x" and "_x" got distinct files holds two
    entries of one path: the plot drawn again at that path takes the first one's place and the other is dropped
    (its step's plot, drawn again, is under its own path now); not drawn again, the PNG is the plot saved last
    there (it replaced the earlier), so only the entry recorded last for that path is kept."""
    fresh = {p["path"]: p for p in drawn}
    records = [p for p in previous if isinstance(p, dict) and isinstance(p.get("path"), str)]
    last = {p["path"]: i for i, p in enumerate(records)}
    taken: set[str] = set()
    out = []
    for i, old in enumerate(records):
        path = old["path"]
        if path in taken:
            continue
        if path in fresh:
            out.append(fresh.pop(path))
            taken.add(path)
        elif last[path] == i and (Path(run_dir) / path).is_file():
            out.append(old)
            taken.add(path)
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
    RUN_DIR); with `against`, the comparison with that earlier run is stored in results.json first. Writing,
    it holds RUN_DIR (held_run_dir: RunDirError while a run holds it). RunError for bad input, ResultsError,
    ReportError or RunDirError from the files."""
    if fmt not in report.FORMATS:
        raise RunError(f"--format {fmt!r}: expected one of {', '.join(report.FORMATS)}")
    earlier = read_against(against)
    results = read_results(run_dir)
    if earlier is None and not write:
        return report.render(results, fmt, run_dir=run_dir), []
    # what writes into RUN_DIR holds it as a run does (held_run_dir), read and write alike: a run still saving
    # results.json would otherwise have its newer record replaced by this stale copy (a RunDirError, exit 2)
    with held_run_dir(run_dir):
        results = read_results(run_dir)
        if earlier is not None:
            if _same_path(against, run_dir):  # checked holding RUN_DIR: one that a run holds is refused as in use
                raise RunError(against_itself(against, run_dir))
            add_performance_analysis(run_dir, results, against, earlier, refuse_empty=True)
        if write:
            return None, write_all_reports(run_dir, results, keep_plots=True)
        return report.render(results, fmt, run_dir=run_dir), []


def listing_dir(path: Path, option: str) -> Path:
    """`path` when it is a directory; RunError naming `option` ("--runs") and the path otherwise."""
    if not Path(path).is_dir():
        what = "not a directory" if os.path.lexists(path) else "no such directory"
        raise RunError(f"{option} {path}: {what}")
    return Path(path)


def listing_dirs(runbooks_dir: Optional[Path], runs_dir: Optional[Path]) -> tuple[Path, Path]:
    """The directories `nsa-validate list` reads: `runbooks_dir` (None: runbooks) and `runs_dir` (None:
    DEFAULT_RUNS), each one given checked by listing_dir (RunError naming --runbooks or --runs, --runbooks first)."""
    return (Path("runbooks") if runbooks_dir is None else listing_dir(runbooks_dir, "--runbooks"),
            DEFAULT_RUNS if runs_dir is None else listing_dir(runs_dir, "--runs"))


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


# the largest results.json a listing reads (a run's is well under 1 MiB: 0.3 MiB for cpu_smoke's 5 steps)
LIST_MAX_BYTES = 64 << 20

def _not_listed(path: Path) -> str | None:
    """Why a listing does not read `path` (its row's verdict), from its stat alone: a results.json that is not a
    regular file (a FIFO, a device: reading it waits for a writer, or never ends; store.not_regular_file) or is
    larger than LIST_MAX_BYTES; None for one to read (where stat fails, reading it fails too: "unreadable")."""
    odd = not_regular_file(path)
    if odd:
        return f"unreadable: {odd}"
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if size > LIST_MAX_BYTES:
        return f"unreadable: {size / (1 << 20):,.0f} MiB, larger than a listing reads ({LIST_MAX_BYTES >> 20} MiB)"
    return None


def list_runs(runs_dir: Path) -> list[tuple]:
    """(run directory, runbook name, verdict, started) of every run under `runs_dir`, from its results.json as it
    is (not checked against the schema: a listing shows runs of any version); an unreadable one: "unreadable", one
    that is not a regular file or is larger than LIST_MAX_BYTES: "unreadable: " and why, without reading it (a FIFO
    of that name held the listing forever)."""
    runs = []
    for results_path in sorted(Path(runs_dir).glob("*/results.json")):
        why = _not_listed(results_path)
        if why is not None:
            runs.append((results_path.parent, "?", why, ""))
            continue
        try:
            data = load_json(results_path)
            runs.append((results_path.parent, data["runbook"]["name"], data["verdict"], data["started"]))
        except (ResultsError, KeyError, TypeError):
            runs.append((results_path.parent, "?", "unreadable", ""))
    return runs
