"""`longrun`: a long trainer launch under the heartbeat watchdog: stalls (a HANG with stack dumps), .HALT,
throughput stability and a memory plateau.

Own keys: none (the train keys). Metrics: a trainer launch's (validation.kinds.trainer) plus "halted" (a .HALT file
or the trainer ended halted), "stalls" (1 when the launch hung), "stack_dumps" (paths). A halted run fails.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation import contracts
from validation import kinds
from validation.formatting import fmt_gb, fmt_num
from validation.kinds.blocks import Block, Column, Table
from validation.kinds.trainer import TRAINER_METRICS, TrainerKind, run_single
from validation.results.codec import decode
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import LaunchMetrics


@dataclasses.dataclass(frozen=True)
class Result(LaunchMetrics):
    """The step's metrics: its trainer launch's, then what the watchdog found."""
    halted: bool | None = None
    stalls: Any = None  # 1 when the launch hung, else 0
    stack_dumps: list[Any] = dataclasses.field(default_factory=list)


class Longrun(TrainerKind):
    typed = False  # still the dict interface (validation.kinds.base.StepKind.typed)
    name = "longrun"
    metrics = TRAINER_METRICS + ("halted", "stalls", "stack_dumps.<i>")
    summary = "a long run under the heartbeat watchdog: stalls, .HALT, throughput stability, memory plateau"

    def run(self, step, launches, result, ctx) -> None:
        spec, lr = run_single(ctx, step, launches, result)
        out_dir = ctx.run_dir / spec.out_dir
        m = result["metrics"]
        halted = contracts.halted(out_dir) or decode(LaunchMetrics, m, "metrics").trainer_status == "halted"
        m["halted"] = halted
        m["stalls"] = 1 if lr.status == "hang" else 0
        m["stack_dumps"] = [ctx.rel(p) for p in contracts.stack_dumps(out_dir)]
        if result["status"] == "passed" and halted:
            result.update(status="failed", reason="the run was halted (.HALT)")

    def blocks(self, result: dict) -> list[Block]:
        """The trainer launch's blocks, then stability: throughput, memory plateau, halts, stalls, stack dumps."""
        step = decode(StepRecord, result, "step", lenient=True)
        m = decode(Result, step.metrics, lenient=True)
        dumps = {str(p) for p in m.stack_dumps + step.stack_dumps}
        return super().blocks(result) + [Table(
            (Column("Throughput stable"), Column("Memory plateau"), Column("Peak mem", numeric=True), Column("Halted"),
             Column("Stalls", numeric=True), Column("Stack dumps", numeric=True)),
            [(fmt_num(m.throughput_stable), fmt_num(m.mem_plateau), fmt_gb(m.mem_peak_gb), fmt_num(m.halted),
              fmt_num(len(m.stalls) if isinstance(m.stalls, list) else m.stalls), str(len(dumps)))])]


kinds.register(Longrun())
