"""The metrics of one trainer launch as a typed record: what validation.kinds.trainer.collect records for every launch
of the trainer (a train, longrun or profile step's "metrics", each run's "metrics" of a sweep, A/B, scan, triage,
parallelism or scaling step), read back with validation.results.codec:

    m = decode(LaunchMetrics, step["metrics"], lenient=True)      a report: a damaged record still renders
    m.toks_per_s.mean, m.window.first_step, m.context.device, m.summary.tokens_per_s, m.startup.init_s, ...

The keys and what they mean are validation.kinds.trainer's module docstring (validation.analysis.metrics.summarize's,
validation.contracts.run_context's, validation.kinds.train_report's). Encoding a decoded record gives back the same
JSON: a key a writer adds only when it applies is an absent() field, the telemetry's keys are written together
(absent(beside="telemetry")), a record that is `{}` when its file is missing is a blank() field, and every key not
declared here (a kind's own, e.g. the profile kind's "profile"; "interference", validation.analysis.interference's
record) is kept in `extra`.

This is a foundation module: the kinds, the analyses and the report read it alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation.results.codec import absent, blank, decode, written
from validation.results.interference import LaunchInterference

Num = int | float  # a figure as its writer gave it (an int stays an int: the JSON is written back unchanged)


@dataclasses.dataclass(frozen=True)
class Stat:
    """A training.csv column over the statistics window (validation.analysis.metrics.column_stats; stdev is the
    population stdev, cv = stdev / mean); None where nothing was finite."""
    mean: Num | None = None
    median: Num | None = None
    stdev: Num | None = None
    cv: Num | None = None
    min: Num | None = None
    max: Num | None = None
    n: int | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Gauge:
    """A telemetry figure over the launch's measured period (validation.launch.telemetry.summarize)."""
    mean: Num | None = None
    min: Num | None = None
    max: Num | None = None
    n: int | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Window:
    """The statistics window: `last` and `warmup` as asked, `n` rows used, the first and last step of those rows."""
    last: int | None = None
    warmup: int | None = None
    n: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What the launch's tokens/s means, from its env.json (validation.contracts.run_context); a field the file lacks
    is None."""
    seq_len: Num | None = None
    micro_batch: Num | None = None
    accum: Num | None = None
    world_size: Num | None = None
    global_batch_tokens: Num | None = None
    n_params: Num | None = None
    precision: str | None = None
    flops_per_token: Num | None = None
    peak_flops: Num | None = None
    device: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def on_cpu(self) -> bool | None:
        """Whether the launch trained on a CPU, from env.json's device name as the trainer wrote it ("cpu" on a CPU,
        the GPU's own name on a GPU, "cuda:0" in older records); None when it names none (it never started)."""
        name = str(self.device or "").strip().lower()
        return name.startswith("cpu") if name else None


@dataclasses.dataclass(frozen=True)
class Problem:
    """A trainer file that broke its contract (validation.contracts' readers): what is wrong with it."""
    problem: str


@dataclasses.dataclass(frozen=True)
class TrainingSummary:
    """The Training Summary (summary.json; validation.kinds.train_report.SUMMARY_KEYS)."""
    steps: Num | None = None
    avg_step_time_s: Num | None = None
    min_step_time_s: Num | None = None
    max_step_time_s: Num | None = None
    avg_step_time_excl_first_s: Num | None = None
    samples_per_s: Num | None = None
    tokens_per_s: Num | None = None
    avg_loss: Num | None = None
    final_loss: Num | None = None
    memory_kind: str | None = None  # cuda or cpu_rss
    peak_mem_alloc_gb: Num | None = None
    avg_mem_alloc_gb: Num | None = None
    peak_mem_reserved_gb: Num | None = None
    avg_mem_reserved_gb: Num | None = None
    comm_time_s: Num | None = None
    comm_share: Num | None = None
    comm_time_method: str | None = None
    parallel: str | None = None
    world_size: Num | None = None
    status: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class InitGrowth:
    """The "init grows faster than the model" flag of a launch (validation.kinds.train_report.init_growth)."""
    flagged: bool | None = None
    reference: str | None = None
    init_ratio: Num | None = None
    model_ratio: Num | None = None
    text: str | None = None
    # true where a disturbed init leaves the comparison without a verdict (never flagged); absent otherwise
    inconclusive: bool | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Startup:
    """The start-up timeline (timeline.json; validation.kinds.train_report.startup_metrics): seconds since the
    process started."""
    milestones: dict[str, Num] = dataclasses.field(default_factory=dict)
    imports_s: Num | None = None
    init_s: Num | None = None
    first_step_s: Num | None = None
    time_to_first_step_s: Num | None = None
    slowest: Any = None  # {milestone: {"rank", "s"}}: the rank that reached it last
    n_params: Num | None = None
    process_start_unix: Num | None = None
    missing: list[str] = dataclasses.field(default_factory=list)
    # what else used the machine over the init (imports_done -> setup_done); absent without telemetry over it
    init_interference: LaunchInterference | None = absent()
    init_growth: InitGrowth | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The trainer's timeline.json as validation.contracts.read_timeline gives it (nsa.training.outputs.read_timeline:
    the milestones, rank 0's time to first step and process start, the rank that reached each milestone last, the
    required milestones it lacks), or {"problem": the reason} where the file breaks its contract. `milestones` is None
    where the file has none."""
    milestones: dict[str, Any] | None = None
    time_to_first_step_s: Num | None = None
    slowest: Any = None
    process_start_unix: Num | None = None
    missing_milestones: list[Any] = dataclasses.field(default_factory=list)
    problem: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Telemetry:
    """What the launch's device telemetry covers (validation.kinds.train_report.telemetry_metrics)."""
    files: list[str] = dataclasses.field(default_factory=list)
    samples: int | None = None
    nodes: list[str] = dataclasses.field(default_factory=list)
    gpus: list[str] = dataclasses.field(default_factory=list)
    gpu_match: str | None = None
    period: str | None = None
    sampler_cpu_ms: Num | None = None
    gpu_mem_total_gb: Num | None = None
    pcie_gen_max: Num | None = None
    pcie_width_max: Num | None = None
    window_unix: list[Num] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Cause:
    cause: str | None = None
    evidence: str | None = None


