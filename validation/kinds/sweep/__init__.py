"""`sweep`: the trainer over a matrix of env/args values (every combination), optionally repeated, and a decision
that only names a winner when the data say so (validation.analysis.significance.decide):

- every repeat runs each point once, in a random order drawn per repeat (significance.interleaved_order; the
  seed comes from the run directory and is recorded), so that a machine's drift does not favour a point;
- repeats: paired by repeat. One run per point: the points are compared on block means of their windows, each
  run's noise held to at least the run-to-run variation this validation run measured in repeated runs before it
  (significance.windows.measured_run_noise, as an A/B's) and to one launch's share of the runbook's declared launch
  noise (`compare: {launch_sd, pairs}`). Block means of one window never see how far the next launch's level lies,
  so with neither noise no point can be significant: the point to keep is kept and the decision's reason says why
  and names the fix (`repeats: 2` or more, or a declared `compare`);
- the best point is the winner only when it beats every other point significantly (p < 0.05) and by more than
  the noise floor; otherwise "no significant difference" and the point to keep is kept: `prefer:` when the runbook
  states one, else the runbook's own value of the swept keys (the step's env/args or `defaults`), else the matrix's
  first point. Keeping it is a passed decision, not a failure. A point to keep measured only while other work used
  the machine (every run of it disturbed) was never beaten: it is kept, whatever the other points showed.

Later steps use the decision's point (the winner, or the point kept) as ${<step>.winner.env.NSA_DDP_BUCKET_MB}.
Only a significant decision is recommended (validation.execution.acceptance.recommendations).

Own keys: `matrix: {"env.NSA_DDP_BUCKET_MB": [25, 50, 100], "args.batch_size": [...]}`, `select: {metric, goal}`
(default toks_per_s; the metric a training.csv column or a window figure: SELECT_METRICS; the goal by default the
metric's better direction: max for tokens/s, min for a step time, a loss or memory, max for a metric without one),
`repeats` (default 1), `prefer` (the point to keep without a significant difference: `{env.NSA_DDP_BUCKET_MB: 50}`,
a list of such points in order of preference, or one value for a one-key matrix).
Result: "runs" (one per launch, each a trainer launch's record with its "repeat"),
"decision": validation.analysis.significance.Decision.as_dict() plus "order_seed", "order" (labels in run order),
"default_source" ("prefer", "runbook" or "first") and "points" {label: params};
"choice": {label, params, explanation, significant, kept_default} (the point later steps use) or null;
"winner": the choice when it rests on a significant difference, else null;
"metrics": {"points", "runs", "passed", "repeats", "decided" (a point chosen by comparing measured points: false
without a choice and when nothing was compared, e.g. every run disturbed, though a point is still kept), "significant",
"winner" (label or null), "choice", "kept_default", "method", "noise_floor", "recommended_repeats", "selection" (the
decision in words), "rule"}.

Options: the keys above. Result: the step record (validation.results.run.Step: its runs a LaunchRun each, its
decision a DecisionRecord, its choice and winner a Choice), its metrics a Metrics; run() builds it, the report hooks
read it (decoded leniently).
Report: a row per run (the chosen point marked), the decision and its statistics; a bar chart of the means of the
runs that passed.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from typing import Any, Mapping

from validation import kinds
from validation.analysis.interference import decision_record, disturbed_flags, measured_disturbed
from validation.analysis.metric_names import METRIC_COLUMNS
from validation.analysis.metrics import window_mean
from validation.analysis.stats import METRIC_DIRECTIONS
from validation.launch.spec import safe_name
from validation.formatting import (context_text, file_name, finite, fmt_num, fmt_pct, fmt_rate,
                                      fmt_tflops, mfu_text, param_name, params_text, shared_context_text)
from validation.runbook.schema import REPEATS_MAX, mapping, setting_key, typed
from validation.analysis.significance import StatsError, decide
from validation.analysis.significance.windows import measured_run_noise
from validation.kinds import train_report
from validation.kinds.blocks import Block, Column, Paragraph, Table
from validation.kinds.trainer import (RUN_METRICS, RUN_PERFORMANCE, TrainerKind, declared_pair_noise, order_seed,
                                      run_all, run_order, run_values, trainer_launch)
from validation.kinds.base import DECIDING_LAUNCH_KEYS, Effect, KeyFigure, effect_of, run_side, with_labels
from validation.kinds._plot_helpers import bar_points
from validation.results.codec import absent, decode, encode, given, written
from validation.kinds._decision_view import (block_means_alone, compared_nothing, decision_blocks, decision_mark,
                                             held_to_no_run_noise, kept_text, no_single_winner, status_badge,
                                             unkept_clause, without_run_noise)
from validation.results.decision import Choice, DecisionRecord
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import Stat


@dataclasses.dataclass(frozen=True)
class Options:
    matrix: Mapping[str, list]  # {"env.X" | "args.y": values}: every combination is a point
    select_metric: str = "toks_per_s"
    select_goal: str = "max"  # or "min"
    repeats: int = 1
    prefer: list = dataclasses.field(default_factory=list)  # the points to keep without a significant winner


# what `select: {metric}` can name: a training.csv column (compared per step over the window) or a window figure of
# every run (compared over repeats); a name outside these measures nothing, and the decision would compare nothing
SELECT_METRICS = tuple(dict.fromkeys(METRIC_COLUMNS + tuple(METRIC_DIRECTIONS)))
UNDECIDED = ""  # Metrics.method where no decision was computed: method, noise_floor and recommended_repeats absent


def default_goal(metric: str) -> str:
    """`select: {goal}` where the runbook states none: the metric's better direction ("min" for a step time, a loss
    or memory, METRIC_DIRECTIONS), else "max" (tokens/s, MFU; a metric without a direction)."""
    return "min" if METRIC_DIRECTIONS.get(metric) == "lower" else "max"


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's own metrics (the module docstring); method, noise_floor and recommended_repeats only when a
    decision was computed (method null where it compared nothing; UNDECIDED, the keys left out, where none was).
    Results written before decisions were recorded have neither runs nor repeats, decided, significant, choice and
    kept_default."""
    points: int | None = None
    runs: int | None = absent()
    passed: int | None = None
    repeats: int | None = absent()
    rule: str | None = absent()
    selection_rule: str | None = absent()  # "rule" in results written before it was renamed
    winner: str | None = None
    method: str | None = absent(UNDECIDED)
    noise_floor: int | float | None = absent(beside="method")
    recommended_repeats: int | None = absent(beside="method")
    decided: bool | None = absent()
    significant: bool | None = absent(beside="decided")
    choice: str | None = absent(beside="decided")
    kept_default: bool | None = absent(beside="decided")
    selection: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A sweep step's record: its runs, decision, choice and winner (the step record's), and its metrics."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


