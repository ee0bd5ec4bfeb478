"""What the `parallelism` step records (validation.kinds.parallelism), as typed records read with
validation.results.codec, and what it reads of each run's trainer files to get there:

    r = decode(Result, step, lenient=True)        a report: a damaged record still renders
    r.metrics.strategies["ddp"].toks_per_s, r.metrics.comparisons["fsdp:ddp"].rel, r.metrics.capacity.gb,
    r.metrics.batch_search (Skipped, or {label: Searched}), r.metrics.recommendation_numbers["ddp"].headroom, r.runs

The Result is the whole step record (a validation.results.run.Step: status, reason, runs, run order, ...) with its
metrics typed: what run() returns and what the report hooks read.

The metrics' keys and what they mean are the kind's module docstring (validation.kinds.parallelism); a comparison is
a Compared (validation.results.decision.ComparisonRecord, significance.Comparison's record), or a NotCompared (why
a pair was not compared), each run a
validation.results.trainer_launch.LaunchRun. Encoding a decoded record gives back the same JSON: a key written only
when it applies is an absent() field, and every key not declared here is kept in `extra`.

validation.analysis.parallelism's records are reused: Numbers (what the recommendation weighed), ExposedComm and
AlignedComm (what the profiler traces show). RunInfo is what validation.kinds.parallelism.analysis.read_run reads of
one run's out_dir (summary.json as SummaryJson, the traces' communication, env.json's devices): not part of
results.json.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation.analysis.parallelism import AlignedComm, ExposedComm, Numbers
from validation.results.codec import absent, decode
from validation.results.decision import ComparisonRecord
from validation.results.run import Step
from validation.results.trainer_launch import Num, TrainingSummary


# ---------------------------------------------------------------------------------------------- the trainer's files
@dataclasses.dataclass(frozen=True)
class CommCount:
    """One kind of collective in one optimizer step: a row of summary.json's comm.per_step
    (nsa.training.comm_count.counts_table), or an entry of the byte model's per_step."""
    kind: str | None = absent()
    calls: int | None = absent()
    bytes: int | None = absent()
    sizes: list[int] | None = absent()  # every call's message bytes, where kept
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CommCounted:
    """summary.json's "comm": the collectives rank 0 issued, counted at the calls."""
    counted_by: str | None = None
    per_step: list[CommCount] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ByteModel:
    """summary.json's "comm_model": the byte model's prediction (nsa.training.comm_model.CommPrediction.to_dict)."""
    per_step: dict[str, CommCount] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """Bytes per rank predicted by nsa.training.comm_model.memory_model (summary.json's "memory_model", copied into
    the strategy's figures)."""
    strategy: str | None = absent()
    world_size: int | None = absent()
    params: Num | None = absent()
    grads: Num | None = absent()
    optimizer_state: Num | None = absent()
    buffers: Num | None = absent()
    activations: Num | None = absent()
    total: Num | None = absent()
    # "exact: ..." on CPU (the PyTorch path's count), "estimate: ..." elsewhere (nsa.training.comm_model
    # .activations_basis): whether activations, and so total, is a count or an estimate
    activations_basis: str | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SummaryJson(TrainingSummary):
    """A run's summary.json (nsa.training.outputs.SUMMARY_FIELDS): the Training Summary and the communication and
    memory figures the kind reads beside it."""
    comm: CommCounted | None = None
    comm_model: ByteModel | None = None
    comm_model_matches: bool | None = None
    memory_model: MemoryModel | None = None


@dataclasses.dataclass(frozen=True)
class Device:
    memory_gb: Num | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EnvDevices:
    """The part of a run's env.json the kind reads: the device it trained on ("cpu", "cuda:0") and the GPUs the
    host has (listed whenever CUDA is available, also for a run that trained on the CPU)."""
    device: str | None = None
    devices: list[Device] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What validation.kinds.parallelism.analysis.read_run reads of one run: its summary.json (None with
    summary_error when missing or damaged), rank 0's exposed communication and the ranks' aligned collectives (None
    without a trace holding a collective), the trace read and env.json."""
    summary: SummaryJson | None = None
    trace: ExposedComm | None = None
    env: EnvDevices = dataclasses.field(default_factory=EnvDevices)
    summary_error: str | None = None
    trace_path: str | None = None
    aligned: AlignedComm | None = None


@dataclasses.dataclass(frozen=True)
class CommTable:
    """One collective of a `comm` step's metrics: its bandwidth table (validation.analysis.collectives.bandwidth_row
    rows), the rest of its figures unread here."""
    table: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CommMeasured:
    """What the step reads of its `comm` step's metrics (that kind's documented interface; the step does not import
    the kind): what its tables were measured with, and every collective's table."""
    world_size: Any = None
    backend: Any = None
    source: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """{collective: its table} of the collectives with a table, in the order they were written."""
        read = {k: decode(CommTable, v, k, lenient=True) for k, v in self.extra.items() if isinstance(v, dict)}
        return {k: c.table for k, c in read.items() if c.table}


