"""How far a run's evidence can be trusted, judged once when the run ends (validation.execution.runner) and read by the
acceptance criteria, the recommendations, the report and `compare`:

- **interference**: every measured launch records what else used the machine over its measured period
  (validation.launch.telemetry.interference: other processes' CPU against the cores the launch leaves free, steal,
  other processes on its GPUs, GPU clock throttles). A step whose evidence was taken under interference is
  *disturbed* (step_interference); what a disturbed step measured may not pass, fail or win anything on its own:
  a performance criterion reading it is *inconclusive*, named among the report's open problems with the command
  that runs just those steps again (rerun_command), and a run whose required criteria are inconclusive ends
  INCOMPLETE, never GO (validation.execution.acceptance). A decision (sweep, A/B, triage) leaves disturbed runs out itself.
  A figure a step computes from what other steps measured (StepKind.derived_from: a train step's scaling
  efficiency divides by its `scaling_baseline` step's tokens/s) stands on their evidence too: a criterion reading it
  is inconclusive when any of them was disturbed, though its own step was not, and those steps are measured
  (derived_from, derived_disturbed); the command that runs a step again runs the steps that compute a figure from
  it too (recomputed).
- **plausibility**: every metric with a physical range declares it once (validation.analysis.plausibility.RANGES): a scaling
  efficiency above 1.1 or at most 0, a tokens/s CV above 50%, an MFU above 100% (or tokens/s beyond the device's
  peak), a GPU utilisation above 100%, a negative time, memory or loss. A figure outside its range is a bug in the
  measurement, not a result: a criterion reading it is an error (inconclusive when a disturbance explains it: its
  step was disturbed, or only runs a decision left out as disturbed measured it, disturbed_implausible), a
  decision over runs that measured one is neither recommended nor a key finding (runs_implausible), and the report
  lists it among the open problems.
- **performance metrics**: what a kind measures about speed (StepKind.performance: patterns over its metric
  names), as opposed to correctness (a loss that falls, tests that pass), which still decides on a busy machine.

`assess(runbook, results)` returns results.json's "evidence" record:
    {"disturbed": [{"step", "text", "launches"}], "implausible": [{"step", "metric", "value", "range", "reason",
     "disturbed"}], "measured": [step names whose performance evidence a criterion, decision or key figure uses],
     "rules": the interference thresholds in words, "rerun": the command that runs the disturbed steps again}
"""

from __future__ import annotations

from typing import Any, Iterable

from validation import kinds as step_kinds
from validation.formatting import as_dict, as_list, run_command
from validation.analysis.interference import disturbed, launch_records, step_interference  # noqa: F401 - the run's judge
from validation.analysis.interference import run_disturbed
from validation.launch.telemetry import interference_rules
from validation.analysis.plausibility import range_of, step_implausible
from validation.analysis.plausibility import text as plausibility_text
from validation.kinds.base import metric_declared
from validation.results.codec import decode, encode
from validation.results.run import Implausible, Step as StepRecord, read_run


# ------------------------------------------------------------------------------------------------ performance
def is_performance(step_kind, path: tuple) -> bool:
    """Whether `path` of a step of `step_kind` is performance evidence: it is, or holds, a name of the kind's
    `performance` patterns; a bare step (path ()) is when the kind declares any."""
    patterns = _performance(step_kind)
    below = tuple(p if p.endswith("*") else f"{p}.*" for p in patterns)  # and everything inside each
    return bool(patterns) and (not path or metric_declared(tuple(path), patterns + below))


def _performance(step_kind) -> tuple[str, ...]:
    """A kind's `performance` patterns (none for an object that is no kind)."""
    return tuple(getattr(step_kind, "performance", ()) or ())


def performance_reads(runbook, criterion) -> list[tuple[str, tuple]]:
    """The (step, path) reads of a runbook criterion that are performance evidence: of a kind whose every key may
    be a figure (performance "*": a benchmark's free-form JSON), not what the criterion only counts, looks into or
    compares with a string (Expression.structural_paths: `bench.status == 'passed' and len(bench.checks) >= 4` says
    the benchmark ran, not how fast); of another kind, every read of a key it names."""
    steps_by_name = {s.name: s for s in runbook.steps()}
    measured = criterion.expr.measured_paths
    structural = criterion.expr.structural_paths
    out = []
    for name, path in measured + structural:
        step = steps_by_name.get(name)
        if step is None or (name, path) in out or not is_performance(step.kind_impl, path):
            continue
        if (name, path) not in measured and "*" in _performance(step.kind_impl):
            continue  # only counted, looked into or compared with a string, in a benchmark's JSON
        out.append((name, path))
    return out


