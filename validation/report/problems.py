"""The report's "Open problems": every failure, warning and skipped step or criterion of a run, with its reason, in
one list a reader can work through (results.json alone; pure; accepts damaged input).

Each problem is {"severity": word, "css": class, "where": "step X" / "criterion Y" / "X vs earlier run", "what":
one sentence}. Order: failures (steps that failed, timed out, hung or errored; criteria that failed or could not be
evaluated for an error, but for a warning's, figures outside their physical range, of every step whether or not
something reads it and however it ended), then what is incomplete or inconclusive
(interrupted or pending steps; criteria and steps whose evidence was taken while other work used the machine, with
the command that runs them again), then what was not run (skipped steps, criteria not evaluated), then warnings
(criteria of severity warn that did not hold or could not be evaluated, settings the trainer ignored, snapshot
problems, short or damaged training.csv windows, measured launches whose throughput was not stable, significant
regressions against an earlier run).
A step the runbook no longer has (removed_steps: kept from an earlier attempt of a resumed run) is no open problem,
unless it failed: the verdict still counts that.
A run whose trainer steps all ran on the CPU of a machine without a GPU does not list the snapshot's missing
nvidia-smi: that is what such a runbook asks for.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from validation.formatting import (CRITERION_LABELS, FAILED_STATUSES, NA, STATUS_LABELS, as_list, fmt_num, fmt_pct,
                                      status_view)
from validation.execution.evidence import recomputed, rerun_command
from validation.analysis.interference import step_record
from validation.analysis.plausibility import step_implausible
from validation.analysis.metric_names import THROUGHPUT_CV_MAX
from validation.report.performance import analysis_rows
from validation.results.codec import decode, encode
from validation.results.run import Criterion, Implausible, Run, Step, read_run
from validation.results.trainer_launch import LaunchMetrics

_RANK = {"fail": 0, "error": 0, "warn-incomplete": 1, "inconclusive": 1, "skip": 2, "warn": 3}


# a line break and the blanks around it: one space in a one-line "what"
_LINE_BREAK = re.compile(r"\s*(?:\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029])\s*")


def _item(rank: str, severity: str, css: str, where: str, what: Any) -> dict:
    """One problem; `what` on one line: each line break, with the blanks around it, one space. Other blanks stay as
    they are: a command in it (the "run it again" of a disturbed step, a criterion's "run again") quotes a path or
    a --set value holding two spaces or a tab, and squeezed it would name another directory or set another value."""
    text = _LINE_BREAK.sub(" ", str(what)).strip() if what is not None else ""
    return {"rank": _RANK[rank], "severity": severity, "css": css, "where": where,
            "what": text or "no reason recorded"}


def _launch(metrics: dict) -> LaunchMetrics:
    """A step's metrics as a trainer launch's (a step of another kind: the keys it shares with one)."""
    return decode(LaunchMetrics, metrics, lenient=True)


def removed_steps(results: Run | dict) -> list[str]:
    """The steps results.json holds that the runbook the run last ran no longer has, sorted (where the report shows
    them, under "other steps"): a run resumed with a runbook that lost a step keeps what an earlier attempt recorded
    of it, but no resume runs it again and the verdict does not wait for it (validation.execution.acceptance.verdict:
    the steps no phase record lists, when the run records its phases)."""
    run = read_run(results)
    if not run.phases:
        return []
    listed = {str(n) for p in run.phases for n in p.steps}
    return sorted(n for n in run.steps if n not in listed)


def last_recorded(step: Step | None) -> str:
    """What an earlier attempt last recorded of a step the runbook no longer has: "last recorded: PENDING" or
    "last recorded: FAILED (reason)"."""
    if step is None:
        return "no result recorded"
    reason = f" ({step.reason})" if step.reason else ""
    key = "unknown" if step.status is None else str(step.status)  # as status_view names it
    word = STATUS_LABELS.get(key, (key.upper(), None))[0]
    return f"last recorded: {word}{reason}"


def _step_problems(name: str, step: Step) -> list[dict]:
    out = []
    status = str(step.status)
    view = status_view(status)
    reason = step.reason
    if status in FAILED_STATUSES:
        out.append(_item("fail", view["word"], view["css"], f"step {name}", reason))
    elif status in ("interrupted", "pending", "running"):
        out.append(_item("warn-incomplete", view["word"], "warn", f"step {name}", reason or "the step did not finish"))
    elif status == "skipped":
        out.append(_item("skip", "SKIPPED", "skip", f"step {name}", reason))
    elif status not in STATUS_LABELS:
        out.append(_item("warn-incomplete", view["word"], "warn", f"step {name}", reason or "no result recorded"))
    if status in FAILED_STATUSES or status == "skipped":
        return out  # the reason already says why; what the step measured is not evidence either way
    metrics = step.metrics
    if status == "passed" and reason:  # passed with a caveat (a snapshot tool missing, a cut-off csv line)
        out.append(_item("warn", "WARN", "warn", f"step {name}", reason))
    for note in step.notes or []:  # e.g. an A/B whose setting the trainer ignored
        out.append(_item("warn", "WARN", "warn", f"step {name}", note))
    for setting in as_list(metrics.get("ignored_settings")):  # the ab kind's
        out.append(_item("warn", "WARN", "warn", f"step {name}", f"the trainer ignored {fmt_num(setting)}"))
    for problem in as_list(metrics.get("problems")):  # the snapshot kind's: a tool missing, a file not written
        if str(problem) not in str(reason or ""):  # not said already
            out.append(_item("warn", "WARN", "warn", f"step {name}", problem))
    records = [(f"step {name}", _launch(metrics))] + [(f"step {name} [{fmt_num(r.label)}]", r.metrics)
                                                      for r in step.runs]
    for where, m in records:
        if m.status == "short" or (m.status == "ok" and m.note):
            out.append(_item("warn", "WARN", "warn", where, f"training.csv: {m.note or m.status}"))
    return out


def _criterion_problems(crit: Criterion) -> list[dict]:
    status = str(crit.status)
    if status == "pass":
        return []
    view = status_view(status, CRITERION_LABELS)
    name = fmt_num(crit.name)
    detail = crit.detail
    actual = crit.actual
    parts = []
    if status in ("fail", "warn"):
        parts.append(f"expected {fmt_num(crit.target)}, got {fmt_num(actual)}")
    if detail:
        parts.append(str(detail))
    what = "; ".join(parts) or (f"got {fmt_num(actual)}" if actual not in (None, "", NA) else None)
    rank = {"fail": "fail", "error": "fail", "warn": "warn", "skipped": "skip",
            "inconclusive": "inconclusive"}.get(status, "warn-incomplete")
    if status == "error" and crit.severity == "warn":  # a warning that could not be computed: the verdict does not
        # stand on it (validation.execution.acceptance.verdict), so it is a warning here too
        rank = "warn"
        what = f"{what or 'could not be evaluated'}; a warning only, the verdict does not stand on it"
    return [_item(rank, view["word"], view["css"], f"criterion {name}", what)]


def _regressions(run: Run) -> list[dict]:
    """Significant regressions against an earlier run (the performance_analysis block, validation.report.performance)."""
    out = []
    for row in analysis_rows(run):
        if row["significant"] and row["verdict_value"] == "worse":
            out.append(_item("warn", "WARN", "warn", f"{row['step']} {row['metric']} vs earlier run",
                             f"worse by {row['rel_delta']} ({row['ci']}, p {row['p']}): {row['mean_a']} -> "
                             f"{row['mean_b']}"))
    return out


NO_GPU_TOOL = "nvidia-smi not found"  # the snapshot's caveat on a machine without the NVIDIA driver


def _cpu_only(run: Run) -> bool:
    """The run found no GPU and no step asked for one (every trainer step ran on the CPU)."""
    if run.environment.gpu_count != 0:
        return False
    launches = [m for step in run.steps.values() if step is not None
                for m in [_launch(step.metrics)] + [r.metrics for r in step.runs]]
    devices = {m.context.device for m in launches if m.context is not None and m.context.device}
    return bool(devices) and all(d.startswith("cpu") for d in devices)


def _implausible(run: Run) -> list[Implausible]:
    """Every figure of the run outside its physical range: those the evidence record judged (the steps whose
    performance evidence something uses, and the key figures), then those of every other step that recorded any
    (a step nothing reads, one that timed out, hung or ended in an error, a run recorded without its evidence),
    with whether other work used the machine while its step measured."""
    found = list(run.evidence.implausible)
    judged = {(str(b.step), str(b.metric)) for b in found}
    for name, step in run.steps_in_order():
        if step is None:
            continue
        raw = encode(step)
        extra = [b for b in (Implausible(step=name, **figure) for figure in step_implausible(raw))
                 if (name, str(b.metric)) not in judged]
        if extra:
            record = step_record(raw)
            shaken = bool(record is not None and record.disturbed)
            found += [dataclasses.replace(b, disturbed=shaken) for b in extra]
    return found


def _evidence_problems(run: Run) -> list[dict]:
    """What the run's evidence record (validation.execution.evidence.assess) found, and every other figure outside
    its physical range (_implausible): each an error, a bug in the measurement, unless a disturbance explains it;
    steps measured under interference, and measured launches whose throughput was not stable."""
    ev = run.evidence
    out = []
    for bad in _implausible(run):
        where = f"step {fmt_num(bad.step)}"
        what = (f"{fmt_num(bad.metric)} = {fmt_num(bad.value)} is outside its physical range "
                f"{fmt_num(bad.range)}: {fmt_num(bad.reason)}")
        if bad.disturbed:
            out.append(_item("inconclusive", "INCONCLUSIVE", "warn", where,
                             f"{what}; measured while other work used the machine, so not a result"))
        else:
            out.append(_item("error", "IMPLAUSIBLE", "fail", where, f"{what}: a bug in the measurement, not a result"))
    runbook, run_dir = run.runbook.path, run.run_dir
    records = {str(n): encode(s) for n, s in run.steps.items() if s is not None} if ev.disturbed else {}
    for d in ev.disturbed:
        # and the steps that compute a figure from what it measures (a scaling efficiency over it): run again
        # without them, that figure would still stand on the disturbed measurement
        steps = recomputed(records, [str(d.step)])
        again = rerun_command(str(runbook or "RUNBOOK"), str(run_dir or "RUN_DIR"), steps,
                              overrides=run.overrides(steps))
        out.append(_item("inconclusive", "DISTURBED", "warn", f"step {fmt_num(d.step)}",
                         f"measured while other work used the machine: {fmt_num(d.text)}; what it measured "
                         f"decides nothing on its own; run it again: {again}"))
    for name in (str(n) for n in ev.measured):
        step = run.steps.get(name)
        if step is None or step.status != "passed":
            continue
        records = [(f"step {name}", _launch(step.metrics))] + [
            (f"step {name} [{fmt_num(r.label)}" + (f", repeat {r.repeat + 1}" if r.repeat is not None else "") + "]",
             r.metrics) for r in step.runs]
        for where, m in records:
            if m.throughput_stable is False:
                cv = m.toks_per_s.cv if m.toks_per_s is not None else None
                out.append(_item("warn", "WARN", "warn", where,
                                 f"throughput not stable: tokens/s CV {fmt_pct(cv)} over the window (stable: at most "
                                 f"{fmt_pct(THROUGHPUT_CV_MAX)}); its mean is a poor summary of the run"))
    return out


def open_problems(results: Run | dict) -> list[dict]:
    """Every open problem of a run, failures first (see the module docstring); [] when there is none."""
    run = read_run(results)
    removed = set(removed_steps(run))
    items: list[dict] = []
    for name, step in run.steps_in_order():
        if name in removed:
            continue  # not part of the runbook any more: nothing of it is open, whatever it recorded (the verdict
            # does not count it)
        if step is not None:
            items += _step_problems(name, step)
        else:
            items.append(_item("warn-incomplete", "MISSING", "warn", f"step {name}", "no result recorded"))
    for crit in run.acceptance:
        items += _criterion_problems(crit)
    items += _regressions(run)
    items += _evidence_problems(run)
    if _cpu_only(run):  # no GPU on a CPU-only run is what the runbook asked for, not a problem
        items = [p for p in items if not (p["rank"] == _RANK["warn"] and NO_GPU_TOOL in p["what"])]
    items.sort(key=lambda p: p["rank"])  # stable: run order within a rank
    unique = {(p["where"], p["what"]): p for p in reversed(items)}  # a reason that is also a note: once
    return [{k: v for k, v in p.items() if k != "rank"} for p in items if unique[(p["where"], p["what"])] is p]
