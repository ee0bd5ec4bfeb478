"""`train`: one trainer launch (the step's env/args over the defaults); statistics over the last N steps of its
training.csv.

Own key: `scaling_baseline: <an earlier train step>`: scaling_efficiency = tokens/s / (world-size ratio x the
baseline's tokens/s), e.g. two nodes against one; where the baseline ran on more ranks than this step (a
single-process step run after the multi-rank one it isolates), the baseline's scaling against this step: its tokens/s
per rank over this step's per rank, and "scaling_of" names the baseline (the efficiency is always the launch on
more ranks over the one on fewer).
Noise: that efficiency is a ratio of two launches' throughputs (this step's and the baseline's, one launch each), and
launches of one configuration differ by several percent (cpu_smoke's declared launch_sd: a log-ratio of two launches
has an sd of 12%), so it carries its 95% interval, scaling_efficiency_low / _high = E exp(-/+ t(0.975, df) s sqrt 2),
s the sd of one launch's log tokens/s from launch to launch, from, in this order (as a `scaling` step with one run a
point; a train step has no repeats of its own):
  declared   one launch's share of the runbook's declared `compare: {launch_sd, pairs}` (launch_sd / sqrt 2, df
             pairs - 1: s sqrt 2 = launch_sd, the sd of a log-ratio of two launches), or the run-to-run noise
             measured earlier in this run where that is larger (significance.PairNoise.hold);
  measured   nothing declared: the run-to-run noise this validation run measured in repeated runs before this step
             (validation.kinds.trainer.measured_launch_noise: a sweep's or parallelism's repeats);
  unknown    none of these: no interval (the fix: declare `compare: {launch_sd, pairs}` from A/A pairs, or run
             repeats, e.g. a sweep or parallelism step with `repeats: 2`, before this step).
"scaling_noise" {"source" (declared | measured | unknown), "sd", "df", "detail"} says which, written with the
efficiency. Criteria: a claim that the scaling holds at least a level reads the lower bound
(`two_nodes.scaling_efficiency_low >= 0.85`: an error, never a pass, where the noise is unknown); a check against a
collapse far below any launch noise may read the point figure (`two_nodes.scaling_efficiency >= 0.85` where losing
15% means a broken inter-node path).
Evidence: the efficiency and its bounds stand on the baseline step's tokens/s too (derived_from): a criterion reading
them is inconclusive when either launch was measured under interference (validation.execution.evidence).
Metrics: a trainer launch's (validation.kinds.trainer), plus "scaling_baseline", "scaling_efficiency",
"scaling_efficiency_low", "scaling_efficiency_high" (absent where the noise is unknown or no efficiency was computed),
"scaling_noise" and "scaling_of" (above; absent where the efficiency is this step's own scaling).
Report: the run table and notes (the efficiency with its interval and noise); the executive summary's baseline
throughput and scaling efficiency (a train step's own with its interval; else the multi-rank baseline's tokens/s per
rank over a single-process train step's, one launch each: no interval, and the figure says so).

Options: the key above. Result: the step record of one trainer launch (validation.kinds.trainer.TrainerResult), its
metrics a Metrics: a LaunchMetrics with the interval and its noise (scaling_baseline, scaling_efficiency and these
are written only by this kind). The key figures read every step of the run as its own kind's Result, and a step's
metrics as a trainer launch's (as_launch).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from nsa.training.config import brief
from validation.analysis import metrics
from validation.analysis.significance.distributions import t_ppf
from validation import kinds
from validation.formatting import (NA, against_one, context_text, finite, fmt_num, fmt_rate, mean_pm,
                                   shared_context_text)
from validation.runbook.schema import NAME_RE, typed
from validation.analysis.plausibility import figure_problem
from validation.kinds.base import KeyFigure, earlier_step_of_kind
from validation.kinds.blocks import Block, Bullets
from validation.kinds.trainer import (TRAINER_METRICS, TRAINER_PERFORMANCE, TrainerKind, TrainerResult,
                                      launch_noise, launch_one, launch_window_text, trainer_blocks)
from validation.results.decision import LaunchNoise as ScalingNoise  # the noise a ratio of launches stands on
from validation.results.codec import absent, decode, given, written
from validation.results.run import Step as StepRecord, read_run
from validation.results.trainer_launch import LaunchMetrics, Num, RunContext, Stat, as_launch


@dataclasses.dataclass(frozen=True)
class Options:
    scaling_baseline: str | None = None  # an earlier train step: this one's scaling efficiency against it


@dataclasses.dataclass(frozen=True)
class Metrics(LaunchMetrics):
    """A train step's metrics: its trainer launch's, and with `scaling_baseline` the efficiency's 95% interval
    (absent where the noise is unknown or no efficiency was computed) and the noise it stands on (written with the
    efficiency; absent in records from before efficiencies carried one)."""
    scaling_efficiency_low: Num | None = absent()
    scaling_efficiency_high: Num | None = absent(beside="scaling_efficiency_low")
    scaling_noise: ScalingNoise | None = absent()
    # the step whose scaling the efficiency measures where it is not this one: the scaling_baseline, run on more
    # ranks than this step (its tokens/s per rank over this step's); absent where it is this step
    scaling_of: str | None = absent()


@dataclasses.dataclass(frozen=True)
class Result(TrainerResult):
    """A train step's record: its one trainer launch's (metrics: Metrics, with the scaling efficiency against
    `scaling_baseline`, its interval and its noise where the step names one)."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