def evidence_reads(runbook, criterion) -> list[tuple[str, tuple]]:
    """The (step, path) reads of a criterion whose figures may stand on another step's measurements: its
    performance_reads, then every read that is not only counted, looked into or compared with a string
    (Expression.measured_paths): a figure its own kind does not count as speed may still be computed from what
    another step measured (derived_from)."""
    return list(dict.fromkeys(performance_reads(runbook, criterion) + list(criterion.expr.measured_paths)))


def derived_from(steps: dict, name: str, path: tuple) -> list[str]:
    """The other steps of the run whose measurements the figure at key `path` of step `name` is computed from (its
    kind's StepKind.derived_from, asked with the step's record; `steps`: the step records as results.json holds
    them): a train step's scaling efficiency divides its tokens/s by its `scaling_baseline` step's. Only steps the
    run holds a record of; [] for a step without a record, or of a kind this process does not know."""
    return deriving(steps)(name, path)


def deriving(steps: dict):
    """derived_from over `steps`, which must not change while it is used: each step's record is read (decoded as
    its kind's) once, however many figures of it are asked about; reading a record, not asking its kind, is what
    costs (every criterion, key figure and step of a run asks)."""
    read: dict[str, tuple] = {}

    def of(name: str, path: tuple) -> list[str]:
        if name not in read:
            record = steps.get(name)
            kind = step_kinds.find(decode(StepRecord, record, lenient=True).kind) if isinstance(record, dict) else None
            read[name] = (kind, kind.read(record) if kind is not None else None)
        kind, result = read[name]
        if kind is None:
            return []
        return [str(s) for s in dict.fromkeys(kind.derived_from(result, tuple(path)))
                if str(s) != name and isinstance(steps.get(str(s)), dict)]

    return of


def derived_disturbed(steps: dict, name: str, path: tuple, derive=None) -> list[str]:
    """The steps of derived_from(steps, name, path) that were disturbed: the figure stands on what they measured
    while other work used the machine, though its own step may have measured undisturbed. `derive`: deriving(steps)
    where the caller asks about many figures of one run."""
    return [s for s in (derive or deriving(steps))(name, path) if disturbed(steps[s])]


def recomputed(steps: dict, names: Iterable[str], derive=None) -> list[str]:
    """`names` (steps to run again), then every other step of `steps` (the step records as results.json holds them)
    with a figure computed from what one of them measures (derived_from, of the step as a whole), and so on: run
    again without them, such a figure would still stand on the earlier, disturbed measurement (a scaling
    efficiency over its baseline's old tokens/s). `derive`: deriving(steps), as derived_disturbed's."""
    derive = derive or deriving(steps)
    out = list(dict.fromkeys(names))
    grew = True
    while grew:
        more = [n for n in steps if n not in out and set(derive(n, ())) & set(out)]
        out += more
        grew = bool(more)
    return out


def runs_implausible(step: dict) -> list[str]:
    """"runs.<label>.metric = value outside [range]: reason" for every figure of a step's runs (a sweep's, an A/B's,
    a triage's, a scaling step's launches) outside its physical range, and "metric = ..." for every figure the step
    derived from them (a scaling step's per-row efficiencies, whose minimum a criterion may read while one row is
    14.9): what a decision or table over those runs stands on is then not a result (no criterion passes on it,
    nothing is recommended from it, it is no key finding). [] for a step of one launch (a criterion reading its
    figures judges those it reads)."""
    step = as_dict(step)
    if not any(label for label, _, _ in launch_records(step)):
        return []
    out = []
    for item in step_implausible(step):
        text = plausibility_text(item)
        if text not in out:
            out.append(text)
    return out


def disturbed_implausible(step: dict) -> list[str]:
    """The figures of runs_implausible(step) that only its disturbed runs measured: a disturbance explains them
    (a window another process shared can vary by more than half its mean), not a bug in the measurement. What the
    step decided stands on none of them once it left those runs out (its record then says it is not disturbed),
    yet a decision over runs that measured one is no result: a criterion on it is inconclusive, not an error.
    [] for a step without disturbed runs."""
    step = as_dict(step)
    runs = [encode(r) for r in decode(StepRecord, step, lenient=True).runs]
    shaken = [r for r in runs if run_disturbed(r)]
    if not shaken:
        return []
    quiet = [r for r in runs if not run_disturbed(r)]
    others = {plausibility_text(item) for item in step_implausible({**step, "runs": quiet})}  # and what it derived
    return [text for text in runs_implausible({**step, "runs": shaken}) if text not in others]


