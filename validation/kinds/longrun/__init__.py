"""`longrun`: a long trainer launch under the heartbeat watchdog: stalls (a HANG with stack dumps), .HALT,
throughput stability and a memory plateau.

Own keys: none (the train keys). Metrics: a trainer launch's (validation.kinds.trainer) plus "halted" (a .HALT file
or the trainer ended halted), "stalls" (1 when the launch hung), "stack_dumps" (paths). A halted run fails.

Result: the step record of one trainer launch (validation.kinds.trainer.TrainerResult), its metrics the launch's
LaunchMetrics with what the watchdog found (Metrics).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation import contracts
from validation import kinds
from validation.formatting import fmt_gb, fmt_num, fmt_pct
from validation.kinds.blocks import Block, Column, Table
from nsa.training.watchdog import HALT_NAME
from validation.kinds.trainer import (EARLIER_TOLERANCE_S, TRAINER_METRICS, TrainerKind, TrainerResult, launch_one,
                                      launch_started, written_before)
from validation.results.trainer_launch import LaunchMetrics


@dataclasses.dataclass(frozen=True)
class Metrics(LaunchMetrics):
    """The step's metrics: its trainer launch's, then what the watchdog found."""
    halted: bool | None = None
    stalls: Any = None  # 1 when the launch hung, else 0
    stack_dumps: list[Any] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Result(TrainerResult):
    """A longrun step's record: its one trainer launch's, with the watchdog's findings in its metrics."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


class Longrun(TrainerKind):
    name = "longrun"
    listing = 80
    metrics = TRAINER_METRICS + ("halted", "stalls", "stack_dumps.<i>")
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
        m = Metrics(**launch, halted=halted, stalls=1 if one.lr.status == "hang" else 0,
                    stack_dumps=[ctx.rel(p) for p in dumps])
        if one.status == "passed" and halted:
            return Result(status="failed", reason="the run was halted (.HALT)", metrics=m)
        return Result(status=one.status, reason=one.reason, metrics=m)

    def blocks(self, result: Result) -> list[Block]:
        """The trainer launch's blocks, then stability: throughput (the window's CV; the drift from the first third
        of the run to the last), memory plateau, halts, stalls, stack dumps."""
        m = result.metrics
        dumps = {str(p) for p in m.stack_dumps + result.stack_dumps}
        return super().blocks(result) + [Table(
            (Column("Throughput stable"), Column("Throughput drift", numeric=True), Column("Memory plateau"),
             Column("Peak mem", numeric=True), Column("Halted"), Column("Stalls", numeric=True),
             Column("Stack dumps", numeric=True)),
            [(fmt_num(m.throughput_stable), fmt_pct(m.throughput_drift, signed=True), fmt_num(m.mem_plateau),
              fmt_gb(m.mem_peak_gb), fmt_num(m.halted),
              fmt_num(len(m.stalls) if isinstance(m.stalls, list) else m.stalls), str(len(dumps)))])]


kinds.register(Longrun())