# the figures a train step computes from its scaling_baseline step's tokens/s (StepKind.derived_from)
SCALING_FIGURES = ("scaling_efficiency", "scaling_efficiency_low", "scaling_efficiency_high")

UNKNOWN_NOISE = ("no launch-to-launch noise declared or measured before this step: the efficiency carries no "
                 "interval (declare the machine's launch noise, `compare: {launch_sd, pairs}` from A/A pairs, or run "
                 "repeats before this step, e.g. a sweep or parallelism step with `repeats: 2`)")


def efficiency_noise(ctx) -> ScalingNoise:
    """The noise of one launch's log tokens/s the scaling efficiency's interval stands on (the module docstring):
    one launch's share of the runbook's declared launch noise or the run-to-run noise measured earlier in this run,
    the larger, else the measured alone, else unknown (validation.kinds.trainer.launch_noise)."""
    source, sd, df, detail = launch_noise(ctx)
    return ScalingNoise(source=source, sd=sd, df=df, detail=detail or UNKNOWN_NOISE)


def efficiency_interval(efficiency: float | None, noise: ScalingNoise) -> tuple[float | None, float | None]:
    """The 95% interval of a ratio of two launches' throughputs: E exp(-/+ t(0.975, df) s sqrt 2), s the sd of one
    launch's log tokens/s (noise.sd); (None, None) without an efficiency or a known noise."""
    e, sd, df = finite(efficiency), finite(noise.sd), finite(noise.df)
    if e is None or e <= 0 or noise.source == "unknown" or sd is None or sd < 0 or df is None or df <= 0:
        return None, None
    half = t_ppf(0.975, df) * sd * math.sqrt(2.0)
    return e * math.exp(-half), e * math.exp(half)


def train_metrics(metrics: Any) -> Metrics:
    """A step's metrics as a train step's: the record itself, or its JSON (or another record's) decoded leniently."""
    return metrics if isinstance(metrics, Metrics) else decode(Metrics, written(metrics), lenient=True)