RULE = ("a winner only when the best point beats every other one significantly (p < 0.05, paired over interleaved "
        "repeats, or block means of one run each held to a run-to-run noise measured or declared: without one, none "
        "is significant) and by more than the noise floor; otherwise no significant difference and the runbook's "
        "point is kept")


class Sweep(TrainerKind):
    name = "sweep"
    listing = 30
    summary = ("a matrix over env/args (e.g. `env.NSA_DDP_BUCKET_MB: [25, 50, 100]`), optionally repeated in a random "
               "order per repeat; a winner only when it beats every other point significantly, else the runbook's "
               "point (`prefer`) is kept; later steps use it as `${bucket_sweep.winner.env.NSA_DDP_BUCKET_MB}`")
    keys = ("matrix", "select", "repeats", "prefer")
    launch_keys = DECIDING_LAUNCH_KEYS  # retry_disturbed too: it decides from repeats
    metrics = ("points", "runs", "passed", "repeats", "rule", "winner", "method", "noise_floor",
               "recommended_repeats", "decided", "significant", "choice", "kept_default", "selection") + RUN_METRICS
    performance = ("winner", "method", "noise_floor", "recommended_repeats", "decided", "significant", "choice",
                   "kept_default", "selection") + RUN_PERFORMANCE
    decides = True
    result_type = Result

    def metric_names(self, step):  # runs.<label>: the matrix's points, by their labels (NSA_DDP_BUCKET_MB=50)
        return self.metrics if step is None else with_labels(self.metrics, "<label>", dict(sweep_points(step)))
    plan_note = ("runs in a random order within each repeat, drawn for each run directory (the seed is recorded in "
                 "results.json), so the order shown here is an example")

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        raw_matrix = raw.get("matrix")
        matrix = mapping(raw_matrix, path + ("matrix",), ctx,
                         tuple(raw_matrix) if isinstance(raw_matrix, dict) else ())
        if not matrix:
            raise ctx.error(path + ("matrix",), "a sweep needs a matrix, e.g. {env.NSA_DDP_BUCKET_MB: [25, 50]}")
        clean = {}
        for key, values in matrix.items():
            setting_key(key, path + ("matrix", key), ctx, "matrix keys are")
            if not isinstance(values, list) or not values:
                raise ctx.error(path + ("matrix", key), "expected a non-empty list of values")
            clean[key] = [str(v) if key.startswith("env.") else v for v in values]
            shown = [str(v) for v in clean[key]]
            if len(set(shown)) != len(shown):
                raise ctx.error(path + ("matrix", key), f"values must be distinct, got {shown}")
        select = mapping(raw.get("select"), path + ("select",), ctx, ("metric", "goal"))
        metric = typed(select.get("metric", "toks_per_s"), str, path + ("select", "metric"), ctx,
                       choices=SELECT_METRICS)
        return Options(matrix=clean,
                       select_metric=metric,
                       select_goal=typed(select.get("goal", default_goal(metric)), str, path + ("select", "goal"), ctx,
                                         choices=("max", "min")),
                       repeats=typed(raw.get("repeats", 1), int, path + ("repeats",), ctx, minimum=1,
                                      maximum=REPEATS_MAX),
                       prefer=_parse_prefer(raw.get("prefer"), clean, path + ("prefer",), ctx))

    def winner_params(self, step) -> tuple[str, ...]:
        return tuple(step.matrix)

    def launches(self, step, winners, run_dir):
        points = dict(sweep_points(step))
        out = []
        for repeat, label in run_order(list(points), step.repeats, order_seed(step, run_dir)):
            params = points[label]
            env = {k[4:]: str(v) for k, v in params.items() if k.startswith("env.")}
            args = {k[5:]: v for k, v in params.items() if k.startswith("args.")}
            suffix = f"_r{repeat + 1}" if step.repeats > 1 else ""
            out.append(trainer_launch(step, step.launch, label, f"{step.name}/{safe_name(label)}{suffix}", winners,
                                      run_dir, extra_args=args, extra_env=env, params=params, repeat=repeat))
        return out

    def run(self, options: Options, ctx) -> Result:
        """Every point in every repeat (a disturbed repeat run again), then the decision over the points."""
        step = ctx.step
        done = run_all(ctx, retry_disturbed=True)
        runs = done.runs
        points = dict(sweep_points(options))
        data: dict[str, list] = {label: [None] * options.repeats for label in points}
        for r in runs:
            data[r.label][r.repeat] = run_values(ctx.run_dir, step, encode(r), options.select_metric)
        keep, source = keep_point(step)
        preferred = [label for label in preferred_points(options)[1:] if label != keep]
        ours = DecisionRecord(order_seed=order_seed(step, ctx.run_dir), order=[spec.label for spec in ctx.launches],
                              default_source=source, points=points)
        # one run a point: block means of each run's window see only the noise within it, never how far the next
        # launch's level lies; each run's noise is held to the run-to-run variation this validation run measured in
        # repeated runs before (as an A/B's), and to one launch's share of the runbook's declared launch noise
        rn = None if options.repeats > 1 else measured_run_noise(ctx.results, ctx.run_dir, options.select_metric)
        launch_noise = declared_pair_noise(ctx)
        try:
            d = decide(data, default=keep, preference=preferred, higher_is_better=options.select_goal == "max",
                       metric=options.select_metric,
                       disturbed=disturbed_flags([encode(r) for r in runs], points, options.repeats),
                       run_noise=rn, pair_noise=launch_noise)
        except StatsError as exc:
            d = None
            reason = f"no decision: {exc}"
            decision = dataclasses.replace(ours, reason=reason, significant=False, choice=None)
        if (d is not None and d.significant and d.choice != keep and keep not in dict(d.ranking)
                and any(k == keep for k, _ in d.disturbed_runs)):
            # the point kept otherwise was measured only while other work used the machine: no point beat it, so
            # whatever the others showed among themselves, it stays (as an A/B keeps a baseline it never measured)
            text = (f"{d.choice} is ahead of the other points ({d.reason.rstrip('.')}) but {keep}, the point kept "
                    "otherwise, was measured only while other work used the machine, so no point beat it and it is "
                    "kept")
            d = dataclasses.replace(d, winner=None, choice=keep, significant=False, kept_default=True, reason=text,
                                    recommendable=False, recommendation=f"nothing is recommended: {text}")
        if d is not None and d.method == "blocks" and rn is None and launch_noise is None:
            d = without_run_noise(d, keep)
        choice = None
        computed: dict[str, Any] = {}
        if d is not None:
            reason = d.reason
            decision = dataclasses.replace(decode(DecisionRecord, d.as_dict(), "decision"), order_seed=ours.order_seed,
                                           order=ours.order, default_source=source, points=points)
            if d.choice is not None:
                choice = Choice(d.choice, points[d.choice], d.reason, significant=d.significant,
                                kept_default=d.kept_default)
            computed = dict(winner=d.winner, method=d.method, noise_floor=d.noise_floor,
                            recommended_repeats=d.recommended_repeats)
        significant = bool(choice and choice.significant)
        metrics = Metrics(points=len(points), runs=len(runs), passed=sum(r.status == "passed" for r in runs),
                          repeats=options.repeats, rule=RULE, **computed,
                          decided=choice is not None and bool(d and d.comparisons),
                          significant=significant, choice=choice.label if choice else None,
                          kept_default=bool(choice and choice.kept_default), selection=reason)
        if done.problems:
            status, reason = "failed", "; ".join(done.problems)
        elif choice is None:
            status, reason = "failed", str(reason or "no decision")
        else:
            status, reason = "passed", None
        return Result(status=status, reason=reason, metrics=metrics, runs=runs, superseded=done.superseded,
                      notes=done.notes, decision=decision, choice=choice, winner=choice if significant else None,
                      interference=decision_record(encode(StepRecord(runs=runs)),
                                                   conclusive=bool(d is not None and d.significant)))

    def summary_line(self, result: Result) -> str:
        r = self.read(result)
        choice = given(r.choice)
        if choice is None:
            return ""
        params = params_text(choice.params)
        if choice.significant and no_single_winner(given(r.decision), choice):
            default = r.decision.default if r.decision else None
            return (f" {params} chosen (significantly ahead of " + (f"{default}, " if default else "")
                    + "the point kept otherwise; no single winner)")
        if choice.significant:
            return f" winner: {params} (significant)"
        source = r.decision.default_source if r.decision else None
        # a point other than the default kept without a significant difference: the only point measured (the
        # default's runs failed), never a preference the runbook did not state
        how = {"prefer": "preferred", "runbook": "the runbook's value", "first": "the matrix's first point"}.get(
            str(source), "kept") if choice.kept_default else (
            "the only point measured" if compared_nothing(r) else "preferred")
        return f" {kept_text(r, params)} ({how})"

    def view(self, result: Result, view: dict) -> dict:
        return {"command": ""}  # each run has its own

    def blocks(self, result: Result) -> list[Block]:
        """One row per run (the chosen one marked), the decision with its figures, and each run's summary."""
        r = self.read(result)
        runs = r.runs
        metrics = [written(run.metrics) for run in runs]
        choice = given(r.choice) or given(r.winner)
        keys = sorted({str(k) for run in runs for k in run.params})
        label_counts = Counter(str(run.label) for run in runs)
        decision = given(r.decision)
        mark = "BEST" if not decision else "WINNER" if choice and choice.significant else "KEPT"
        rows, marked = [], set()
        for i, run in enumerate(runs):
            params = run.params
            if len(keys) == 1 and keys[0] in params:
                value = fmt_num(params[keys[0]])
            else:
                value = params_text(params) if params else fmt_num(run.label)
            if label_counts[str(run.label)] > 1 and run.repeat is not None:
                value = f"{value} (repeat {run.repeat + 1})"
            toks = run.metrics.toks_per_s or Stat()
            best = choice is not None and run.label == choice.label
            if best:
                marked.add(i)
            rows.append((value, fmt_rate(toks.mean), fmt_rate(toks.stdev), fmt_pct(toks.cv), fmt_num(toks.n),
                         fmt_tflops(run.metrics.tflops_per_s), mfu_text(metrics[i], why=False),
                         status_badge(run.status, run.reason, mark if best else None)))
        out: list[Block] = [Table(
            (Column(param_name(keys[0]) if len(keys) == 1 else "value"),
             *(Column(c, numeric=True) for c in ("Tokens/s, window mean (all ranks)", "Stdev", "CV", "n", "TFLOP/s",
                                                 "MFU")), Column("Status")), rows, marked=marked)]
        context = shared_context_text(metrics)
        if context:
            out.append(Paragraph(f"Context of the tokens/s: {context}", style="context"))
        if decision:
            out += decision_blocks(decision, given(r.choice))
        elif choice:  # results written before decisions were recorded
            out.append(Paragraph(f"**Winner**: {params_text(choice.params)} — {fmt_num(choice.explanation)}"))
        else:
            out.append(Paragraph(f"**Winner**: none — "
                                 f"{r.metrics.selection or 'no run finished with a throughput figure'}"))
        rule = r.metrics.rule or r.metrics.selection_rule
        if rule:
            out.append(Paragraph(f"Rule: {rule}", style="muted"))
        return out + train_report.runs_blocks(runs)

    def comparisons(self, result: Result) -> list[Effect]:
        """The decision's best point against each other point."""
        r = self.read(result)
        comps = r.decision.comparisons or [] if r.decision else []
        effects = ((comp, effect_of(comp, run_side(r, comp.baseline), run_side(r, comp.variant))) for comp in comps)
        # block means of one run each with no run-to-run noise decide nothing: no such effect is significant, nor
        # "same" (_decision_view.held_to_no_run_noise)
        return [held_to_no_run_noise(e) if block_means_alone(comp) else e for comp, e in effects if e]

    def key_figures(self, in_order: list[StepRecord]) -> list[KeyFigure]:
        """Each sweep's decision ("Best bucket" for a significant bucket-size winner, "Bucket" for the point kept),
        after the baseline throughput."""
        figures = []
        for r in in_order:
            if not isinstance(r, Result):
                continue
            choice = given(r.choice) or given(r.winner)
            if not choice:
                continue
            significant = bool(choice.significant if choice.significant is not None else not given(r.decision))
            # the default beaten by points the data cannot order: the choice is not shown as the best
            tied = significant and no_single_winner(given(r.decision), choice)
            params = choice.params
            if len(params) == 1:
                key = param_name(str(next(iter(params))))
                value = fmt_num(next(iter(params.values())))
                is_bucket = "BUCKET" in key.upper()
                label = ("Best bucket" if significant and not tied else "Bucket") if is_bucket else (
                    f"Best {key}" if significant and not tied else key)
                value = f"{value} MB ({key})" if is_bucket and key.upper().endswith("_MB") else (
                    f"{value} ({key})" if is_bucket else value)
            else:
                label = "Sweep winner" if significant and not tied else "Sweep point chosen" if tied else (
                    "Sweep point kept")
                value = params_text(params) if params else fmt_num(choice.label)
            if tied:
                value += ", the point kept otherwise beaten: no single winner"
            if not significant:
                found = unkept_clause(given(r.decision))
                value += ", kept: no decision, nothing compared" if compared_nothing(r) else (
                    f", kept, no winner: {found}" if found else ", kept: no significant difference")
            chosen_runs = [run for run in r.runs if run.label == choice.label]
            # the point's throughput from its runs that passed (a crashed run's partial window is no measurement
            # of the point), as an A/B's pooled summary has it; of those measured undisturbed, where any was (a
            # run slowed by other work on the machine is no measurement of the point either)
            passed = [run for run in chosen_runs if run.status == "passed"]
            quiet = [run for run in passed if not measured_disturbed(written(run.metrics))]
            means = [finite((run.metrics.toks_per_s or Stat()).mean) for run in (quiet or passed)]
            # the runs' work over their time (each the point's same window): the harmonic mean of their figures
            # (metrics.window_mean, a window's own rule), not the plain mean, which favours the faster repeat
            mean = window_mean([m for m in means if m is not None], "toks_per_s")
            name = r.name
            note = f"step `{name}`" + (f", {fmt_rate(mean)} tokens/s" if mean is not None else "")
            note += " (measured under interference)" if mean is not None and not quiet else ""
            context = context_text(written(chosen_runs[0].metrics)) if chosen_runs else None
            note += f" at {context}" if context and mean is not None else ""
            figures.append(KeyFigure("sweep_choice", label, value, note, order=20, steps=(str(name),)))
        return figures

    def plots(self, name: str, result: Result, plotter) -> None:
        r = self.read(result)
        mark = decision_mark(r)
        keys = sorted({str(k) for run in r.runs for k in run.params})
        marked_color = "tab:green" if mark and mark[1] == "winner" else "tab:blue"
        # the runs that passed: a failed run's partial window is no measurement of its point (the table shows it
        # failed, the decision left it out), and as a bar of its own, or pooled into its point's bar, it would show
        # the point as a loser
        measured = [run for run in r.runs if run.status == "passed"]
        plotter.bars(bar_points(measured, tick_by_param=True), title=f"Sweep: {r.title or name}",
                     xlabel=param_name(keys[0]) if len(keys) == 1 else "run", filename=f"sweep_{file_name(name)}.png",
                     colors=lambda i, label: marked_color if mark and label == mark[0] else "tab:gray", mark=mark)


