"""`scaling`: the trainer at several world sizes, strong scaling (the global batch fixed: each rank gets
global_batch / n sequences) and weak scaling (the per-rank batch fixed), interleaved in a random order per repeat;
speedup and efficiency per world size (validation.analysis.parallelism.scaling_table: S(n) = X(n) / X(n0),
E(n) = S(n) n0 / n with X the tokens/s of all ranks and n0 the smallest world size; 1.0 = perfect). With repeats,
X(n) is the repeats' work over their time: each run's tokens/s is its window's figure over the same work (the same
window of steps at the same batch and world size), so X(n) is the harmonic mean of those figures
(validation.analysis.metrics.window_mean, the rule of a window's own figure), never their plain mean, which counts a
slow run as much as a fast one (1 rank at [100, 100] tok/s, 2 at [190, 90]: weak efficiency 0.61, not 0.70); a
row's MFU is averaged the same way.

Own keys:
  world_sizes   the world sizes, e.g. [1, 2] (at least two, distinct, >= 1). On one node (nnodes 1) a world size n
                runs as nproc_per_node n; with nnodes > 1 each node runs nproc_per_node ranks and n must be a multiple
                of it (nnodes = n / nproc_per_node, the existing launchers)
  modes         [strong, weak] (default both)
  batch_size    the per-rank micro-batch of weak scaling (default: the step's args.batch_size)
  global_batch  the sequences per micro-step of strong scaling, all ranks (default batch_size x max(world_sizes));
                must divide by every world size
  repeats       runs per point (default 1)
Noise: an efficiency is a ratio of two points' throughputs, each one launch (or the repeats' work over their time),
and launches of one configuration differ by several percent (cpu_smoke's declared launch_sd: a log-ratio of two
launches has an sd of 12%), so every efficiency beyond the base carries its 95% interval
(validation.analysis.parallelism.scaling_table: E exp(-/+ t(0.975, df) s sqrt(1/r(n0) + 1/r(n))), s the sd of one
run's log tokens/s from run to run, from, in this order:
  repeats    with 2 or more passed runs at some point: the repeats' own spread, log tokens/s pooled over every point
             of the step (both modes, every world size) that has 2 or more (df: the sum of runs - 1 over them; the
             harmonic and the geometric mean of the repeats differ by far less than this spread), held to at least one
             launch's share of the runbook's declared launch noise (launch_sd / sqrt 2) where it declares one,
             keeping the repeats' df (significance.PairNoise);
  declared   one run a point: one launch's share of the runbook's declared `compare: {launch_sd, pairs}`
             (launch_sd / sqrt 2, df pairs - 1; one launch a side: s sqrt 2 = launch_sd, the sd of a log-ratio of
             two launches), or the run-to-run noise measured earlier in this run where that is larger (as a sweep
             holds one run a point: PairNoise.hold);
  measured   one run a point, nothing declared: the run-to-run noise this validation run measured in repeated runs
             before this step (significance.windows.measured_run_noise: the sweep's and parallelism's repeats);
  unknown    none of these: no interval (the fix: `repeats: 2`, or a declared `compare`).
Metrics: {"world_sizes", "strong"/"weak": {"mode", "base", "rows": [{world_size, toks_per_s, speedup,
efficiency, efficiency_low, efficiency_high (the 95% interval; None for the base and where the noise is unknown),
batch_per_rank, mfu (the runs' mean where the device peak is known)}], "efficiency": {"min", "last", "min_low",
"min_high", "last_low", "last_high", "reason" (why min and last are None, where they are)}}, "noise": {"source"
(repeats | declared | measured | unknown), "sd", "df", "detail"}, "runs", "passed", "device", "note"} so that
`scaling.weak.efficiency.min >= 0.8` is a criterion. Criteria: a claim that the scaling holds at least a target
reads the interval's lower bound (`scaling.weak.efficiency.min_low >= 0.85`: an error, never a pass, where the noise
is unknown); a check that it did not collapse far below any noise may read the point figure (`efficiency.min >=
0.5`); `efficiency.min_high < 0.9` says the loss is resolved. min_low/min_high are the lowest of the rows' bounds: they
hold the lowest true efficiency whenever every row's interval holds its own. On a CPU with fewer cores than ranks the
ranks share cores: the efficiency there measures core contention more than communication, so criteria on CPU should
be warnings.
Every world size of a local step runs with the same OMP_NUM_THREADS per rank (cores / the largest world size), so
that a rank's resources stay fixed as on a GPU.
Options: the keys above. Result: the step record, its metrics typed (Metrics: a ScalingTable per mode, written strong
before weak), its runs a LaunchRun each (validation.kinds.trainer.run_all) and its run order; the report hooks read it
decoded leniently. A row's MFU is written where the device peak is known.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from validation import kinds
from validation.analysis.metrics import window_mean
from validation.analysis.parallelism import scaling_table
from validation.analysis.significance import run_noise
from validation.formatting import against_one, file_name, finite, fmt_num, fmt_pct, rate_with_mfu
from validation.runbook.schema import REPEATS_MAX, str_list, typed
from validation.kinds.blocks import Block, Column, Paragraph, Table, strong
from validation.kinds.trainer import (RUN_METRICS, RUN_PERFORMANCE, TrainerKind, declared_pair_noise, launch_noise,
                                      order_seed, run_all, run_order, trainer_launch)
from validation.results.decision import LaunchNoise as Noise  # the noise a ratio of launches stands on
from validation.results.codec import absent, decode, given
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import LaunchRun, Num, RunContext


@dataclasses.dataclass(frozen=True)
class Options:
    world_sizes: list[int]  # ascending
    modes: list[str]  # strong, weak
    scale_batch: int | None = None  # `batch_size`: the per-rank batch of weak scaling
    global_batch: int | None = None  # the global batch of strong scaling
    repeats: int = 1


@dataclasses.dataclass(frozen=True)
class ScalingRow:
    """One world size of a mode (validation.analysis.parallelism.scaling_table's row, then the kind's per-rank
    batch and, in records since points carry it, the runs' MFU: their work over their time, as toks_per_s)."""
    world_size: int | None = None
    toks_per_s: Num | None = None
    speedup: Num | None = None
    efficiency: Num | None = None
    batch_per_rank: int | None = None
    mfu: Num | None = absent()
    efficiency_low: Num | None = absent()  # the 95% interval (records since efficiencies carry one)
    efficiency_high: Num | None = absent(beside="efficiency_low")
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """The efficiency over the world sizes beyond the base: the lowest and the largest world size's, with their 95%
    intervals (min_low/min_high: the lowest of the rows' bounds) and why they are None where they are (records
    since efficiencies carry an interval)."""
    min: Num | None = None
    last: Num | None = None
    min_low: Num | None = absent()
    min_high: Num | None = absent(beside="min_low")
    last_low: Num | None = absent(beside="min_low")
    last_high: Num | None = absent(beside="min_low")
    reason: str | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ScalingTable:
    """One mode's table (validation.analysis.parallelism.scaling_table), strong scaling's with its global batch."""
    mode: str | None = None
    base: int | None = None
    rows: list[ScalingRow] = dataclasses.field(default_factory=list)
    efficiency: Efficiency = dataclasses.field(default_factory=Efficiency)
    global_batch: int | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's metrics (the module docstring): the CPU note where the ranks shared a CPU, a table per mode
    measured (strong before weak, whatever the order of the step's `modes`)."""
    world_sizes: list[int] = dataclasses.field(default_factory=list)
    runs: int | None = None
    passed: int | None = None
    repeats: int | None = None
    device: str | None = None
    note: str | None = absent()
    strong: ScalingTable = absent(ScalingTable())  # a mode not measured: a blank table
    weak: ScalingTable = absent(ScalingTable())
    noise: Noise = absent(Noise())  # records since efficiencies carry an interval
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def tables(self) -> dict[str, ScalingTable]:
        """{mode: its table} of the modes measured (strong, then weak), a blank table left out."""
        found = {"strong": given(self.strong), "weak": given(self.weak)}
        return {mode: table for mode, table in found.items() if table is not None}


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A scaling step's record: its metrics, a LaunchRun per run (StepRecord.runs) and the run order (order_seed,
    order)."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


MODES = ("strong", "weak")
CPU_NOTE = ("CPU: the ranks share this machine's {cores} core(s), so the efficiency measures core contention as much "
            "as communication; criteria on it are warnings here")


class Scaling(TrainerKind):
    name = "scaling"
    summary = ("strong (fixed global batch) and weak (fixed per-rank batch) scaling over `world_sizes`: tokens/s, "
               "speedup and efficiency per world size, a table and a plot")
    keys = ("world_sizes", "modes", "batch_size", "global_batch", "repeats")
    metrics = ("world_sizes.<i>", "runs", "passed", "repeats", "device", "note",
               "noise.*",
               *(f"{mode}.{k}" for mode in ("strong", "weak")
                 for k in ("mode", "base", "rows.<i>.*", "efficiency.min", "efficiency.last", "efficiency.min_low",
                           "efficiency.min_high", "efficiency.last_low", "efficiency.last_high", "efficiency.reason",
                           "global_batch"))) + RUN_METRICS
    performance = ("strong", "weak") + RUN_PERFORMANCE
    decides = True
    plan_note = "runs in a random order within each repeat, drawn for each run directory (the seed is recorded)"
    result_type = Result

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        sizes = raw.get("world_sizes")
        if (not isinstance(sizes, list) or not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                                            for n in sizes) or len(set(sizes)) != len(sizes)):
            raise ctx.error(path + ("world_sizes",), f"expected a list of distinct positive integers, e.g. [1, 2], "
                                                     f"got {sizes!r}")
        if len(sizes) < 2:  # the efficiency of a world size is against the smallest: one alone measures no scaling
            raise ctx.error(path + ("world_sizes",), f"expected at least two world sizes (the efficiency of each is "
                                                     f"against the smallest), e.g. [1, 2], got {sizes!r}")
        modes = str_list(raw.get("modes", list(MODES)), path + ("modes",), ctx)
        if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
            raise ctx.error(path + ("modes",), f"expected distinct values of {', '.join(MODES)}, got {modes}")
        batch = typed(raw.get("batch_size"), int, path + ("batch_size",), ctx, minimum=1, optional=True)
        global_batch = typed(raw.get("global_batch"), int, path + ("global_batch",), ctx, minimum=1, optional=True)
        return Options(world_sizes=sorted(sizes), modes=modes, scale_batch=batch, global_batch=global_batch,
                       repeats=typed(raw.get("repeats", 1), int, path + ("repeats",), ctx, minimum=1,
                                      maximum=REPEATS_MAX))

    def check(self, step, order, error) -> None:
        per_rank = per_rank_batch(step)
        if per_rank is None:
            raise error("scaling needs the per-rank batch: `batch_size:` or the step's args.batch_size")
        if "strong" in step.modes:
            g = global_batch(step)
            bad = [n for n in step.world_sizes if g % n]
            if bad:
                raise error(f"global_batch {g} does not divide by world size(s) {bad}")
        if step.launch.nnodes > 1:
            bad = [n for n in step.world_sizes if n % step.launch.nproc_per_node]
            if bad:
                raise error(f"with nnodes > 1, world sizes must be multiples of nproc_per_node "
                            f"({step.launch.nproc_per_node}): {bad}")

    def launches(self, step, winners, run_dir):
        labels = [f"{mode}_n{n}" for mode in step.modes for n in step.world_sizes]
        extra_env = same_threads_per_rank(step)
        out = []
        for repeat, label in run_order(labels, step.repeats, order_seed(step, run_dir)):
            mode, n = label.split("_n")
            n = int(n)
            if step.launch.nnodes > 1:
                launch = dataclasses.replace(step.launch, nnodes=n // step.launch.nproc_per_node)
            else:
                launch = dataclasses.replace(step.launch, nproc_per_node=n)
            batch = per_rank_batch(step) if mode == "weak" else global_batch(step) // n
            suffix = f"_r{repeat + 1}" if step.repeats > 1 else ""
            out.append(trainer_launch(step, launch, label, f"{step.name}/{label}{suffix}", winners, run_dir,
                                      extra_args={"batch_size": batch}, extra_env=extra_env, repeat=repeat,
                                      params={"mode": mode, "world_size": n, "args.batch_size": batch}))
        return out

    def run(self, options: Options, ctx) -> Result:
        step = ctx.step
        done = run_all(ctx)
        device = run_device(done.runs)
        noise = efficiency_noise(step, done.runs, ctx)
        spread = (noise.sd, noise.df) if noise.source != "unknown" else None

        def table(mode: str) -> ScalingTable:
            """The mode's table (blank where the step does not measure it)."""
            return scaling_mode(step, mode, done.runs, spread) if mode in options.modes else ScalingTable()

        metrics = Metrics(world_sizes=list(options.world_sizes), runs=len(done.runs),
                          passed=sum(r.status == "passed" for r in done.runs), repeats=options.repeats, device=device,
                          note=CPU_NOTE.format(cores=os.cpu_count()) if device == "cpu" else None,
                          strong=table("strong"), weak=table("weak"), noise=noise)
        return Result(status="failed" if done.problems else "passed", reason="; ".join(done.problems) or None,
                      metrics=metrics, runs=done.runs, superseded=done.superseded, notes=done.notes,
                      order_seed=order_seed(step, ctx.run_dir), order=[s.label for s in ctx.launches])

    def summary_line(self, result: Result) -> str:
        tables = self.read(result).metrics.tables()
        parts = [f"{mode} efficiency min {fmt_num(t.efficiency.min)}"
                 + (f" (95% CI {fmt_num(t.efficiency.min_low)}..{fmt_num(t.efficiency.min_high)})"
                    if finite(t.efficiency.min_low) is not None and finite(t.efficiency.min_high) is not None else "")
                 for mode, t in tables.items()]
        return f" ({'; '.join(parts)})" if parts else ""

    def view(self, result: Result, view: dict) -> dict:
        return {"command": ""}  # one command per launch: shown with each run

    def blocks(self, result: Result) -> list[Block]:
        """A table per mode (strong, weak): speedup and efficiency against the smallest world size."""
        m = self.read(result).metrics
        noise = given(m.noise)  # None: a record written before efficiencies carried an interval
        out: list[Block] = []
        for mode, t in m.tables().items():
            what = (f"global batch {fmt_num(t.global_batch)} sequences fixed" if mode == "strong"
                    else "per-rank batch fixed")
            columns = ["World size", "Batch per rank", "Tokens/s, window mean (all ranks)", "Speedup", "Efficiency"]
            rows = [[fmt_num(r.world_size), fmt_num(r.batch_per_rank), rate_with_mfu(r.toks_per_s, r.mfu),
                     "—" if finite(r.speedup) is None else f"{r.speedup:.2f}x",
                     "—" if finite(r.efficiency) is None else f"{r.efficiency:.0%}"] for r in t.rows]
            if noise is not None:
                columns.append("95% interval, against 1.0")
                for row, r in zip(rows, t.rows):
                    row.append("— (the base)" if r.world_size == t.base and t.base is not None
                               else interval_text(r.efficiency, r.efficiency_low, r.efficiency_high))
            out += [Paragraph(f"{strong(mode.capitalize() + ' scaling')} ({what}; base world size "
                              f"{fmt_num(t.base)}):"),
                    Table(tuple(Column(c, numeric=True) for c in columns), [tuple(row) for row in rows])]
            e = t.efficiency
            if noise is not None and finite(e.min) is not None:
                beyond = sum(r.world_size != t.base and finite(r.efficiency) is not None for r in t.rows)
                out.append(Paragraph(f"Lowest efficiency beyond the base: {e.min:.0%} (95% interval "
                                     + interval_text(e.min, e.min_low, e.min_high) + ")"
                                     + (f"; the largest world size's: {e.last:.0%} (95% interval "
                                        + interval_text(e.last, e.last_low, e.last_high) + ")"
                                        if beyond > 1 and finite(e.last) is not None else "") + "."))
            if e.reason:
                out.append(Paragraph(f"No min or last efficiency: {e.reason}.", style="muted"))
        if noise is not None:
            out.append(Paragraph(f"Noise of the efficiencies ({noise.source}): {noise.detail}. An efficiency is a "
                                 "ratio of two points' throughputs: its 95% interval is E exp(-/+ t(0.975, df) s "
                                 "sqrt(1/r(n0) + 1/r(n))), s that sd of one run's log tokens/s, r the runs behind "
                                 "each point.", style="muted"))
        out.append(Paragraph("Definition: speedup S(n) = X(n) / X(n0), efficiency E(n) = S(n) x n0 / n, X = tokens/s "
                             "of all ranks, n0 the smallest world size measured; strong: = T(n0) n0 / (T(n) n), weak: "
                             "= T(n0) / T(n); 1.0 = perfect.", style="muted"))
        if m.note:
            out.append(Paragraph(f"Note: {m.note}.", style="muted"))
        return out

    def plots(self, name: str, result: Result, plotter) -> None:
        record = self.read(result)
        m = record.metrics
        lines = []
        for mode, t in m.tables().items():
            pts = [(r.world_size, r.efficiency) for r in t.rows
                   if r.world_size is not None and finite(r.efficiency) is not None]
            if pts:
                lines.append((mode, pts))
        if not lines:
            return
        title = f"Scaling efficiency: {record.title or name}"
        fig, ax = plotter.figure(title, "world size (ranks)", "efficiency")
        for mode, pts in lines:
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{mode} scaling")
            bars = [(r.world_size, r.efficiency, r.efficiency_low, r.efficiency_high) for r in m.tables()[mode].rows
                    if r.world_size is not None and finite(r.efficiency) is not None
                    and finite(r.efficiency_low) is not None and finite(r.efficiency_high) is not None
                    and r.efficiency_low <= r.efficiency <= r.efficiency_high]
            if bars:  # the 95% intervals
                ax.errorbar([b[0] for b in bars], [b[1] for b in bars],
                            yerr=[[b[1] - b[2] for b in bars], [b[3] - b[1] for b in bars]], fmt="none",
                            ecolor=line.get_color(), capsize=4)
        sizes = sorted({p[0] for _, pts in lines for p in pts})
        ax.plot(sizes, [1.0] * len(sizes), "--", color="gray", label="ideal")
        ax.set_xticks(sizes)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
        plotter.save(fig, f"scaling_{file_name(name)}.png", title)


def point_rates(runs: list[LaunchRun], mode: str, n: int) -> list[float]:
    """The passed runs' tokens/s of one point (mode, world size n): each run's window figure."""
    mine = [r.metrics for r in runs if r.label == f"{mode}_n{n}" and r.status == "passed"]
    vals = [finite(x.toks_per_s.mean) for x in mine if x.toks_per_s is not None]
    return [v for v in vals if v is not None]


def scaling_mode(step, mode: str, runs: list[LaunchRun], spread: tuple[float, float] | None = None) -> ScalingTable:
    """One mode's table from the step's runs (a run's label is its mode and world size: launches): the passed runs'
    tokens/s per world size, their work over their time (each run's window the same work: the harmonic mean of
    their figures, metrics.window_mean; the module docstring), through validation.analysis.parallelism.scaling_table
    (with `spread`, (sd of one run's log tokens/s, df): efficiency_noise's, each efficiency's 95% interval from the
    runs behind its two points), each row with its per-rank batch and the runs' MFU averaged the same way (where the
    device peak is known), strong scaling's with its global batch."""
    points, counts, batches, mfu = {}, {}, {}, {}
    for n in step.world_sizes:
        mine = [r.metrics for r in runs if r.label == f"{mode}_n{n}" and r.status == "passed"]
        vals = point_rates(runs, mode, n)
        points[n] = window_mean(vals, "toks_per_s") if vals else None
        counts[n] = len(vals)
        util = [finite(x.mfu.mean) for x in mine if x.mfu is not None]
        util = [u for u in util if u is not None]
        mfu[n] = window_mean(util, "mfu") if util else None
        batches[n] = per_rank_batch(step) if mode == "weak" else global_batch(step) // n
    table = decode(ScalingTable, scaling_table(points, mode, counts, spread), f"metrics.{mode}")
    rows = [dataclasses.replace(r, batch_per_rank=batches[r.world_size], mfu=mfu[r.world_size]) for r in table.rows]
    return dataclasses.replace(table, rows=rows, global_batch=global_batch(step) if mode == "strong" else None)


UNKNOWN_NOISE = ("one run a point and no run-to-run noise measured or declared: the efficiencies carry no interval "
                 "(run the step with `repeats: 2`, or declare the machine's launch noise: `compare: {launch_sd, "
                 "pairs}`, from A/A pairs)")


def efficiency_noise(step, runs: list[LaunchRun], ctx) -> Noise:
    """The run-to-run noise of one run's log tokens/s the efficiencies' intervals stand on (the module docstring):
    the repeats' own spread pooled over the step's points with 2 or more passed runs (held to one launch's share of
    the declared launch noise, the repeats' df kept), else one launch's share of the declared launch noise or the
    run-to-run noise measured earlier in this run, the larger (PairNoise.hold), else either alone, else unknown."""
    floor = declared_pair_noise(ctx)
    groups = [[(v, None) for v in point_rates(runs, mode, n)] for mode in step.modes for n in step.world_sizes]
    own = run_noise(groups)
    if own is not None:
        detail = (f"the repeats' own spread, sd {fmt_pct(own.total)} of one run's log tokens/s pooled over "
                  f"{own.groups} point(s) with {own.runs} runs ({own.df:g} df, t quantile)")
        if floor is not None and own.total < floor.launch_noise().total:
            share = floor.launch_noise().total
            return Noise(source="repeats", sd=share, df=own.df,
                         detail=f"{detail}, held to one launch's share of {floor.source}: sd {fmt_pct(share)} "
                                f"({own.df:g} df kept)")
        return Noise(source="repeats", sd=own.total, df=own.df, detail=detail)
    source, sd, df, detail = launch_noise(ctx)
    if source != "unknown":
        return Noise(source=source, sd=sd, df=df, detail=f"one run a point: {detail}")
    return Noise(source="unknown", detail=UNKNOWN_NOISE)


def interval_text(point: Any, low: Any, high: Any) -> str:
    """An efficiency's 95% interval and, in words, whether it is resolved against 1.0 (perfect scaling)."""
    if finite(point) is None:
        return "—"
    if finite(low) is None or finite(high) is None:
        return "interval unknown (run-to-run noise unknown)"
    return f"{low:.0%} .. {high:.0%}: {against_one(low, high)}"


def run_device(runs: list[LaunchRun]) -> str:
    """"cuda" when any run trained on a GPU, else "cpu". A run's device is env.json's device name as the trainer
    wrote it: "cpu" on a CPU, the GPU's own name on a GPU ("NVIDIA H100 80GB HBM3"; "cuda" or "cuda:0" in older
    records); a run without one (it never started) says nothing."""
    return "cuda" if any((r.metrics.context or RunContext()).on_cpu() is False for r in runs) else "cpu"


def same_threads_per_rank(step) -> dict[str, str]:
    """OMP_NUM_THREADS for every world size of a local (torchrun) step: the cores / the largest number of ranks on
    the node, so that a rank is like a device whose resources stay fixed (the runner would otherwise give a lone
    rank every core, and a CPU's 'speedup' would be the threads', not the ranks'). The step's or the caller's own
    OMP_NUM_THREADS wins; Slurm nodes keep torchrun's default."""
    if (step.launch.launcher.type != "torchrun" or "OMP_NUM_THREADS" in step.launch.env
            or "OMP_NUM_THREADS" in os.environ):
        return {}
    most = max(min(n, step.launch.nproc_per_node) if step.launch.nnodes > 1 else n for n in step.world_sizes)
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // most))}


def per_rank_batch(step) -> int | None:
    b = step.scale_batch if step.scale_batch is not None else step.launch.args.get("batch_size")
    return b if isinstance(b, int) and not isinstance(b, bool) and b >= 1 else None


def global_batch(step) -> int:
    return step.global_batch if step.global_batch is not None else (per_rank_batch(step) or 1) * max(step.world_sizes)


kinds.register(Scaling())