def interval_text(metrics: Any) -> str | None:
    """The scaling efficiency's 95% interval and, in words, whether it is resolved against 1.0 (perfect scaling):
    "95% interval 0.67 .. 1.08, not resolved from 1.0"; "95% interval unknown" where the noise is; None for a
    record without a noise (written before efficiencies carried one) or without an efficiency."""
    m = train_metrics(metrics)
    noise = given(m.scaling_noise)
    if finite(m.scaling_efficiency) is None or noise is None:
        return None
    low, high = finite(m.scaling_efficiency_low), finite(m.scaling_efficiency_high)
    if low is None or high is None:
        return "95% interval unknown"
    return f"95% interval {low:.2f} .. {high:.2f}, {against_one(low, high)}"


def noise_text(metrics: Any) -> str | None:
    """Which noise the interval stands on, in words ("noise (declared): ..."), or None where none is recorded."""
    m = train_metrics(metrics)
    noise = given(m.scaling_noise)
    if noise is None or finite(m.scaling_efficiency) is None:
        return None
    return f"noise ({noise.source or 'unknown'}): {noise.detail or NA}"


class Train(TrainerKind):
    name = "train"
    listing = 20
    repeatable = True
    summary = "one trainer launch (env/args overrides); statistics over the last N steps of its training.csv"
    keys = ("scaling_baseline",)
    metrics = TRAINER_METRICS + ("scaling_baseline", "scaling_efficiency", "scaling_efficiency_low",
                                 "scaling_efficiency_high", "scaling_noise.*", "scaling_of")
    # the interval's bounds measure speed as the efficiency does: a disturbed launch decides nothing on them
    performance = TRAINER_PERFORMANCE + ("scaling_efficiency_low", "scaling_efficiency_high")
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
        m = Metrics(**{f.name: getattr(one.metrics, f.name) for f in dataclasses.fields(LaunchMetrics)})
        if options.scaling_baseline:
            # multi-node scaling: this run's throughput against the baseline step's, per process
            base_step = read_run(ctx.results).steps.get(options.scaling_baseline)
            # a baseline that did not pass measured nothing to scale against: no efficiency (None)
            base = as_launch(base_step.metrics if base_step is not None and base_step.status == "passed" else {})
            # nor does this launch where it did not pass (a partial window of a failed or timed-out launch)
            own = (m.toks_per_s or Stat()).mean if one.status == "passed" else None
            other = (base.toks_per_s or Stat()).mean
            own_world, base_world = (1 if m.world_size is None else m.world_size), max(1, base.world_size or 1)
            scaling_of = None
            if own_world >= base_world:  # this launch on as many ranks or more: its scaling against the baseline's
                efficiency = metrics.scaling_efficiency(own, other, own_world / base_world)
            else:  # the baseline on more ranks (a single-process step after the multi-rank one): the baseline's
                scaling_of = options.scaling_baseline
                efficiency = metrics.scaling_efficiency(other, own, base_world / max(1, own_world))
            m = dataclasses.replace(m, scaling_baseline=options.scaling_baseline, scaling_efficiency=efficiency,
                                    scaling_of=scaling_of if efficiency is not None else None)
            if efficiency is not None:  # a ratio of two launches: its 95% interval from the launch noise
                noise = efficiency_noise(ctx)
                low, high = efficiency_interval(efficiency, noise)
                m = dataclasses.replace(m, scaling_efficiency_low=low, scaling_efficiency_high=high,
                                        scaling_noise=noise)
        return Result(status=one.status, reason=one.reason, metrics=m)

    def blocks(self, result: StepRecord) -> list[Block]:
        """The trainer launch's part (validation.kinds.trainer.trainer_blocks), its scaling efficiency's note with
        the 95% interval and the noise it stands on."""
        step = self.read(result)
        out = trainer_blocks(str(step.name), step)
        m = train_metrics(step.metrics)
        interval = interval_text(m)
        if interval is None:
            return out
        plain = f"Scaling efficiency: {fmt_num(m.scaling_efficiency)}"
        of = given(m.scaling_of)
        what = (f"Scaling efficiency of `{of}` against this launch ({of}'s tokens/s per rank over this launch's)"
                if of else f"Scaling efficiency against `{m.scaling_baseline}`")
        text = (f"{what}: {fmt_num(m.scaling_efficiency)}; {interval}; "
                f"{noise_text(m)}. A ratio of two launches' throughputs: E exp(-/+ t(0.975, df) s sqrt 2), s the sd "
                "of one launch's log tokens/s.")
        for i, block in enumerate(out):
            if isinstance(block, Bullets) and plain in block.items:
                out[i] = Bullets(tuple(text if item == plain else item for item in block.items))
                return out
        return out + [Bullets((text,))]

    def derived_from(self, result: StepRecord, path: tuple) -> list[str]:
        """The scaling_baseline step, for the scaling efficiency and its interval's bounds (and the step as a whole):
        a ratio of this step's tokens/s to that step's; none where no efficiency was computed (no baseline named,
        or it did not pass: its tokens/s was not used) and for every other figure (this launch's own)."""
        m = train_metrics(self.read(result).metrics)
        if not m.scaling_baseline or finite(m.scaling_efficiency) is None:
            return []
        return [str(m.scaling_baseline)] if not path or str(path[0]) in SCALING_FIGURES else []

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
        interval = None  # a train step's own efficiency's 95% interval, in words
        own_value = finite(_launch(own).scaling_efficiency) if own is not None else None
        if own is not None and own_value is not None:  # a train step's own (_figure_steps: only one that has it)
            own_m = train_metrics(own.metrics)
            interval, noise, of = interval_text(own_m), noise_text(own_m), given(own_m.scaling_of)
            what = (f"step `{own.name}`" if not of else
                    f"step `{own.name}`: `{of}`'s tokens/s per {_unit(_launch(own))} over `{own.name}`'s")
            scaling = (own_value, what + (f"; {noise}" if noise else ""), (str(own.name),))
        elif baseline is not None and single is not None:
            # per-GPU throughput of the multi-rank baseline over the throughput of a single-process train step
            base = _launch(baseline)
            per_gpu = finite(base.toks_per_s_per_gpu)
            single_mean = finite((_launch(single).toks_per_s or Stat()).mean)
            if per_gpu is not None and single_mean:
                both = shared_context_text([written(baseline.metrics), written(single.metrics)])
                # a ratio of two launches with no noise recorded: no interval, and said so (a single-process step
                # naming the multi-rank one as its scaling_baseline records the efficiency with its interval)
                interval = "one launch each, no 95% interval"
                scaling = (per_gpu / single_mean,
                           f"`{baseline.name}` {fmt_rate(per_gpu)} tokens/s per {_unit(base)} over "
                           f"`{single.name}` {fmt_rate(single_mean)} tokens/s single-process"
                           + (f"; at {both}" if both else "")
                           + f"; a ratio of two launches, one each: a difference smaller than the noise between "
                             f"launches does not show in it (`scaling_baseline: {baseline.name}` on `{single.name}` "
                             "records the efficiency with its 95% interval)",
                           (str(baseline.name), str(single.name)))
        if scaling is not None:
            v, note, named = scaling
            problem = figure_problem("scaling_efficiency", v)
            value = f"{v:.2f} ({v * 100:.0f}% of linear" + (f"; {interval})" if interval else ")")
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
    that passed with its own scaling efficiency), each None when there is none. Only a train step has its own (this
    kind writes scaling_efficiency; another kind's metrics, e.g. a benchmark's free-form JSON, may hold a key of that
    name), and the single-process step is one only where the figure divides by it: no step has its own, and the
    baseline ran on more than one rank, passed, with a per-GPU throughput."""
    train_steps = [s for s in steps if s.kind == "train"]
    baseline = next((s for s in train_steps if "baseline" in str(s.name or "").lower()), None)
    baseline = baseline or next((s for s in train_steps if s.status == "passed"), None)
    own = next((s for s in train_steps
                if s.status == "passed" and finite(_launch(s).scaling_efficiency) is not None), None)
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
