"""`sweep`: the trainer over a matrix of env/args values (every combination, in order) and the winner by the
runbook's rule: the highest mean of `select.metric` (or lowest, `goal: min`), a tie (within 1%) going to the lower
stdev. Later steps use the winner as ${<step>.winner.env.NSA_DDP_BUCKET_MB}.

Own keys: `matrix: {"env.NSA_DDP_BUCKET_MB": [25, 50, 100], "args.batch_size": [...]}`, `select: {metric, goal}`.
Result: "runs" (one per point, each a trainer launch's record), "winner" {label, params, explanation},
"metrics": {"points", "passed", "winner", "selection"}.
Report: a row per point (the winner marked), the winner and its rule; a bar chart of the means with error bars.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from typing import Any

from validation import steps
from validation.launch.spec import safe_name
from validation.report.format import (as_dict, as_list, context_text, finite, fmt_num, fmt_pct, fmt_rate,
                                      fmt_tflops, mfu_text, param_name, params_text, shared_context_text, stat_of,
                                      status_view)
from validation.schema import mapping, reserved_arg, typed
from validation.steps.trainer import TrainerKind, run_each, trainer_launch


class Sweep(TrainerKind):
    name = "sweep"
    summary = ("a matrix over env/args (e.g. `env.NSA_DDP_BUCKET_MB: [25, 50, 100]`) and the runbook's rule: highest "
               "mean, tie (within 1%) -> lower stdev; later steps use the winner as "
               "`${bucket_sweep.winner.env.NSA_DDP_BUCKET_MB}`")
    keys = ("matrix", "select")

    def parse(self, raw: dict, path: tuple, ctx) -> dict[str, Any]:
        matrix = mapping(raw.get("matrix"), path + ("matrix",), ctx,
                         tuple(raw["matrix"].keys()) if isinstance(raw.get("matrix"), dict) else ())
        if not matrix:
            raise ctx.error(path + ("matrix",), "a sweep needs a matrix, e.g. {env.NSA_DDP_BUCKET_MB: [25, 50]}")
        clean = {}
        for key, values in matrix.items():
            if not isinstance(key, str) or not re.match(r"^(env|args)\.[A-Za-z0-9_-]+$", key):
                raise ctx.error(path + ("matrix", key), "matrix keys are env.VARIABLE or args.flag")
            if key.startswith("args.") and reserved_arg(key[5:]):
                raise ctx.error(path + ("matrix", key), f"set by nsa-validate itself ({reserved_arg(key[5:])})")
            if not isinstance(values, list) or not values:
                raise ctx.error(path + ("matrix", key), "expected a non-empty list of values")
            clean[key] = [str(v) if key.startswith("env.") else v for v in values]
        select = mapping(raw.get("select"), path + ("select",), ctx, ("metric", "goal"))
        return {"matrix": clean,
                "select_metric": typed(select.get("metric", "toks_per_s"), str, path + ("select", "metric"), ctx),
                "select_goal": typed(select.get("goal", "max"), str, path + ("select", "goal"), ctx,
                                     choices=("max", "min"))}

    def winner_params(self, step) -> tuple[str, ...]:
        return tuple(step.matrix)

    def launches(self, step, winners, run_dir):
        out = []
        for label, params in sweep_points(step):
            env = {k[4:]: str(v) for k, v in params.items() if k.startswith("env.")}
            args = {k[5:]: v for k, v in params.items() if k.startswith("args.")}
            out.append(trainer_launch(step, step.launch, label, f"{step.name}/{safe_name(label)}", winners, run_dir,
                                      extra_args=args, extra_env=env, params=params))
        return out

    def run(self, step, launches, result, ctx) -> None:
        from validation import metrics

        runs, problems = run_each(ctx, step, launches, result)
        label, explanation = metrics.select_best(
            [(r["label"], r["metrics"]) for r in runs if r["status"] == "passed"], step.select_metric,
            step.select_goal)
        if label is not None:
            won = next(r for r in runs if r["label"] == label)
            result["winner"] = {"label": label, "params": won["params"], "explanation": explanation}
        result["metrics"] = {"points": len(runs), "passed": sum(r["status"] == "passed" for r in runs),
                             "winner": label, "selection": explanation}
        if problems:
            result.update(status="failed", reason="; ".join(problems))
        elif label is None:
            result.update(status="failed", reason=f"no winner: {explanation}")
        else:
            result.update(status="passed", reason=None)

    def view(self, result: dict, view: dict) -> dict:
        runs = [as_dict(r) for r in as_list(result.get("runs"))]
        winner = as_dict(result.get("winner"))
        keys = sorted({str(k) for r in runs for k in as_dict(r.get("params"))})
        header = param_name(keys[0]) if len(keys) == 1 else "value"
        label_counts = Counter(str(r.get("label")) for r in runs)
        rows = []
        for run in runs:
            params = as_dict(run.get("params"))
            if len(keys) == 1 and keys[0] in params:
                value = fmt_num(params[keys[0]])
            else:
                value = params_text(params) if params else fmt_num(run.get("label"))
            if label_counts[str(run.get("label"))] > 1 and run.get("repeat") is not None:
                value = f"{value} (repeat {fmt_num(run.get('repeat'))})"
            run_metrics = as_dict(run.get("metrics"))
            toks = stat_of(run_metrics, "toks_per_s")
            best = bool(winner) and run.get("label") == winner.get("label")
            rows.append({
                "value": value, "label": fmt_num(run.get("label")), "best": best,
                "mean": fmt_rate(toks.get("mean")), "stdev": fmt_rate(toks.get("stdev")),
                "cv": fmt_pct(toks.get("cv")), "n": fmt_num(toks.get("n")),
                "tflops": fmt_tflops(run_metrics.get("tflops_per_s")), "mfu": mfu_text(run_metrics, why=False),
                "status": status_view(run.get("status")), "reason": run.get("reason"),
            })
        winner_view = None
        if winner:
            winner_view = {"label": fmt_num(winner.get("label")), "params": params_text(winner.get("params")),
                           "explanation": fmt_num(winner.get("explanation"))}
        metrics = as_dict(result.get("metrics"))
        rule = metrics.get("rule") or metrics.get("selection_rule")
        no_winner = None if winner else (metrics.get("selection") or "no run finished with a throughput figure")
        return {"command": "",  # each run has its own
                "sweep": {"header": header, "rows": rows, "winner": winner_view,
                          "context": shared_context_text(as_dict(r.get("metrics")) for r in runs),
                          "no_winner": str(no_winner) if no_winner else None, "rule": str(rule) if rule else None}}

    def key_figures(self, in_order: list[dict]) -> list[tuple[int, dict]]:
        """Each sweep's winner ("Best bucket" for a bucket-size sweep), after the baseline throughput."""
        figures = []
        for step in in_order:
            winner = as_dict(step.get("winner"))
            if step.get("kind") != self.name or not winner:
                continue
            params = as_dict(winner.get("params"))
            if len(params) == 1:
                key = param_name(str(next(iter(params))))
                value = fmt_num(next(iter(params.values())))
                is_bucket = "BUCKET" in key.upper()
                label = "Best bucket" if is_bucket else f"Best {key}"
                value = f"{value} MB ({key})" if is_bucket and key.upper().endswith("_MB") else (
                    f"{value} ({key})" if is_bucket else value)
            else:
                label, value = "Sweep winner", params_text(params) if params else fmt_num(winner.get("label"))
            run = next((as_dict(r) for r in as_list(step.get("runs"))
                        if as_dict(r).get("label") == winner.get("label")), {})
            mean = stat_of(as_dict(run.get("metrics")), "toks_per_s").get("mean")
            note = f"step `{step.get('name')}`" + (f", {fmt_rate(mean)} tokens/s" if finite(mean) is not None else "")
            context = context_text(run.get("metrics"))
            note += f" at {context}" if context and finite(mean) is not None else ""
            figures.append((20, {"label": label, "value": value, "note": note}))
        return figures

    def plots(self, name: str, result: dict, plotter) -> None:
        from validation.report.format import file_name
        from validation.report.plots import bar_points

        runs = [as_dict(r) for r in as_list(result.get("runs"))]
        winner = as_dict(result.get("winner")).get("label")
        keys = sorted({str(k) for r in runs for k in as_dict(r.get("params"))})
        plotter.bars(bar_points(runs, tick_by_param=True), title=f"Sweep: {result.get('title') or name}",
                     xlabel=param_name(keys[0]) if len(keys) == 1 else "run", filename=f"sweep_{file_name(name)}.png",
                     colors=lambda i, label: "tab:green" if label == winner and winner is not None else "tab:gray",
                     best=winner)


def sweep_points(step) -> list[tuple[str, dict[str, Any]]]:
    """(label, {"env.X": v, "args.y": w}) for every point of the step's matrix, in order."""
    keys = list(step.matrix)
    points = []
    for values in itertools.product(*(step.matrix[k] for k in keys)):
        params = dict(zip(keys, values))
        label = ",".join(f"{k.split('.', 1)[1]}={v}" for k, v in params.items())
        points.append((label, params))
    return points


steps.register(Sweep())
