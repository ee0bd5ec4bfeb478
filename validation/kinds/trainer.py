"""What the step kinds that launch the trainer share (train, longrun, profile, sweep, ab): the trainer's command
line, collecting one trainer launch into metrics, running a list of launches (a sweep's points, an A/B's variants),
and the report's run table and notes. TrainerKind is their base class: one trainer launch, its metrics, its table.

A trainer launch writes into RUN_DIR/<dir>/out (--out-dir): training.csv, heartbeats, env.json, status.json, ...
(nsa.training.outputs); everything the step learns about the run comes from those files (validation.contracts,
validation.analysis.metrics), never from the trainer's console log.

Metrics of one trainer launch (results.json step or run "metrics"): the validation.analysis.metrics.summarize() dict (status,
window, toks_per_s {mean, median, stdev, cv, min, max, n}, toks_per_s_per_gpu, loss..., mem_peak_gb, mem_plateau,
throughput_stable, final_loss, ...) plus "world_size", "csv" (path), "trainer_status" (status.json), "compression"
(the DDP gradient compression in effect: env.json toggles, or null), "launcher", "nnodes", "nodes", "gpus",
"slurm_job", "toks_per_s_per_node", "context" (what the tokens/s means, from env.json: seq_len, micro_batch,
accum, world_size, global_batch_tokens, n_params, precision, flops_per_token, peak_flops, device;
validation.contracts.run_context), "tflops_per_s" (achieved model TFLOP/s, all ranks: flops_per_token x mean
tokens/s; the training.csv "mfu" column, when the device peak is known, is summarized as "mfu"), and with
NSA_SDPA_AUDIT=1 "sdpa_audit": {"calls", "backends", "fallbacks", "by_site"} (fallbacks: math-backend calls on a GPU),
and validation.kinds.train_report's: "summary" (summary.json), "time_to_first_step_s" and "startup" (timeline.json),
the device telemetry over the window ("gpu_util", "throttled", "cpu_util", "rss_gb", "pcie_gen_min", ...,
"telemetry") and "gpu_diagnosis". Every trainer launch runs with the telemetry sampler (LaunchSpec.telemetry_s).
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any

from nsa.training.flags import tokens as flag_tokens
from nsa.training.outputs import ENV_JSON, SDPA_AUDIT_JSON, STATUS_JSON, SUMMARY_JSON, TIMELINE_JSON, TRAINING_CSV
from validation import contracts
from validation.analysis import metrics
from validation.launch.spec import LaunchSpec
from validation.analysis.metric_names import DERIVED_KEYS, METRIC_COLUMNS, STAT_NAMES
from validation.analysis.metrics import USABLE_STATUSES
from validation.launch.telemetry import INTERVAL_S as TELEMETRY_INTERVAL_S
from validation.analysis.interference import run_disturbed
from validation.formatting import (NA, as_list, context_text, env_text, finite, fmt_gb, fmt_num, fmt_pct,
                                      fmt_rate, loss_text, mean_pm, status_view)
from validation.runbook.model import LaunchSettings, Step, references, resolve_references
from validation.analysis.significance import PairNoise, interleaved_order, pair_noise_from
from validation.analysis.significance.windows import launch_series, measured_run_noise
from validation.kinds import train_report
from validation.kinds.blocks import Badge, Block, Bullets, Column, Paragraph, Table, code
from validation.kinds.base import StepKind, launch_identity, run_path, step_dir
from validation.results.codec import decode, encode, written
from validation.results.run import Step as StepRecord, read_run
from validation.results.trainer_launch import (LaunchMetrics, LaunchRun, RunContext, SdpaAudit, Stat, TrainerEnv,
                                               TrainerStatus, Window, as_launch)


def _trainer_metrics() -> tuple[str, ...]:
    """The metric names of one trainer launch (collect(): the module docstring), as patterns."""
    telemetry_stats = ("mean", "min", "max", "n")
    return ("status", "reason", "note", "steps", "last_step", "dropped_rows", "cut_last_line", "first_bad_row",
            *(f"window.{k}" for k in ("last", "warmup", "n", "first_step", "last_step")),
            *(f"{c}.{s}" for c in METRIC_COLUMNS for s in STAT_NAMES), *DERIVED_KEYS,
            "world_size", "csv", "tflops_per_s", "trainer_status", "compression",
            *(f"context.{k}" for k in ("seq_len", "micro_batch", "accum", "world_size", "global_batch_tokens",
                                       "n_params", "precision", "flops_per_token", "peak_flops", "device")),
            "launcher", "nnodes", "nodes.<i>", "slurm_job", "gpus.<i>", "toks_per_s_per_node",
            "summary.*", "startup.*", "time_to_first_step_s",
            *(f"{k}.{s}" for k in ("gpu_util", "gpu_mem_used_gb", "power_w", "sm_clock_mhz", "temp_c", "cpu_util",
                                   "rss_gb") for s in telemetry_stats),
            "throttled", "throttle_reasons.*", "pcie_gen_min", "pcie_width_min", "ecc_uncorrected", "xid_errors",
            "telemetry.*", "gpu_diagnosis.*", "interference.*",
            "sdpa_audit.calls", "sdpa_audit.backends.*", "sdpa_audit.fallbacks", "sdpa_audit.by_site.*")


TRAINER_METRICS = _trainer_metrics()  # a trainer launch's metrics (a step's, or each run's)
RUN_METRICS = tuple(f"runs.<label>.{m}" for m in TRAINER_METRICS)  # a multi-run kind's runs, as criteria read them
# The metrics of a trainer launch that measure speed (validation.execution.evidence): throughput, step and start-up times,
# utilisation; not the loss, memory or what the run was (its config, its status).
TRAINER_PERFORMANCE = ("toks_per_s", "toks_per_s_per_gpu", "toks_per_s_per_node", "step_time_s", "mfu",
                       "tflops_per_s", "throughput_stable", "throughput_drift", "scaling_efficiency",
                       "time_to_first_step_s", "startup", "gpu_util", "summary.tokens_per_s", "summary.samples_per_s",
                       "summary.avg_step_time_s", "summary.min_step_time_s", "summary.max_step_time_s",
                       "summary.avg_step_time_excl_first_s", "summary.comm_time_s", "summary.comm_share")
RUN_PERFORMANCE = tuple(f"runs.<label>.{m}" for m in TRAINER_PERFORMANCE)


@dataclasses.dataclass(frozen=True)
class TrainerResult(StepRecord):
    """The step record of a kind whose step is one trainer launch: its metrics are the launch's (collect())."""
    metrics: LaunchMetrics = dataclasses.field(default_factory=LaunchMetrics)