# ------------------------------------------------------------------------------------------------ the run
def rerun_command(runbook_path: str, run_dir: str, step_names: Iterable[str], overrides: Iterable[str] = ()) -> str:
    """The command that runs just `step_names` of a finished run again, into it, with `overrides` (the --set they
    ran with: validation.results.run.Run.overrides), every word shell-quoted."""
    return run_command(runbook_path, resume=run_dir, rerun=step_names, overrides=overrides)


def measured_steps(runbook, results: dict, derive=None) -> list[str]:
    """The steps whose performance evidence something uses: a criterion's performance read, a kind that decides
    on performance (StepKind.decides), or a key figure (StepKind.key_figure_steps). `derive`: deriving(results'
    steps)."""
    used: dict[str, None] = {}
    steps = as_dict(results.get("steps"))
    derive = derive or deriving(steps)
    for c in runbook.acceptance:
        for name, _ in performance_reads(runbook, c):
            used[name] = None
        for name, path in evidence_reads(runbook, c):  # and the steps a figure it reads is computed from
            used.update(dict.fromkeys(derive(name, path)))
    # each step read once (as its kind's record) for every kind's key figures: reading is what costs
    in_order = step_kinds.read_steps(steps[s.name] for s in runbook.steps() if isinstance(steps.get(s.name), dict))
    for s in runbook.steps():
        if getattr(s.kind_impl, "decides", False):
            used[s.name] = None
    for kind in step_kinds.kinds():
        for name in kind.key_figure_steps(list(in_order)):
            used[str(name)] = None
        for fig in kind.key_figures(list(in_order)):
            used.update(dict.fromkeys(_figure_sources(steps, fig, derive)))
    order = [s.name for s in runbook.steps()]
    return [n for n in order if n in used]


def _figure_sources(steps: dict, fig, derive=None) -> list[str]:
    """The steps a key figure is computed from besides its own (fig.steps): derived_from of its metric, read as
    that key of each step it comes from (a train step's own scaling efficiency: its baseline step). `derive`:
    deriving(steps)."""
    if not fig.metric:
        return []
    derive = derive or deriving(steps)
    return [s for name in fig.steps for s in derive(str(name), tuple(str(fig.metric).split(".")))
            if s not in fig.steps]


def assess(runbook, results: dict, run_dir: str) -> dict[str, Any]:
    """results.json's "evidence" (see the module docstring)."""
    steps = as_dict(results.get("steps"))
    derive = deriving(steps)
    measured = measured_steps(runbook, results, derive)
    disturbed_steps, bad = [], []
    for name in measured:
        step = as_dict(steps.get(name))
        if step.get("status") not in ("passed", "failed"):
            continue
        rec = step_interference(step)
        is_disturbed = bool(rec and rec.get("disturbed"))
        if is_disturbed:
            launches = [x for x in as_list(rec.get("launches")) if as_dict(x).get("disturbed")]
            disturbed_steps.append({"step": name, "text": rec.get("text"), "launches": launches})
        explained = disturbed_implausible(step)  # measured only by runs a disturbance explains
        for item in step_implausible(step):  # each launch's figures and what the step derived from them
            # or computed from another step's measurement that a disturbance explains (derived_from)
            metric = tuple(str(decode(Implausible, item, lenient=True).metric or "").split("."))
            bad.append({"step": name, **item,
                        "disturbed": (is_disturbed or plausibility_text(item) in explained
                                      or bool(derived_disturbed(steps, name, metric, derive)))})
    in_order = step_kinds.read_steps(as_dict(steps.get(s.name)) for s in runbook.steps())  # read once, as above
    shaken = {d["step"] for d in disturbed_steps}
    for kind in step_kinds.kinds():
        for fig in kind.key_figures(list(in_order)):
            r = range_of(fig.metric or "")
            if fig.problem and r is not None:
                bad.append({"step": ", ".join(fig.steps) or "run", "metric": fig.label, "value": fig.raw,
                            "range": r.text(), "reason": r.reason,
                            "disturbed": bool(shaken.intersection([*fig.steps, *_figure_sources(steps, fig, derive)]))})
    again = recomputed(steps, [d["step"] for d in disturbed_steps] + [b["step"] for b in bad if b["step"] in steps],
                       derive)
    rerun = rerun_command(as_dict(results.get("runbook")).get("path") or "RUNBOOK", run_dir, again,
                          read_run(results).overrides(again))
    return {"disturbed": disturbed_steps, "implausible": bad, "measured": measured, "rules": interference_rules(),
            "rerun": rerun if disturbed_steps or bad else None}
