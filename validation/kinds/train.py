"""`train`: one trainer launch (the step's env/args over the defaults); statistics over the last N steps of its
training.csv.

Own key: `scaling_baseline: <an earlier train step>`: scaling_efficiency = tokens/s / (world-size ratio x the
baseline's tokens/s), e.g. two nodes against one.
Metrics: a trainer launch's (validation.kinds.trainer), plus "scaling_baseline" and "scaling_efficiency".
Report: the run table and notes; the executive summary's baseline throughput and scaling efficiency.
"""

from __future__ import annotations

import dataclasses

from nsa.training.config import brief
from validation.analysis import metrics
from validation import kinds
from validation.formatting import NA, as_dict, context_text, finite, fmt_rate, mean_pm, shared_context_text
from validation.runbook.schema import NAME_RE, typed
from validation.analysis.plausibility import figure_problem
from validation.kinds.base import KeyFigure, earlier_step_of_kind
from validation.kinds.trainer import TRAINER_METRICS, TrainerKind, launch_window_text, run_single
from validation.results.codec import decode
from validation.results.trainer_launch import LaunchMetrics, RunContext, Stat


@dataclasses.dataclass(frozen=True)
class Options:
    scaling_baseline: str | None = None  # an earlier train step: this one's scaling efficiency against it


class Train(TrainerKind):
    name = "train"
    repeatable = True
    summary = "one trainer launch (env/args overrides); statistics over the last N steps of its training.csv"
    keys = ("scaling_baseline",)
    metrics = TRAINER_METRICS + ("scaling_baseline", "scaling_efficiency")

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

    def run(self, step, launches, result, ctx) -> None:
        run_single(ctx, step, launches, result)
        if step.scaling_baseline:
            # multi-node scaling: this run's throughput against the baseline step's, per process
            m = result["metrics"]
            own = decode(LaunchMetrics, m, f"steps.{step.name}.metrics")
            base = decode(LaunchMetrics, (ctx.results["steps"].get(step.scaling_baseline) or {}).get("metrics") or {},
                          f"steps.{step.scaling_baseline}.metrics")
            multi, single = (own.toks_per_s or Stat()).mean, (base.toks_per_s or Stat()).mean
            ratio = (1 if own.world_size is None else own.world_size) / max(1, base.world_size or 1)
            m["scaling_baseline"] = step.scaling_baseline
            m["scaling_efficiency"] = metrics.scaling_efficiency(multi, single, ratio)

    def key_figure_steps(self, in_order: list[dict]) -> list[str]:
        """The baseline step and, for the scaling efficiency, the step whose figure it is or the single-process
        step it divides by."""
        baseline, single, own = _figure_steps(in_order)
        return [str(s.get("name")) for s in (baseline, single, own) if s is not None]

    def key_figures(self, in_order: list[dict]) -> list[KeyFigure]:
        """Baseline throughput (the train step named *baseline*, else the first that passed) first, scaling
        efficiency last (a step's own, else the multi-rank baseline per GPU over a single-process train step).
        A scaling efficiency outside its physical range (validation.execution.evidence.figure_problem) carries "problem"."""
        figures = []
        train_steps = [s for s in in_order if s.get("kind") == "train"]
        baseline = _figure_steps(in_order)[0]
        if baseline is not None:
            metrics = as_dict(baseline.get("metrics"))
            m = decode(LaunchMetrics, metrics, lenient=True)
            toks = m.toks_per_s or Stat()
            value = (f"{mean_pm({'mean': toks.mean, 'stdev': toks.stdev})} tokens/s (window mean ± stdev, all ranks)"
                     if finite(toks.mean) is not None else f"{NA} (step {baseline.get('status') or 'has no result'})")
            window = launch_window_text(m.window)
            note = f"step `{baseline.get('name')}`" + (f", {window}" if window != NA else "")
            if finite(m.toks_per_s_per_gpu) is not None:
                note += f", {fmt_rate(m.toks_per_s_per_gpu)} tokens/s per {_unit(m)} (window mean)"
            context = context_text(metrics)
            if context and finite(toks.mean) is not None:
                note += f"; at {context}"
            figures.append(KeyFigure("baseline_throughput", "Baseline throughput", value, note, order=10,
                                     steps=(str(baseline.get("name")),)))
        scaling = None
        for step in in_order:
            v = finite(as_dict(step.get("metrics")).get("scaling_efficiency"))
            if v is not None:
                scaling = {"value": v, "note": f"step `{step.get('name')}`", "steps": [str(step.get("name"))]}
                break
        if scaling is None and baseline is not None:
            # per-GPU throughput of the multi-rank baseline over the throughput of a single-process train step
            base_metrics = as_dict(baseline.get("metrics"))
            base = decode(LaunchMetrics, base_metrics, lenient=True)
            world, per_gpu = finite(base.world_size), finite(base.toks_per_s_per_gpu)
            single = next((s for s in train_steps if s.get("status") == "passed" and _world_size(s) == 1), None)
            single_m = decode(LaunchMetrics, as_dict(single).get("metrics"), lenient=True)
            single_mean = finite((single_m.toks_per_s or Stat()).mean)
            if world is not None and world > 1 and per_gpu is not None and single_mean:
                both = shared_context_text([base_metrics, as_dict(single.get("metrics"))])
                scaling = {"value": per_gpu / single_mean,
                           "steps": [str(baseline.get("name")), str(single.get("name"))],
                           "note": f"`{baseline.get('name')}` {fmt_rate(per_gpu)} tokens/s per {_unit(base)} over "
                                   f"`{single.get('name')}` {fmt_rate(single_mean)} tokens/s single-process"
                                   + (f"; at {both}" if both else "")}
        if scaling is not None:
            v = scaling["value"]
            problem = figure_problem("scaling_efficiency", v)
            value = f"{v:.2f} ({v * 100:.0f}% of linear)"
            figures.append(KeyFigure("scaling_efficiency", "Scaling efficiency",
                                     f"{value}: NOT A RESULT, outside its physical range" if problem else value,
                                     scaling["note"], order=30, steps=tuple(scaling["steps"]),
                                     metric="scaling_efficiency", raw=v, problem=problem, shared_cores=True))
        return figures


def _figure_steps(in_order: list[dict]) -> tuple[dict | None, dict | None, dict | None]:
    """(the baseline train step, the single-process train step the scaling efficiency divides by, the step with its
    own scaling efficiency), each None when there is none."""
    train_steps = [s for s in in_order if isinstance(s, dict) and s.get("kind") == "train"]
    baseline = next((s for s in train_steps if "baseline" in str(s.get("name", "")).lower()), None)
    baseline = baseline or next((s for s in train_steps if s.get("status") == "passed"), None)
    own = next((s for s in in_order if isinstance(s, dict)
                and finite(as_dict(s.get("metrics")).get("scaling_efficiency")) is not None), None)
    single = next((s for s in train_steps if s.get("status") == "passed" and _world_size(s) == 1), None)
    return baseline, (single if own is None else None), own


def _world_size(step: dict) -> float | None:
    """A train step's world size (its launch's metrics), None when not known."""
    return finite(decode(LaunchMetrics, step.get("metrics"), lenient=True).world_size)


def _unit(m: LaunchMetrics) -> str:
    """What a per-device figure is per: "rank" on a CPU run (no GPU), else "GPU"."""
    return "rank" if str((m.context or RunContext()).device or "").startswith("cpu") else "GPU"


kinds.register(Train())
