"""`longrun`: a long trainer launch under the heartbeat watchdog: stalls (a HANG with stack dumps), .HALT,
throughput stability and a memory plateau.

Own keys: none (the train keys). Metrics: a trainer launch's (validation.kinds.trainer) plus "halted" (a .HALT file
or the trainer ended halted), "stalls" (1 when the launch hung), "stack_dumps" (paths), "throughput_drift_ci_low"
and "throughput_drift_ci_high" (below). A halted run fails.

The throughput drift (validation.analysis.metrics: the median tokens/s of the last third of the run after the warmup
over that of the first third, minus 1) comes with its 95% interval, "throughput_drift_ci_low" and
"throughput_drift_ci_high" (significance.drift.throughput_drift_interval: block means of each third, AR(1)-aware; absent
below 24 rows after the warmup, where a criterion reading them is an error): the drift alone judges no noise (with no
true drift, AR(1) steps of 10% CV at phi 0.9 gave a drift below -10% in 13% of 115-row runs), and the runbooks' "holds"
criterion warns on a drift below -10% only where the interval shows a decline (its upper bound below 0). The drift and
its interval measure speed as the window's tokens/s does: a criterion on them decides nothing when the run was measured
under interference (validation.execution.evidence; a trainer kind's TRAINER_PERFORMANCE, and this kind's `performance`).
They read the whole run, the launch's interference its statistics window only: the launch's record is that of a third
the drift reads when that third was measured under interference and the window was not (drift_interference).

Result: the step record of one trainer launch (validation.kinds.trainer.TrainerResult), its metrics the launch's
LaunchMetrics with what the watchdog found (Metrics).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from validation import contracts
from validation import kinds
from validation.analysis.interference import launch_interference
from validation.analysis.metrics import USABLE_STATUSES, CsvRead, drift_thirds, read_training_csv
from validation.analysis.significance.drift import DRIFT_CONFIDENCE, throughput_drift_interval
from validation.formatting import NA, finite, fmt_gb, fmt_num, fmt_pct
from validation.kinds.blocks import Block, Column, Table
from validation.kinds.train_report import step_times, training_period
from validation.launch import telemetry
from validation.results.codec import encode
from validation.results.interference import LaunchInterference
from nsa.training.outputs import TRAINING_CSV
from nsa.training.watchdog import HALT_NAME
from validation.kinds.trainer import (EARLIER_TOLERANCE_S, TRAINER_METRICS, TRAINER_PERFORMANCE, TrainerKind,
                                      TrainerResult, launch_one, launch_started, written_before)
from validation.results.codec import absent
from validation.results.trainer_launch import LaunchMetrics, Num, RunContext, Startup


@dataclasses.dataclass(frozen=True)
class Metrics(LaunchMetrics):
    """The step's metrics: its trainer launch's, then what the watchdog found."""
    halted: bool | None = None
    stalls: Any = None  # 1 when the launch hung, else 0
    stack_dumps: list[Any] = dataclasses.field(default_factory=list)
    # the throughput drift's 95% interval (significance.drift.throughput_drift_interval): absent where it was not
    # computed
    # (under DRIFT_CI_MIN_ROWS rows after the warmup) and in runs recorded before it existed
    throughput_drift_ci_low: Num | None = absent()
    throughput_drift_ci_high: Num | None = absent()


@dataclasses.dataclass(frozen=True)
class Result(TrainerResult):
    """A longrun step's record: its one trainer launch's, with the watchdog's findings in its metrics."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


