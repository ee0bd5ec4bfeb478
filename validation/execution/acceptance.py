"""Acceptance criteria, the GO/NO-GO verdict and the recommended settings, from a run's results.

A criterion is an expression over step metrics (validation.runbook.expressions), e.g. `baseline.toks_per_s.mean >= 39`.
Each step is visible under its name as its metrics plus: `status`, `reason`, `excerpt` (the failing rank's
traceback), `stack_dumps` (how many were collected), `winner` (label/params of a sweep or ab winner, or None),
`runs` (label -> metrics) and `comparison` (variant -> statistics). `log_contains(step, text)`
searches the step's logs.

Verdict (``verdict``), in this order:

- INCOMPLETE when the run was interrupted or steps are still pending (`--resume` continues it; a step the runbook
  no longer has, kept from before a resume under "other steps", never runs again and is not waited for, and counts
  for nothing below: that an earlier attempt failed it is no NO-GO, nor does it count among the steps passed);
- NO-GO when a non-optional step that ran did not pass, or a criterion of severity "fail" failed or could not
  be computed (an error; a figure it reads outside its physical range is one, validation.analysis.plausibility,
  unless a disturbance explains it: then it is inconclusive, below);
- INCOMPLETE when a "fail" criterion was not evaluated because its step did not run (skipped by --only / --skip,
  by unmet requirements, ...), or is inconclusive because the performance figures it reads were measured while
  other work used the machine (validation.execution.evidence: it neither passes nor fails on disturbed evidence alone; its
  detail names the disturbance and the command that runs those steps again): nothing failed, but the evidence for
  GO is missing. A criterion whose outcome its evaluation reached without reading a disturbed figure (`a.loss_drop
  > 0 and a.toks_per_s.mean > 1` failing on a loss that rose) decides as evaluated, and so does one whose and / or
  a known part decides whatever its disturbed parts hold (`a.toks_per_s.mean > 100 and b.failed == 0` with b.failed
  3 fails: three-valued logic, validation.runbook.expressions);
- GO otherwise: every non-optional step that ran passed and every "fail" criterion holds.

The CLI exits 0 GO, 1 NO-GO, 3 INCOMPLETE (validation.cli).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from validation.execution import evidence
from validation.analysis import plausibility
from validation import kinds as step_kinds
from validation.formatting import plural
from validation.analysis.interference import launch_interference, measured_disturbed
from validation.results.codec import encode, written
from validation.results.decision import Choice, DecisionRecord
from validation.results.model import FAILED_STEP_STATUSES, Criterion, Recommendations, RunResults
from validation.results.run import Criterion as CriterionRow, Run, Step, read_run
from validation.results.store import RESULTS_JSON, ResultsError, load_json
from validation.results.trainer_launch import LaunchRun
from validation.runbook.expressions import ExpressionError, compile_expression
from validation.runbook.loader import Runbook

BAD_STEP = FAILED_STEP_STATUSES


def _run(results: RunResults) -> Run:
    """The run record of what the run holds now. Decoded leniently: steps may come from an earlier attempt's
    results.json (--resume), checked when read against validation.results.model's schema, which leaves a launch's
    metrics freer than the records do; what is read here (statuses, reasons, criteria, choices) the schema checks."""
    return read_run(results)


def _namespace(results: RunResults) -> dict[str, Any]:
    ns = {}
    for name, step in results["steps"].items():
        view = dict(step.get("metrics") or {})
        view.update(status=step["status"], reason=step.get("reason") or "", excerpt=step.get("excerpt") or "",
                    stack_dumps=len(step.get("stack_dumps") or []), winner=step.get("winner"),
                    runs={r["label"]: r.get("metrics", {}) for r in step.get("runs", [])},
                    comparison={c["variant"]: c for c in step.get("comparison", [])})
        ns[name] = view
    return ns


def _logs(run: Run, run_dir: Path):
    """log_contains / log_count's reader: a step's logs (its .log artifacts), read where they are: this run's
    directory, or for a step taken from an earlier run (--reuse) that run's, whose record names them (this run's
    record of it keeps none of its files). A reused step whose earlier run cannot be read is an error (ValueError:
    the criterion errs naming why), never an empty log that `not log_contains(...)` would pass on; so is a log its
    record names that cannot be read (deleted, moved), and a step that recorded no log has none (None: the criterion
    errs, "no log for step ...")."""
    def read(step_name: str) -> str | None:
        step, base = run.steps.get(step_name) or Step(), Path(run_dir)
        for _ in range(8):  # a step reused by a run that had reused it in turn: its logs are where it ran
            source = str(step.reused.source or "") if step.reused is not None else ""
            if not source:
                break
            step, base = _reused_step(Path(source), step_name)
        texts = []
        for rel in step.artifacts:
            if isinstance(rel, str) and rel.endswith(".log"):
                try:
                    texts.append((base / rel).read_text(errors="replace"))
                except OSError as exc:  # the text it held is unknown: `not log_contains(...)` may not pass on it
                    raise ValueError(f"{rel} cannot be read: {exc.strerror or exc}") from None
        return "\n".join(texts) if texts else None

    return read


def _reused_step(source: Path, name: str) -> tuple[Step, Path]:
    """Step `name`'s record in the run `source` (its results.json, or its directory) and that run's directory."""
    results = source if source.name == RESULTS_JSON else source / RESULTS_JSON
    why = f"step {name} was taken from {source} (--reuse), whose logs"
    try:
        earlier = read_run(load_json(results))
    except ResultsError as exc:
        raise ValueError(f"{why} cannot be read: {exc}") from None
    if name not in earlier.steps:
        raise ValueError(f"{why} hold no step {name}")
    return earlier.steps[name] or Step(), results.parent


def evaluate(runbook: Runbook, results: RunResults, run_dir: Path) -> list[Criterion]:
    """One row per criterion of the runbook, in its order: evaluated, or "skipped" when a step it names did not
    run (skipped, pending, interrupted, or without a record yet)."""
    ns = _namespace(results)
    run = _run(results)
    logs = _logs(run, run_dir)
    steps: dict[str, Step] = run.steps  # type: ignore[assignment]  # every step has a record while the run runs
    records = results["steps"]  # as results.json holds them: their interference records as written
    derive = evidence.deriving(records)  # each step's record read once for every figure a criterion reads
    rows = []
    for c in runbook.acceptance:
        # a step of the runbook without a record has not run yet: a resumed run whose runbook gained steps, cut off
        # before it reached them
        got = {n: steps.get(n) or Step(status="pending") for n in c.expr.names}
        not_run = [n for n in sorted(got) if got[n].status in ("skipped", "pending", "interrupted")]
        if not_run:
            reasons = "; ".join(f"{n}: {got[n].status}" + (f" ({got[n].reason})" if got[n].reason else "")
                                for n in not_run)
            status, actual, detail = "skipped", "n/a", f"not evaluated: {reasons}"
        else:
            r = c.expr.evaluate(ns, logs, _undecided_reads(runbook, run, records, c, derive))
            status = {"pass": "pass", "fail": "fail" if c.severity == "fail" else "warn", "error": "error"}[r.status]
            actual, detail = r.actual, r.detail
            status, detail = _judge_evidence(runbook, run, records, ns, c, r.status, status, detail,
                                             None if r.status == "error" else r.reads, derive)
        rows.append(Criterion(name=c.name, expr=c.expr.text, target=c.target, severity=c.severity,
                              description=c.description, status=status, actual=actual, detail=detail))
    return rows


def _undecided_reads(runbook: Runbook, run: Run, steps: dict, criterion, derive=None) -> list[tuple[str, tuple]]:
    """The performance reads of a criterion (evidence.performance_reads) that _judge_evidence finds no evidence in:
    those of a disturbed step, of a disturbed run of a step (`sweep.runs['x'].toks_per_s.mean`), and those of a
    step (not of its runs) a figure outside its range of which only its disturbed runs measured. A part of and / or
    reading one decides nothing (Expression.evaluate's `disturbed`). `steps`: the step records as results.json
    holds them; `derive`: evidence.deriving(steps)."""
    out = []
    for n, path in evidence.performance_reads(runbook, criterion):
        step = steps.get(n) or {}
        if evidence.disturbed(step):
            out.append((n, path))
        elif len(path) >= 2 and path[0] == "runs":
            launch = _run_read(run.steps.get(n), path[1])
            rec = launch_interference(written(launch.metrics)) if launch is not None else None
            if rec is not None and rec.disturbed:
                out.append((n, path))
        elif (not path or path[0] != "runs") and evidence.disturbed_implausible(step):
            out.append((n, path))
    for n, path in evidence.evidence_reads(runbook, criterion):  # a figure computed from a disturbed step's
        if (n, path) not in out and evidence.derived_disturbed(steps, n, path, derive):
            out.append((n, path))
    return out


def _judge_evidence(runbook: Runbook, run: Run, steps: dict, ns: dict, criterion, outcome: str, status: str,
                    detail: str | None, read: tuple | None = None, derive=None) -> tuple[str, str | None]:
    """(status, detail) of an evaluated criterion once its evidence is judged (validation.execution.evidence): "inconclusive"
    when a performance figure it reads comes from a disturbed step (it may neither pass nor fail on that alone, nor
    err on it: a triage whose disturbed launches left it undecided names no culprit, so `culprit == 'x'` cannot be
    evaluated), or when a figure outside its physical range that the decision it reads stands on was measured only
    by disturbed runs (the decision left them out: evidence.disturbed_implausible); "error" when a figure it reads
    lies outside its physical range (validation.analysis.plausibility) and no disturbance explains it; otherwise as
    evaluated. `steps`: the step records as results.json holds them, which the
    interference records are read from. `read`: the paths a "pass" or "fail" was evaluated from (EvalResult.reads;
    None: every path of the expression, as for an error): a figure the evaluation never read (`a.loss_drop > 0 and
    a.toks_per_s.mean > 1` failing on a loss that rose) is no evidence the outcome stands on, so a correctness check
    still decides on a disturbed step. `derive`: evidence.deriving(steps)."""
    derive = derive or evidence.deriving(steps)
    reads = [r for r in evidence.performance_reads(runbook, criterion) if read is None or r in read]
    shaken = list(dict.fromkeys(n for n, _ in reads if evidence.disturbed(steps.get(n) or {})))
    # a figure computed from what another step measured (evidence.derived_from: a train step's scaling efficiency
    # over its baseline's tokens/s) stands on that step's evidence too: the disturbed one -> the figures read
    sourced: dict[str, list[str]] = {}
    for n, path in evidence.evidence_reads(runbook, criterion):
        if read is None or (n, path) in read:
            for source in evidence.derived_disturbed(steps, n, path, derive):
                if source not in shaken:
                    sourced.setdefault(source, []).append(".".join(map(str, (n, *path))))
    # `sweep.runs['x'].toks_per_s.mean` reads one launch (the namespace's: the last of its label), which a decision
    # that left it out as disturbed does not make undisturbed: step -> the disturbed launches read
    shaken_runs: dict[str, list[str]] = {}
    for n, path in reads:
        if n not in shaken and len(path) >= 2 and path[0] == "runs":
            launch = _run_read(run.steps.get(n), path[1])
            rec = launch_interference(written(launch.metrics)) if launch is not None else None
            if rec is not None and rec.disturbed:
                repeat = launch.repeat
                shaken_runs.setdefault(n, []).append(f"{path[1]}" + (
                    f", repeat {repeat + 1}" if isinstance(repeat, int) else "") + f": {rec.text or 'disturbed'}")
    bad = plausibility.implausible_reads(ns, [p for p in criterion.expr.paths if read is None or p in read])
    explained: dict[str, list[str]] = {}  # step -> the figures outside their range only its disturbed runs measured
    for n in dict.fromkeys(n for n, path in reads if not path or path[0] != "runs"):  # a decision over its runs
        loose = evidence.disturbed_implausible(steps.get(n) or {})
        if loose and n not in shaken:
            explained[n] = loose
        bad += [f"{n}.{text}" for text in evidence.runs_implausible(steps.get(n) or {})
                if text not in loose and f"{n}.{text}" not in bad]
    if shaken or sourced or explained or shaken_runs:  # an expression that could not be evaluated (a figure a
        # disturbed step left undecided: None) too
        what = {"pass": "held", "error": f"could not be evaluated ({detail})"}.get(outcome, "did not hold")
        said = {n: (evidence.step_interference(steps[n]) or {}).get("text") for n in shaken + list(sourced)}
        why = "; ".join([f"step {n} was disturbed: {said[n]}" for n in shaken]
                        + [f"{', '.join(dict.fromkeys(figures))} {'is' if len(set(figures)) == 1 else 'are'} "
                           f"computed from what step {n} measured, and step {n} was disturbed: {said[n]}"
                           for n, figures in sourced.items()]
                        + [f"the run of step {n} it reads was disturbed: {'; '.join(dict.fromkeys(texts))}"
                           for n, texts in shaken_runs.items()]
                        + [f"disturbed runs of step {n} measured {'; '.join(texts)}" for n, texts in explained.items()])
        # and the steps whose figures are computed from those, else they keep standing on the disturbed ones
        again = evidence.recomputed(steps, shaken + list(sourced) + list(shaken_runs) + list(explained), derive)
        rerun = evidence.rerun_command(run.runbook.path or "RUNBOOK", run.run_dir or "RUN_DIR", again,
                                       run.overrides(again))
        return "inconclusive", (f"it {what}, but on disturbed evidence: {why}"
                                + (f"; and {'; '.join(bad)}" if bad else "") + f"; run again: {rerun}")
    if outcome == "error":
        return status, detail
    if bad:
        return "error", ("a figure it reads is outside its physical range, a bug in the measurement, not a result: "
                         + "; ".join(bad))
    return status, detail


def _run_read(step: Step | None, label: Any) -> LaunchRun | None:
    """The run `runs[label]` of a step reads (the namespace's: the last run of that label), None if none."""
    found = None
    for r in step.runs if step is not None else []:
        if str(r.label) == str(label):
            found = r
    return found


def _shaken(step: dict) -> bool:
    """Whether a disturbance explains a step's evidence: its interference record says disturbed, or a figure outside
    its range was measured only by runs it left out as disturbed (evidence.disturbed_implausible)."""
    return evidence.disturbed(step) or bool(evidence.disturbed_implausible(step))


def _disturbed_reads(criterion: CriterionRow, steps: dict[str, Step], records: dict) -> list[str]:
    """The steps whose disturbance made an inconclusive criterion so: those _shaken, of the steps it reads and the
    steps a figure it reads is computed from (evidence.derived_from: a scaling efficiency's baseline step), else (a
    criterion reading one run of a decision that left it out: `ab.runs['x'].toks_per_s.mean`) those with a
    disturbed run."""
    names = sorted(_step_names(criterion, steps))
    names += [n for n in _derived_names(criterion, records) if n not in names]
    return ([n for n in names if _shaken(records[n])]
            or [n for n in names if any(measured_disturbed(written(r.metrics)) for r in steps[n].runs)])


def verdict(results: RunResults, interrupted: bool | str) -> tuple[str, str]:
    """(verdict, one-sentence reason) of a run (see the module docstring). `interrupted`: False, or True / the
    signal's name ("SIGTERM") when the run was interrupted."""
    if interrupted:
        how = f" ({interrupted})" if isinstance(interrupted, str) else ""
        return "INCOMPLETE", f"the run was interrupted{how}; `nsa-validate run --resume RUN_DIR` continues it"
    run = _run(results)
    steps: dict[str, Step] = run.steps  # type: ignore[assignment]  # every step has a record while the run runs
    # the runbook's steps as the run holds them (results.json's phases): a step only an earlier attempt's runbook
    # had keeps its record, but no resume runs it (validation.execution.runner.steps_to_run)
    listed = {str(n) for p in run.phases for n in p.steps} if run.phases else set(steps)
    pending = [n for n, s in steps.items() if s.status in ("pending", "running", "interrupted") and n in listed]
    if pending:
        return "INCOMPLETE", f"step(s) not run yet: {', '.join(pending)}"
    # a step the runbook no longer lists (shown as removed) counts for nothing: neither a failure nor a pass
    bad = [f"{n} {s.status}" for n, s in steps.items() if s.status in BAD_STEP and not s.optional and n in listed]
    required = [c for c in run.acceptance if c.severity == "fail"]
    failed = [c.name for c in required if c.status in ("fail", "error")]
    unproven = [c for c in required if c.status == "skipped"]
    shaken = [c for c in required if c.status == "inconclusive"]
    reasons = []
    if bad:
        reasons.append(f"step(s) {', '.join(bad)}")
    if failed:
        reasons.append(f"criteria failed: {', '.join(failed)}")
    if reasons:
        if unproven:
            reasons.append(f"criteria not evaluated (steps skipped): {', '.join(c.name for c in unproven)}")
        if shaken:
            reasons.append(f"criteria inconclusive (disturbed evidence): {', '.join(c.name for c in shaken)}")
        return "NO-GO", "; ".join(reasons)
    if unproven or shaken:
        parts = []
        if unproven:
            parts.append(f"{plural(len(unproven), 'required criterion', 'required criteria')} not evaluated: "
                         f"{', '.join(c.name for c in unproven)}; their steps did not run "
                         f"({_why_not_run(unproven, steps)})")
        if shaken:
            records = results["steps"]  # its interference records as written
            disturbed = list(dict.fromkeys(n for c in shaken for n in _disturbed_reads(c, steps, records)))
            again = evidence.recomputed(records, disturbed)  # and the steps that compute a figure from them
            parts.append(f"{plural(len(shaken), 'required criterion', 'required criteria')} inconclusive: "
                         f"{', '.join(c.name for c in shaken)}, measured while other work used the machine "
                         f"(disturbed: {', '.join(disturbed) or 'see the criteria'}); run again: "
                         + evidence.rerun_command(run.runbook.path or "RUNBOOK", run.run_dir or "RUN_DIR", again,
                                                  run.overrides(again)))
        return "INCOMPLETE", "; ".join(parts) + "; nothing evaluated failed"
    ran = sum(s.status == "passed" and n in listed for n, s in steps.items())
    # a warn criterion that could not be evaluated is named too (a "fail" one that errs is NO-GO above)
    warns = [c.name for c in run.acceptance if c.status in ("warn", "inconclusive", "error")]
    note = f"; warnings: {', '.join(warns)}" if warns else ""
    return "GO", f"{ran} step(s) passed and every required criterion holds{note}"


def _why_not_run(criteria: list[CriterionRow], steps: dict[str, Step]) -> str:
    """"baseline: phase baseline not selected (--only x); gpu: needs 2 GPU(s), found 0" for the steps the criteria
    needed (from the steps' own reasons), each step once."""
    parts = {}
    for c in criteria:
        for name in sorted(_step_names(c, steps)):
            s = steps[name]
            if s.status in ("skipped", "pending", "interrupted") and name not in parts:
                parts[name] = f"{name}: {s.reason or s.status}"
    return "; ".join(parts.values()) or "skipped"


def _step_names(criterion: CriterionRow, steps: dict[str, Step]) -> set[str]:
    """The steps a criterion row reads (its expression's step names; not a word inside a string or a key:
    `log_contains(a, "b")` and `a.runs.b` read step a only)."""
    try:
        names = compile_expression(criterion.expr or "").names
    except ExpressionError:  # a results.json from another version: its identifiers that are steps
        names = frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", criterion.expr or ""))
    return {n for n in names if n in steps}


def _derived_names(criterion: CriterionRow, records: dict) -> list[str]:
    """The steps a figure a criterion row reads is computed from (evidence.derived_from), in the order it reads
    them; `records`: the step records as results.json holds them."""
    try:
        paths = compile_expression(criterion.expr or "").paths
    except ExpressionError:  # a results.json from another version: the steps it names only (_step_names)
        return []
    return list(dict.fromkeys(s for n, path in paths for s in evidence.derived_from(records, n, path)))


def _given(choice: Choice | None) -> Choice | None:
    """A step's choice or winner, None where it has none (null, or an empty record)."""
    return None if choice is None or choice == Choice() else choice


def _settings(step: Step, chosen: Choice) -> dict[str, str]:
    """{variable: value} of the environment the chosen point or variant ran with: its params' "env.X" entries, each
    value as the launch's environment held it (text). A choice without params (an A/B's baseline in records
    written before the A/B recorded the baseline's own settings) is read from the params its runs ran with (a
    baseline pinning `NSA_OPT_FUSED: "0"`)."""
    params = chosen.params or next((r.params for r in step.runs if r.label == chosen.label and r.params), {})
    return {str(k)[4:]: str(v) for k, v in params.items() if str(k).startswith("env.")}


def recommendations(runbook: Runbook, results: RunResults) -> Recommendations:
    """The settings to export: the runbook's always-recommended `recommend.env`, plus the env of each decision
    (a sweep's or an A/B's "choice") that is recommendable: significant after the multiple-comparison control,
    beyond the noise floor, the same way in every interleaved repeat, from undisturbed runs
    (validation.analysis.significance.decide) none of which measured a figure outside its physical range
    (validation.execution.evidence.runs_implausible), of a step that passed (a step that failed, e.g. a launch of
    its winner crashed, recommends nothing); a decision without that (the default kept, one run per variant, an
    effect that did not replicate) adds nothing and leaves the runbook's own value in place, and its note says why.
    A setting that two recommendable decisions chose different values of is recommended from neither (the
    runbook's own value stays), and the notes name both. Nothing is recommended when no training step passed
    (nothing was measured here) or the runbook has none."""
    steps: dict[str, Step] = _run(results).steps  # type: ignore[assignment]  # every step has a record
    trainers = [s for s in steps.values() if getattr(step_kinds.find(s.kind), "trainer", False)]
    if not trainers:  # a runbook of tests, sanitizer runs and benchmarks (gpu_kernels): no settings to recommend
        return Recommendations(env={}, notes=["this runbook has no training step: it recommends no settings"])
    if not any(s.status == "passed" for s in trainers):
        return Recommendations(env={}, notes=["nothing was measured here (no training step passed): no settings "
                                              "are recommended"])
    always = dict(runbook.recommend_env)
    measured: dict[str, dict[str, str]] = {}  # variable -> {step: value} of the recommendable decisions
    decided = []  # (step, its note's text, the settings it swept: None for a recommendable decision), in run order
    for name, step in steps.items():
        chosen = _given(step.choice) or _given(step.winner)
        if chosen is None:
            continue
        decision = step.decision or DecisionRecord()
        significant = (decision.significant if chosen.significant is None else chosen.significant) is True
        # a decision recorded since replication was required says whether its choice may be recommended; an older
        # one: when it was significant
        recommendable = (significant if decision.recommendable is None else decision.recommendable) is True
        swept = sorted({str(k)[4:] for r in step.runs for k in r.params if str(k).startswith("env.")})
        bad = evidence.runs_implausible(encode(step))
        if step.status != "passed" or not recommendable or bad:
            why = decision.recommendation or (
                f"no recommendation: {'not replicated' if significant else 'no significant difference'}")
            if bad:  # whatever it decided stands on a figure that is not a result: measured while other work
                # used the machine (its evidence disturbed), else a bug in the measurement
                explained = evidence.disturbed_implausible(encode(step))
                cause = ("measured while other work used the machine"
                         if evidence.disturbed(encode(step)) or all(text in explained for text in bad)
                         else "a bug in the measurement")
                why = (f"no recommendation: a figure of its runs is outside its physical range, {cause}, not a "
                       f"result: {'; '.join(bad)}")
            if step.status != "passed":  # what it chose, it chose from the runs that did not fail
                why = (f"no recommendation: the step did not pass ({step.status}"
                       + (f": {step.reason}" if step.reason else "") + ")")
            decided.append((name, f"{why}; {chosen.label} kept, {', '.join(swept) or 'its settings'} not "
                                  "recommended from this step", swept))
            continue
        for key, value in _settings(step, chosen).items():
            measured.setdefault(key, {})[name] = value
        decided.append((name, f"{chosen.label} ({chosen.explanation or ''})", None))
    env, source = dict(always), {key: "the runbook's recommendation" for key in always}
    disputed: dict[str, dict[str, str]] = {}
    for key, by_step in measured.items():
        if len(set(by_step.values())) > 1:  # the decisions disagree: neither is the setting to use
            disputed[key] = by_step
        else:
            env[key], source[key] = next(iter(by_step.values())), f"measured in {', '.join(by_step)}"
    notes = []
    for name, text, swept in decided:
        if swept is None:  # recommendable: each setting another recommendable decision chose otherwise is not
            keys = [key for key in disputed if name in disputed[key]]
            text += "".join(
                f"; {key} not recommended: the decisions disagree ("
                + ", ".join(f"{s}: {key}={v}" for s, v in disputed[key].items()) + ")" for key in keys)
        else:
            keys = swept
        stays = [f"{key}={env[key]} ({source[key]})" for key in keys if key in env]
        notes.append(f"{name}: {text}" + (f"; {', '.join(stays)} stays" if stays else ""))
    return Recommendations(env=dict(sorted(env.items())), notes=notes)
