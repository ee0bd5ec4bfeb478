"""`scan`: the trainer over a list of values of one setting (seq_len, batch size, ...), repeated in a random order
per repeat; per point tokens/s, step time, time to first step and peak memory; the cost exponent (log step time vs
log value: ~1 linear, ~2 quadratic) with its 95% interval; cliff detection between neighbouring points (a local
exponent significantly above `expected_exponent`); and, when a cliff is found and `bisect` is set, a bisection
between the two points, launched while the step runs, that localises it (seed 000: "binary-search seq_len for
the cliff"). The statistics are validation.analysis.triage's (run means of the window, pooled repeat noise, Holm).

Own keys:
  values             {args.seq_len: [64, 128, 256, 512]} or {env.VARIABLE: [...]}: one setting, numeric values
  repeats            runs per point, interleaved in a random order per repeat (default 2: the noise of a point is
                     the spread of its runs' step times, each the median of its window; with 1, block means of a
                     window of >= BLOCK_WINDOW_MIN (20) steps: a shorter window gives no noise estimate, no cliff is
                     called and a note says so); values x repeats >= 3 runs (the exponent's fit), else a runbook error.
                     Block means see only the noise within one window, not how far the next launch's level lies: where
                     the runbook declares its launch noise (`compare: {launch_sd, pairs}`), or the run measured its
                     run-to-run noise in repeats before the step (an A/B's, a sweep's: the larger of the two),
                     every point's noise is held to at least one launch's share of it (launch_sd / sqrt 2, with
                     repeats too); with neither, a cliff found with one run a point on block noise alone is
                     inconclusive (`cliff` null)
  expected_exponent  the exponent a point-to-point growth may reach before it is a cliff (default 1.5)
  bisect             {steps: 3, resolution: 64, multiple_of: 32}: after a cliff between a and b, measure midpoints
                     (rounded to multiple_of, e.g. the model's selection block) until b - a <= resolution or the
                     steps are spent; each midpoint runs `repeats` times (with 1, its noise is its window's block
                     means held to the declared launch noise, as a scan point's) and is "bad" when its local
                     exponent from the interval's good end is significantly above expected_exponent
Metrics: "setting", "values", "repeats", "expected_exponent", "exponent" (slope), "exponent_ci" [low, high],
"exponent_fit" (validation.analysis.triage.Fit), "cliff" (bool), "cliff_reason", "cliff_pair" (the pair found by the
scan), "pairs" (every neighbouring pair), "cliff_interval" [good, bad] (after bisection) or null, "cliff_localised"
(interval width <= resolution; false without a cliff), "bisection" (validation.analysis.triage.Bisection) or null,
"points" [{value, source (scan | bisect), runs, passed, disturbed (passed runs measured under interference, when
any: left out of the point's speed figures, the exponent and the cliffs, a note naming them), step_time_s, toks_per_s
(its undisturbed passed runs' work over their time: each run's window is the same work, so the harmonic mean of
their window figures, validation.analysis.metrics.window_mean, never their plain mean, which favours the faster
run: [100, 300] tok/s is 150, not 200), mfu (the runs' window mean, where the device peak is known),
time_to_first_step_s, peak_mem_gb, exponent_to_next}], "noise_source" (repeats | blocks | declared | none),
"run_to_run" (repeats | measured | declared | unknown: what covers the noise between launches),
"launch_sd" (the launch pair's sd the noise is held to: the declared one, or the measured one's x sqrt 2), "runs",
"passed". "cliff" is true, false, or null when inconclusive (a pair,
marked "inconclusive", significant on one run's block noise alone with no declared launch noise); "cliff_localised"
is then null too. The step's "interference" (validation.analysis.interference.decision_record): not disturbed when
the runs other work disturbed were left out and every point still has an undisturbed one; disturbed (what reads its
speed figures inconclusive) when a point has only disturbed runs.
Options: the keys above. Result: the step record (validation.results.run.Step: runs, a LaunchRun each with its
"source" scan or bisect, run order, ...) with these metrics as the Metrics record: what run() returns, built from
the LaunchRun records run_all gives and the analysis's records (Fit, Pair, Bisection), and what the report hooks read
(decoded leniently). The records are validation.kinds.scan.result's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from validation import kinds
from validation.launch.spec import safe_name
from validation.formatting import file_name, finite, fmt_gb, fmt_num, rate_with_mfu
from validation.runbook.schema import REPEATS_MAX, mapping, setting_key, typed
from validation.analysis.interference import decision_record, run_disturbed
from validation.analysis.metrics import window_mean
from validation.analysis.significance import PairNoise, StatsError
from validation.kinds.base import KeyFigure
from validation.kinds.trainer import (RUN_METRICS, RUN_PERFORMANCE, TrainerKind, declared_pair_noise,
                                      launch_noise, order_seed, run_all, run_order, run_values, trainer_launch)
from validation.kinds._plot_helpers import scan_loglog
from validation.kinds.blocks import Block, Column, Paragraph, Table, strong
from validation.analysis.triage import RUN_NOISE_FIX, bisect, find_cliffs, fit_exponent, local_exponent, point_noise
from validation.kinds.scan.result import BisectionRecord, ExponentFit, Metrics, PairRecord, Point, Result
from validation.results.codec import decode, encode, given
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import LaunchRun, TrainingSummary


@dataclasses.dataclass(frozen=True)
class Bisect:
    steps: int = 3  # bisection points at most
    resolution: float = 1.0  # stop when the interval is no wider
    multiple_of: int = 1  # every point a multiple of this


@dataclasses.dataclass(frozen=True)
class Options:
    setting: str  # "env.X" or "args.y"
    values: list  # its values, ascending
    repeats: int = 2
    expected_exponent: float = 1.5
    bisect: Bisect | None = None


class Scan(TrainerKind):
    name = "scan"
    summary = ("the trainer over the values of one setting (e.g. `args.seq_len: [64, 128, 256, 512]`), interleaved "
               "repeats: tokens/s, step time, time to first step and peak memory per point, the cost exponent with "
               "its 95% CI, cliffs (a local exponent significantly above `expected_exponent`) and a bisection that "
               "localises a cliff (`seq_scan.cliff_localised`, `seq_scan.exponent <= 1.3`)")
    keys = ("values", "repeats", "expected_exponent", "bisect")
    metrics = ("setting", "values.<i>", "repeats", "expected_exponent", "exponent", "exponent_ci.<i>", "exponent_fit.*",
               "exponent_reason", "cliff", "cliff_reason", "cliff_pair.*", "pairs.<i>.*", "cliff_interval.<i>",
               "cliff_localised", "bisection.*", "points.<i>.*", "noise_source", "run_to_run", "launch_sd", "runs",
               "passed") + RUN_METRICS
    performance = ("exponent", "exponent_ci", "exponent_fit", "exponent_reason", "cliff", "cliff_reason", "cliff_pair",
                   "pairs", "cliff_interval", "cliff_localised", "bisection", "points") + RUN_PERFORMANCE
    decides = True
    result_type = Result
    plan_note = ("runs in a random order within each repeat, drawn for each run directory (the seed is recorded in "
                 "results.json); when a cliff is found, bisection points are launched while the step runs")

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        values = raw.get("values")
        if not isinstance(values, dict) or len(values) != 1:
            raise ctx.error(path + ("values",), "expected one setting and its values, e.g. "
                                                "{args.seq_len: [64, 128, 256, 512]}")
        key, vals = next(iter(values.items()))
        vpath = path + ("values", key)
        setting_key(key, vpath, ctx, "the scanned setting is")
        if (not isinstance(vals, list) or len(vals) < 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in vals)):
            raise ctx.error(vpath, f"expected a list of at least 2 positive numbers, got {vals!r}")
        if len(set(vals)) != len(vals):
            raise ctx.error(vpath, f"values must be distinct, got {vals}")
        bisect = raw.get("bisect")
        if bisect is not None:
            b = mapping(bisect, path + ("bisect",), ctx, ("steps", "resolution", "multiple_of"))
            bpath = path + ("bisect",)
            multiple = typed(b.get("multiple_of", 1), int, bpath + ("multiple_of",), ctx, minimum=1)
            bisect = Bisect(steps=typed(b.get("steps", 3), int, bpath + ("steps",), ctx, minimum=1),
                            resolution=typed(b.get("resolution", multiple), float, bpath + ("resolution",), ctx),
                            multiple_of=multiple)
            if not bisect.resolution > 0:
                raise ctx.error(bpath + ("resolution",), f"expected a positive number, got {bisect.resolution}")
        expected = typed(raw.get("expected_exponent", 1.5), float, path + ("expected_exponent",), ctx)
        if not expected > 0:
            raise ctx.error(path + ("expected_exponent",), f"expected a positive number, got {expected}")
        repeats = typed(raw.get("repeats", 2), int, path + ("repeats",), ctx, minimum=1, maximum=REPEATS_MAX)
        if len(vals) * repeats < 3:  # the exponent's fit has a 95% interval from 3 runs (validation.analysis.triage)
            raise ctx.error(path + ("repeats",), f"{len(vals)} values x {repeats} repeat(s) give {len(vals) * repeats} "
                                                 "runs; the cost exponent needs at least 3: use repeats >= 2 or a "
                                                 "third value")
        return Options(setting=key, values=sorted(vals), repeats=repeats, expected_exponent=float(expected),
                       bisect=bisect)

    def launches(self, step, winners, run_dir):
        return [point_launch(step, value, repeat, winners, run_dir)
                for repeat, value in run_order(list(map(value_label, step.values)), step.repeats,
                                               order_seed(step, run_dir))]

    def run(self, options: Options, ctx) -> Result:
        step = ctx.step
        done = run_all(ctx)
        runs = [dataclasses.replace(r, source="scan") for r in done.runs]
        frame = Result(runs=runs, superseded=done.superseded, notes=done.notes,
                       order_seed=order_seed(step, ctx.run_dir), order=[s.label for s in ctx.launches])
        m = Metrics(setting=options.setting, values=list(options.values), repeats=options.repeats,
                    expected_exponent=options.expected_exponent, cliff=False, cliff_localised=False)
        times, series = point_times(ctx, step, runs)
        shaken = [r for r in runs if r.status == "passed" and run_disturbed(encode(r))]
        if shaken:  # a run slowed by other work is no measurement of its value: no cliff or exponent stands on it
            frame = dataclasses.replace(frame, notes=list(frame.notes or []) + [disturbed_note(shaken)])
        # the runbook's declared launch noise (compare.launch_sd), or the run-to-run noise this run measured in
        # repeats before the step where that is larger: every point's noise is held to one launch's share of it;
        # without either, one run a point sees no run-to-run noise and its cliffs are inconclusive (find_cliffs)
        floor, measured = launch_floor(ctx)
        # with repeats at any point every point's noise is their pooled spread (point_noise), the series unused
        blocks = not any(len(ts) > 1 for ts in times.values())
        short = {v: len(s) for v, s in series.items() if len(s) < BLOCK_WINDOW_MIN} if blocks else {}
        if short:  # block means of a window this short understate the noise: no cliff is called from them alone
            series = {v: s for v, s in series.items() if v not in short}
            frame = dataclasses.replace(frame, notes=list(frame.notes or []) + [short_window_note(short, floor)])
        exponent_reason = None
        try:
            fit = fit_exponent([(v, t) for v in options.values for t in times.get(v, [])])
            m = dataclasses.replace(m, exponent=fit.slope, exponent_ci=[fit.ci_low, fit.ci_high],
                                    exponent_fit=decode(ExponentFit, fit.as_dict(), "exponent_fit"))
        except StatsError as exc:
            exponent_reason = f"no exponent: {exc}"
            m = dataclasses.replace(m, exponent_reason=exponent_reason)
        cliffs = None
        try:
            noise = point_noise(times, series, floor)
            cliffs = find_cliffs(noise, options.expected_exponent)
            m = dataclasses.replace(m, pairs=[decode(PairRecord, p.as_dict(), "pairs") for p in cliffs.pairs],
                                    cliff_reason=cliffs.reason,
                                    noise_source=next(iter(noise.values())).source if noise else "none",
                                    run_to_run=("repeats" if not blocks else "measured" if measured
                                                else "declared" if floor is not None else "unknown"),
                                    launch_sd=floor.sd if floor is not None else None)
            if cliffs.cliff is None and cliffs.inconclusive is not None:  # neither a cliff nor the absence of one
                m = dataclasses.replace(m, cliff=None, cliff_localised=None)
        except StatsError as exc:
            m = dataclasses.replace(m, cliff_reason=f"no cliff detection: {exc}")
        bisected: list[LaunchRun] = []
        if cliffs is not None and cliffs.cliff is not None:
            pair = cliffs.cliff
            m = dataclasses.replace(m, cliff=True, cliff_pair=decode(PairRecord, pair.as_dict(), "cliff_pair"),
                                    cliff_interval=[_plain(pair.a), _plain(pair.b)])
            if options.bisect:
                bis_times: dict[float, list[float]] = {}
                bis_series: dict[float, list[float]] = {}
                unclassified: list[str] = []

                def save(point_runs: list[LaunchRun]) -> None:
                    ctx.save(dataclasses.replace(frame, runs=runs + bisected + point_runs, metrics=m))

                def classify(value):
                    point_runs, new, window = bisect_point(ctx, step, value, save)
                    bisected.extend(point_runs)
                    if not new:
                        return None
                    bis_times[float(value)] = new
                    if len(new) == 1 and window is not None and len(window) >= BLOCK_WINDOW_MIN:
                        bis_series[float(value)] = window  # one run: its noise from its window's block means
                    try:
                        both = point_noise({**times, **bis_times}, {**series, **bis_series}, floor)
                        good = max(v for v in both if v < value and (v in bis_times or v <= pair.a))
                        if not (both[good].run_noise and both[float(value)].run_noise):
                            raise StatsError("its run-to-run noise is unknown (one run, no declared launch noise); "
                                             + RUN_NOISE_FIX)
                        test = local_exponent(both[good], both[float(value)], options.expected_exponent)
                    except StatsError as exc:  # e.g. a step time that is not positive: no verdict, the search stops
                        unclassified.append(f"bisection point {fmt_num(_plain(value))} not classified: {exc}")
                        return None
                    return None if test.p is None else test.p < 0.05

                b = bisect(classify, pair.a, pair.b, resolution=options.bisect.resolution,
                           steps=options.bisect.steps, multiple_of=options.bisect.multiple_of)
                m = dataclasses.replace(m, bisection=decode(BisectionRecord, b.as_dict(), "bisection"),
                                        cliff_interval=[_plain(b.good), _plain(b.bad)], cliff_localised=b.localised)
                times.update(bis_times)
                shaken_bis = [r for r in bisected if r.status == "passed" and run_disturbed(encode(r))]
                if shaken_bis:
                    unclassified.append(disturbed_note(shaken_bis))
                if unclassified:
                    frame = dataclasses.replace(frame, notes=list(frame.notes or []) + unclassified)
        every = runs + bisected
        m = dataclasses.replace(m, points=point_rows(every, times, cliffs), runs=len(every),
                                passed=sum(r.status == "passed" for r in every))
        problems = done.problems + [f"{r.label}: {r.reason}" for r in every if r.status != "passed"]
        if problems:
            status, reason = "failed", "; ".join(dict.fromkeys(problems))
        elif exponent_reason is not None:
            status, reason = "failed", exponent_reason
        else:
            status, reason = "passed", None
        # its figures left the disturbed runs out: they stand when every point measured keeps an undisturbed run
        # (a point only disturbed runs measured is missing from the exponent, the cliffs and the bisection, and may
        # hide a cliff: the step stays disturbed, its criteria inconclusive)
        whole = all(p.passed == 0 or (p.disturbed or 0) < p.passed for p in m.points)
        return dataclasses.replace(frame, status=status, reason=reason, metrics=m, runs=every,
                                   interference=decision_record(encode(StepRecord(runs=every)), conclusive=whole))

    def summary_line(self, result: Result) -> str:
        m = self.read(result).metrics
        if finite(m.exponent) is None:
            return ""
        ci = m.exponent_ci or []
        text = f" exponent {m.exponent:.2f}"
        if len(ci) == 2 and finite(ci[0]) is not None and finite(ci[1]) is not None:
            text += f" (95% CI {ci[0]:.2f} .. {ci[1]:.2f})"
        if m.cliff:
            lo, hi = ((m.cliff_interval or []) + [None, None])[:2]
            text += f"; cliff between {fmt_num(lo)} and {fmt_num(hi)}" + (" (localised)" if m.cliff_localised
                                                                           else "")
        elif _inconclusive(m):
            text += "; cliff inconclusive (run-to-run noise unknown)"
        else:
            text += "; no cliff"
        return text

    def blocks(self, result: Result) -> list[Block]:
        """One row per point (a cliff to the next point marked), the cost exponent, the cliff, the bisection."""
        m = self.read(result).metrics
        setting = _setting(m)
        points = m.points
        unsure = {p.a for p in m.pairs if isinstance(p, PairRecord) and p.inconclusive is True}
        rows = [(fmt_num(p.value), str(p.source or ""), f"{fmt_num(p.passed)}/{fmt_num(p.runs)}"
                 + (f" ({fmt_num(p.disturbed)} disturbed, left out)" if p.disturbed else ""),
                 _ms(p.step_time_s), rate_with_mfu(p.toks_per_s, p.mfu),
                 _secs(p.time_to_first_step_s), fmt_gb(p.peak_mem_gb),
                 strong(f"{_num2(p.exponent_to_next)} CLIFF") if p.cliff_to_next
                 else f"{_num2(p.exponent_to_next)} (cliff?)" if p.value in unsure
                 else _num2(p.exponent_to_next)) for p in points]
        table = Table((Column(setting), Column("Points"), *(Column(c, numeric=True) for c in (
            "Runs passed", "Step time", "Tokens/s, window mean (over repeats)", "Time to first step", "Peak memory",
            "Exponent to next"))), rows, marked={i for i, p in enumerate(points) if p.cliff_to_next})
        ci = m.exponent_ci or []
        exponent = (f"{_num2(m.exponent)} (95% CI {_num2(ci[0])} .. {_num2(ci[1])})" if len(ci) == 2
                    else _num2(m.exponent))
        bis = given(m.bisection)
        interval = m.cliff_interval or []
        if m.cliff:
            where = f"between {fmt_num(interval[0])} and {fmt_num(interval[1])}" if len(interval) == 2 else "—"
            cliff = (f"yes, {where}" + (f" (localised to {fmt_num(bis.width if bis else None)} <= resolution "
                                        f"{fmt_num(bis.resolution if bis else None)})" if m.cliff_localised else
                                        " (not localised)" if bis else ""))
        elif _inconclusive(m):
            cliff = "inconclusive"
        else:
            cliff = "no"
        reason = str(m.cliff_reason or m.exponent_reason or "")
        out: list[Block] = [
            table,
            Paragraph(f"{strong('Cost exponent')} (log step time vs log {setting}): {exponent} · expected at most "
                      f"{fmt_num(m.expected_exponent)}"),
            Paragraph(f"{strong('Cliff')}: {cliff}" + (f" — {reason}" if reason else ""))]
        if bis:
            bisection = ", ".join(f"{fmt_num(v)}: {fmt_num(verdict)}" for v, verdict in
                                  ((list(x) + [None, None])[:2] for x in bis.points))
            if bisection:
                out.append(Paragraph(f"Bisection: {bisection} ({bis.stopped or ''})"))
        out.append(Paragraph(f"Noise of a point: {m.noise_source or '—'} (each run one unit: the median step "
                             "time of its window; never per-step samples)", style="muted"))
        if m.run_to_run == "declared":
            out.append(Paragraph(f"Run-to-run noise: one run a point, each point's noise held to at least one "
                                 f"launch's share of the runbook's declared launch_sd {fmt_num(m.launch_sd)}",
                                 style="muted"))
        elif m.run_to_run == "measured":
            out.append(Paragraph(f"Run-to-run noise: one run a point, each point's noise held to at least the "
                                 f"run-to-run noise this run measured in repeats before the step (a launch pair's "
                                 f"sd {fmt_num(m.launch_sd)})", style="muted"))
        elif m.run_to_run == "unknown":
            out.append(Paragraph("Run-to-run noise: unknown (one run a point, no launch noise declared or measured "
                                 "before: block means "
                                 "of one window do not see how far the next launch's level lies, so a cliff cannot be "
                                 f"established); {RUN_NOISE_FIX}", style="note"))
        return out

    def key_figures(self, in_order: list[StepRecord]) -> list[KeyFigure]:
        out = []
        for s in in_order:
            if not isinstance(s, Result):
                continue
            m = s.metrics
            if finite(m.exponent) is not None:
                value = f"{m.exponent:.2f}"
                ci = m.exponent_ci or []
                if len(ci) == 2 and finite(ci[0]) is not None and finite(ci[1]) is not None:
                    value += f" (95% CI {ci[0]:.2f} .. {ci[1]:.2f})"
                if m.cliff:
                    interval = m.cliff_interval or []
                    value += f", cliff at {fmt_num(interval[0])}..{fmt_num(interval[1])}" if len(interval) == 2 else ""
                elif _inconclusive(m):
                    value += ", cliff inconclusive"
                out.append(KeyFigure("cost_exponent", f"Cost exponent ({_setting(m)})", value,
                                     f"step `{s.name}`: log step time vs log value", order=25, steps=(str(s.name),)))
        return out

    def plots(self, name: str, result: Result, plotter) -> None:
        """Step time per value on log-log axes: every run, the fitted cost law and the cliffs found."""
        step = self.read(result)
        m = step.metrics
        runs = [(float(p.value), float(t), p.source or "scan") for p in m.points if finite(p.value) is not None
                for t in p.run_step_times_s if finite(t)]
        scanned = [(x, y) for x, y, source in runs if source == "scan"]
        bisected = [(x, y) for x, y, source in runs if source == "bisect"]
        # each pair found to be a cliff, as tested: a scan value none of whose runs passed is no end of a pair
        cliffs = [(float(p.a), float(p.b)) for p in m.pairs
                  if isinstance(p, PairRecord) and p.cliff is True and finite(p.a) is not None
                  and finite(p.b) is not None]
        fit = m.exponent_fit or ExponentFit()
        scan_loglog(plotter, scanned, bisected, (finite(fit.slope), finite(fit.intercept)), cliffs,
                    title=f"Scan: {step.title or name}", xlabel=_setting(m), filename=f"scan_{file_name(name)}.png")


# The shortest window of one run whose block means give a point's noise (validation.analysis.significance.units:
# their 95% interval is measured to cover the mean in 91-97% of autocorrelated series of 20 to 150 steps; at 10
# steps it covers 84-92% at a lag-1 correlation of 0.7-0.85, so a cliff called from it is called too often)
BLOCK_WINDOW_MIN = 20


def short_window_note(short: dict[float, int], floor=None) -> str:
    """Why the points with one run and a window shorter than BLOCK_WINDOW_MIN steps have no noise estimate of their
    own; with a declared launch noise (`floor`, significance.PairNoise) their noise is that alone."""
    where = ", ".join(f"{fmt_num(_plain(v))} ({n} steps)" for v, n in sorted(short.items()))
    if floor is not None:
        return (f"one run per point with a statistics window shorter than {BLOCK_WINDOW_MIN} steps at {where}: "
                f"block means of so few steps understate the noise, so the noise of these points is one launch's "
                f"share of the declared launch noise alone ({floor.source})")
    return (f"one run per point with a statistics window shorter than {BLOCK_WINDOW_MIN} steps at {where}: block "
            f"means of so few steps understate the noise (their 95% interval is checked from {BLOCK_WINDOW_MIN} "
            f"steps), so no cliff is called from them; use repeats >= 2 or a window of at least "
            f"{BLOCK_WINDOW_MIN} steps with a declared launch noise (compare.launch_sd: block means alone never "
            f"establish a cliff)")


def disturbed_note(runs: list[LaunchRun]) -> str:
    """Which passed runs were left out of the points' figures, the exponent and the cliffs as measured under
    interference."""
    names = ", ".join(dict.fromkeys(str(r.dir or r.label) for r in runs))
    return (f"{len(runs)} run(s) measured under interference (other work on the machine) left out of the step "
            f"times, the cost exponent and the cliffs: {names}")


def _inconclusive(m: Metrics) -> bool:
    """Whether the scan's cliff is inconclusive: no cliff, and a pair significant on one run's block noise alone."""
    return m.cliff is not True and any(isinstance(p, PairRecord) and p.inconclusive is True for p in m.pairs)


def _setting(m: Metrics) -> str:
    """The scanned setting without its env./args. prefix ("seq_len", "NSA_X")."""
    return str(m.setting or "value").split(".", 1)[-1]


def value_label(value) -> str:
    """The label of a value, which is also what the launch passes to the trainer (point_launch reads the value back
    from it): the short form ("1024", "0.5") where it reads back as the value, else the value in full
    ("0.00012345", "100.25"), so that no value is launched rounded and two values never share a label."""
    short = fmt_num(value).replace(",", "")
    try:
        if float(short) == float(value):
            return short
    except ValueError:
        pass
    return repr(float(value)) if isinstance(value, float) else str(value)


def point_launch(step, label: str, repeat: int, winners, run_dir, *, source: str = "scan"):
    """The trainer launch of scan value `label` (repeat `repeat`); bisection points go to bisect_<value>."""
    value = float(label)
    value = int(value) if value.is_integer() else value
    key = step.setting
    args = {key[5:]: value} if key.startswith("args.") else {}
    env = {key[4:]: str(value)} if key.startswith("env.") else {}
    prefix = "bisect_" if source == "bisect" else ""
    rel = f"{step.name}/{prefix}{safe_name(label)}" + (f"_r{repeat + 1}" if step.repeats > 1 else "")
    return trainer_launch(step, step.launch, label, rel, winners, run_dir, extra_args=args, extra_env=env,
                          params={key: value}, repeat=repeat)


def bisect_point(ctx, step, value, save: Callable[[list[LaunchRun]], None]
                 ) -> tuple[list[LaunchRun], list[float], list[float] | None]:
    """Launch `repeats` runs at a bisection point (now, while the step runs), each saved as it ends (`save(this
    point's runs so far)`): the runs, each measured run's step time (the median of its window, as point_times) and
    the window's per-step times of the last run that has them (the point's noise when it has one run), else None.
    A run measured under interference (validation.analysis.interference.run_disturbed) is no measurement."""
    winners = ctx.winners()
    specs = [point_launch(step, value_label(value), repeat, winners, ctx.run_dir, source="bisect")
             for repeat in range(step.repeats)]

    def as_bisect(runs: list[LaunchRun]) -> list[LaunchRun]:
        return [dataclasses.replace(r, source="bisect") for r in runs]

    done = run_all(ctx, launches=specs, on_progress=lambda so_far: save(as_bisect(so_far.runs)))
    runs = as_bisect(done.runs)
    times: list[float] = []
    window = None
    for r in runs:
        if run_disturbed(encode(r)):  # slowed by other work on the machine: not a measurement of the value
            continue
        values = run_values(ctx.run_dir, step, encode(r), "step_time_s")
        if isinstance(values, list):
            if values:
                times.append(_median(values))
                window = values
        elif finite(values) is not None:
            times.append(float(values))
    return runs, times, window


def point_times(ctx, step, runs: list[LaunchRun]) -> tuple[dict[float, list[float]], dict[float, list[float]]]:
    """{value: [each run's step time, ...]} (a run's step time: the median of its window, robust to a step that
    another process on the machine slowed; each run is one unit, never its steps) and, for values with one run,
    {value: the window's per-step times}. Runs that failed, and runs measured under interference
    (validation.analysis.interference.run_disturbed: other work on the machine slowed them), are left out."""
    times: dict[float, list[float]] = {}
    series: dict[float, list[float]] = {}
    for run in runs:
        if run.status != "passed" or run_disturbed(encode(run)):  # a disturbed run is no measurement of its value
            continue
        value = float(next(iter(run.params.values())))
        values = run_values(ctx.run_dir, step, encode(run), "step_time_s")
        if isinstance(values, list) and values:
            times.setdefault(value, []).append(_median(values))
            series[value] = values
        elif finite(values) is not None:
            times.setdefault(value, []).append(float(values))
    return times, {v: s for v, s in series.items() if len(times.get(v, [])) == 1}


def point_rows(runs: list[LaunchRun], times: dict, cliffs) -> list[Point]:
    """One row per value (scan and bisection points, by value): means over its passed runs measured undisturbed (its
    tokens/s their work over their time, metrics.window_mean over the runs' figures, and its MFU alike; "disturbed"
    counts the passed runs left out, when any); a run's time to first step and peak memory are those its metrics
    recorded from its timeline.json and summary.json (the peak memory of every passed run: interference does not
    change it)."""
    by_value: dict[float, list[LaunchRun]] = {}
    for r in runs:
        by_value.setdefault(float(next(iter(r.params.values()))), []).append(r)
    pairs = {p.a: p for p in cliffs.pairs} if cliffs is not None else {}
    rows = []
    for value in sorted(by_value):
        group = by_value[value]
        passed = [r for r in group if r.status == "passed"]
        quiet = [r for r in passed if not run_disturbed(encode(r))]  # the speed figures: undisturbed runs only
        toks = [finite(r.metrics.toks_per_s.mean) if r.metrics.toks_per_s else None for r in quiet]
        mfu = [finite(r.metrics.mfu.mean) if r.metrics.mfu else None for r in quiet]
        ttfs = [finite(r.metrics.time_to_first_step_s) for r in quiet]
        mem = [finite(r.metrics.summary.peak_mem_alloc_gb) if isinstance(r.metrics.summary, TrainingSummary)
               else None for r in passed]
        t = times.get(value) or []
        pair = pairs.get(value)
        rows.append(Point(value=int(value) if value.is_integer() else value, source=group[0].source or "scan",
                          runs=len(group), passed=len(passed), disturbed=(len(passed) - len(quiet)) or None,
                          step_time_s=_mean(t), run_step_times_s=list(t),
                          toks_per_s=window_mean(toks, "toks_per_s"), mfu=window_mean(mfu, "mfu"),
                          time_to_first_step_s=_mean(ttfs),
                          peak_mem_gb=max((x for x in mem if x is not None), default=None),
                          exponent_to_next=pair.exponent if pair else None, cliff_to_next=bool(pair and pair.cliff)))
    return rows


def _plain(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def _median(values: list[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0


def _mean(values) -> float | None:
    xs = [float(v) for v in values if finite(v) is not None]
    return sum(xs) / len(xs) if xs else None


def _ms(value) -> str:
    v = finite(value)
    return "—" if v is None else f"{v * 1000:,.1f} ms"


def _secs(value) -> str:
    v = finite(value)
    return "—" if v is None else f"{v:,.2f} s"


def _num2(value) -> str:
    v = finite(value)
    return "—" if v is None or not math.isfinite(v) else f"{v:.2f}"


def launch_floor(ctx) -> tuple[PairNoise | None, bool]:
    """(the least noise of one launch pair every point is held to, whether it is the measured one): the runbook's
    declared launch noise (`compare: {launch_sd, pairs}`), or the run-to-run variation of a run's mean this
    validation run measured in repeats before the step where that is larger (validation.kinds.trainer.launch_noise),
    as a pair's noise (its sd x sqrt 2: one launch's share is the measured sd, with its degrees of freedom); (None,
    False) without either."""
    source, sd, df, _ = launch_noise(ctx)
    if source != "measured" or not sd or not sd > 0:
        return declared_pair_noise(ctx), False
    return PairNoise(sd=sd * math.sqrt(2.0), pairs=float(df) + 1.0,
                     source=f"the run-to-run noise measured earlier in this run (sd {sd:.1%} of a run's mean, "
                            f"{df:g} df)"), True

kinds.register(Scan())
