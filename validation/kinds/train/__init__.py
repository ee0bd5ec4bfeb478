"""`train`: one trainer launch (the step's env/args over the defaults); statistics over the last N steps of its
training.csv.

Own key: `scaling_baseline: <an earlier train step>`: scaling_efficiency = tokens/s / (world-size ratio x the
baseline's tokens/s), e.g. two nodes against one.
Metrics: a trainer launch's (validation.kinds.trainer), plus "scaling_baseline" and "scaling_efficiency".
Report: the run table and notes; the executive summary's baseline throughput and scaling efficiency.

Options: the key above. Result: the step record of one trainer launch (validation.kinds.trainer.TrainerResult), its
metrics a LaunchMetrics (whose scaling_baseline and scaling_efficiency are written only by this kind). The key
figures read every step of the run as its own kind's Result, and a step's metrics as a trainer launch's (as_launch).
"""

from __future__ import annotations

import dataclasses

from nsa.training.config import brief
from validation.analysis import metrics
from validation import kinds
from validation.formatting import NA, context_text, finite, fmt_rate, mean_pm, shared_context_text
from validation.runbook.schema import NAME_RE, typed
from validation.analysis.plausibility import figure_problem
from validation.kinds.base import KeyFigure, earlier_step_of_kind
from validation.kinds.trainer import TRAINER_METRICS, TrainerKind, TrainerResult, launch_one, launch_window_text
from validation.results.codec import written
from validation.results.run import Step as StepRecord, read_run
from validation.results.trainer_launch import LaunchMetrics, RunContext, Stat, as_launch


@dataclasses.dataclass(frozen=True)
class Options:
    scaling_baseline: str | None = None  # an earlier train step: this one's scaling efficiency against it


@dataclasses.dataclass(frozen=True)
class Result(TrainerResult):
    """A train step's record: its one trainer launch's (metrics: LaunchMetrics, with the scaling efficiency against
    `scaling_baseline` where the step names one)."""


class Train(TrainerKind):
    name = "train"
    listing = 20
    repeatable = True
    summary = "one trainer launch (env/args overrides); statistics over the last N steps of its training.csv"
    keys = ("scaling_baseline",)
    metrics = TRAINER_METRICS + ("scaling_baseline", "scaling_efficiency")
    result_type = Result

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        base_name = None
        if raw.get("scaling_baseline") is not None:
            base_name = typed(raw["scaling_baseline"], str, path + ("scaling_baseline",), ctx)
            if not NAME_RE.fullmatch(base_name):
                raise ctx.error(path + ("scaling_baseline",), f"{brief(base_name)}: a step name")
        return Options(scaling_baseline=base_name)

    def check(self, step, order, error) -> None:
        if step.scaling_baseline is None:
            return
        if not earlier_step_of_kind(order, step, step.scaling_baseline, "train"):
            raise error(f"scaling_baseline {step.scaling_baseline!r} must name an earlier train step")

    def run(self, options: Options, ctx) -> Result:
        one = launch_one(ctx)
        m = one.metrics
        if options.scaling_baseline:
            # multi-node scaling: this run's throughput against the baseline step's, per process
            base_step = read_run(ctx.results).steps.get(options.scaling_baseline)
            # a baseline that did not pass measured nothing to scale against: no efficiency (None)
            base = as_launch(base_step.metrics if base_step is not None and base_step.status == "passed" else {})
            multi, single = (m.toks_per_s or Stat()).mean, (base.toks_per_s or Stat()).mean
            ratio = (1 if m.world_size is None else m.world_size) / max(1, base.world_size or 1)
            m = dataclasses.replace(m, scaling_baseline=options.scaling_baseline,
                                    scaling_efficiency=metrics.scaling_efficiency(multi, single, ratio))
        return Result(status=one.status, reason=one.reason, metrics=m)

    def key_figure_steps(self, in_order: list[StepRecord]) -> list[str]:
        """The baseline step and, for the scaling efficiency, the step whose figure it is or the single-process
        step it divides by (every step of the run, each its own kind's Result)."""
        baseline, single, own = _figure_steps(in_order)
        return [str(s.name) for s in (baseline, single, own) if s is not None]

    def key_figures(self, in_order: list[StepRecord]) -> list[KeyFigure]:
        """Baseline throughput (the train step named *baseline*, else the first that passed) first, scaling
        efficiency last (a train step's own, else the multi-rank baseline per GPU over a single-process train step).
        A scaling efficiency outside its physical range (validation.execution.evidence.figure_problem) carries "problem"."""
        figures = []
        steps = list(in_order)
        baseline, single, own = _figure_steps(steps)
        if baseline is not None:
            m = _launch(baseline)
            toks = m.toks_per_s or Stat()
            # a baseline that did not pass (failed, timed out) is no figure, whatever rows it wrote
            shown = finite(toks.mean) is not None and baseline.status == "passed"
            value = (f"{mean_pm({'mean': toks.mean, 'stdev': toks.stdev})} tokens/s (window mean ± stdev, all ranks)"
                     if shown else f"{NA} (step {baseline.status or 'has no result'})")
            window = launch_window_text(m.window)
            note = f"step `{baseline.name}`" + (f", {window}" if window != NA else "")
            if finite(m.toks_per_s_per_gpu) is not None:
                note += f", {fmt_rate(m.toks_per_s_per_gpu)} tokens/s per {_unit(m)} (window mean)"
            context = context_text(written(baseline.metrics))
            if context and shown:
                note += f"; at {context}"
            figures.append(KeyFigure("baseline_throughput", "Baseline throughput", value, note, order=10,
                                     steps=(str(baseline.name),)))
        scaling: tuple[float, str, tuple[str, ...]] | None = None  # (value, note, steps)
        own_value = finite(_launch(own).scaling_efficiency) if own is not None else None
        if own is not None and own_value is not None:  # a train step's own (_figure_steps: only one that has it)
            scaling = (own_value, f"step `{own.name}`", (str(own.name),))
        elif baseline is not None and single is not None:
            # per-GPU throughput of the multi-rank baseline over the throughput of a single-process train step
            base = _launch(baseline)
            per_gpu = finite(base.toks_per_s_per_gpu)
            single_mean = finite((_launch(single).toks_per_s or Stat()).mean)
            if per_gpu is not None and single_mean:
                both = shared_context_text([written(baseline.metrics), written(single.metrics)])
                scaling = (per_gpu / single_mean,
                           f"`{baseline.name}` {fmt_rate(per_gpu)} tokens/s per {_unit(base)} over "
                           f"`{single.name}` {fmt_rate(single_mean)} tokens/s single-process"
                           + (f"; at {both}" if both else ""),
                           (str(baseline.name), str(single.name)))
        if scaling is not None:
            v, note, named = scaling
            problem = figure_problem("scaling_efficiency", v)
            value = f"{v:.2f} ({v * 100:.0f}% of linear)"
            figures.append(KeyFigure("scaling_efficiency", "Scaling efficiency",
                                     f"{value}: NOT A RESULT, outside its physical range" if problem else value,
                                     note, order=30, steps=named,
                                     metric="scaling_efficiency", raw=v, problem=problem, shared_cores=True))
        return figures