def sweep_points(step) -> list[tuple[str, dict[str, Any]]]:
    """(label, {"env.X": v, "args.y": w}) for every point of the step's matrix, in order."""
    keys = list(step.matrix)
    points = []
    for values in itertools.product(*(step.matrix[k] for k in keys)):
        params = dict(zip(keys, values))
        points.append((point_label(params), params))
    return points


def point_label(params: dict[str, Any]) -> str:
    return ",".join(f"{k.split('.', 1)[1]}={v}" for k, v in params.items())


def _parse_prefer(value: Any, matrix: dict[str, list], path: tuple, ctx) -> list[dict[str, Any]]:
    """`prefer`: a point ({key: value} for every matrix key), a list of points, or one value (one-key matrix);
    each must be a point of the matrix. Returns the points as matrix params, in order."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ctx.error(path, "expected a point of the matrix, e.g. {env.NSA_DDP_BUCKET_MB: 50}")
    keys = list(matrix)
    out = []
    for i, item in enumerate(items):
        ipath = path + ((i,) if isinstance(value, list) else ())
        if not isinstance(item, dict):
            if len(keys) != 1:
                raise ctx.error(ipath, f"expected a mapping of {', '.join(keys)} to values, got {item!r}")
            item = {keys[0]: item}
        if set(item) != set(keys):
            raise ctx.error(ipath, f"a preferred point gives a value for every matrix key ({', '.join(keys)}), "
                                   f"got {', '.join(map(str, item)) or 'none'}")
        point = {}
        for key in keys:
            match = [v for v in matrix[key] if str(v) == str(item[key])]
            if not match:
                raise ctx.error(ipath + (key,), f"{item[key]!r} is not one of the matrix values "
                                                f"{', '.join(str(v) for v in matrix[key])}")
            point[key] = match[0]
        out.append(point)
    return out


def preferred_points(step) -> list[str]:
    """Labels of the `prefer` points, in order."""
    return [point_label(p) for p in step.prefer]


def keep_point(step) -> tuple[str, str]:
    """(label, source) of the point kept without a significant difference: the first `prefer` point ("prefer"),
    else the runbook's own values of the swept keys in the step's env/args (with defaults) when they form a point
    of the matrix ("runbook"), else the matrix's first point ("first": the runbook names no default)."""
    preferred = preferred_points(step)
    if preferred:
        return preferred[0], "prefer"
    point = {}
    for key in step.matrix:
        section, name = key.split(".", 1)
        own = (step.launch.env if section == "env" else step.launch.args).get(name)
        match = [v for v in step.matrix[key] if own is not None and str(v) == str(own)]
        if not match:
            return sweep_points(step)[0][0], "first"
        point[key] = match[0]
    return point_label(point), "runbook"


kinds.register(Sweep())
