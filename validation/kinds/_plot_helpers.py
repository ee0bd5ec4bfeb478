"""Plot helpers that step kinds share with the report (validation.report.plots): bar points of tokens/s per run
label, log-log lines, a scan's cost law. They draw through the `plotter` they are handed (a
validation.report.plots.Plotter: figure(title, xlabel, ylabel) -> (fig, ax), save(fig, filename, title)), so this
module imports no plotting library and sits below both the kinds and the report."""

from __future__ import annotations

import math
from typing import Any

from validation.analysis.interference import measured_disturbed
from validation.analysis.metrics import window_mean
from validation.formatting import finite, fmt_num
from validation.results.codec import decode, written
from validation.results.trainer_launch import LaunchRun, Stat


def bar_points(runs: list[dict] | list[LaunchRun], tick_by_param: bool = False) -> list[tuple[str, float, float, Any]]:
    """(tick label, mean, error bar, run label) per bar of tokens/s, each bar the figure the step's tables and key
    figures show for its label: of the label's runs that passed (a failed run's partial window is no measurement of
    it), those measured undisturbed where any was (a run slowed by other work on the machine is none either), and
    repeats pooled as their work over their time (metrics.window_mean of their window means: the harmonic mean, as
    an A/B's pooled summary and a sweep's key figure have it), with the stdev of those means as the error bar (a
    single run: its window stdev). `tick_by_param`: a run varying one parameter is labelled by its value. A run as
    written is read leniently."""
    grouped: dict[str, list[tuple[LaunchRun, float, Stat]]] = {}
    for i, raw in enumerate(runs):
        run = raw if isinstance(raw, LaunchRun) else decode(LaunchRun, raw, f"runs[{i}]", lenient=True)
        if run.status != "passed":
            continue
        toks = run.metrics.toks_per_s or Stat()
        mean = finite(toks.mean)
        if mean is not None:
            grouped.setdefault(str(run.label), []).append((run, mean, toks))
    points = []
    for label, passed in grouped.items():
        members = [m for m in passed if not measured_disturbed(written(m[0].metrics))] or passed
        means = [m for _, m, _ in members]
        mean = window_mean(means, "toks_per_s")
        if mean is None:  # past a float's range: the plain mean of the shares
            mean = sum(m / len(means) for m in means)
        if len(means) == 1:
            err = finite(members[0][2].stdev)
            err = err if err is not None and err >= 0 else 0.0  # a negative stdev is no spread (a damaged record)
        else:
            err = _spread(means)
        tick = label
        first = members[0][0]
        if tick_by_param and len(first.params) == 1:
            tick = fmt_num(next(iter(first.params.values())))
        if len(means) > 1:
            tick += f" (x{len(means)})"
        points.append((tick, mean, err, first.label))
    return points


def _spread(values: list[float]) -> float:
    """The population stdev of `values` (about their plain mean, from the sum of their shares: no overflow); where
    its squares pass a float's range, from the hypotenuse of the deviations; 0.0 when even that is past the range
    (no error bar rather than no plot)."""
    mean = sum(x / len(values) for x in values)
    try:
        err = math.sqrt(sum((x - mean) ** 2 for x in values) / len(values))
    except OverflowError:
        err = math.inf
    if not math.isfinite(err):
        err = math.hypot(*(x - mean for x in values)) / math.sqrt(len(values))
    return err if math.isfinite(err) else 0.0


def loglog_lines(plotter: Any, series: dict[str, list[tuple[float, float]]], *, title: str, xlabel: str,
                 ylabel: str, filename: str) -> None:
    """One line with markers per series ({label: [(x, y), ...]}, x and y > 0) on log-log axes (base 2 for x, e.g.
    message sizes; base 10 for y), in the report's style; nothing when no series has a point."""
    series = {label: sorted(points) for label, points in series.items() if points}
    if not series:
        return
    fig, ax = plotter.figure(title, xlabel, ylabel)
    for label, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, linewidth=1.2, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend(loc="lower right", fontsize="small")
    plotter.save(fig, filename, title)


def scan_loglog(plotter: Any, scanned: list[tuple[float, float]], bisected: list[tuple[float, float]],
                fit: tuple[float | None, float | None], cliffs: list[tuple[float, float]], *, title: str, xlabel: str,
                filename: str) -> None:
    """A scan's step time per value on log-log axes: every run's (value, step time), the scanned points' and the
    bisection points' apart, the fitted cost law (slope, intercept: exp(intercept) * value^slope over the scanned
    range, its exponent in the legend) and the neighbouring pairs (low, high) found to be a cliff shaded; nothing
    without runs."""
    if not scanned and not bisected:
        return
    fig, ax = plotter.figure(title, xlabel, "step time (s)")
    for runs, marker, label in ((scanned, "o", "scan runs"), (bisected, "s", "bisection runs")):
        if runs:
            ax.plot([x for x, _ in runs], [y for _, y in runs], linestyle="none", marker=marker, markersize=5,
                    label=label)
    slope, intercept = fit
    values = sorted(x for x, _ in scanned if x > 0)  # the law's domain, and all a log axis shows
    if slope is not None and intercept is not None and values:
        xs = [values[0], values[-1]]
        try:
            ys = [math.exp(intercept) * x ** slope for x in xs]
        except (OverflowError, ValueError, ZeroDivisionError):  # a damaged fit: no line rather than no plot
            ys = []
        if ys and all(math.isfinite(y) and y > 0 for y in ys):
            ax.plot(xs, ys, linewidth=1.2, color="gray", label=f"fit: exponent {slope:.2f}")
    for low, high in cliffs:
        ax.axvspan(low, high, color="tab:red", alpha=0.08)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend(loc="upper left", fontsize="small")
    plotter.save(fig, filename, title)
