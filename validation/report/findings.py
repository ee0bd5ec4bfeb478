"""What the run itself measured with and without a setting: every comparison an A/B, a sweep or a triage step of
the run recorded (results.json alone; pure; accepts damaged input), the "Key finding" (the largest significant
effect among them) and the report's conclusion (what passed, what failed, the next action).

A comparison is {"step", "kind", "without", "with" (what each side ran: settings or a label), "metric",
"mean_without", "mean_with" (the means the step's own table shows), "rel" (with / without - 1), "ci_low",
"ci_high", "p" (Holm-adjusted when the step adjusted), "significant" (never for a step whose runs measured a figure
outside its physical range, "implausible", or that was measured while other work used the machine, "disturbed"),
"verdict", "ignored" (the trainer ignored the setting: an A/A check, never a finding), "recommendable" (False where
the step's decision recommends nothing: one run a side, not replicated; "caveat" says why), "reused" (the step was
taken from an earlier run), "text"}: each kind says what its steps compared (StepKind.comparisons,
validation.kinds.base.Effect), e.g. an A/B's variants against its baseline.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from dataclasses import dataclass
from typing import Any

from nsa.toggles import TOGGLES
from validation import kinds as step_kinds
from validation.execution.evidence import runs_implausible
from validation.analysis.interference import disturbed as step_disturbed
from validation.kinds.base import Effect
from validation.kinds.blocks import code
from validation.formatting import FAILED_STATUSES, NA, STATUS_LABELS, as_dict, fmt_p, fmt_pct, plural, run_command
from validation.report.problems import removed_steps
from validation.results.codec import given
from validation.results.run import Run, read_run


@dataclass(frozen=True)
class Found:
    """One with/without comparison a passed step recorded, as the report weighs it: the kind's Effect, whether it
    counts (significant, and neither an ignored setting, nor measured by runs with a figure outside its range, nor
    while other work used the machine), whether its decision may be recommended (None where the step records no
    such judgement: a triage's ranking is replicated) and why not, whether its phase was taken from an earlier run,
    and the sentence that states it."""
    step: str
    kind: str
    without: Any
    with_: Any
    metric: Any
    mean_without: Any
    mean_with: Any
    rel: Any
    ci_low: Any
    ci_high: Any
    p: Any
    significant: bool
    verdict: str
    ignored: bool
    implausible: list[str]
    disturbed: bool
    recommendable: bool
    caveat: str | None
    reused: bool
    text: str


def comparisons(results: dict, run: Run | None = None) -> list[Found]:
    """Every with/without comparison the run's passed steps recorded (StepKind.comparisons: each kind reads its step
    record as results.json holds it), in run order (see the module docstring); `run`: read_run(results), where the
    caller has it."""
    out: list[dict] = []
    raw_steps = as_dict(as_dict(results).get("steps"))
    run = run or read_run(results)
    shaken_steps = {str(d.step) for d in run.evidence.disturbed}
    for name, step in run.steps_in_order():
        kind = step_kinds.find(step.kind) if step is not None else None
        if step is None or step.status != "passed" or kind is None:
            continue
        bad = runs_implausible(raw_steps[name])  # its runs measured a figure no device can: nothing it found is
        # measured while other work used the machine, and not left out of what the step concluded: it decides nothing
        shaken = name in shaken_steps or step_disturbed(raw_steps[name])
        decision = step.decision
        # a decision that is not recommendable (one run a side, not replicated, no winner): its effect is measured,
        # never a setting to use; None where the step records no such judgement (a triage's ranking is replicated)
        recommendable = decision.recommendable if decision is not None else None
        caveat = (str(decision.recommendation or "no recommendation") if recommendable is False and decision
                  else None)
        reused = given(step.reused) is not None  # taken from an earlier run (--reuse): not measured in this one
        for e in kind.comparisons(kind.read(raw_steps[name])):
            out.append(Found(step=name, kind=kind.name, without=e.without, with_=e.with_, metric=e.metric,
                             mean_without=e.mean_without, mean_with=e.mean_with, rel=e.rel, ci_low=e.ci_low,
                             ci_high=e.ci_high, p=e.p,
                             significant=bool(e.significant and not e.ignored and not bad and not shaken),
                             verdict=e.verdict or NA, ignored=bool(e.ignored), implausible=bad,
                             disturbed=bool(shaken), recommendable=recommendable is not False, caveat=caveat,
                             reused=reused, text=_sentence(name, e, reused)))
    return out


def _rate(v: float | None) -> str:
    return NA if v is None else (f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}")


def _sentence(step: str, e: Effect, reused: bool = False) -> str:
    """One comparison of step `step` in a sentence: the means with and without, the change, its CI and p; `reused`:
    the step was taken from an earlier run (--reuse), which the sentence says."""
    ci = (f"95% CI {fmt_pct(e.ci_low, signed=True)} to {fmt_pct(e.ci_high, signed=True)}"
          if e.ci_low is not None and e.ci_high is not None else "CI n/a")
    unit = " tokens/s" if e.metric == "toks_per_s" else f" {e.metric}"
    ratio = ""
    if e.mean_without and e.mean_with and e.mean_without > 0:
        factor = e.mean_with / e.mean_without
        if factor >= 2 or factor <= 0.5:
            ratio = f", {factor:.1f}x" if factor >= 2 else f", {1 / factor:.1f}x slower"
    return (f"{e.with_}: {_rate(e.mean_with)}{unit} with, {_rate(e.mean_without)} without "
            f"({e.without}): {fmt_pct(e.rel, signed=True)}{ratio} ({ci}, p {fmt_p(e.p)}), step `{step}`"
            + (" (taken from an earlier run, not measured in this one)" if reused else ""))


def key_finding(comps: list[Found]) -> dict | None:
    """The largest significant effect (by |relative difference|) of the run's own comparisons: {"text", "step",
    "rel", "record" (its Found)}; {"text": "none: ..."} when none is significant; None when the run compared
    nothing."""
    if not comps:
        return None
    significant = [c for c in comps if c.significant]
    if not significant:
        measured = [c for c in comps if not c.ignored]
        bad = list(dict.fromkeys(c.step for c in measured if c.implausible))
        shaken = list(dict.fromkeys(c.step for c in measured if c.disturbed and c.step not in bad))
        text = (f"none: no significant effect in {plural(len(measured), 'with/without comparison')} of this run"
                if measured else "none: the only comparisons were of settings the trainer ignored (A/A checks)")
        if bad:
            text += (f" ({plural(len(bad), 'step')} left out, {', '.join(bad)}: a figure of the runs is outside its "
                     "physical range, not a result)")
        if shaken:
            text += (f" ({plural(len(shaken), 'step')} left out, {', '.join(shaken)}: measured while other work "
                     "used the machine, not a result)")
        return {"text": text, "step": None, "rel": None, "record": None}
    top = max(significant, key=lambda c: abs(c.rel))
    caveat = re.sub(r"^no recommendation:\s*", "", str(top.caveat or "its decision recommends nothing"))
    text = top.text + (f"; not a setting to use ({caveat})" if not top.recommendable else "")
    return {"text": text, "step": top.step, "rel": top.rel, "record": top}


def comparison_rows(comps: list[Found]) -> list[dict]:
    """The Performance analysis table of the run's own comparisons, formatted."""
    rows = []
    for c in comps:
        ci = (f"{fmt_pct(c.ci_low, signed=True)} to {fmt_pct(c.ci_high, signed=True)}"
              if c.ci_low is not None and c.ci_high is not None else NA)
        verdict = ("A/A: setting ignored by the trainer" if c.ignored else
                   "NOT A RESULT, a figure of its runs outside its physical range" if c.implausible else
                   f"{c.verdict}: NOT A RESULT, measured while other work used the machine" if c.disturbed else
                   f"{c.verdict} (significant)" if c.significant else c.verdict)
        # a comparison of another metric (a sweep's `select: {metric}`: a step time, a memory peak) names it beside
        # its figures: the table's figures are tokens/s otherwise
        unit = "" if _tokens_per_s(c.metric) else f" {c.metric}"
        rows.append({"step": c.step, "kind": c.kind, "without": c.without, "with": c.with_, "metric": c.metric,
                     "mean_without": _rate(c.mean_without) + unit, "mean_with": _rate(c.mean_with) + unit,
                     "change": fmt_pct(c.rel, signed=True), "ci": ci, "p": fmt_p(c.p), "verdict": verdict,
                     "significant": c.significant})
    return rows


