"""Compare two validation runs: per step and metric, B against A, with the direction of "better", a noise
threshold and a Welch t-test over the per-step values of each run's measurement window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from validation import metrics, stats
from validation import steps as step_kinds
from validation.steps.base import StepKind

ENV_KEYS = ("host", "gpu_count", "torch", "cuda", "nccl", "python", "git_sha")
# summary metrics compared besides the windowed throughput (mean of the window, no per-step sample)
SUMMARY_METRICS = ("final_loss", "mem_peak_gb")


def environment_differences(a: dict, b: dict) -> list[str]:
    ea, eb = a.get("environment", {}), b.get("environment", {})
    out = [f"{k} differs: {ea.get(k)!r} vs {eb.get(k)!r}" for k in ENV_KEYS if ea.get(k) != eb.get(k)]
    names_a = [g.get("name") for g in ea.get("gpus", [])]
    names_b = [g.get("name") for g in eb.get("gpus", [])]
    if names_a != names_b:
        out.append(f"GPUs differ: {names_a} vs {names_b}")
    return out


def _train_runs(step: dict) -> list[tuple[str, dict]]:
    """(label, metrics) of every trainer launch of a step, as its kind lists them (StepKind.trainer_runs)."""
    kind = step_kinds.find(step.get("kind")) or StepKind()
    return kind.trainer_runs(step)


def compare_runs(a: dict, b: dict, dir_a: Path, dir_b: Path, noise: float = 0.02) -> dict[str, Any]:
    warnings = environment_differences(a, b)
    if a["runbook"]["name"] != b["runbook"]["name"]:
        warnings.append(f"different runbooks: {a['runbook']['name']} vs {b['runbook']['name']}")
    rows = []
    for name, step_a in a["steps"].items():
        step_b = b["steps"].get(name)
        if step_b is None:
            continue
        runs_b = dict(_train_runs(step_b))
        for label, ma in _train_runs(step_a):
            mb = runs_b.get(label)
            if not mb:
                continue
            window = ma.get("window") or {}
            win = metrics.Window(last=window.get("last", 50), warmup=window.get("warmup", 0))
            va = metrics.window_values(Path(dir_a) / ma["csv"], "toks_per_s", win)
            vb = metrics.window_values(Path(dir_b) / mb["csv"], "toks_per_s", win)
            if va and vb:
                c = stats.compare_samples(va, vb, higher_is_better=True, noise=noise)
                rows.append({"step": label, "metric": "toks_per_s", **c})
            for metric in SUMMARY_METRICS:
                x, y = ma.get(metric), mb.get(metric)
                if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                    rel = (y - x) / abs(x) if x else None
                    higher = stats.METRIC_DIRECTIONS.get(metric) == "higher"
                    if rel is None or abs(rel) <= noise:
                        verdict = "same"
                    else:
                        verdict = "better" if (rel > 0) == higher else "worse"
                    rows.append({"step": label, "metric": metric, "mean_a": x, "mean_b": y, "delta": y - x,
                                 "rel_delta": rel, "p_value": None, "significant": None, "verdict": verdict})
    return {"run_a": str(dir_a), "run_b": str(dir_b), "warnings": warnings, "rows": rows,
            "verdicts": {"A": a.get("verdict"), "B": b.get("verdict")}}