@dataclasses.dataclass(frozen=True)
class GpuDiagnosis:
    """Low GPU utilisation and its likely causes (validation.launch.telemetry.diagnose)."""
    gpu_util_mean: Num | None = None
    threshold: Num | None = None
    causes: list[Cause] = dataclasses.field(default_factory=list)
    text: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SdpaSite:
    """One SDPA call site's calls on one backend (nsa.observability.SdpaAudit)."""
    site: str | None = None
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    calls: Num | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SdpaAudit:
    """The SDPA audit (NSA_SDPA_AUDIT=1): calls, backends, math-backend calls on a GPU, calls per site."""
    calls: Num | None = None
    backends: Any = None  # the backends seen (a list; {backend: calls} in older records)
    fallbacks: Num | None = None
    by_site: list[SdpaSite] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LaunchMetrics:
    """One trainer launch's metrics (validation.kinds.trainer's module docstring), in the order they are written."""
    # validation.analysis.metrics.summarize: training.csv
    status: str | None = None  # ok, short, missing, empty, corrupt
    reason: str | None = None
    note: str | None = None
    steps: int | None = None
    last_step: int | None = None
    dropped_rows: int | None = None
    cut_last_line: bool | None = None
    first_bad_row: str | None = None
    window: Window = dataclasses.field(default_factory=Window)
    toks_per_s: Stat | None = absent()  # a column's statistics: only for the columns the file has
    step_time_s: Stat | None = absent()
    loss: Stat | None = absent()
    grad_norm: Stat | None = absent()
    mem_alloc_gb: Stat | None = absent()
    mem_reserved_gb: Stat | None = absent()
    mfu: Stat | None = absent()
    toks_per_s_per_gpu: Num | None = None
    first_loss: Num | None = None
    final_loss: Num | None = None
    loss_drop: Num | None = None
    mem_peak_gb: Num | None = None
    mem_plateau: bool | None = None
    throughput_stable: bool | None = None
    throughput_drift: Num | None = absent()  # absent in runs recorded before it existed
    # validation.kinds.trainer.collect
    world_size: int | None = None
    csv: str | None = None
    context: RunContext | None = blank()
    tflops_per_s: Num | None = None
    launcher: str | None = None
    nnodes: int | None = None
    nodes: list[str] = dataclasses.field(default_factory=list)
    slurm_job: str | int | None = None
    gpus: list[str] = dataclasses.field(default_factory=list)
    toks_per_s_per_node: Num | None = None
    # validation.kinds.train_report: summary.json, timeline.json, telemetry.csv
    summary: Problem | TrainingSummary | None = blank()
    startup: Problem | Startup | None = blank()
    time_to_first_step_s: Num | None = None
    gpu_util: Gauge | None = absent(beside="telemetry")
    gpu_mem_used_gb: Gauge | None = absent(beside="telemetry")
    power_w: Gauge | None = absent(beside="telemetry")
    sm_clock_mhz: Gauge | None = absent(beside="telemetry")
    temp_c: Gauge | None = absent(beside="telemetry")
    throttled: bool | None = absent(beside="telemetry")
    throttle_reasons: list[str] = absent([], beside="telemetry")
    pcie_gen_min: Num | None = absent(beside="telemetry")
    pcie_width_min: Num | None = absent(beside="telemetry")
    ecc_uncorrected: Num | None = absent(beside="telemetry")
    xid_errors: Num | None = absent(beside="telemetry")
    cpu_util: Gauge | None = absent(beside="telemetry")
    rss_gb: Gauge | None = absent(beside="telemetry")
    telemetry: Telemetry | None = absent()
    gpu_diagnosis: GpuDiagnosis | None = absent(beside="telemetry")
    # validation.kinds.trainer.collect: status.json, env.json's toggles, sdpa_audit.json
    trainer_status: str | None = None
    compression: str | None = None
    sdpa_audit: SdpaAudit | None = absent()
    scaling_baseline: str | None = absent()  # the train kind's: the step it is measured against
    scaling_efficiency: Num | None = absent(beside="scaling_baseline")  # written with it, null where not computable
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def as_launch(metrics: Any) -> LaunchMetrics:
    """A step's or run's metrics as a trainer launch's: the record itself, or its JSON decoded leniently (a step of
    another kind: the keys it shares with one)."""
    return metrics if isinstance(metrics, LaunchMetrics) else decode(LaunchMetrics, written(metrics), lenient=True)