@dataclasses.dataclass(frozen=True)
class Launched:
    """One trainer launch run to its end (launch_one): what it was, how it ended, and its metrics (collect())."""
    spec: LaunchSpec
    lr: Any  # validation.launch.LaunchResult
    status: str
    reason: str | None
    metrics: LaunchMetrics


class TrainerKind(StepKind):
    """A kind whose step is one trainer launch (train, longrun, profile); sweep and ab reuse its helpers."""

    trainer = True
    metrics = TRAINER_METRICS
    performance = TRAINER_PERFORMANCE
    result_type = TrainerResult

    def launches(self, step: Step, winners, run_dir) -> list[LaunchSpec]:
        return [trainer_launch(step, step.launch, "", step.name, winners, run_dir)]

    def run(self, options, ctx) -> TrainerResult:
        one = launch_one(ctx)
        return TrainerResult(status=one.status, reason=one.reason, metrics=one.metrics)

    def blocks(self, result: StepRecord) -> list[Block]:
        """The launch's row (tokens/s, loss, memory, status), its environment and notes, its Training Summary and
        its start-up."""
        step = self.read(result)
        return trainer_blocks(str(step.name), step)

    def plots(self, name: str, result: StepRecord, plotter) -> None:
        """The launch's device telemetry over time (GPU utilisation and power where present, CPU and RSS)."""
        plotter.telemetry(name, self.read(result))

    def trainer_launches(self, result: StepRecord) -> list[tuple[str, dict, str | None]]:
        """(label, metrics, status) per trainer launch: "step[label]", or "step[label, repeat N]" for a label that
        ran more than once (a sweep's or an A/B's repeats), so that every run has its own row in `compare`."""
        step = self.read(result)
        if not step.runs:
            return super().trainer_launches(step)
        counts = Counter(str(r.label) for r in step.runs)
        out = []
        for run in step.runs:
            label = str(run.label)
            if counts[label] > 1 and run.repeat is not None:
                label = f"{label}, repeat {run.repeat + 1}"
            out.append((f"{step.name}[{label}]", written(run.metrics), run.status))
        return out


