"""One launch's window of per-step values and its comparison with another's: the statistics shared by `compare`
(two runs), the A/B step (its table) and the decisions (validation.analysis.significance.decision), so that each states the
same number for the same comparison.

launch_series      the window values of a metric of one launch (its metrics name the csv and the window)
window_units       the block means of a window whose mean is the window's mean over every step (the report's figure)
compare_windows    b against a, one window each
measured_run_noise the run-to-run variation of a run's mean, from the runs a validation run repeated
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from validation.analysis import metrics
from validation.analysis.significance.comparison import RunNoise, compare_units, run_noise
from validation.analysis.significance.units import MIN_BLOCKS, Units, block_units
from validation.analysis.stats import StatsError

METRIC = "toks_per_s"


def launch_series(run_dir: Path, m: dict, metric: str = METRIC, default: metrics.Window | None = None) -> list[float]:
    """The window values of `metric` of one launch (its metrics name the csv and the window it was summarised
    with). A window that is missing or unusable (an older or hand-edited results.json): `default` (a decision's
    step window), else the last 50 steps when none is recorded, else nothing."""
    if not isinstance(m, dict) or not m.get("csv"):
        return []
    window = m.get("window") if isinstance(m.get("window"), dict) else {}
    try:
        if not window and default is not None:
            raise ValueError("no window recorded")
        win = metrics.Window(last=int(window.get("last", 50)), warmup=int(window.get("warmup", 0)))
    except (metrics.MetricsError, TypeError, ValueError):
        if default is None:
            return []
        win = default
    return metrics.window_values(Path(run_dir) / m["csv"], metric, win)


def window_units(values: list[float], stored: dict | None = None, min_blocks: int = MIN_BLOCKS) -> Units:
    """The block means of one launch's window (significance.block_units) whose `mean` is the window's mean over
    every step of the window: the figure the report shows for the launch (its summary's toks_per_s.mean, the
    same numbers through the same numpy mean), never the mean of the steps that fill whole blocks (block_units
    leaves the earliest steps out, which moved compare's means off the report's: 19,178.7 against 19,214.5).
    `stored`: the launch's summary statistic ({"mean", "n"}) when at hand; used when it covers these values."""
    units = block_units(values, min_blocks=min_blocks)
    mean = float(np.asarray(values, dtype="float64").mean())
    if isinstance(stored, dict) and stored.get("n") == len(values) and isinstance(stored.get("mean"), (int, float)) \
            and math.isfinite(stored["mean"]):
        mean = float(stored["mean"])
    return dataclasses.replace(units, mean=mean)


def compare_windows(a: list[float], b: list[float], *, stored_a: dict | None = None, stored_b: dict | None = None,
                    **kwargs: Any):
    """b against a, each one launch's window of per-step values: window_units of each, then
    significance.compare_units (kwargs: higher_is_better, alpha, noise, baseline, variant, metric, run_noise).
    The Comparison's mean_a/mean_b are the window means the report shows."""
    return compare_units(window_units(a, stored_a), window_units(b, stored_b), **kwargs)


def _repeated_groups(step: dict, run_dir: Path | str, metric: str) -> list[list[tuple[float, float | None]]]:
    """(window mean, relative standard error) of each passed, undisturbed run, grouped by label; the labels that ran
    at least twice."""
    by_label: dict[str, list[tuple[float, float | None]]] = {}
    for run in step.get("runs") or []:
        if not isinstance(run, dict) or run.get("status") != "passed":
            continue
        rec = (run.get("metrics") or {}).get("interference")
        if isinstance(rec, dict) and rec.get("disturbed"):  # its spread is the other work's, not the machine's
            continue
        values = launch_series(Path(run_dir), run.get("metrics") or {}, metric)
        if not values:
            continue
        try:
            rel_se = block_units(values).rel_se
        except StatsError:
            rel_se = None
        by_label.setdefault(str(run.get("label")), []).append((sum(values) / len(values), rel_se))
    return [g for g in by_label.values() if len(g) >= 2]


def measured_run_noise_by_step(results: dict, run_dir: Path | str, metric: str = METRIC,
                               extra: list[tuple[dict, Path | str]] = (), names: tuple[str, ...] = ()
                               ) -> dict[str, RunNoise]:
    """Each step's own run-to-run variation of a run's mean of `metric` (step name -> RunNoise), from its labels
    that ran more than once, passed and were not disturbed, in `results` and in the (results, run_dir) pairs of
    `extra`: steps differ (one thread per process varies more than two ranks sharing the cores), so a step's rows
    are held to its own variation, never to another step's. Steps without repeats are absent."""
    out: dict[str, RunNoise] = {}
    sources = [(results, run_dir), *extra]
    steps = dict.fromkeys(name for res, _ in sources for name in (res.get("steps") or {}))
    for name in steps:
        groups, where = [], []
        for index, (res, rdir) in enumerate(sources):
            step = (res.get("steps") or {}).get(name)
            if not isinstance(step, dict):
                continue
            found = _repeated_groups(step, rdir, metric)
            if found:
                groups += found
                where.append(f"{names[index] + ': ' if index < len(names) else ''}{len(found)} x "
                             f"{max(len(g) for g in found)} runs")
        rn = run_noise(groups, source=f"{name} ({'; '.join(where)})") if groups else None
        if rn is not None:
            out[name] = rn
    return out


def measured_run_noise(results: dict, run_dir: Path | str, metric: str = METRIC,
                       extra: list[tuple[dict, Path | str]] = (), names: tuple[str, ...] = ()) -> RunNoise | None:
    """The run-to-run variation of a run's mean of `metric`, from every label that ran more than once and passed
    (a sweep's or an A/B's repeats) in `results` (and in the (results, run_dir) pairs of `extra`): each run's
    window mean and the relative standard error of its block means. None when nothing ran twice. `names` name
    the runs in the source text (e.g. "A", "B")."""
    groups, sources = [], []
    for index, (res, rdir) in enumerate([(results, run_dir), *extra]):
        where = f"{names[index]}: " if index < len(names) else ""
        for name, step in (res.get("steps") or {}).items():
            by_label: dict[str, list[tuple[float, float | None]]] = {}
            for run in step.get("runs") or []:
                if not isinstance(run, dict) or run.get("status") != "passed":
                    continue
                values = launch_series(Path(rdir), run.get("metrics") or {}, metric)
                if not values:
                    continue
                mean = sum(values) / len(values)
                try:
                    rel_se = block_units(values).rel_se
                except StatsError:
                    rel_se = None
                by_label.setdefault(str(run.get("label")), []).append((mean, rel_se))
            repeated = [g for g in by_label.values() if len(g) >= 2]
            if repeated:
                groups += repeated
                sources.append(f"{where}{name} ({len(repeated)} x {max(len(g) for g in repeated)} runs)")
    return run_noise(groups, source="; ".join(sources)) if groups else None