def _tokens_per_s(metric: Any) -> bool:
    return metric in (None, "", "toks_per_s")


def comparisons_unit(comps: list[Found]) -> str:
    """What the figures of the Performance analysis table measure, for its sentence: "tokens/s", or where a step
    compared another metric, that each such figure names its own."""
    others = list(dict.fromkeys(str(c.metric) for c in comps if not _tokens_per_s(c.metric)))
    if not others:
        return "tokens/s"
    named = ", ".join(others)
    return (f"tokens/s, except the figures that name their metric ({named})"
            if any(_tokens_per_s(c.metric) for c in comps) else f"each figure names its metric ({named})")


def conclusion(results: Run | dict, problems: list[dict], finding: dict | None) -> dict:
    """The report's conclusion: {"verdict", "passed", "failed" (what failed), "open" (what neither passed nor failed:
    steps that did not finish, were skipped or have no result, criteria that were inconclusive, not evaluated or
    only warned; "" when none), each a sentence naming the steps and criteria, and "next" (the next action, one
    sentence)}."""
    run = read_run(results)
    # a step the runbook no longer has (kept from an earlier attempt of a resumed run) is neither open nor waited
    # for, and what it passed or failed the verdict does not count: nor is it counted here
    removed = set(removed_steps(run))
    in_order = [(n, s.status if s is not None else None) for n, s in run.steps_in_order() if n not in removed]
    statuses = {n: s for n, s in in_order if s is not None}
    passed = sorted(n for n, s in statuses.items() if s == "passed")
    failed = sorted(n for n, s in statuses.items() if s in FAILED_STATUSES)
    unfinished = sorted(n for n, s in statuses.items() if s in ("interrupted", "pending", "running"))
    skipped = sorted(n for n, s in statuses.items() if s == "skipped")
    # a step of the runbook with no record, or with a status no step can have: neither passed nor failed
    no_result = sorted({n for n, s in in_order if s is None or s not in STATUS_LABELS})
    crits = run.acceptance
    # a warning criterion that could not be evaluated (error) failed nothing the verdict stands on: it is open
    crit_failed = [str(c.name) for c in crits if c.status in ("fail", "error") and c.severity != "warn"]
    crit_unevaluated = [str(c.name) for c in crits if c.status == "error" and c.severity == "warn"]
    crit_warn = [str(c.name) for c in crits if c.status == "warn"]
    crit_inconclusive = [str(c.name) for c in crits if c.status == "inconclusive"]
    crit_skipped = [str(c.name) for c in crits if c.status == "skipped"]
    crit_pass = [c for c in crits if c.status == "pass"]
    verdict = str(run.verdict or "INCOMPLETE")
    passed_text = (f"{plural(len(passed), 'step')} passed ({', '.join(passed)})" if passed else "no step passed")
    passed_text += f"; {plural(len(crit_pass), 'criterion', 'criteria')} of {len(crits)} hold" if crits else ""
    steps_, crits_ = ("step", "steps"), ("criterion", "criteria")
    failed_text = _listed([(failed, steps_, "failed"), (crit_failed, crits_, "failed")]) or "nothing failed"
    # what neither passed nor failed: steps that did not finish, did not run or have no result, criteria that were
    # inconclusive, not evaluated or only warned
    open_text = _listed([(unfinished, steps_, "did not finish"), (skipped, steps_, "skipped"),
                         (no_result, steps_, "with no result recorded"), (crit_inconclusive, crits_, "inconclusive"),
                         (crit_skipped, crits_, "not evaluated"), (crit_warn, crits_, "only warned"),
                         (crit_unevaluated, crits_, "only warned, not computable")])
    if failed or crit_failed:
        # the first to fail in run order: a later failure is often its consequence
        first = next((n for n, s in in_order if n in failed), None)
        where = f"`{first}/` (its log and excerpt above)" if first else "the failed criteria above"
        # a step the runbook no longer has runs no more: --rerun names only the runbook's
        again = [n for n in failed if n not in removed]
        nxt = f"fix what failed, starting with {where}, then {_next_command(run, again)}"
    elif unfinished or verdict == "INCOMPLETE":
        if _cut_off(run):
            nxt = f"finish the run: {_command(run, resume=True)}"
        else:
            again = _not_run_or_disturbed(run)
            # why each skipped one did not run: one skipped for what this machine lacks skips again here
            why = [f"{n}: {run.steps[n].reason}" for n in again
                   if run.steps[n].status == "skipped" and run.steps[n].reason]
            nxt = ("run the steps that did not run or were disturbed again"
                   + (f" ({'; '.join(why)})" if why else "") + f": {_command(run, rerun=again)}" if again
                   else f"start a new run: {_command(run)}")
    elif problems:
        # every open problem, whatever its severity: a disturbed step, a figure outside its range, a skipped step
        # or a criterion that could not be evaluated is as open as a warning
        severities = Counter(str(p.get("severity")) for p in problems)
        nxt = ("use the settings under Recommendations; read the "
               + (plural(len(problems), "open warning") if set(severities) == {"WARN"} else
                  f"{plural(len(problems), 'open problem')} ("
                  + ", ".join(f"{n} {word}" for word, n in severities.items()) + ")")
               + " under Open Problems before relying on the figures")
    else:
        nxt = "use the settings under Recommendations; nothing else is open"
    record = finding.get("record") if finding else None  # the comparison behind the key finding (a Found)
    if isinstance(record, Found) and record.recommendable and not (failed or crit_failed):
        where = f"step `{record.step}`" + (", taken from an earlier run" if record.reused else "")
        nxt += f"; the setting that mattered most here: {record.with_} ({where})"
    return {"verdict": verdict, "passed": passed_text, "failed": failed_text, "open": open_text,
            "next": nxt}