# ---------------------------------------------------------------------------------------------- planning
def trainer_args(args: dict[str, Any]) -> list[str]:
    """{"steps": 300, "ddp": 1, "fsdp": True, "compile": False} -> ["--steps", "300", "--ddp", "1", "--fsdp"]
    (the trainer's own rule: nsa.training.flags.tokens)."""
    return [token for key, value in args.items() for token in flag_tokens(key, value)]


def trainer_launch(step: Step, launch: LaunchSettings, label: str, rel_dir: str, winners, run_dir,
                   extra_args: dict | None = None, extra_env: dict | None = None, params: dict | None = None,
                   repeat: int = 0, window: int | None = None) -> LaunchSpec:
    """One `python -m nsa.training` launch of `step` in RUN_DIR/rel_dir (out_dir rel_dir/out), with the step's
    env/args plus `extra_env`/`extra_args` (a sweep point, an A/B variant); ${x.winner...} references resolved
    from `winners`, or left as text in plan mode (winners None) and listed in `unresolved`."""
    env = {**launch.env, **(extra_env or {})}
    args = {**launch.args, **(extra_args or {})}
    unresolved = sorted({r for v in list(env.values()) + list(args.values()) for r in references(v)})
    if winners is not None:
        env = {k: resolve_references(v, winners) for k, v in env.items()}
        args = {k: resolve_references(v, winners) for k, v in args.items()}
        unresolved = []
    argv = [sys.executable, "-m", "nsa.training"]
    if launch.config:
        argv += ["--config", launch.config]
    out_dir = f"{rel_dir}/out"
    argv += trainer_args(args) + ["--out-dir", run_path(run_dir, out_dir)]
    return LaunchSpec(
        argv=argv, env=env, inherit_env=True, run_dir=run_dir, step_dir=step_dir(run_dir, rel_dir),
        trainer_out_dir=step_dir(run_dir, out_dir), nproc_per_node=launch.nproc_per_node, nnodes=launch.nnodes,
        torchrun=launch.launcher.type == "slurm",  # a one-rank Slurm job too (LaunchSpec.uses_torchrun decides)
        timeout_s=launch.timeout_s, stall_timeout_s=launch.stall_timeout_s,
        expected_ranks=launch.nproc_per_node * launch.nnodes,
        master_port=None if launch.master_port == "auto" else int(launch.master_port),
        port_retries=launch.port_retries, telemetry_s=TELEMETRY_INTERVAL_S, **launch_identity(step, label),
        params=params or {}, repeat=repeat, unresolved=unresolved, window=window)


