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


from validation.analysis import metrics
from validation.analysis.interference import measured_disturbed
from validation.analysis.significance.comparison import RunNoise, compare_units, run_noise
from validation.analysis.significance.units import MIN_BLOCKS, Units, block_units
from validation.analysis.stats import StatsError
from validation.results.codec import decode

METRIC = "toks_per_s"


_NOT_WRITTEN = "not written"  # a window key an older or hand-edited results.json lacks


@dataclasses.dataclass(frozen=True)
class _RecordedWindow:
    """The window a launch's metrics say it was summarised with (validation.analysis.metrics.summarize's "window"),
    its values as written: launch_series checks them where it uses them."""
    last: Any = _NOT_WRITTEN
    warmup: Any = _NOT_WRITTEN
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def written(self) -> bool:
        return self.last != _NOT_WRITTEN or self.warmup != _NOT_WRITTEN or bool(self.extra)


@dataclasses.dataclass(frozen=True)
class _Recorded:
    """What launch_series reads of a launch's metrics: its training.csv and its window."""
    csv: Any = None
    window: _RecordedWindow = dataclasses.field(default_factory=_RecordedWindow)


@dataclasses.dataclass(frozen=True)
class _Stored:
    """A launch's summary statistic of the metric (validation.analysis.metrics' column statistics), the values
    window_units reads, as written."""
    mean: Any = None
    n: Any = None


@dataclasses.dataclass(frozen=True)
class _Run:
    """A run record as the run-to-run variation reads it: label, status, metrics (the launch's, as written)."""
    label: Any = None
    status: Any = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Step:
    runs: list[Any] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Results:
    steps: dict[str, Any] = dataclasses.field(default_factory=dict)


def _runs(step: Any) -> list[_Run]:
    """A step's run records (those that are objects), in order."""
    return [decode(_Run, run, lenient=True) for run in decode(_Step, step, lenient=True).runs if isinstance(run, dict)]


def launch_series(run_dir: Path, m: dict, metric: str = METRIC, default: metrics.Window | None = None) -> list[float]:
    """The window values of `metric` of one launch (its metrics name the csv and the window it was summarised
    with). A window that is missing or unusable (an older or hand-edited results.json): `default` (a decision's
    step window), else the last 50 steps when none is recorded, else nothing."""
    if not isinstance(m, dict):
        return []
    recorded = decode(_Recorded, m, lenient=True)
    if not recorded.csv:
        return []
    window = recorded.window
    try:
        if not window.written() and default is not None:
            raise ValueError("no window recorded")
        if isinstance(window.last, bool) or isinstance(window.warmup, bool):  # int(True) is 1: a one-step window
            raise TypeError("a JSON true/false is no number of steps")
        win = metrics.Window(last=int(50 if window.last == _NOT_WRITTEN else window.last),
                             warmup=int(0 if window.warmup == _NOT_WRITTEN else window.warmup))
    except (metrics.MetricsError, TypeError, ValueError):
        if default is None:
            return []
        win = default
    return metrics.window_values(Path(run_dir) / recorded.csv, metric, win)


def window_units(values: list[float], stored: dict | None = None, min_blocks: int = MIN_BLOCKS,
                 metric: str = METRIC) -> Units:
    """The block means of one launch's window (significance.block_units) whose `mean` is the window's figure over
    every step of the window (metrics.window_mean: a rate's is its work over its time): the figure the report shows
    for the launch (its summary's toks_per_s.mean, the same numbers through the same computation), never the mean
    of the steps that fill whole blocks (block_units leaves the earliest steps out, which moved compare's means off
    the report's: 19,178.7 against 19,214.5). The blocks' relative standard error is that of the figure to first
    order. `stored`: the launch's summary statistic ({"mean", "n"}) when at hand; used when it covers these
    values."""
    units = block_units(values, min_blocks=min_blocks)
    mean = window_figure(values, stored, metric)
    return dataclasses.replace(units, mean=units.mean if mean is None else mean)


def window_figure(values: list[float], stored: dict | None = None, metric: str = METRIC) -> float | None:
    """The figure the report shows for one launch's window of `metric`: its summary's statistic (`stored`,
    {"mean", "n"}) when it covers these values, else metrics.window_mean of them (None without a finite value)."""
    figure = decode(_Stored, stored, lenient=True) if isinstance(stored, dict) else None
    # a JSON true/false is no count or figure (Python's bool is an int: `true` read as a mean of 1 token/s, and
    # `true` as n covered a one-step window)
    if figure is not None and not isinstance(figure.n, bool) and figure.n == len(values) \
            and isinstance(figure.mean, (int, float)) and not isinstance(figure.mean, bool) \
            and math.isfinite(figure.mean):
        return float(figure.mean)
    return metrics.window_mean(values, metric)


def compare_windows(a: list[float], b: list[float], *, stored_a: dict | None = None, stored_b: dict | None = None,
                    metric: str = METRIC, **kwargs: Any):
    """b against a, each one launch's window of per-step values of `metric`: window_units of each, then
    significance.compare_units (kwargs: higher_is_better, alpha, noise, baseline, variant, run_noise).
    The Comparison's mean_a/mean_b are the window figures the report shows."""
    return compare_units(window_units(a, stored_a, metric=metric), window_units(b, stored_b, metric=metric),
                         metric=metric, **kwargs)


def _repeated_groups(step: dict, run_dir: Path | str, metric: str) -> list[list[tuple[float, float | None]]]:
    """(window figure, relative standard error of its block means) of each passed, undisturbed run of one step,
    grouped by label; the labels that ran at least twice (measured_run_noise and measured_run_noise_by_step)."""
    by_label: dict[str, list[tuple[float, float | None]]] = {}
    for run in _runs(step):
        if run.status != "passed":
            continue
        if measured_disturbed(run.metrics):  # its spread is the other work's, not the machine's
            continue
        values = launch_series(Path(run_dir), run.metrics, metric)
        if not values:
            continue
        try:
            rel_se = block_units(values).rel_se
        except StatsError:
            rel_se = None
        by_label.setdefault(str(run.label), []).append((metrics.window_mean(values, metric), rel_se))
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
    recorded = [decode(_Results, res, lenient=True).steps for res, _ in sources]
    steps = dict.fromkeys(name for found in recorded for name in found)
    for name in steps:
        groups, where = [], []
        for index, (_, rdir) in enumerate(sources):
            step = recorded[index].get(name)
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
    """The run-to-run variation of a run's mean of `metric`, from every label that ran more than once, passed and
    was not measured under interference (a sweep's or an A/B's repeats) in `results` (and in the (results, run_dir)
    pairs of `extra`): each run's window mean and the relative standard error of its block means. None when nothing
    ran twice. `names` name the runs in the source text (e.g. "A", "B")."""
    groups, sources = [], []
    for index, (res, rdir) in enumerate([(results, run_dir), *extra]):
        where = f"{names[index]}: " if index < len(names) else ""
        for name, step in decode(_Results, res, lenient=True).steps.items():
            repeated = _repeated_groups(step, rdir, metric)
            if repeated:
                groups += repeated
                sources.append(f"{where}{name} ({len(repeated)} x {max(len(g) for g in repeated)} runs)")
    return run_noise(groups, source="; ".join(sources)) if groups else None