class Longrun(TrainerKind):
    name = "longrun"
    listing = 80
    metrics = TRAINER_METRICS + ("halted", "stalls", "stack_dumps.<i>", "throughput_drift_ci_low",
                                 "throughput_drift_ci_high")
    performance = TRAINER_PERFORMANCE + ("throughput_drift_ci_low", "throughput_drift_ci_high")
    summary = ("a long run under the heartbeat watchdog: stalls, .HALT, throughput stability and drift, memory "
               "plateau")
    result_type = Result

    def run(self, options, ctx) -> Result:
        one = launch_one(ctx)
        out_dir = ctx.run_dir / one.spec.out_dir
        # a .HALT or stack dump an earlier launch left in the directory (a rerun whose trainer died before it moved
        # them aside) is not this launch's, as collect() reads the trainer's other files
        since = launch_started(one.lr)
        halted = ((contracts.halted(out_dir) and not written_before(out_dir / HALT_NAME, since))
                  or one.metrics.trainer_status == "halted")
        launch = {f.name: getattr(one.metrics, f.name) for f in dataclasses.fields(LaunchMetrics)}
        dumps = contracts.stack_dumps(out_dir, since - EARLIER_TOLERANCE_S if since is not None else 0.0)
        # the drift reads the whole run after the warmup, the launch's interference its window only
        read = launch_csv(out_dir, one.metrics)
        window = launch_interference(one.metrics.extra)
        shaken = None if window is not None and window.disturbed else drift_interference(
            Path(one.spec.step_dir), out_dir, one.metrics, read)
        if shaken is not None:
            launch["extra"] = {**one.metrics.extra, "interference": encode(shaken)}
        interval = (throughput_drift_interval(read.frame, one.metrics.window.warmup or 0)
                    if read is not None and one.metrics.throughput_drift is not None else None)
        m = Metrics(**launch, halted=halted, stalls=1 if one.lr.status == "hang" else 0,
                    stack_dumps=[ctx.rel(p) for p in dumps],
                    throughput_drift_ci_low=interval[0] if interval else None,
                    throughput_drift_ci_high=interval[1] if interval else None)
        if one.status == "passed" and halted:
            return Result(status="failed", reason="the run was halted (.HALT)", metrics=m)
        return Result(status=one.status, reason=one.reason, metrics=m)

    def blocks(self, result: Result) -> list[Block]:
        """The trainer launch's blocks, then stability: throughput (the window's CV; the drift from the first third
        of the run to the last, with its 95% interval where recorded), memory plateau, halts, stalls, stack
        dumps."""
        m = result.metrics
        dumps = {str(p) for p in m.stack_dumps + result.stack_dumps}
        return super().blocks(result) + [Table(
            (Column("Throughput stable"), Column("Throughput drift", numeric=True), Column("Memory plateau"),
             Column("Peak mem", numeric=True), Column("Halted"), Column("Stalls", numeric=True),
             Column("Stack dumps", numeric=True)),
            [(fmt_num(m.throughput_stable), drift_text(m), fmt_num(m.mem_plateau),
              fmt_gb(m.mem_peak_gb), fmt_num(m.halted),
              fmt_num(len(m.stalls) if isinstance(m.stalls, list) else m.stalls), str(len(dumps)))])]


def drift_text(m: Metrics) -> str:
    """The throughput drift as the report shows it: '-12.0% (95% CI -18.5% .. -5.1%)', the drift alone where no
    interval was recorded (a run recorded before it existed, or under DRIFT_CI_MIN_ROWS rows after the warmup)."""
    drift = fmt_pct(m.throughput_drift, signed=True)
    low, high = finite(m.throughput_drift_ci_low), finite(m.throughput_drift_ci_high)
    if drift == NA or low is None or high is None:
        return drift
    return (f"{drift} ({fmt_pct(DRIFT_CONFIDENCE, digits=0)} CI {fmt_pct(low, signed=True)} .. "
            f"{fmt_pct(high, signed=True)})")


def launch_csv(out_dir: Path, m: LaunchMetrics) -> CsvRead | None:
    """The launch's training.csv as read again for the figures of the whole run (the drift's interval, the
    interference over its thirds), or None where the launch's summary found it unusable (missing, corrupt, an
    earlier launch's: validation.kinds.trainer.earlier_files) or it now reads with a problem."""
    if m.status not in USABLE_STATUSES:
        return None
    read = read_training_csv(out_dir / TRAINING_CSV)
    return read if read.problem is None else None


def drift_interference(step_dir: Path, out_dir: Path, m: LaunchMetrics,
                       read: CsvRead | None = None) -> LaunchInterference | None:
    """What else used the machine while the run measured the throughput drift's two thirds (metrics.drift_thirds), where
    either was measured under interference (validation.launch.telemetry.interference: at least DISTURBED_SHARE of its
    samples contended), the first such third's record, its text naming the steps; else None. The launch's own
    interference covers its statistics window only (validation.kinds.train_report), yet the drift reads the whole run
    after the warmup: a neighbour that slowed the run's first third alone (before the window) makes a run that slowed
    read as one that held, its window undisturbed. `m`: the launch's LaunchMetrics (its training.csv read as this
    launch's: an earlier launch's file is not, validation.kinds.trainer.earlier_files); `read`: its training.csv as
    launch_csv read it (read here when not given)."""
    rows = contracts.read_telemetry(step_dir)
    startup = m.startup
    if not rows or not isinstance(startup, Startup) or m.status not in USABLE_STATUSES:
        return None
    read = launch_csv(out_dir, m) if read is None else read
    timed = step_times(read) if read is not None and read.problem is None else None
    thirds = drift_thirds(read.frame, m.window.warmup or 0) if timed is not None else None
    if thirds is None:
        return None
    steps, times = timed  # in the frame's order: drift_thirds' row positions index them
    on_gpu = (m.context or RunContext()).on_cpu() is not True
    for which, rows_of in zip(("first", "last"), thirds):
        first, last = steps[rows_of[0]], steps[rows_of[-1]]
        period = training_period(startup, steps, times, first, last)
        if period is None:
            continue
        rec = telemetry.interference(rows, *period, use_gpus=on_gpu)
        if rec is not None and rec.disturbed:
            return dataclasses.replace(rec, text=f"over the {which} third of the run (steps {first}-{last}), "
                                                 f"which the throughput drift reads: {rec.text}")
    return None


kinds.register(Longrun())