# ---------------------------------------------------------------------------------------------- running
def collect(ctx, step: Step, spec: LaunchSpec, lr) -> tuple[str, str | None, dict]:
    """(status, reason, metrics) of one trainer launch, from the files in its out_dir that this launch wrote (those an
    earlier launch left there read as absent: earlier_files)."""
    out_dir = ctx.run_dir / spec.out_dir
    window = metrics.Window(last=spec.window or step.launch.window, warmup=step.launch.warmup_steps)
    earlier = earlier_files(out_dir, launch_started(lr))
    csv_path = out_dir / TRAINING_CSV
    read = (metrics.unread_csv(csv_path, "only an earlier launch's (last written before this launch started)")
            if TRAINING_CSV in earlier else metrics.read_training_csv(csv_path))
    m = metrics.summarize(read, window, world_size=spec.world_size)
    m["world_size"] = spec.world_size
    m["csv"] = ctx.rel(csv_path)
    env = {} if ENV_JSON in earlier else contracts.read_env_json(out_dir)
    m["context"] = contracts.run_context(env)
    so_far = decode(LaunchMetrics, m, "metrics")
    mean = (so_far.toks_per_s or Stat()).mean
    m["tflops_per_s"] = metrics.model_tflops((so_far.context or RunContext()).flops_per_token, mean)
    m.update(_node_metrics(ctx, spec, lr, env, mean))
    m.update(train_report.launch_metrics(ctx, spec, out_dir, read, m, earlier))  # summary, startup, telemetry
    status = None if STATUS_JSON in earlier else contracts.read_status_json(out_dir)
    trainer_status = decode(TrainerStatus, status or {}, "status.json", lenient=True)
    ended = m["trainer_status"] = trainer_status.status
    m["compression"] = contracts.ddp_compression(env)
    written = {} if SDPA_AUDIT_JSON in earlier else contracts.read_sdpa_audit(out_dir)
    if written:
        audit = decode(SdpaAudit, written, "sdpa_audit.json", lenient=True)
        m["sdpa_audit"] = encode(SdpaAudit(
            calls=0 if audit.calls is None else audit.calls, backends=[] if audit.backends is None else audit.backends,
            fallbacks=sum(r.calls for r in audit.by_site if r.device == "cuda" and r.backend == "math"),
            by_site=audit.by_site))
    if lr.status != "ok":
        return lr.status, lr.reason, m
    if ended != "completed":
        return "failed", not_completed(out_dir, earlier, trainer_status), m
    return csv_verdict(m, trainer_status.step)


def not_completed(out_dir: Path, earlier: Collection[str], status: TrainerStatus) -> str:
    """Why a launch that ended cleanly did not complete, by its status.json (`status`; `earlier`: earlier_files):
    how the trainer says its run ended and why ("trainer ended halted: <reason>"), or that it left no word of its
    own: no status.json, one that cannot be read, an earlier launch's, or one still saying "running"."""
    ended = status.status
    if ended is None:
        if STATUS_JSON in earlier:
            return ("the trainer wrote no status.json of its own: the one in its out_dir is an earlier launch's "
                    "(last written before this launch started)")
        if (Path(out_dir) / STATUS_JSON).exists():
            return ("the trainer's status.json cannot be read (no JSON object with a status as text): how its run "
                    "ended is not known")
        return "the trainer wrote no status.json: how its run ended is not known"
    if ended == "running":
        return "the trainer's status.json still says running: the trainer ended without writing how its run ended"
    return f"trainer ended {ended}" + (f": {status.reason}" if status.reason not in (None, "") else "")


# A file last written more than this before a launch started is an earlier launch's: file times can lag this
# machine's clock by the file system's granularity, and on a shared file system by the clock of the node or server
# that wrote them; an earlier launch's files are older than that by the start-up of a whole nsa-validate run
EARLIER_TOLERANCE_S = 5.0
# The trainer's files that collect() reads from its out_dir
TRAINER_FILES = (TRAINING_CSV, ENV_JSON, STATUS_JSON, SUMMARY_JSON, TIMELINE_JSON, SDPA_AUDIT_JSON)


def launch_started(lr) -> float | None:
    """When a launch started (unix time): now less its duration (collect runs as it ends); None when not known."""
    duration = None if lr is None else finite(lr.duration_s)
    return None if duration is None or duration < 0 else time.time() - duration


def written_before(path: Path, since: float | None) -> bool:
    """Whether `path` was last written before a launch that started at `since` (EARLIER_TOLERANCE_S): an earlier
    launch's file, left in the same directory. False when it is not there or `since` is not known."""
    try:
        return since is not None and Path(path).stat().st_mtime < since - EARLIER_TOLERANCE_S
    except OSError:
        return False


def earlier_files(out_dir: Path, since: float | None) -> set[str]:
    """The trainer files in `out_dir` an earlier launch left there (written_before `since`: a --rerun or --resume
    whose trainer died before it moved them to previous_runs/ or wrote its own). They are not this launch's
    figures: collect() reads them as absent."""
    return {name for name in TRAINER_FILES if written_before(Path(out_dir) / name, since)}


