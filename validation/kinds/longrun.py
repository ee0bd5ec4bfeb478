"""`longrun`: a long trainer launch under the heartbeat watchdog: stalls (a HANG with stack dumps), .HALT,
throughput stability and a memory plateau.

Own keys: none (the train keys). Metrics: a trainer launch's (validation.kinds.trainer) plus "halted" (a .HALT file
or the trainer ended halted), "stalls" (1 when the launch hung), "stack_dumps" (paths). A halted run fails.
"""

from __future__ import annotations

from validation import contracts
from validation import kinds
from validation.formatting import as_dict, as_list, fmt_gb, fmt_num
from validation.kinds.blocks import Block, Column, Table
from validation.kinds.trainer import TRAINER_METRICS, TrainerKind, run_single


class Longrun(TrainerKind):
    name = "longrun"
    metrics = TRAINER_METRICS + ("halted", "stalls", "stack_dumps.<i>")
    summary = "a long run under the heartbeat watchdog: stalls, .HALT, throughput stability, memory plateau"

    def run(self, step, launches, result, ctx) -> None:
        spec, lr = run_single(ctx, step, launches, result)
        out_dir = ctx.run_dir / spec.out_dir
        m = result["metrics"]
        m["halted"] = contracts.halted(out_dir) or m.get("trainer_status") == "halted"
        m["stalls"] = 1 if lr.status == "hang" else 0
        m["stack_dumps"] = [ctx.rel(p) for p in contracts.stack_dumps(out_dir)]
        if result["status"] == "passed" and m["halted"]:
            result.update(status="failed", reason="the run was halted (.HALT)")

    def blocks(self, result: dict) -> list[Block]:
        """The trainer launch's blocks, then stability: throughput, memory plateau, halts, stalls, stack dumps."""
        metrics = as_dict(result.get("metrics"))
        stalls = metrics.get("stalls")
        dumps = {str(p) for p in as_list(metrics.get("stack_dumps")) + as_list(result.get("stack_dumps"))}
        return super().blocks(result) + [Table(
            (Column("Throughput stable"), Column("Memory plateau"), Column("Peak mem", numeric=True), Column("Halted"),
             Column("Stalls", numeric=True), Column("Stack dumps", numeric=True)),
            [(fmt_num(metrics.get("throughput_stable")), fmt_num(metrics.get("mem_plateau")),
              fmt_gb(metrics.get("mem_peak_gb")), fmt_num(metrics.get("halted")),
              fmt_num(len(stalls) if isinstance(stalls, list) else stalls), str(len(dumps)))])]


kinds.register(Longrun())
