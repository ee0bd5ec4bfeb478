"""What a `comm` step records (validation.kinds.comm), as typed records read with validation.results.codec: its
Result, the step record (validation.results.run.Step) whose metrics are the Metrics below (a Collective per
collective measured, a Row per size; the keys and what they mean: the kind's module docstring), and what it reads to
get there: the torch benchmark's comm.json (BenchFile) and an nccl-tests table (ParsedTable). Encoding a decoded
record gives back the same JSON: a key written only when it applies is an absent() field, and every key not declared
here is kept in `extra`.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from validation.results.codec import absent, decode, encode, given
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import Num

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


@dataclasses.dataclass(frozen=True)
class Row:
    """One message size of a collective (validation.analysis.collectives.bandwidth_row; nccl-tests' rows add the
    busbw it reported itself)."""
    bytes: Num
    time_s: Num
    algbw_gbps: Num
    busbw_gbps: Num
    reported_busbw_gbps: Num | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Spread:
    max: Num | None = None
    median: Num | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective's metrics (summarize): its rows by size, peak and median bandwidths, the latency (the smallest
    size's time), the number of sizes and, from nccl-tests, the average busbw it reported."""
    table: list[Row] = dataclasses.field(default_factory=list)
    busbw_gbps: Spread = dataclasses.field(default_factory=Spread)
    algbw_gbps: Spread = dataclasses.field(default_factory=Spread)
    latency_us: Num | None = None
    sizes: int | None = None
    avg_busbw_gbps_reported: Num | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A comm step's metrics (the module docstring): what was measured how, a Collective per collective and the
    one-rank note. The torch benchmark's keys (device, ..., threads) and the collectives are written only when they
    apply (a collective not measured is a blank Collective), the collectives in KINDS order; world size, backend
    and source are written together whenever a run wrote any (a step that never ran has none)."""
    world_size: Any = absent(beside="source")  # comm.json's, as the benchmark wrote it
    backend: str | None = absent(beside="source")
    source: str | None = absent()
    device: Any = absent()  # the torch benchmark's comm.json, as written
    device_name: str | None = absent()  # the GPU's name (comm.json's, or nccl-tests' `# Rank` lines), "cpu" on gloo
    iters: Any = absent()
    warmup: Any = absent()
    compute_ms: Any = absent()
    threads: Any = absent()
    all_reduce: Collective = absent(Collective())
    all_gather: Collective = absent(Collective())
    reduce_scatter: Collective = absent(Collective())
    broadcast: Collective = absent(Collective())
    note: str | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def collectives(self) -> dict[str, Collective]:
        """{kind: its record} of the collectives measured (a table or figures recorded), in KINDS order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name in KINDS and given(getattr(self, f.name)) is not None}


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A comm step's record: its metrics are the Metrics above."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


@dataclasses.dataclass(frozen=True)
class ParsedTable:
    """One nccl-tests output as validation.analysis.nccl_tests.parse reads it: its rows (bandwidth_row's keys and
    the busbw it reported) and the average busbw it reported."""
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    avg_busbw_gbps: Num | None = None
    world_size: Any = None
    devices: list[Any] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BenchFile:
    """The torch benchmark's comm.json (validation.analysis.comm_bench): its values copied into the metrics as
    written; `kinds` {kind: rows}, None where it is not a mapping."""
    world_size: Any = None
    backend: Any = None
    device: Any = None
    device_name: Any = None
    dtype: Any = None
    iters: Any = None
    warmup: Any = None
    compute_ms: Any = None
    threads: Any = None
    kinds: dict[str, Any] | None = None


def summarize(kind: str, table: list[dict]) -> Collective:
    """The metrics of one collective from its rows (bandwidth_row's JSON; sorted here by bytes)."""
    rows = sorted((decode(Row, r, f"{kind}[{i}]") for i, r in enumerate(table)), key=lambda r: r.bytes)
    bus = [r.busbw_gbps for r in rows]
    alg = [r.algbw_gbps for r in rows]
    return Collective(table=rows, busbw_gbps=Spread(max=max(bus), median=statistics.median(bus)),
                      algbw_gbps=Spread(max=max(alg), median=statistics.median(alg)),
                      latency_us=rows[0].time_s * 1e6, sizes=len(rows))


def measured(metrics: Metrics | Any) -> tuple[Metrics, dict[str, Collective]]:
    """A comm step's metrics (a Metrics, or its JSON decoded leniently) and the collectives it measured."""
    m = metrics if isinstance(metrics, Metrics) else decode(Metrics, metrics, lenient=True)
    return m, m.collectives()


def tables(metrics: Metrics | Any) -> dict[str, list[dict]]:
    """{kind: table} of a comm step's metrics (what validation.analysis.collectives.predict_seconds takes)."""
    return {k: [encode(row) for row in c.table] for k, c in measured(metrics)[1].items() if c.table}