def _node_metrics(ctx, spec: LaunchSpec, lr, env: dict, mean: Any) -> dict:
    """Launcher, nodes (from the trainer's env.json: every node of the job), per-node throughput (`mean`: the
    window's mean tokens/s, all nodes); every node's record (host, GPUs, NCCL/IB/Slurm environment) is added to the
    run's environment["nodes"]."""
    nodes = decode(TrainerEnv, env, "env.json", lenient=True).job_nodes()
    known = ctx.results["environment"].setdefault("nodes", {})
    for node in nodes:
        if node.node:
            known.setdefault(str(node.node), {}).update({"host": node.host, "gpus": node.gpus, "env": node.env})
    return {"launcher": spec.launcher, "nnodes": spec.nnodes,
            "nodes": [str(n.node) for n in nodes] or list(lr.nodes),
            "slurm_job": lr.job_id,
            "gpus": [str(g) for n in nodes for g in (n.gpus or [])],
            "toks_per_s_per_node": mean / spec.nnodes if isinstance(mean, (int, float)) else None}


def launch_one(ctx) -> Launched:
    """Run the step's one trainer launch (ctx.launches[0]) to its end and collect it."""
    spec = ctx.launches[0]
    lr = ctx.launch(spec, 0, 1)
    status, reason, m = collect(ctx, ctx.step, spec, lr)
    return Launched(spec, lr, status, reason, decode(LaunchMetrics, m, "metrics"))


def declared_pair_noise(ctx) -> PairNoise | None:
    """The least noise of one repeat in a paired decision (A/B, sweep, triage) of this run: the runbook's declared
    launch noise (its `compare` mapping, stored in results.json's runbook record; significance.pair_noise_from), or
    None when it declares none."""
    return pair_noise_from(read_run(_results(ctx)).runbook.compare)


def measured_launch_noise(ctx, metric: str = "toks_per_s"):
    """The run-to-run variation of a run's mean of `metric` this validation run measured in repeats before the step
    (significance.windows.measured_run_noise), or None (no repeats yet, or a context without results)."""
    results = _results(ctx)
    return measured_run_noise(results, ctx.run_dir, metric) if isinstance(results, dict) else None


def launch_noise(ctx) -> tuple[str, float | None, float | None, str | None]:
    """(source, sd, df, detail) of one launch's log tokens/s from launch to launch, for a figure that is a ratio of
    launches (a scaling efficiency): one launch's share of the runbook's declared launch noise (`compare`) or the
    run-to-run noise measured earlier in this run (measured_launch_noise), the larger (PairNoise.hold: source
    "declared" or "measured"), else the measured alone; ("unknown", None, None, None) without either."""
    floor = declared_pair_noise(ctx)
    measured = measured_launch_noise(ctx)
    if floor is not None:
        chosen = floor.hold(measured)
        if chosen is not measured:
            return ("declared", chosen.total, chosen.df,
                    f"one launch's share of {floor.source}, sd {chosen.total:.1%} of one launch's log tokens/s "
                    f"({chosen.df:g} df, t quantile)"
                    + (f"; the {measured.total:.1%} measured earlier in this run is smaller" if measured else ""))
    if measured is not None:
        return ("measured", measured.total, measured.df,
                f"the run-to-run noise measured earlier in this run, {measured.describe()}"
                + (f", larger than one launch's share of {floor.source}" if floor is not None else ""))
    return "unknown", None, None, None


def _results(ctx):
    """The run's results as results.json holds them, or None for a context without them (a plan, a test's)."""
    return getattr(ctx, "results", None)


def order_seed(step: Step, run_dir: Path | None) -> int:
    """The seed of a multi-run step's random run order (validation.analysis.significance.interleaved_order): from the run
    directory's absolute path and the step's name, so that it differs between runs and stays the same when a run
    is resumed; "RUN_DIR" in plan mode. 0 .. 2**31 - 1."""
    base = str(Path(run_dir).resolve()) if run_dir is not None else "RUN_DIR"
    return int.from_bytes(hashlib.sha256(f"{base}:{step.name}".encode()).digest()[:4], "big") >> 1


