"""Plots of a validation run: PNG files in RUN_DIR/plots, written with matplotlib's Agg backend at a fixed size and
dpi and without a Software/date stamp, so the same results give the same files.

Every step whose results name a training.csv (its own, or its runs') gets a tokens/s-per-step plot, read through
the same loader as the statistics (validation.analysis.metrics.read_training_csv); each step kind adds its own plots
through StepKind.plots with the Plotter below (a sweep's and an A/B's bar charts).
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import Any, Callable

import matplotlib.style
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.category import StrCategoryFormatter
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import FixedFormatter, FuncFormatter

from nsa.training.outputs import atomic_write
from validation import contracts
from validation.analysis import metrics
from validation.results.store import inside_run_dir
from validation import kinds as step_kinds
from validation.kinds._plot_helpers import bar_points, loglog_lines, scan_loglog  # noqa: F401 - shared with the kinds
from validation.formatting import as_dict, as_list, file_name, finite, plot_context_text, printable
from validation.results.codec import decode
from validation.results.run import Step as StepRecord, read_run
from validation.results.trainer_launch import Telemetry, as_launch

PLOTS_DIR = "plots"
TITLE_WIDTH = 90  # characters per title line at the report's figure size


def drawn_text(text: Any) -> str:
    """`text` as a plot shows it, literally: as printable() makes it (a lone surrogate, which the font renderer
    refuses, or a control character shown as U+FFFD, as in the report's text), every `$` escaped (matplotlib reads
    the text between two of them as mathtext: "$5 to $6" was drawn in italics without its dollars, "$x^$" failed)."""
    return printable(text).replace("$", r"\$")


def _literal_texts(fig) -> None:
    """Every text of `fig` that came from the results made drawn_text: titles, axis labels, legend entries,
    annotations and the tick labels a plot gave itself (set_xticklabels: a FixedFormatter, or in newer matplotlib a
    FuncFormatter; category names); the tick labels that matplotlib's number formatters write (a log axis's powers
    of ten are mathtext) are left as they are."""
    seen: set[int] = set()

    def walk(artist) -> None:
        for child in artist.get_children():
            if id(child) in seen:
                continue
            seen.add(id(child))
            if isinstance(child, Axis):  # its label, and its tick labels through the formatter that writes them
                child.label.set_text(drawn_text(child.label.get_text()))
                formatter = child.get_major_formatter()
                if id(formatter) in seen:  # shared with a twin's axis
                    continue
                seen.add(id(formatter))
                if isinstance(formatter, (FixedFormatter, FuncFormatter, StrCategoryFormatter)):  # labels of its own
                    literal = FuncFormatter(lambda x, pos, labels=formatter: drawn_text(labels(x, pos)))
                    seen.add(id(literal))
                    child.set_major_formatter(literal)
                continue
            if isinstance(child, Text):
                child.set_text(drawn_text(child.get_text()))
            walk(child)

    walk(fig)


def _png(fig) -> bytes:
    """`fig` laid out and written as PNG bytes (its texts drawn literally, no Software stamp)."""
    _literal_texts(fig)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def _legend(ax, entries: list[tuple[Any, str]], **kwargs) -> None:
    """A legend of (artist, text) entries, each text shown whatever it starts with: matplotlib leaves an entry whose
    label starts with "_" out of a legend, and a step's or a run's name may (validation.runbook.schema.NAME_RE), so
    the texts are set once the legend is made."""
    legend = ax.legend([artist for artist, _ in entries], ["entry"] * len(entries), **kwargs)
    for text, (_, label) in zip(legend.get_texts(), entries):
        text.set_text(label)


def _lone_marker(n_points: int) -> dict:
    """A line plot's marker for a series of n_points: a series of one point has no segment to draw, so that point
    is drawn as a dot (otherwise the plot shows its legend and nothing else)."""
    return {"marker": "o", "markersize": 4} if n_points == 1 else {}


def read_toks(csv_path: Path) -> tuple[list, list] | None:
    """(steps, toks_per_s) of a training.csv's rows with a finite tokens/s value, or None when there are none (an
    inf, like a NaN, is no point of the line: drawn, it would cut the line on both sides of it)."""
    read = metrics.read_training_csv(csv_path)
    if read.problem is not None or "toks_per_s" not in read.frame.columns or read.frame.empty:
        return None
    frame = read.frame[read.frame["toks_per_s"].map(lambda v: finite(v) is not None)]
    if frame.empty:
        return None
    return frame[metrics.STEP_COLUMN].to_list(), frame["toks_per_s"].to_list()


def step_context(step: dict) -> str:
    """plot_context_text of a step's own metrics and its runs' (what its plots measured)."""
    metrics = [as_dict(step.get("metrics"))] + [as_dict(as_dict(r).get("metrics")) for r in as_list(step.get("runs"))]
    return plot_context_text(m for m in metrics if m.get("context"))


class Plotter:
    """Draws the plots of one run into run_dir/plots and remembers what it wrote ([{"title", "path", "step",
    "context", "caption", "marked", "mark"}]): `step` is the step whose section shows the plot (beside its table),
    `context` what it measured (seq_len, micro-batch, precision, world size, device), in the title's second line
    and in the caption; `marked`/`mark` the run label of the bar a bar chart marks and the mark's word (the
    decision the step's text states: "winner" or "kept")."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.written: list[dict] = []
        self._taken: set[str] = set()  # the paths written, each once (save)
        self.step: str | None = None
        self.context = ""
        self._marked: tuple[Any, str] | None = None

    def for_step(self, name: str | None, step: dict | None = None) -> None:
        """The plots that follow belong to step `name` (their context read from `step`)."""
        self.step = name
        self.context = step_context(as_dict(step)) if step is not None else ""

    def figure(self, title: str, xlabel: str, ylabel: str = "tokens/s"):
        """A new (figure, axes) of the report's size and style; the title's second line is the step's context."""
        fig = Figure(figsize=(8, 4.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        wrapped = textwrap.fill(title, TITLE_WIDTH)  # a long step title is wrapped, never cut at the edge
        ax.set_title(f"{wrapped}\n{self.context}" if self.context else wrapped, fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.set_axisbelow(True)
        return fig, ax

    def save(self, fig, filename: str, title: str) -> None:
        """Write `fig` as plots/`filename` (atomically) and list it under `title`. A name this run already wrote
        (file_name makes steps "x" and "_x" both "x") takes "-2", "-3", ... before its suffix, which no step name
        has (NAME_RE), so that one step's plot never replaces another's."""
        rel, stem, suffix, n = f"{PLOTS_DIR}/{filename}", Path(filename).stem, Path(filename).suffix, 1
        while rel in self._taken:
            n += 1
            rel = f"{PLOTS_DIR}/{stem}-{n}{suffix}"
        try:
            png = _png(fig)
        except (ValueError, OverflowError) as exc:  # figures matplotlib cannot lay out (near a float's range)
            png = _png(self._not_drawn(title, exc))
        path = inside_run_dir(self.run_dir, rel)  # a name from the results (a step's) never leads out of RUN_DIR
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, png)
        entry = {"title": title, "path": rel, "step": self.step, "context": self.context or None,
                 "caption": f"{title} ({self.context})" if self.context else title}
        if self._marked is not None:
            entry.update(marked=self._marked[0], mark=self._marked[1])
            self._marked = None
        self.written.append(entry)
        self._taken.add(rel)

    def _not_drawn(self, title: str, exc: Exception):
        """The figure saved in place of one that cannot be drawn: its title, and a note saying why."""
        fig, ax = self.figure(title, "")
        ax.set_axis_off()
        why = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:200]
        ax.text(0.5, 0.5, textwrap.fill("Not drawn: its figures are outside the range a plot can show "
                                        f"({type(exc).__name__}{': ' + why if why else ''})", 70),
                ha="center", va="center", transform=ax.transAxes)
        return fig

    def tokens_per_step(self, name: str, step: StepRecord | dict) -> None:
        """Tokens/s per step of the step's training.csv and of each of its runs', the statistics window shaded
        (`step`: its record, or as results.json holds it)."""
        if not isinstance(step, StepRecord):
            step = decode(StepRecord, step, f"steps.{name}", lenient=True)
        own = as_launch(step.metrics)
        series = [(name, own)] if own.csv else []
        series += [(str(run.label), run.metrics) for run in step.runs if run.metrics.csv]
        lines = []
        for label, m in series:
            data = read_toks(self.run_dir / str(m.csv))
            if data is not None:
                lines.append((label, data, m.window))
        if not lines:
            return
        title = f"Tokens/s per step: {step.title or name}"
        fig, ax = self.figure(title, "step")
        # one colour and one legend entry per label: the repeats of a label share both ("label (2 runs)")
        counts: dict[str, int] = {}
        for label, _, _ in lines:
            counts[label] = counts.get(label, 0) + 1
        colors = {label: f"C{i % 10}" for i, label in enumerate(counts)}
        entries: list[tuple[Any, str]] = []  # (line, legend text): the first line of each label
        seen: set[str] = set()
        for label, (xs, ys), _ in lines:
            (line,) = ax.plot(xs, ys, linewidth=1.2, color=colors[label], alpha=0.9 if counts[label] == 1 else 0.6,
                              **_lone_marker(len(xs)))
            if label not in seen:
                seen.add(label)
                entries.append((line, f"{label} ({counts[label]} runs)" if counts[label] > 1 else label))
        window = lines[0][2]  # "start" and "end" in records written before first_step and last_step
        first = finite(window.first_step if window.first_step is not None else window.extra.get("start"))
        last = finite(window.last_step if window.last_step is not None else window.extra.get("end"))
        if first is not None and last is not None and last >= first:
            entries.append((ax.axvspan(first, last, color="tab:green", alpha=0.08), "statistics window"))
        _legend(ax, entries, loc="lower right", fontsize="small")
        self.save(fig, f"toks_per_s_{file_name(name)}.png", title)

    def telemetry(self, name: str, record: StepRecord) -> None:
        """Device telemetry of a trainer step over time (its telemetry files, validation.contracts.read_telemetry):
        GPU utilisation per GPU and the CPU utilisation of the launch's processes (percent, left axis), the
        processes' RSS and GPU memory used (GiB, right axis); the statistics window shaded. Only the series
        present are drawn (no GPU columns on CPU)."""
        telemetry = as_launch(record.metrics).telemetry
        step_dir = self.run_dir / str(record.dir or name)
        rows = contracts.read_telemetry(step_dir) if telemetry not in (None, Telemetry()) else []
        if not rows:
            return
        t0 = min(r["time"] for r in rows)
        title = f"Telemetry: {record.title or name}"
        fig, ax = self.figure(title, "seconds since the launch started", ylabel="percent")
        right = ax.twinx()
        right.set_ylabel("GiB")
        drawn = 0
        gpus = sorted({(r.get("node"), r.get("gpu")) for r in rows if r.get("gpu") is not None}, key=str)
        ours = {(r.get("node"), r.get("gpu")) for r in rows if r.get("ours") == 1}
        for key in [g for g in gpus if not ours or g in ours]:
            series = [(r["time"] - t0, r) for r in rows if (r.get("node"), r.get("gpu")) == key]
            label = f"GPU {key[1]}" + (f" ({key[0]})" if len({g[0] for g in gpus}) > 1 else "")
            for col, axis, style, what in (("gpu_util_pct", ax, "-", "util %"), ("mem_used_gb", right, ":",
                                                                                     "memory GiB")):
                pts = [(x, r[col]) for x, r in series if finite(r.get(col)) is not None]
                if pts:
                    axis.plot(*zip(*pts), style, linewidth=1.2, label=f"{label} {what}", **_lone_marker(len(pts)))
                    drawn += 1
        per_node = sorted({r.get("node") for r in rows}, key=str)
        for node in per_node:
            seen, samples = set(), []
            for r in rows:
                if r.get("node") == node and r.get("sample") not in seen:
                    seen.add(r.get("sample"))
                    samples.append(r)
            suffix = f" ({node})" if len(per_node) > 1 else ""
            for col, axis, style, what, color in (("cpu_util_pct", ax, "-", "CPU % (processes)", "tab:orange"),
                                                  ("rss_gb", right, "--", "RSS GiB", "tab:purple")):
                pts = [(r["time"] - t0, r[col]) for r in samples if finite(r.get(col)) is not None]
                if pts:
                    axis.plot(*zip(*pts), style, linewidth=1.2, label=what + suffix,
                              color=color if len(per_node) == 1 else None, **_lone_marker(len(pts)))
                    drawn += 1
        if not drawn:
            return
        window = telemetry.window_unix
        if window is not None and len(window) == 2 and all(finite(w) is not None for w in window):
            ax.axvspan(window[0] - t0, window[1] - t0, color="tab:green", alpha=0.08, label="statistics window")
        ax.set_ylim(bottom=0)
        right.set_ylim(bottom=0)
        handles, labels = ax.get_legend_handles_labels()
        h2, l2 = right.get_legend_handles_labels()
        ax.legend(handles + h2, labels + l2, loc="upper left", fontsize="small")
        self.save(fig, f"telemetry_{file_name(name)}.png", title)

    def bars(self, points: list[tuple[str, float, float, Any]], *, title: str, xlabel: str, filename: str,
             colors: Callable[[int, Any], str], mark: tuple[Any, str] | None = None) -> None:
        """A bar chart of bar_points() with error bars; `mark` = (run label, word): that bar is annotated with the
        word (the decision the step's text states, e.g. "winner" or "kept"), and the plot's entry records both."""
        if not points:
            return
        fig, ax = self.figure(title, xlabel)
        xs = list(range(len(points)))
        ax.bar(xs, [p[1] for p in points], yerr=[p[2] for p in points], capsize=6,
               color=[colors(i, p[3]) for i, p in enumerate(points)], edgecolor="black", linewidth=0.6)
        ax.set_xticks(xs)
        ax.set_xticklabels([p[0] for p in points])
        marked = None
        if mark is not None:
            for x, point in zip(xs, points):
                if point[3] == mark[0]:
                    ax.annotate(mark[1], (x, point[1] + point[2]), textcoords="offset points", xytext=(0, 4),
                                ha="center", fontweight="bold")
                    marked = (point[3], mark[1])
        pooled = any(p[0].endswith(")") and " (x" in p[0] for p in points)
        ax.set_xlabel(f"{xlabel}\n" + ("bar: mean of the runs' window means (xN: N runs); error bar: their stdev"
                                       if pooled else "bar: the run's window mean; error bar: stdev over its steps"))
        top = max(p[1] + p[2] for p in points) * 1.15  # room for the mark above the tallest error bar
        if 0 < top < math.inf:  # past a float's range: the axis as matplotlib scales it
            ax.set_ylim(0, top)
        self._marked = marked
        self.save(fig, filename, title)


def make_plots(results: dict, run_dir: Path) -> list[dict]:
    """Write RUN_DIR/plots/*.png and return [{"title", "path" (relative to run_dir)}] for those written: per step
    in run order, its tokens/s per step, then its kind's own plots."""
    raw_steps = as_dict(as_dict(results).get("steps"))  # what the kinds read
    plotter = Plotter(run_dir)
    with matplotlib.style.context("default"):  # the user's matplotlibrc does not change the pictures
        for name, record in read_run(results).steps_in_order():
            step = as_dict(raw_steps.get(name))
            record = record or StepRecord()
            plotter.for_step(name, step)
            plotter.tokens_per_step(name, record)
            kind = step_kinds.find(record.kind)
            if kind is not None:
                kind.plots(name, kind.read({**step, "name": name}), plotter)
    return plotter.written