def _listed(groups: list[tuple[list[str], tuple[str, str], str]]) -> str:
    """"2 steps failed (a, b); 1 criterion failed (c)": each non-empty group of names as its count, noun and what
    happened to them, the names in brackets."""
    return "; ".join(f"{plural(len(names), *noun)} {what} ({', '.join(names)})" for names, noun, what in groups
                     if names)


def _cut_off(run: Run) -> bool:
    """The run did not reach its verdict (interrupted, or killed before it finished): `--resume RUN_DIR` continues
    it. A run that did is refused by a plain --resume (validation.execution.runner.check_resume)."""
    return not run.finished or bool(run.interrupted_by)


def _command(run: Run, resume: bool = False, rerun: list[str] | tuple = ()) -> str:
    """`nsa-validate run RUNBOOK ...` as a Markdown code span, every word shell-quoted, with the --set the steps ran
    with (Run.overrides): --resume RUN_DIR (continue), --resume RUN_DIR --rerun STEP ... (run those again), or
    neither (a new run in a new directory)."""
    runbook = run.runbook.path or "RUNBOOK"
    where = run.run_dir or "RUN_DIR"
    text = run_command(runbook, resume=where if resume or rerun else None, rerun=rerun, overrides=run.overrides(rerun))
    return code(text)  # a span as long as a backtick in a path needs


