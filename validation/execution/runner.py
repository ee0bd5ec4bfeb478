"""Executes a runbook: every step in order, results on disk after each one, acceptance, verdict.

Each step is run by its kind (validation.kinds: StepKind.run) through a StepContext: the runner starts the kind's
launches (validation.launch), records them in the step's results entry and saves results.json; what a step
measures and how it passes is its kind's business.

The runner never prints: it reports progress through a `Reporter` (the CLI's is a rich live display) and returns
the results record (validation.results.model.RunResults).

Steps run in order; a step whose runbook entry says `on_failure: stop` and that ends failed, timeout, hang or
error ends the run there: the remaining steps are recorded as skipped ("not run: step X failed and on_failure is
stop") and the verdict is computed as usual.

A run continued with --resume (Runner(previous=...)) runs only the steps without a final status, plus those named by
--rerun, plus, decided as the run reaches them, the steps it kept that take a setting from a step's choice
(${STEP.winner...}) that differs now from the value they ran with, or that were skipped for want of a choice that is
there now (STEP run again chose otherwise: Runner._rerun_if_superseded; a kept step still measured under other
settings than the run now gives it is named in the resume's kept_changed and the verdict's reason, with the command
that measures it again); check_resume first refuses a run directory of another runbook (by name), a finished run
with nothing to run again, and --rerun names that are no steps. Each resume is recorded in results["resumes"] (when
the earlier attempt ended and how, what this one runs, its own --only, --skip and --set; validation.results.store).
A resume runs with the --set it is given, not with the run's earlier ones (validation.run warns when they differ).
From the moment a run starts until its verdict is computed, results.json says INCOMPLETE with a reason saying so,
and the acceptance rows and recommendations of an earlier attempt are cleared: a run cut off at any point never
shows a verdict that contradicts its own reason or its steps.

Every file the run writes lies under RUN_DIR: each output path is checked (relative, no `..`) and no existing
symlink on it or under a step's directory may lead outside RUN_DIR (e.g. RUN_DIR/<step> replaced by a link to
another directory before a --resume); such a run stops before writing anything with RunDirError, as does a run
whose directory cannot be written (disk full, permission denied, not a directory).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from validation.formatting import first_of
from validation.launch import environment
from validation.execution import evidence
from validation.execution.acceptance import evaluate, recommendations, verdict
from validation.launch import LaunchResult, LaunchSpec, launch, recorded_env
from validation.launch.interrupts import Interrupted
from validation.launch.interrupts import describe as describe_interrupt
from validation.runbook.model import resolve_references, step_definition
from validation.runbook.plan import launch_env, step_launches
from validation.results.store import (FAILED_STEP_STATUSES, FINAL_STEP_STATUSES, RESULTS_JSON, SCHEMA_VERSION, RunDirError,
                                cannot_write, inside_run_dir, os_error_text, resume_note, write_results)
from validation.results.model import (Options, PhaseRecord, Recommendations, ReplacedStep, Resume, RunbookRef,
                                      RunResults, StepResult, Tool)
from validation.results.codec import decode, encode, given
from validation.results.decision import Choice as ChoiceRecord
from validation.results.reuse import Reuse, definition_differences
from validation.results.run import Resume as ResumeRecord, Step as StepRecord, read_run
from validation.runbook.loader import Runbook, RunbookError, Step, load_runbook, references
from validation.kinds.base import undeclared_metrics
from validation.version import version as tool_version


class Reporter:
    """Progress hooks; the default does nothing."""

    def run_resumed(self, note: str) -> None: ...  # before run_started, when the run continues an earlier one
    def run_started(self, runbook: Runbook, run_dir: Path, steps: list[Step]) -> None: ...
    def step_started(self, step: Step, launches: int) -> None: ...
    def launch_started(self, step: Step, planned: LaunchSpec, index: int, total: int) -> None: ...
    def launch_progress(self, step: Step, progress) -> None: ...
    def step_finished(self, step: Step, result: StepResult) -> None: ...
    def run_finished(self, results: RunResults) -> None: ...


class _SafeReporter:
    """Progress display must never cost a run its results: reporter errors are logged and dropped. Calls are
    serialised (a lock): a step that runs launches side by side (StepContext.launch_all) reports from several
    threads."""

    def __init__(self, inner: Reporter):
        self._inner = inner
        self._lock = threading.Lock()

    def __getattr__(self, name):
        method = getattr(self._inner, name)

        def call(*args, **kwargs):
            try:
                with self._lock:
                    return method(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - display only
                logging.getLogger(__name__).warning("progress display failed in %s: %s", name, exc)
                return None

        return call


@dataclass
class RunOptions:
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    cwd: Path = Path(".")
    rerun: tuple[str, ...] = ()  # --rerun: steps of a resumed run to run again, whatever their status
    reuse: dict[str, Reuse] = field(default_factory=dict)  # --reuse: phases taken from an earlier run (validation.results.reuse)
    resume: ResumeJudgement | None = None  # judge_resume's reading of a --resume, when the caller has made it already


@dataclass(frozen=True)
class ResumeJudgement:
    """What a resume keeps that differs from what it would run now (judge_resume): whether the runbook file changed
    since the run started (runbook_file_changed) and the kept steps measured under other settings (kept_but_changed)."""
    runbook_changed: bool
    kept_changed: dict[str, str]


def judge_resume(runbook: Runbook, previous: RunResults, rerun: tuple[str, ...] | list[str] = ()) -> ResumeJudgement:
    """runbook_file_changed and kept_but_changed of resuming `previous` with `runbook` and --rerun `rerun`, read once
    for the warnings (validation.run) and the resume record (Runner)."""
    return ResumeJudgement(runbook_file_changed(runbook, previous),
                           kept_but_changed(runbook, previous, steps_to_run(runbook, previous, rerun)))


class ResumeError(ValueError):
    """A --resume (or --rerun) that would overwrite a run or do nothing; the message is one line naming both runs
    or the step."""


def _now(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(at))


def left_out(step: Step, options: RunOptions) -> str | None:
    """Why --only or --skip leave `step` out of the run, or None (the runner's first skip reason, and
    `run --dry-run`'s: validation.run.not_run)."""
    if options.only and step.phase not in options.only:
        return f"phase {step.phase} not selected (--only {' '.join(options.only)})"
    if step.phase in options.skip:
        return f"phase {step.phase} skipped (--skip)"
    return None


def steps_to_run(runbook: Runbook, results: RunResults, rerun: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The steps of `runbook` that a run continuing `results` runs: those without a final status there (pending,
    running, interrupted, or new in the runbook), those named in `rerun`, and those a step `rerun` names had kept
    from running (skipped there because it failed and its on_failure is stop: they run once it no longer stops the
    run, and are skipped again if it does); in runbook order. A kept step whose ${STEP.winner...} setting the run
    changes meanwhile runs too, decided as the run reaches it (Runner._rerun_if_superseded)."""
    done = read_run(results).steps
    stopped = {stopped_reason(name, status) for name in rerun for status in FAILED_STEP_STATUSES}
    out = []
    for s in runbook.steps():
        record = done.get(s.name) or StepRecord()
        if (s.name in rerun or record.status not in FINAL_STEP_STATUSES
                or (record.status == "skipped" and record.reason in stopped)):
            out.append(s.name)
    return out


def check_resume(runbook: Runbook, previous: RunResults, run_dir: Path | str, rerun: tuple[str, ...] | list[str] = ()
                 ) -> None:
    """Raise ResumeError unless `runbook` may continue the run `previous` (RUN_DIR/results.json): it must be a run
    of the same runbook (by name; a changed runbook of that name is the caller's warning), every --rerun name a
    step of the runbook, and there must be something to do: a step still to run, a step to run again, or a
    verdict the earlier attempt did not reach (the refusal names the steps whose definition changed since they ran:
    kept_but_changed)."""
    before = read_run(previous)
    earlier = before.runbook
    names = [s.name for s in runbook.steps()]
    if earlier.name != runbook.name:
        raise ResumeError(f"--resume {run_dir}: it holds a run of runbook {earlier.name!r} "
                          f"({earlier.path or 'path unknown'}), not of {runbook.name!r} ({runbook.path}); "
                          f"continue it with its own runbook, or start a new run with --out")
    for name in rerun:
        if name not in names:
            raise ResumeError(f"--rerun {name}: no step {name!r} in {runbook.path} (steps: {', '.join(names)})")
    if not rerun and _reached_verdict(previous) and not steps_to_run(runbook, previous):
        changed = kept_but_changed(runbook, previous, [])
        since = (f"; measured under other settings than {runbook.path} and this --set give them now: "
                 + "; ".join(f"{n} ({why})" for n, why in changed.items())
                 + f" (--rerun {' --rerun '.join(changed)} measures them again)") if changed else ""
        raise ResumeError(f"--resume {run_dir}: nothing to resume: the run finished ({before.verdict}, "
                          f"{before.finished}) and every step of {runbook.name} has its result{since}; to run "
                          f"steps again into it name them with --rerun STEP (steps: {', '.join(names)}), or start "
                          f"a new run with --out")


def kept_but_changed(runbook: Runbook, previous: RunResults, todo: list[str] | tuple[str, ...]) -> dict[str, str]:
    """{step: how it differs} of the steps a resume keeps (not in `todo`) whose recorded definition
    (validation.runbook.plan.step_definition) is not what `runbook`, with this resume's --set, would run: their
    results were measured under other settings (the resume record and the report say so; --rerun measures them
    again). A step that recorded no definition (a run of an older version) is not judged."""
    before = read_run(previous)
    out = {}
    for step in runbook.steps():
        record = before.steps.get(step.name)
        if step.name in todo or record is None or given(record.reused) is not None:
            continue
        if not isinstance(record.definition, dict) or not record.definition:
            continue
        differences, _ = definition_differences(step_definition(step), record.definition, {})
        if differences:
            more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
            out[step.name] = differences[0] + more
    return out


def _source_change(before, now: dict[str, Any]) -> dict[str, Any] | None:
    """The source the earlier attempt ran and the one this resume runs, when they differ (by source digest, else by
    git sha): {"before": {git_sha, git_dirty, source_digest}, "now": {...}}; None when they are the same or unknown."""
    keys = ("git_sha", "git_dirty", "source_digest")
    old_sha, old_dirty, old_digest = (getattr(before, k, None) for k in keys)
    new_sha, new_dirty, new_digest = (now.get(k) for k in keys)
    if old_digest and new_digest:
        same = old_digest == new_digest
    elif old_sha and new_sha:
        same = (old_sha, old_dirty) == (new_sha, new_dirty) and not new_dirty
    else:
        return None
    return None if same else {"before": dict(zip(keys, (old_sha, old_dirty, old_digest))),
                              "now": dict(zip(keys, (new_sha, new_dirty, new_digest)))}


def runbook_file_changed(rb: Runbook, previous: RunResults) -> bool:
    """Whether the runbook file (or a file it includes) differs from the one the run `previous` started with. The
    sha256 results.json records covers the file, its includes and the first run's --set, so a resume given other
    --set (warned about on their own) is compared with it under the first run's --set."""
    before = read_run(previous)
    recorded = before.runbook.sha256
    if recorded == rb.sha256:
        return False
    first = before.options.set
    if not isinstance(first, list) or not rb.path:  # early records: {key: value}, not the --set text it covered
        return True
    try:
        return load_runbook(rb.path, [str(item) for item in first]).sha256 != recorded
    except RunbookError:
        return True


def _reached_verdict(results: RunResults) -> bool:
    """Whether a run ended with its verdict computed, not cut off (a signal's verdict counts as cut off)."""
    run = read_run(results)
    return bool(run.finished) and not run.interrupted_by


# a resume's not_rerun reason for a step --rerun named that an interrupt kept it from reaching (its earlier result kept)
NOT_REACHED = "the run was interrupted before it ran again"


class Runner:
    def __init__(self, runbook: Runbook, run_dir: Path, options: RunOptions, reporter: Reporter | None = None,
                 previous: RunResults | None = None):
        self.rb, self.run_dir, self.opt = runbook, Path(run_dir), options
        self.reporter = _SafeReporter(reporter or Reporter())
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_write(self.run_dir, exc) from None
        self.env_record = environment.probe(options.cwd)
        self._resuming = previous is not None
        # the earlier results of the steps --rerun sets back to pending: kept where such a step then does not run
        self._earlier: dict[str, StepResult] = {}
        # steps kept from an earlier attempt that run again because a choice they use changed: why (superseded_settings)
        self._superseded: dict[str, str] = {}
        self._winners_before: dict[str, dict[str, Any]] = {}  # the choices the run held when this resume began
        self._resume_entry: Resume | None = None  # this resume's record (results["resumes"]' last)
        if previous is not None:
            self._continue(previous)
        self.results: RunResults = previous or self._fresh_results()
        self.results["environment"] = {**self.results.get("environment", {}), **self.env_record}
        if options.reuse:
            taken = {r.phase: encode(r) for r in read_run(self.results).reused or [] if given(r) is not None}
            taken.update({phase: reuse.record() for phase, reuse in options.reuse.items()})
            self.results["reused"] = list(taken.values())
        self.results["finished"] = None
        self.results["interrupted_by"] = None
        # until _finish computes them together: no verdict, and nothing left of an earlier attempt's evaluation
        self.results["acceptance"] = []
        self.results["recommendations"] = Recommendations(env={}, notes=[])
        self.results.pop("evidence", None)
        self.results["verdict"], self.results["verdict_reason"] = self._unfinished_verdict()

    def _unfinished_verdict(self) -> tuple[str, str]:
        run = read_run(self.results)
        when = f"resumed at {run.resumes[-1].at}" if run.resumes else f"started at {run.started}"
        return "INCOMPLETE", (f"not finished: the run ({when}) has not reached its verdict; if it is no longer "
                              "running, `nsa-validate run --resume RUN_DIR` continues it")

    def _continue(self, previous: RunResults) -> None:
        """Prepare `previous` (an earlier attempt's results) to be continued: the steps named by --rerun back to
        pending (what they held is kept in the resume record), and the resume recorded in previous["resumes"]."""
        before = read_run(previous)
        if before.finished:
            ended = before.finished
        else:  # killed before it could record anything: its last save is when it stopped
            try:
                ended = _now((self.run_dir / RESULTS_JSON).stat().st_mtime)
            except OSError:
                ended = None
        if before.interrupted_by:
            how = f"interrupted by {before.interrupted_by}"
        elif before.finished:
            how = f"finished ({before.verdict})"
        else:
            how = "stopped without finishing (no signal recorded: the process was killed or the machine went down)"
        todo = steps_to_run(self.rb, previous, self.opt.rerun)
        by_name = {step.name: step for step in self.rb.steps()}
        runs = [n for n in todo if left_out(by_name[n], self.opt) is None]  # what --only / --skip leave in: it runs
        judged = self.opt.resume or judge_resume(self.rb, previous, self.opt.rerun)
        self._winners_before = {name: c.params for name, c in ((n, chosen(r)) for n, r in before.steps.items())
                                if c is not None}
        entry = Resume(at=_now(), previous_end=ended, previous_state=how, steps=runs,
                       rerun=[n for n in runs if n in self.opt.rerun], replaced={},
                       runbook_changed=judged.runbook_changed,
                       options=Options(only=list(self.opt.only), skip=list(self.opt.skip),
                                       set=list(self.opt.overrides)))
        if judged.kept_changed:
            entry["kept_changed"] = dict(judged.kept_changed)
        source = _source_change(before.environment, self.env_record)
        if source:
            entry["source_changed"] = source
        records = previous["steps"]  # as results.json holds them (what a kept record stays)
        for step in self.rb.steps():
            if step.name in todo and step.name not in self.opt.rerun and \
                    (before.steps.get(step.name) or StepRecord()).status == "skipped":
                records[step.name] = self._pending(step)  # a stop kept it from running: it runs now (steps_to_run)
            if step.name in self.opt.rerun:
                old = before.steps.get(step.name) or StepRecord()
                entry["replaced"][step.name] = ReplacedStep(status=old.status, reason=old.reason,  # type: ignore
                                                            started=old.started, duration_s=old.duration_s)
                if kept_if_not_rerun(old):
                    self._earlier[step.name] = records[step.name]
                records[step.name] = self._pending(step)
        if self.opt.rerun:  # a comparison with an earlier run measured the steps replaced now
            previous.pop("performance_analysis", None)
        # a runbook that gained steps since (runbook_changed): each has its pending record from the start, and the
        # phases are the runbook's as it runs now (a step it no longer has keeps its record, under "other steps")
        for step in self.rb.steps():
            records.setdefault(step.name, self._pending(step))
        if judged.runbook_changed:
            previous["phases"] = self._phases()
        previous["resumes"] = [*(previous.get("resumes") or []), entry]
        self._resume_entry = entry

    # ------------------------------------------------------------------ results skeleton
    def _fresh_results(self) -> RunResults:
        rb = self.rb
        return RunResults(
            schema_version=SCHEMA_VERSION,
            tool=Tool(name="nsa-validate", version=tool_version()),
            # compare: only where the runbook declares it (the record's `compare?`: absent, never null)
            runbook=RunbookRef(name=rb.name, description=rb.description, path=rb.path, sha256=rb.sha256,
                               **({} if rb.compare_noise is None else {"compare": rb.compare_noise})),
            run_dir=str(self.run_dir), started=_now(), finished=None, duration_s=None,
            verdict="INCOMPLETE", verdict_reason="", interrupted_by=None,  # set by __init__
            environment={},
            options=Options(only=list(self.opt.only), skip=list(self.opt.skip), set=list(self.opt.overrides)),
            phases=self._phases(),
            steps={s.name: self._pending(s) for s in rb.steps()},
            acceptance=[], recommendations=Recommendations(env={}, notes=[]), plots=[],
        )

    def _phases(self) -> list[PhaseRecord]:
        return [PhaseRecord(name=p.name, title=p.title, description=p.description, steps=[s.name for s in p.steps])
                for p in self.rb.phases]

    @staticmethod
    def _pending(step: Step) -> StepResult:
        return StepResult(name=step.name, phase=step.phase, kind=step.kind, title=step.title,
                          description=step.description, status="pending", reason=None, started=None,
                          duration_s=None, dir=step.name, command=None, env={}, metrics={}, runs=[],
                          winner=None, comparison=[], artifacts=[], excerpt=None, stack_dumps=[],
                          optional=step.optional, definition=step_definition(step))

    def save(self) -> None:
        write_results(self.run_dir, self.results)

    # ------------------------------------------------------------------ the run
    def run(self, first_saved: Callable[[RunResults], None] | None = None) -> RunResults:
        """Run the steps; `first_saved(results)` is called once right after the run's first save (results.json
        then says INCOMPLETE, not finished): validation.run re-renders an earlier attempt's reports from it, so a
        resume cut off even by SIGKILL never leaves a report whose verdict results.json no longer holds."""
        steps = self.rb.steps()
        self._check_outputs_inside(steps)
        if self._resuming:
            self.reporter.run_resumed(resume_note({"resumes": self.results["resumes"][-1:]}) or "")
        self.reporter.run_started(self.rb, self.run_dir, steps)
        t0 = time.time()
        self.save()
        stopped_by: Step | None = None  # a step with on_failure: stop that failed
        try:
            if first_saved is not None:  # inside the try: a signal meanwhile ends the run as during a step
                first_saved(self.results)
            for step in steps:
                self._rerun_if_superseded(step, stopped_by)
                if self._status(step.name) not in FINAL_STEP_STATUSES:
                    if stopped_by is not None:
                        result = self._not_run(step, stopped_by)
                    else:
                        try:
                            result = self._run_step(step)
                        except OSError as exc:  # writing the step's files (disk full, permission denied)
                            where = exc.filename if isinstance(exc.filename, str) else self.run_dir / step.name
                            raise RunDirError(f"step {step.name}: cannot write {where}: {os_error_text(exc)}") \
                                from None
                    result, shown = self._kept_or(step.name, result)
                    self._note_superseded(step.name, result, shown)
                    self._keep(step.name, result)
                    self.save()
                    self.reporter.step_finished(step, shown)
                # a step finished in an earlier, interrupted run (--resume) counts too
                if stopped_by is None and step.on_failure == "stop" and self._status(step.name) in FAILED_STEP_STATUSES:
                    stopped_by = step
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (validation.launch.interrupts.Interrupted)
            how = describe_interrupt(exc)
            for name, res in self._records.items():
                if res["status"] == "running":
                    res.update(status="interrupted", reason=f"interrupted ({how})")
            self._keep_unreached()
            self.results["interrupted_by"] = how
            self._finish(t0, interrupted=True)
            raise
        self._finish(t0, interrupted=False)
        return self.results

    def _finish(self, t0: float, interrupted: bool) -> None:
        self.results["evidence"] = evidence.assess(self.rb, self.results, str(self.run_dir))
        self.results["acceptance"] = evaluate(self.rb, self.results, self.run_dir)
        self.results["recommendations"] = recommendations(self.rb, self.results)
        self.results["verdict"], self.results["verdict_reason"] = verdict(
            self.results, (self.results.get("interrupted_by") or "Ctrl-C") if interrupted else False)
        if not interrupted:
            self.results["verdict_reason"] += self._kept_changed_note()
        self.results["finished"] = _now()
        self.results["duration_s"] = round(time.time() - t0 + (self.results.get("duration_s") or 0.0), 3)
        self.save()
        self.reporter.run_finished(self.results)

    def _kept_changed_note(self) -> str:
        """What the verdict's reason adds for the steps this resume kept as measured under other settings than the
        runbook, this resume's --set and the run's choices now give them (its kept_changed: the criteria and the
        verdict stand on those results): their names, how they differ, and the command that measures them again
        (with this resume's --set); "" for none."""
        changed = decode(ResumeRecord, self._resume_entry, "resume", lenient=True).kept_changed \
            if self._resume_entry is not None else {}
        if not changed:
            return ""
        return ("; kept from an earlier attempt as measured under other settings than the run now gives them: "
                + "; ".join(f"{n} ({why})" for n, why in changed.items()) + "; measure them again: "
                + evidence.rerun_command(self.rb.path or "RUNBOOK", str(self.run_dir), list(changed),
                                         self.opt.overrides))

    def _kept_or(self, name: str, result: StepResult) -> tuple[StepResult, StepResult]:
        """(the record to keep, the one to show) of step `name` that ended `result`. A step --rerun named that did
        not run again after all (skipped: a step before it stopped the run, the winner it uses is missing, this
        machine lacks what it needs) keeps its earlier result, and this resume's record says so (not_rerun, with
        why), instead of a skip that would lose what was measured; the console shows the skip and the result kept."""
        ended = decode(StepRecord, result, f"steps.{name}", lenient=True)
        if ended.status != "skipped" or name not in self._earlier or self._resume_entry is None:
            return result, result
        earlier = self._earlier.pop(name)
        why = ended.reason or "skipped"
        self._resume_entry.setdefault("not_rerun", {})[name] = why
        kept = decode(StepRecord, earlier, f"steps.{name}", lenient=True).status
        return earlier, StepResult(result, reason=f"not run again ({why}): its earlier result ({kept}) kept")

    def _rerun_if_superseded(self, step: Step, stopped_by: Step | None) -> None:
        """A step kept from an earlier attempt (--resume) that takes a setting from another step's choice
        (${STEP.winner...}) and ran with another value than the run's choice gives it now (STEP was run again and
        chose otherwise: superseded_settings), or was skipped for want of a choice the run holds now, is run again,
        as --rerun would: set back to pending, what it held in this resume's record (replaced, rerun), its earlier
        result kept if it then does not run (Runner._kept_or). Where a step before it stopped the run, a step that
        had run stays as measured, named in the resume's kept_changed."""
        record = self._step(step.name)
        if (self._resume_entry is None or record is None or record.status not in FINAL_STEP_STATUSES
                or given(record.reused) is not None):
            return
        winners = self._winners()
        if record.status == "skipped":  # measured nothing: run it once the choice it lacked is there
            differences = [f"the choice of {ref} it lacked: there now" for ref in winner_refs(step)
                           if ref in winners and (record.reason or "").startswith(no_winner_reason(ref, "")[:-2])]
        else:
            differences = superseded_settings(step, record, winners, self.run_dir, self._winners_before)
        if not differences:
            return
        why = differences[0] + (f" (and {len(differences) - 1} more)" if len(differences) > 1 else "")
        entry = self._resume_entry
        if stopped_by is not None:
            if record.status != "skipped":
                entry.setdefault("kept_changed", {}).setdefault(step.name, why)
            return
        self._superseded[step.name] = why
        entry["replaced"][step.name] = ReplacedStep(status=record.status, reason=record.reason,  # type: ignore
                                                    started=record.started, duration_s=record.duration_s)
        for key in ("steps", "rerun"):
            if step.name not in entry[key]:
                entry[key].append(step.name)
        if step.name in decode(ResumeRecord, entry, "resume", lenient=True).kept_changed:  # an earlier pass named it
            entry.setdefault("kept_changed", {}).pop(step.name)
        if kept_if_not_rerun(record):
            self._earlier[step.name] = self._records[step.name]
        self._records[step.name] = self._pending(step)
        self.results.pop("performance_analysis", None)  # a comparison with an earlier run measured what it held

    def _note_superseded(self, name: str, result: StepResult, shown: StepResult) -> None:
        """For a step _rerun_if_superseded ran again: a note on its record saying why; where it did not run after
        all and kept its earlier result, the resume's kept_changed names it (measured under a superseded setting)."""
        why = self._superseded.pop(name, None)
        if why is None or self._resume_entry is None:
            return
        if result is not shown:  # its earlier result kept (Runner._kept_or)
            self._resume_entry.setdefault("kept_changed", {})[name] = why
            return
        result.setdefault("notes", []).append(f"run again: it takes a setting from another step's choice, which "
                                              f"changed since its earlier result ({why})")

    def _keep(self, name: str, record: StepResult) -> None:
        """Step `name`'s record in the results from now on (saved with the next save)."""
        self._records[name] = record

    def _keep_unreached(self) -> None:
        """After an interrupt: a step --rerun named that the run had not reached (still pending, its directory as the
        earlier attempt left it) keeps its earlier result, this resume's record saying so (not_rerun:
        NOT_REACHED), instead of a pending record that lost what was measured; `--resume --rerun STEP` runs it
        again (validation.run's interrupt message names it)."""
        for name in list(self._earlier):
            if self._status(name) == "pending" and self._resume_entry is not None:
                self._keep(name, self._earlier.pop(name))
                self._resume_entry.setdefault("not_rerun", {})[name] = NOT_REACHED

    def _not_run(self, step: Step, stopped_by: Step) -> StepResult:
        status = self._status(stopped_by.name)
        result = self._pending(step)
        result.update(status="skipped", duration_s=0.0, reason=stopped_reason(stopped_by.name, status))
        return result

    # ------------------------------------------------------------------ outputs stay inside RUN_DIR
    def _step_paths(self, step: Step) -> list[str]:
        """Every path (relative to RUN_DIR) that `step` writes under."""
        paths = [step.name]
        for pl in step_launches(step, None, self.run_dir):
            paths += [pl.dir] + ([pl.out_dir] if pl.out_dir else [])
        return paths

    def _check_outputs_inside(self, steps: list[Step]) -> None:
        """Before anything runs: every output path of the steps still to run, and the plots directory, stays
        inside RUN_DIR. Raises RunDirError."""
        inside_run_dir(self.run_dir, "plots")
        for step in steps:
            if self._status(step.name) not in FINAL_STEP_STATUSES:
                for rel in self._step_paths(step):
                    inside_run_dir(self.run_dir, rel)

    # ------------------------------------------------------------------ one step
    def _skip_reason(self, step: Step) -> str | None:
        reason = left_out(step, self.opt)
        if reason:
            return reason
        reason = environment.unmet_for(step, self.env_record)
        if reason:
            return reason
        reason = step.kind_impl.skip_reason(step)
        if reason:
            return reason
        for ref in winner_refs(step):
            if chosen(self._step(ref)) is None:
                return no_winner_reason(ref, self._status(ref))
        return None

    def _winners(self) -> dict[str, dict[str, Any]]:
        picked = {name: chosen(self._step(name)) for name in self._records}
        return {name: c.params for name, c in picked.items() if c is not None}

    @property
    def _records(self) -> dict[str, StepResult]:
        """The run's step records as results.json holds them (what the runner writes and keeps)."""
        return self.results["steps"]

    def _step(self, name: str) -> StepRecord | None:
        """Step `name`'s record as the run holds it now, None before it has one. Decoded leniently: a step may come
        from an earlier attempt's results.json (--resume), checked when read against validation.results.model's
        schema, which leaves a launch's metrics freer than the records do; what is read here (status, choice,
        winner) the schema checks."""
        record = self._records.get(name)
        return decode(StepRecord, record, f"steps.{name}", lenient=True) if record else None

    def _status(self, name: str) -> str | None:
        """Step `name`'s status now: None before it has a record."""
        return (self._step(name) or StepRecord()).status

    def _run_step(self, step: Step) -> StepResult:
        result = self._pending(step)
        result["started"] = _now()
        t0 = time.time()
        if step.phase in self.opt.reuse:  # nothing is launched: the earlier run's outcome and figures
            return self.opt.reuse[step.phase].step_result(result)
        skip = self._skip_reason(step)
        if skip:
            result.update(status="skipped", reason=skip, duration_s=0.0)
            return result
        planned = step_launches(step, self._winners(), self.run_dir)
        # checked again right before writing: a link may have appeared since the run started
        for rel in [step.name] + [p for spec in planned for p in (spec.dir, spec.out_dir) if p]:
            inside_run_dir(self.run_dir, rel)
        result["status"] = "running"
        self._records[step.name] = result
        self.save()
        step_dir = self.run_dir / step.name
        try:
            step_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_write(step_dir, exc) from None
        self.reporter.step_started(step, max(1, len(planned)))
        ctx = StepContext(self, step, planned, result)
        try:
            ctx.merge(step.kind_impl.run(step.options, ctx), final=True)
            self._note_undeclared_metrics(step, result)
            record = evidence.step_interference(result)  # what else used the machine while it measured
            if record is not None:
                result["interference"] = record
        except KeyboardInterrupt as exc:
            ctx.record_launched()
            result.update(status="interrupted", reason=f"interrupted ({describe_interrupt(exc)})")
            raise
        finally:
            result["duration_s"] = round(time.time() - t0, 3)
        return result

    @staticmethod
    def _note_undeclared_metrics(step: Step, result: StepResult) -> None:
        """A note (a WARN in the report's open problems) naming the metrics the step recorded that its kind does
        not declare (StepKind.metrics): a criterion could not have named them before the run. The metrics stay."""
        undeclared = undeclared_metrics(step.kind_impl, step, result.get("metrics") or {})
        if undeclared:
            shown = first_of(undeclared, 6, sep=", ")
            result.setdefault("notes", []).append(
                f"metrics the {step.kind} kind does not declare: {shown} (its `metrics` should name them)")

    def _launch(self, step: Step, spec: LaunchSpec, index: int, total: int,
                stop: Callable[[], BaseException | None] | None = None) -> LaunchResult:
        """One launch to its end. `stop` (launches run side by side in threads, StepContext.launch_all): polled
        with the progress; an exception it returns is raised there, inside the launch, which then ends its
        processes as it does on Ctrl-C (validation.launch.local.Run.execute) and raises it again."""
        self.reporter.launch_started(step, spec, index, total)
        env = launch_env(step, spec)  # the ranks share this machine's cores, as the plan shows

        def progress(p) -> None:
            exc = stop() if stop is not None else None
            if exc is not None:
                raise exc
            self.reporter.launch_progress(step, p)

        return launch(dataclasses.replace(spec, env=env, cwd=self.opt.cwd, on_progress=progress))

    def _rel(self, path: Path | str | None) -> str | None:
        if path is None:
            return None
        try:
            return str(Path(path).resolve().relative_to(self.run_dir.resolve()))
        except ValueError:
            return str(path)



def stopped_reason(stopped_by: str, status: str | None) -> str:
    """Why a step after `stopped_by` (a step with on_failure: stop that ended `status`) is not run."""
    how = {"timeout": "timed out", "hang": "hung", "error": "ended in an error"}.get(status, "failed")
    return f"not run: step {stopped_by} {how} and on_failure is stop"


def kept_if_not_rerun(record: StepRecord) -> bool:
    """Whether a step's earlier record stays when --rerun names the step and it then does not run (Runner._kept_or;
    the dry run: validation.run.not_run): one that ran and ended (a skip measured nothing to keep)."""
    return record.status in FINAL_STEP_STATUSES and record.status != "skipped"


def winner_refs(step: Step) -> list[str]:
    """The steps whose winner `step`'s launch settings use (${STEP.winner...} in its env or args), sorted: checked
    before the step launches (Runner._skip_reason, and the dry run: validation.run.not_run)."""
    return sorted({r for v in list(step.launch.env.values()) + list(step.launch.args.values()) for r in references(v)})


def superseded_settings(step: Step, record: StepRecord, winners: dict[str, dict[str, Any]], run_dir: Path,
                        before: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """How the launch settings `step` takes from other steps' decisions (${STEP.winner...} in its env or args) differ
    between `record` (what it ran with, kept from an earlier attempt) and what `winners` (the choices the run holds
    now: Runner._winners) give it now: each "env.K: V when it ran, W now (the choice of STEP)" for a variable the
    record names (its `env`: the prefixed ones), "argv FLAG: V when it ran, W now (...)" for an argument of a
    launch's recorded command, and "the choice of STEP it used: none now" where a step it uses has no choice left.
    A variable the record does not name is judged by `before` (the choices the run held when this attempt began,
    which the kept step ran with unless an earlier resume changed them): what it resolves to with those and with
    `winners`. [] where they agree, or where nothing says (no command, no `before`)."""
    refs = winner_refs(step)
    if not refs:
        return []
    gone = [ref for ref in refs if ref not in winners]
    if gone:
        return [f"the choice of {ref} it used: none now" for ref in gone]
    try:
        planned, now = step_launches(step, None, None), step_launches(step, winners, run_dir)
    except LookupError as exc:  # a choice that lacks the setting the step takes from it
        return [f"the choice it used: {exc}"]
    commands = {run.label: run.command for run in record.runs or [] if run.command}
    if not commands and record.command and len(now) == 1:
        commands = {now[0].label: record.command}
    ran_env = record.env or {}
    out: list[str] = []
    for plan, spec in zip(planned, now):
        for key, value in plan.env.items():
            used = references(value)
            if not used:
                continue
            if key in ran_env:
                ran_value = ran_env[key]
            elif before is not None:
                try:
                    ran_value = resolve_references(value, before)
                except LookupError:  # no choice then: the step did not run with one
                    continue
            else:
                continue
            if str(ran_value) != str(spec.env.get(key)):
                out.append(f"env.{key}: {ran_value} when it ran, {spec.env.get(key)} now "
                           f"(the choice of {', '.join(dict.fromkeys(used))})")
        ran = commands.get(spec.label)
        if not ran or len(ran) != len(spec.argv) or len(plan.argv) != len(spec.argv):
            continue
        for i, word in enumerate(plan.argv):
            used = references(str(word))
            if used and str(ran[i]) != str(spec.argv[i]):
                flag = f" {plan.argv[i - 1]}" if i and str(plan.argv[i - 1]).startswith("-") else ""
                out.append(f"argv{flag}: {ran[i]} when it ran, {spec.argv[i]} now "
                           f"(the choice of {', '.join(dict.fromkeys(used))})")
    return list(dict.fromkeys(out))


def no_winner_reason(ref: str, status: str | None) -> str:
    """Why a step that uses ${ref.winner...} is skipped when `ref` (ended `status`) has no winner."""
    return f"needs the winner of {ref}, which has none ({status})"


def chosen(step: StepRecord | None) -> ChoiceRecord | None:
    """What ${step.winner.env.X} resolves to: the step's decision ("choice": a significant winner or the point
    kept, validation.kinds.sweep), else its "winner" (results written before decisions were recorded); None where
    it has neither (null, or an empty record)."""
    if step is None:
        return None
    return next((c for c in (step.choice, step.winner) if c is not None and c != ChoiceRecord()), None)


# The keys of a step's entry that the runner writes, whatever its kind returns: what the step is and when it ran.
FRAME_KEYS = ("name", "phase", "kind", "title", "description", "started", "duration_s", "dir", "optional")


@dataclass
class StepLaunches:
    """What a step's launches left, as each ended: the last one's command and recorded environment, every log
    (relative to RUN_DIR), the last excerpt, every stack dump, and a note for each launch started more than once
    (its rendezvous port was in use: validation.launch.attempt)."""
    command: list[str] | None = None
    env: dict[str, Any] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    excerpt: str | None = None
    stack_dumps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, runner: Runner, spec: LaunchSpec, lr: LaunchResult) -> None:
        self.command = list(lr.argv)
        self.env = recorded_env(spec.env, only_prefixed=True)[0]
        logs = {runner._rel(lr.log_path), *(runner._rel(p) for p in lr.rank_logs.values())} - {None}
        self.artifacts = sorted({*self.artifacts, *logs})
        self.excerpt = lr.excerpt or self.excerpt
        self.stack_dumps = sorted({*self.stack_dumps, *(runner._rel(p) for p in lr.stack_dumps)})
        if lr.attempts > 1:
            log_name = runner._rel(lr.log_path) or str(lr.log_path)
            self.notes.append(f"{f'launch {spec.label}' if spec.label else 'the launch'} was started {lr.attempts} "
                              f"times: its rendezvous port was in use (address already in use), so it ran again on "
                              f"a fresh port; {log_name} is the last attempt's log, the earlier ones are kept "
                              f"beside it ({Path(log_name).stem}.attempt<n>{Path(log_name).suffix})")

    def into(self, step: StepRecord) -> dict[str, Any]:
        """The step's command, env, artifacts, excerpt and stack dumps with these added: the command, environment
        and excerpt the step's own record names win; its own artifacts follow the logs; the launches' notes follow
        its own (the key only where there is a note)."""
        out = {"command": step.command if step.command is not None else self.command,
               "env": step.env or self.env,
               "artifacts": self.artifacts + [a for a in step.artifacts if a not in self.artifacts],
               "excerpt": step.excerpt or self.excerpt,
               "stack_dumps": sorted({*self.stack_dumps, *step.stack_dumps})}
        own = list(step.notes or [])
        if self.notes:
            out["notes"] = own + [n for n in self.notes if n not in own]
        return out


class StepContext:
    """What a step kind's run() gets from the runner (validation.kinds.base.StepKind.run): the step, its planned
    launches, the means to launch them, and the run so far. Every launch's command, environment, logs, excerpt and
    stack dumps are recorded as it ends, into the step's entry (merge)."""

    def __init__(self, runner: Runner, step: Step, launches: list[LaunchSpec] | None = None,
                 entry: StepResult | None = None):
        self._runner, self._step = runner, step
        self.step: Step = step  # the runbook's step: name, kind, launch settings, options
        self.launches: list[LaunchSpec] = list(launches or [])  # what plan shows, in order
        self.run_dir: Path = runner.run_dir
        self.cwd: Path = runner.opt.cwd
        self.results: RunResults = runner.results  # the whole run's results so far (other steps, environment)
        self._entry: StepResult = entry if entry is not None else {}  # the step's results.json entry, live
        self._launched = StepLaunches()

    def _ended(self, spec: LaunchSpec, lr: LaunchResult) -> None:
        self._launched.add(self._runner, spec, lr)

    def merge(self, record: StepRecord, final: bool = False) -> None:
        """Put a kind's Result (or a partial one: final False) into the step's entry: every key but the frame
        (FRAME_KEYS, the runner's), a partial one's status only when it has one (the step stays "running"), and
        what the launches so far left (StepLaunches.into)."""
        for key, value in encode(record).items():
            if key in FRAME_KEYS or (key == "status" and value is None and not final):
                continue
            self._entry[key] = value
        self._entry.update(self._launched.into(record))

    def record_launched(self) -> None:
        """What the launches so far left, into the step's entry (on an interrupt, where the kind returned nothing)."""
        self._entry.update(self._launched.into(decode(StepRecord, self._entry, "step", lenient=True)))

    def launch(self, spec: LaunchSpec, index: int = 0, total: int = 1) -> LaunchResult:
        """Run one of the step's launches to its end (progress shown, this machine's thread count set). A launch
        the kind builds while it runs (e.g. a bisection's next point) is checked to write inside RUN_DIR too."""
        for rel in (spec.dir, spec.out_dir):
            if rel:
                inside_run_dir(self.run_dir, rel)
        lr = self._runner._launch(self._step, spec, index, total)
        self._ended(spec, lr)
        return lr

    def launch_all(self, specs: list[LaunchSpec], jobs: int,
                   on_done: Callable[[int, LaunchSpec, LaunchResult], bool | None]) -> None:
        """Run `specs` (a step's launches, in plan order), up to `jobs` at a time, and call `on_done(index, spec,
        result)` in this thread as each one ends (with jobs > 1, in the order they end; the index is its place in
        `specs`, for results kept in plan order). `on_done` returning True starts no further launch (those running
        still end by themselves and are reported). jobs == 1 is `launch` one after another.

        With jobs > 1 each launch runs in a thread of its own, which starts its process and waits for it to end
        (it outlives its process, as PR_SET_PDEATHSIG requires: validation.launch.processes.die_with_parent); each
        keeps its own directory, log, telemetry and process tree. Ctrl-C / SIGTERM / SIGHUP reach this (the main)
        thread: no further launch starts, every running one ends its processes at its next poll (as a single launch
        does on Ctrl-C), and once none is left the interrupt is raised again; so is any exception of `on_done`."""
        if jobs <= 1:
            for i, spec in enumerate(specs):
                if on_done(i, spec, self.launch(spec, i, len(specs))):
                    return
            return
        for spec in specs:
            for rel in (spec.dir, spec.out_dir):
                if rel:
                    inside_run_dir(self.run_dir, rel)
        stopping: list[BaseException] = []  # what ends the running launches (set by this thread only)

        def stop() -> BaseException | None:
            if not stopping:
                return None
            cause = stopping[0]  # a fresh exception for each launch: each ends its own processes
            return Interrupted(cause.signum) if isinstance(cause, Interrupted) else KeyboardInterrupt()

        def one(i: int, spec: LaunchSpec) -> LaunchResult | None:
            if stopping:
                return None
            return self._runner._launch(self._step, spec, i, len(specs), stop)

        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix=f"launch-{self._step.name}")
        running: dict[Future, int] = {}
        todo = list(enumerate(specs))
        try:
            while todo or running:
                while todo and len(running) < jobs and not stopping:
                    i, spec = todo.pop(0)
                    running[pool.submit(one, i, spec)] = i
                if not running:
                    break
                done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=running.get):
                    i = running.pop(future)
                    lr = future.result()  # a launch raises only for an invalid spec: a bug, not a result
                    if lr is not None:
                        self._ended(specs[i], lr)
                    if lr is not None and on_done(i, specs[i], lr):
                        todo.clear()
        except BaseException as exc:
            stopping.append(exc)
            raise
        finally:
            todo.clear()
            if stopping:  # the running launches end their processes within a poll and raise; wait for them
                wait(list(running))
            pool.shutdown(wait=True)

    def save(self, partial: StepRecord | None = None) -> None:
        """Write results.json now (e.g. after each run of a multi-launch step), with `partial` (the kind's Result
        so far: its runs until now) merged into the step's entry first."""
        if partial is not None:
            self.merge(partial)
        self._runner.save()

    def rel(self, path: Path | str | None) -> str | None:
        """`path` relative to the run directory (as results.json records paths)."""
        return self._runner._rel(path)

    def winners(self) -> dict[str, dict[str, Any]]:
        """The winners of the steps finished so far: step name -> the chosen run's params (what `${winner.<step>}`
        resolves to), for the launches a kind builds while it runs (a bisection point, a batch-size probe)."""
        return self._runner._winners()