# ---------------------------------------------------------------------------------------------- results.json
@dataclasses.dataclass(frozen=True)
class StrategyFigures:
    """One strategy's (or variant's) figures over its runs, in the order they are written."""
    strategy: str | None = None
    runs: int | None = None
    passed: int | None = None
    oom: int | None = None
    toks_per_s: Num | None = None  # mean over the passed runs of each run's window mean (all ranks)
    toks_per_s_runs: list[Num | None] = dataclasses.field(default_factory=list)
    step_time_s: Num | None = None
    peak_alloc_gb: Num | None = None
    peak_reserved_gb: Num | None = None
    memory_kind: str | None = None  # cuda or cpu_rss
    memory_model: MemoryModel | None = None
    comm_bytes_counted: int | list[int] | None = None  # one figure when every run counted the same, else each run's
    comm_bytes_model: int | list[int] | None = None
    comm_model_matches: bool | None = None
    comm_counted_by: str | None = None
    per_step: list[CommCount] | None = None
    comm_time_s: Num | None = None
    comm_share: Num | None = None
    comm_predicted_s: Num | None = None
    comm_prediction: str | None = None
    comm_predicted_by_kind: dict[str, Num] | None = absent()  # only where a comm step's tables predicted it
    exposed_comm_s: Num | None = None
    profiled_comm_s: Num | None = None
    aligned_comm_s: Num | None = None
    exposed_source: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Compared(ComparisonRecord):
    """A pair of strategies compared (significance.Comparison.as_dict): its baseline is always there, which tells it
    from a NotCompared."""
    baseline: str = dataclasses.field(default=dataclasses.MISSING)  # required here: ComparisonRecord's is optional


@dataclasses.dataclass(frozen=True)
class NotCompared:
    """A pair that was not compared, and why (a run without a measurement, too few values)."""
    text: str | None = None
    significant: bool | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """The memory one rank has (validation.kinds.parallelism.analysis.capacity)."""
    gb: Num | None = None
    device: str | None = None  # cuda or cpu
    source: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A batch-size search that did not run, and why (on CPU)."""
    skipped: str


@dataclasses.dataclass(frozen=True)
class Tried:
    batch: int | None = None
    fits: bool | None = None


@dataclasses.dataclass(frozen=True)
class Searched:
    """One strategy's batch-size search (validation.analysis.parallelism.SearchResult.as_dict)."""
    largest: int | None = None
    first_oom: int | None = None
    error: str | None = None
    tried: list[Tried] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's metrics, in the order they are written: the analysis's (strategies .. oom_only), the batch-size
    search's, then the recommendation's."""
    strategies: dict[str, StrategyFigures] = dataclasses.field(default_factory=dict)
    repeats: int | None = None
    comm_step: str | None = None
    comm_source: str | None = None
    all_ran: bool | None = None
    byte_model_matches: bool | None = None
    comparisons: dict[str, Compared | NotCompared] = dataclasses.field(default_factory=dict)  # "<b>:<a>"
    capacity: Capacity = dataclasses.field(default_factory=Capacity)
    headroom: Num | None = None
    oom_only: bool | None = None
    batch_search: Skipped | dict[str, Searched] | None = None  # None: the step asked for none
    batch_needed: int | None = None
    recommendation: str | None = None
    recommendation_reason: str | None = None
    regime: str | None = None  # fits_with_headroom, tight or does_not_fit
    recommendation_numbers: dict[str, Numbers] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Result(Step):
    """A parallelism step's record: the step record (a LaunchRun per run, the run order, ...) with its metrics."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)