def run_order(labels: list[str], repeats: int, seed: int) -> list[tuple[int, str]]:
    """(repeat, label) in run order: every repeat runs each label once, in a random order drawn per repeat."""
    return interleaved_order(labels, repeats, seed)


def run_values(run_dir: Path, step: Step, run: dict, metric: str) -> list[float] | float | None:
    """What a significance decision needs of one run (validation.analysis.significance.decide): the per-step values of
    `metric` over the window the launch was summarised with (its metrics' window: an A/B variant's own `window`,
    else the step's; the figures the report shows for it), else the window mean from the run's summary (a metric
    that is not a training.csv column), else None (a failed run, or no such metric)."""
    if decode(LaunchRun, run, "run", lenient=True).status != "passed":
        return None
    m = run.get("metrics") or {}
    if decode(LaunchMetrics, m, "run.metrics", lenient=True).csv:  # the same values compare reads for this launch (significance.windows.launch_series)
        values = launch_series(Path(run_dir), m, metric,
                               default=metrics.Window(step.launch.window, step.launch.warmup_steps))
        if values:
            return values
    mean = finite((m.get(metric) or {}).get("mean") if isinstance(m.get(metric), dict) else m.get(metric))
    return mean


@dataclasses.dataclass(frozen=True)
class Runs:
    """What run_all ran: every run in run order (a repeat run again in place of the one it replaced), the runs
    replaced (superseded, with superseded_by), the notes saying what was run again and why, and the problems
    ("label: reason" of the runs that did not pass)."""
    runs: list[LaunchRun]
    superseded: list[LaunchRun] | None = None
    notes: list[str] | None = None
    problems: list[str] = dataclasses.field(default_factory=list)

    def partial(self) -> StepRecord:
        """The step record so far (what ctx.save writes while the step runs)."""
        return StepRecord(runs=self.runs, superseded=self.superseded, notes=self.notes)


def run_all(ctx, retry_disturbed: bool = False, launches: list[LaunchSpec] | None = None,
            on_progress: Any = None) -> Runs:
    """Run every launch in order (ctx.launches, or `launches`: a sweep's points, an A/B's variants and repeats),
    each collected into a LaunchRun and saved as soon as it ends (`on_progress(Runs)`, by default
    ctx.save(runs.partial())).

    retry_disturbed (the kinds that decide from interleaved repeats: ab, sweep, triage): a repeat in which a launch
    was measured under interference (validation.analysis.interference.run_disturbed) is run again, the whole repeat in its
    order, up to the step's `retry_disturbed` times (LaunchSettings, default 1), each attempt in <dir>_retry<n>.
    A decision never stands on disturbed runs; run again, a passing neighbour leaves the decision its evidence.
    The runs an attempt replaces move to superseded (with superseded_by), their files kept, and a note says what
    was run again and why."""
    step = ctx.step
    launches = ctx.launches if launches is None else launches
    save = on_progress or (lambda so_far: ctx.save(so_far.partial()))
    runs: list[LaunchRun] = []
    superseded: list[LaunchRun] = []
    notes: list[str] = []

    def so_far() -> Runs:
        return Runs(list(runs), list(superseded) or None, list(notes) or None)

    def one(spec: LaunchSpec, index: int, total: int) -> LaunchRun:
        lr = ctx.launch(spec, index, total)
        status, reason, m = collect(ctx, step, spec, lr)
        return LaunchRun(label=spec.label, params=dict(spec.params), status=status, reason=reason, dir=spec.dir,
                         command=list(lr.argv), metrics=decode(LaunchMetrics, m, "metrics"), repeat=spec.repeat)

    for i, spec in enumerate(launches):
        runs.append(one(spec, i, len(launches)))
        save(so_far())
    attempts = step.launch.retry_disturbed if retry_disturbed else 0
    for attempt in range(1, attempts + 1):
        again = sorted({r.repeat for r in runs if run_disturbed(encode(r)) and r.repeat is not None})
        if not again:
            break
        block = [(i, spec) for i, spec in enumerate(launches) if spec.repeat in again]
        shaken = [str(runs[i].dir) for i, _ in block if run_disturbed(encode(runs[i]))]
        for k, (i, spec) in enumerate(block):
            again_spec = retry_spec(spec, attempt)
            run = one(again_spec, k, len(block))
            superseded.append(dataclasses.replace(runs[i], superseded_by=again_spec.dir))
            runs[i] = run
            save(so_far())
        notes.append(
            f"run again (attempt {attempt + 1} of repeat(s) {', '.join(str(r + 1) for r in again)}, every launch of "
            f"the repeat): other work used the machine while {', '.join(shaken)} ran; the runs replaced are kept "
            "in superseded")
    problems = [f"{r.label}: {r.reason}" for r in runs if r.status != "passed"]
    return Runs(runs, superseded or None, notes or None, problems)