@dataclasses.dataclass(frozen=True)
class TrainerStatus:
    """The trainer's status.json (nsa.training.trainer writes it, nsa.training.outputs documents it,
    validation.contracts.read_status_json reads it): how the run ended, as written, one of
    nsa.training.outputs.STATUSES: "running" (written at start-up; left so by a process killed outright),
    "completed", "halted" (.HALT: the watchdog or a user), "terminated" (a signal), "nonfinite" (a non-finite loss
    or gradient) or "crashed" (an exception; "phase": "start-up" when before the first step); why (`reason`, null
    when completed), the last step it completed, and its notes. The file's other keys (steps_planned,
    checkpoint_step, world_size, parallel, updated, phase) are kept in `extra`."""
    status: str | None = None  # read leniently: a status that is not a text (a damaged file) reads as None
    reason: Any = None
    step: int | None = None
    notes: list[Any] = dataclasses.field(default_factory=list)  # e.g. settings it ignored ("NSA_X=1 is ignored: ...")
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class JobNode:
    """A node of the trainer's job as its env.json lists it: the node's name, host, GPU names and its NCCL_/UCX_/
    Slurm variables, as written (they are copied into the run's environment as they are)."""
    node: Any = None
    host: Any = None
    gpus: Any = None
    env: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """The `train` part of the resolved config in env.json that says what a token/s means."""
    seq_len: Num | None = None
    batch_size: Num | None = None  # sequences per rank per micro-step
    accum: Num | None = None
    precision: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """The resolved config in env.json (after every flag and override), the part the orchestrator reads."""
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TrainerEnv:
    """The trainer's env.json (validation.contracts.read_env_json), the parts the orchestrator reads: the resolved
    config, world size, model size and FLOPs per token, the device's peak and name (validation.contracts.run_context),
    the parallelism and the toggles in effect (ddp_compression), the job's nodes (an entry that is not an object is
    left out)."""
    config: ResolvedConfig = dataclasses.field(default_factory=ResolvedConfig)
    world_size: Num | None = None
    n_params: Num | None = None
    flops_per_token: Num | None = None
    peak_flops: Num | None = None
    device_name: Any = None  # shown as text, as written
    device: Any = None
    parallel: str | None = None
    toggles: dict[str, Any] = dataclasses.field(default_factory=dict)  # nsa.toggles' record: {toggle: value}
    nodes: list[Any] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def job_nodes(self) -> list[JobNode]:
        return [decode(JobNode, n, "env.json.nodes", lenient=True) for n in self.nodes if isinstance(n, dict)]


@dataclasses.dataclass(frozen=True)
class LaunchRun:
    """One trainer launch of a step that runs several (validation.kinds.trainer.run_all: a sweep's points, an A/B's
    variants, a scan's values, ...), each an entry of the step's "runs" (and of "superseded" once run again)."""
    label: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    status: str | None = None  # the run's status: passed, failed, ...
    reason: str | None = None
    dir: str | None = None
    command: list[str] | None = None
    metrics: LaunchMetrics = dataclasses.field(default_factory=LaunchMetrics)
    repeat: int | None = None
    source: str | None = absent()  # a scan's: scan or bisect
    superseded_by: str | None = absent()  # a superseded run's: the directory of the run that replaced it
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