def _next_command(run: Run, failed: list[str]) -> str:
    """After a fix: the failed steps run again into the run (with what else a cut-off run has left to run), else
    (only criteria failed) the rest of a cut-off run, or a new run."""
    if failed:
        return _command(run, rerun=failed + _stopped_by(run, failed))
    return _command(run, resume=True) if _cut_off(run) else f"start a new run: {_command(run)}"


# the runner's reason for a step it did not run because an earlier one failed and on_failure is stop
# (validation.execution.runner.Runner._not_run)
_STOPPED = re.compile(r"^not run: step (.+?) (?:failed|timed out|hung|ended in an error) and on_failure is stop$")


def _stopped_by(run: Run, failed: list[str]) -> list[str]:
    """The steps skipped because one of `failed` stopped the run (on_failure: stop), in run order: skipped is a final
    status, so a --rerun of the failed steps alone leaves them unrun."""
    out = []
    removed = set(removed_steps(run))
    for name, step in run.steps_in_order():
        if name in removed:
            continue
        match = _STOPPED.match(str(step.reason or "")) if step is not None and step.status == "skipped" else None
        if match and match.group(1) in failed:
            out.append(name)
    return out


def _not_run_or_disturbed(run: Run) -> list[str]:
    """The steps of a finished INCOMPLETE run to run again: those skipped and those measured under interference,
    in run order."""
    disturbed = {str(d.step) for d in run.evidence.disturbed}
    removed = set(removed_steps(run))  # the runbook no longer has them: a --rerun naming one is refused
    return [name for name, step in run.steps_in_order()
            if step is not None and name not in removed and (step.status == "skipped" or name in disturbed)]


def recommendation_rows(results: Run | dict, comps: list[Found]) -> list[dict]:
    """Each recommended environment variable with why: {"name", "value", "export", "source" ("measured" |
    "always"), "why"}. "measured": a significant comparison of this run chose it (its effect, with its CI; the side
    with the setting faster, or an A/B's baseline that ran with it faster than the variant);
    "always": the runbook recommends it always (recommend.env), with what the setting does (nsa.toggles) and
    whether a step of this run ran with it."""
    run = read_run(results)
    env = run.recommendations.env
    rows = []
    for name in sorted(env, key=str):
        value = str(env[name])
        setting = f"{name}={value}"
        # a significant effect of a decision that may be recommended (replicated, from interleaved repeats): one run
        # a side, or a difference that did not replicate, measures an effect but recommends nothing
        # (an A/B whose baseline won recommends the baseline's setting: the side without, the with side slower)
        measured = [c for c in comps if c.significant and c.recommendable
                    and ((c.rel > 0 and setting in c.with_) or (c.rel < 0 and setting in c.without))]
        if measured:
            top = max(measured, key=lambda c: abs(c.rel))
            why = (f"measured in an earlier run (its phase reused here): {top.text}" if top.reused else
                   f"measured in this run: {top.text}")
            source = "measured"
        else:
            used = sorted(n for n, st in run.steps.items() if st is not None and st.status == "passed"
                          and str(st.env.get(name)) == value)
            toggle = TOGGLES.get(str(name))
            what = f": {toggle.help}" if toggle is not None else ""
            why = (f"always recommended (the runbook's recommend.env){what} "
                   + (f"Steps of this run that ran with it: {', '.join(used)}." if used else
                      "No step of this run ran with it: not measured here."))
            source = "always"
        rows.append({"name": str(name), "value": value, "export": f"export {name}={shlex.quote(value)}",
                     "source": source, "why": why})
    return rows