def retry_spec(spec: LaunchSpec, attempt: int) -> LaunchSpec:
    """`spec` run again in <dir>_retry<attempt> (its trainer's --out-dir moved with it)."""
    rel = f"{spec.dir}_retry{attempt}"
    new_dir = step_dir(spec.run_dir, rel)
    out = None if spec.trainer_out_dir is None else new_dir / "out"
    argv = list(spec.argv)
    if out is not None and "--out-dir" in argv:
        argv[argv.index("--out-dir") + 1] = str(out)
    return dataclasses.replace(spec, argv=argv, step_dir=new_dir, trainer_out_dir=out)


def csv_verdict(m: dict, trainer_steps: Any) -> tuple[str, str | None, dict]:
    """(status, reason, m) of a launch whose trainer completed, from its training.csv summary `m`.

    A missing, empty or unparseable file fails. So does a row left out anywhere but at the very end (a damaged
    row: the numbers around it cannot be trusted either), and a file that ends before the trainer's last step
    by more than a cut-off last line (rows were lost). A last line cut off mid-row, what a writer killed while
    writing leaves, passes with that said in the reason."""
    csv = decode(LaunchMetrics, m, "metrics")
    if csv.status not in USABLE_STATUSES:
        reason = str(csv.reason)
        if reason.startswith(f"{csv.status}: "):  # "missing: /path" -> "training.csv missing: /path"
            reason = reason[len(str(csv.status)) + 2:]
        return "failed", f"training.csv {csv.status}: {reason}", m
    dropped, cut = csv.dropped_rows or 0, bool(csv.cut_last_line)
    if dropped > (1 if cut else 0):
        return "failed", (f"training.csv damaged: {dropped} unparseable row(s) left out (first at "
                          f"{csv.first_bad_row})"), m
    last = csv.last_step
    if isinstance(trainer_steps, int) and last is not None and last + (1 if cut else 0) < trainer_steps:
        return "failed", (f"training.csv ends at step {last} but the trainer completed step {trainer_steps}: "
                          f"{trainer_steps - last - (1 if cut else 0)} row(s) lost"), m
    if cut:
        return "passed", (f"training.csv: the last line was cut off mid-row and left out (1 row); statistics use "
                          f"steps {csv.window.first_step}-{csv.window.last_step}"), m
    return "passed", None, m


# ---------------------------------------------------------------------------------------------- report
def config_path(step: StepRecord) -> str:
    """The model/training config of a launch: CONFIG in its env, else --config in its command."""
    env = step.env
    if env.get("CONFIG"):
        return str(env["CONFIG"])
    argv = [str(a) for a in as_list(step.command)]
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return "—"