def _launch(step: StepRecord) -> LaunchMetrics:
    """A step's metrics as a trainer launch's (a train step's own; another kind's decoded leniently)."""
    return as_launch(step.metrics)


def _figure_steps(steps: list[StepRecord]) -> tuple[StepRecord | None, StepRecord | None, StepRecord | None]:
    """(the baseline train step, the single-process train step the scaling efficiency divides by, the train step
    with its own scaling efficiency), each None when there is none. Only a train step has its own (this kind writes
    scaling_efficiency; another kind's metrics, e.g. a benchmark's free-form JSON, may hold a key of that name), and
    the single-process step is one only where the figure divides by it: no step has its own, and the baseline ran
    on more than one rank, passed, with a per-GPU throughput."""
    train_steps = [s for s in steps if s.kind == "train"]
    baseline = next((s for s in train_steps if "baseline" in str(s.name or "").lower()), None)
    baseline = baseline or next((s for s in train_steps if s.status == "passed"), None)
    own = next((s for s in train_steps if finite(_launch(s).scaling_efficiency) is not None), None)
    single = None
    if own is None and baseline is not None and baseline.status == "passed":
        base = _launch(baseline)
        world, per_gpu = finite(base.world_size), finite(base.toks_per_s_per_gpu)
        first = next((s for s in train_steps if s.status == "passed" and _world_size(s) == 1), None)
        if (world is not None and world > 1 and per_gpu is not None and first is not None
                and finite((_launch(first).toks_per_s or Stat()).mean)):
            single = first
    return baseline, single, own


def _world_size(step: StepRecord) -> float | None:
    """A train step's world size (its launch's metrics), None when not known."""
    return finite(_launch(step).world_size)


def _unit(m: LaunchMetrics) -> str:
    """What a per-device figure is per: "rank" on a CPU run (no GPU), else "GPU"."""
    return "rank" if str((m.context or RunContext()).device or "").startswith("cpu") else "GPU"


kinds.register(Train())