def trainer_blocks(label: str, step: StepRecord) -> list[Block]:
    """A trainer launch's part of a step section (train, longrun, profile): its row (tokens/s over the window, per
    GPU or rank, loss, memory, status), its environment, the context of the tokens/s, its notes, its Training Summary
    and its start-up."""
    raw = written(step.metrics)
    m = as_launch(step.metrics)
    toks = m.toks_per_s or Stat()
    # a CPU run has ranks, not GPUs: its column says "Per rank"
    cpu = (m.context or RunContext()).on_cpu() is True
    status = status_view(step.status)
    out: list[Block] = [
        Table((Column("Run"), Column("Config"), Column("Ranks", numeric=True), Column("Window"),
               Column("Tokens/s, window mean ± stdev (all ranks)", numeric=True, wrap=True),
               Column("Per rank, window mean" if cpu else "Per GPU, window mean", numeric=True),
               Column("CV", numeric=True), Column("Loss"), Column("Peak mem", numeric=True), Column("Status")),
              [(label, code(config_path(step)), fmt_num(m.world_size), launch_window_text(m.window),
                mean_pm({"mean": toks.mean, "stdev": toks.stdev}), fmt_rate(m.toks_per_s_per_gpu), fmt_pct(toks.cv),
                loss_text({"first_loss": m.first_loss, "final_loss": m.final_loss, "loss_drop": m.loss_drop}),
                fmt_gb(m.mem_peak_gb), Badge(status["label"], status["css"]))]),
        Paragraph(f"Environment: {env_text(step.env)}", style="context")]
    context = context_text(raw)
    if context:
        out.append(Paragraph(f"Context of the tokens/s: {context}", style="context"))
    notes = train_notes(m, recorded=raw.keys()) + train_report.telemetry_notes(m)
    if notes:
        out.append(Bullets(notes))
    return out + train_report.summary_blocks(m) + train_report.startup_blocks(m)


def launch_window_text(w: Window) -> str:
    """The statistics window of a launch: "steps 41–60 (n=20)", "last 0 steps" (no row in it), or n/a."""
    if w.first_step is not None and w.last_step is not None:
        text = f"steps {fmt_num(w.first_step)}–{fmt_num(w.last_step)}"
        return f"{text} (n={fmt_num(w.n)})" if w.n is not None else text
    return f"last {fmt_num(w.n)} steps" if w.n is not None else NA


def train_notes(m: LaunchMetrics, recorded: Collection[str]) -> list[str]:
    """The notes under a launch's row: its training.csv's state, the compression, trainer status and stability
    (each where the launch's `recorded` keys have it), the SDPA audit, its nodes, its scaling efficiency."""
    notes = []
    csv_status = m.status
    if csv_status not in (None, "ok"):
        detail = str(m.reason or m.note or NA)
        if detail.startswith(f"{csv_status}: "):  # the reader's reason already names the status
            detail = detail[len(csv_status) + 2:]
        notes.append(f"training.csv {csv_status}: {detail}")
    elif m.note:
        notes.append(f"training.csv: {m.note}")
    if "compression" in recorded:
        notes.append(f"DDP gradient compression: {m.compression or 'none'}")
    if "trainer_status" in recorded:
        notes.append(f"Trainer status: {fmt_num(m.trainer_status)}")
    if "throughput_stable" in recorded:
        notes.append(f"Throughput stable: {fmt_num(m.throughput_stable)}")
    audit = m.sdpa_audit
    if audit is not None:
        per_backend: Counter = Counter()
        for row in audit.by_site:
            calls = finite(row.calls)
            per_backend[f"{row.backend} on {row.device}"] += int(calls) if calls is not None else 0
        if per_backend:
            backend_text = ", ".join(f"{k}={per_backend[k]:,}" for k in sorted(per_backend))
        elif isinstance(audit.backends, dict):
            backends = audit.backends
            backend_text = ", ".join(f"{k}={fmt_num(backends[k])}" for k in sorted(backends, key=str)) or NA
        else:
            backend_text = fmt_num(sorted(str(b) for b in as_list(audit.backends)))
        notes.append(f"SDPA audit: {fmt_num(audit.calls)} calls; backends: {backend_text}; "
                     f"fallbacks to math on GPU: {fmt_num(audit.fallbacks)}")
    if len(m.nodes) > 1 or finite(m.nnodes) not in (None, 1):
        job = f", Slurm job {m.slurm_job}" if m.slurm_job else ""
        notes.append(f"Nodes: {', '.join(map(str, m.nodes)) or '—'} ({m.launcher}{job}); "
                     f"{fmt_rate(finite(m.toks_per_s_per_node))} tokens/s per node")
    if finite(m.scaling_efficiency) is not None:
        notes.append(f"Scaling efficiency: {fmt_num(m.scaling_efficiency)}")
    return notes


