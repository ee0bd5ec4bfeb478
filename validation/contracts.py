"""The trainer's files the orchestrator reads, each through the one reader defined here or named below.

Everything nsa-validate learns about a trainer run comes from files the trainer writes into its out_dir for that
purpose (names from nsa.training.outputs, which documents their content); it never reads a trainer's state out of its
console log. docs/architecture.md lists every file with its writer and its reader:

    training.csv            validation.analysis.metrics.read_training_csv (metrics, plots, A/B samples, compare)
    heartbeat_rank{r}.jsonl nsa.training.watchdog.check (the launcher's progress and stall watch)
    env.json                read_env_json: nodes of the job, the toggles in effect (DDP compression), the run
                            shape beside its throughput (run_context: resolved config, n_params, flops_per_token)
    status.json             read_status_json: how the run ended, its notes (settings the trainer ignored)
    sdpa_audit.json         read_sdpa_audit: SDPA backends per call site (NSA_SDPA_AUDIT=1)
    error_rank{r}.txt       error_files: the failing rank's traceback (validation.launch.diagnosis)
    stackdump_rank{r}*.txt  stack_dumps: where stalled ranks were (validation.launch.diagnosis, longrun)
    .HALT                   halted: the watchdog stopped the run
    profile/trace_rank0_*   validation.kinds.profile.profile_summary (torch profiler chrome trace)
    summary.json            read_summary: the Training Summary (nsa.training.outputs.read_summary, checked)
    timeline.json           read_timeline: start-up milestones, time to first step (nsa.training.outputs.read_timeline)

and one file the launcher writes beside a trainer launch, in its step directory:

    telemetry.csv           read_telemetry: device telemetry (validation.launch.telemetry: one sampler per node;
                            telemetry-<node>.csv for a Slurm job's nodes)

Every reader returns a value for a missing or damaged file (None, {} or []), never raises: a dead run still gets
a clear verdict from what is there.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

from nsa.training import outputs
from nsa.training.outputs import ENV_JSON, SDPA_AUDIT_JSON, STATUS_JSON, ContractError
from nsa.training.watchdog import HALT_NAME
from validation.results.codec import decode
from validation.results.trainer_launch import TrainerEnv, TrainerStatus

_ERROR_FILE_RE = re.compile(r"^error_rank(\d+)\.txt$")
_TELEMETRY_RE = re.compile(r"^telemetry(?:-(.+))?\.csv$")

_TEXT_COLUMNS = ("node", "throttle", "other_top")  # telemetry columns read as text; the others are numbers
TELEMETRY_CSV = "telemetry.csv"  # a local launch's; telemetry-<node>.csv per node of a Slurm job
# telemetry.csv, written by validation.launch.telemetry (its sampler) and read by read_telemetry: every column and
# what it means (the one place they are documented).
TELEMETRY_COLUMNS = {
    "time": "unix time of the sample (s)",
    "elapsed_s": "seconds since the sampler started",
    "node": "host name of the node sampled",
    "sample": "sample number, 0-based (the rows of one sample share it: one per GPU)",
    "gpu": "NVML index of the GPU; empty without one (or without pynvml)",
    "ours": "1 when a process of the launch has a compute context on this GPU, 0 when none has, empty when unknown",
    "gpu_util_pct": "NVML utilization.gpu: percent of the last sample period a kernel was running",
    "mem_used_gb": "GPU memory used, GiB (all processes)",
    "mem_total_gb": "GPU memory, GiB",
    "power_w": "power draw, W",
    "sm_clock_mhz": "SM clock, MHz",
    "temp_c": "GPU temperature, degrees C",
    "throttle": "active clock throttle reasons, '+'-joined (THROTTLE_REASONS names); 'none' when no reason is "
                "active; empty when the driver does not say",
    "pcie_gen": "current PCIe link generation",
    "pcie_gen_max": "maximum PCIe link generation of the GPU and its slot",
    "pcie_width": "current PCIe link width (lanes)",
    "pcie_width_max": "maximum PCIe link width",
    "ecc_corrected": "volatile corrected ECC errors (since the driver loaded); empty without ECC",
    "ecc_uncorrected": "volatile uncorrected ECC errors; empty without ECC",
    "xid_errors": "Xid critical-error events NVML delivered since the sampler started (empty where the GPU's Xid "
                  "events cannot be watched: NVML_ERROR_NOT_SUPPORTED)",
    "xid_last": "the last Xid code seen (empty: none)",
    "other_gpu_procs": "compute processes on this GPU that are not the run's (NVML); empty when unknown",
    "other_gpu_mem_gb": "GPU memory those other processes use, GiB (empty where NVML does not know a process's)",
    "cpu_util_pct": "CPU time of the launch's process tree over the period, percent of one core",
    "rss_gb": "sum of the resident set sizes of the launch's processes, GiB",
    "procs": "processes in the launch's tree",
    "ncpu": "CPUs the run may use (its affinity: a container's or a Slurm task's cpuset; else the machine's)",
    "step_cores": "cores the launch is set to use (its ranks on this node times their threads; at most ncpu)",
    "host_cpu_pct": "CPU time of every process on the machine over the period (user + nice + system), percent of "
                    "one core",
    "other_cpu_pct": "CPU time of the processes that are not the run's own (nsa-validate and everything below it) "
                     "over the period, percent of one core: host_cpu_pct less the run's",
    "steal_pct": "CPU time the hypervisor gave other guests over the period, percent of one core",
    "other_top": "the busiest other processes over the period, 'name[pid] percent; ...'; empty unless the others "
                 "used more than validation.launch.telemetry.OTHER_CPU_SLACK_CORES",
    "sampler_cpu_ms": "CPU time the sampler itself spent on this sample, ms (its cost)",
}

_SET_ASIDE_RE = re.compile(r"\.(?:prev|attempt)\d+\.csv$")  # validation.launch.local.set_aside: earlier launches


def _read_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_env_json(out_dir: Path) -> dict[str, Any]:
    """The trainer's env.json ({} when missing or unreadable)."""
    return _read_object(Path(out_dir) / ENV_JSON) or {}


def read_status_json(out_dir: Path | None, since: float | None = None) -> dict[str, Any] | None:
    """The trainer's status.json, or None (missing, unreadable, or older than `since` - 1 s: an earlier launch's)."""
    if out_dir is None:
        return None
    path = Path(out_dir) / STATUS_JSON
    if since is not None:
        try:
            if path.stat().st_mtime < since - 1.0:
                return None
        except OSError:
            return None
    return _read_object(path)


def read_sdpa_audit(out_dir: Path) -> dict[str, Any]:
    """The trainer's sdpa_audit.json ({} when the audit was off or the file is unreadable)."""
    return _read_object(Path(out_dir) / SDPA_AUDIT_JSON) or {}


def ddp_compression(env: dict[str, Any]) -> str | None:
    """The DDP gradient compression a run used, from its env.json: the NSA_DDP_COMPRESS toggle in effect when the
    run was DDP (the trainer applies it to DDP only), else None."""
    read = decode(TrainerEnv, env, "env.json", lenient=True)
    value = read.toggles.get("ddp_compress")
    if read.parallel != "ddp" or value in (None, "", "none"):
        return None
    return str(value)


def _positive(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= 0:
        return None
    return value


def run_context(env: dict[str, Any]) -> dict[str, Any]:
    """What a run's tokens/s means, from its env.json (the resolved config the trainer ran, after every flag and
    override, and the model it built): {"seq_len", "micro_batch" (train.batch_size: sequences per rank per
    micro-step), "accum", "world_size", "global_batch_tokens" (seq_len x micro_batch x accum x world_size: tokens
    per optimizer step), "n_params", "precision", "flops_per_token", "peak_flops" (per device, None when unknown),
    "device"}. A field the file lacks is None; {} without an env.json."""
    if not isinstance(env, dict) or not env:
        return {}
    read = decode(TrainerEnv, env, "env.json", lenient=True)
    train = read.config.train
    seq_len, micro, accum = _positive(train.seq_len), _positive(train.batch_size), _positive(train.accum)
    world = _positive(read.world_size)
    tokens = seq_len * micro * accum * world if None not in (seq_len, micro, accum, world) else None
    precision = train.precision
    return {"seq_len": seq_len, "micro_batch": micro, "accum": accum, "world_size": world,
            "global_batch_tokens": tokens, "n_params": _positive(read.n_params),
            "precision": str(precision) if precision else None,
            "flops_per_token": _positive(read.flops_per_token), "peak_flops": _positive(read.peak_flops),
            "device": str(read.device_name or read.device or "") or None}


def ignored_settings(status: dict[str, Any] | None, names: list[str]) -> list[str]:
    """Which of the environment variables `names` the trainer reported as ignored (status.json notes, e.g.
    "NSA_OPT_FUSED=1 is ignored: ..."), sorted."""
    notes = [n for n in decode(TrainerStatus, status or {}, "status.json", lenient=True).notes
             if isinstance(n, str) and "ignored" in n]
    # the name as a whole word: a note on NSA_X_Y is none on NSA_X
    return sorted({var for var in names for n in notes
                   if re.search(rf"(?<![A-Za-z0-9_]){re.escape(var)}(?![A-Za-z0-9_])", n)})


def error_files(out_dir: Path | None, since: float) -> list[tuple[float, int, Path]]:
    """(mtime, rank, path) of out_dir/error_rank{r}.txt written during this launch, oldest first."""
    if out_dir is None or not Path(out_dir).is_dir():
        return []
    found = []
    for path in Path(out_dir).glob("error_rank*.txt"):
        match = _ERROR_FILE_RE.match(path.name)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if match and mtime >= since - 1.0:
            found.append((mtime, int(match.group(1)), path))
    return sorted(found)


def stack_dumps(out_dir: Path | None, since: float = 0.0) -> list[Path]:
    """Non-empty out_dir/stackdump_*.txt modified at or after `since`, sorted by name."""
    if out_dir is None or not Path(out_dir).is_dir():
        return []
    dumps = []
    for path in sorted(Path(out_dir).glob("stackdump_*.txt")):
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_size > 0 and st.st_mtime >= since:
            dumps.append(path)
    return dumps


def halted(out_dir: Path) -> bool:
    """Whether the run's watchdog (or a user) left a .HALT file."""
    return (Path(out_dir) / HALT_NAME).exists()


def _read_checked(out_dir: Path | None, read, name: str) -> dict[str, Any]:
    """`read(out_dir)` (a nsa.training.outputs reader that raises ContractError); {} when the file is missing,
    {"problem": the one-line reason} when it exists but breaks its contract."""
    if out_dir is None:
        return {}
    try:
        return read(Path(out_dir))
    except ContractError as exc:
        return {"problem": str(exc)} if (Path(out_dir) / name).exists() else {}


def read_summary(out_dir: Path | None) -> dict[str, Any]:
    """The trainer's summary.json (the Training Summary, checked by nsa.training.outputs.read_summary); {} when
    missing or not following its contract (then {"problem": the one-line reason} when the file exists)."""
    return _read_checked(out_dir, outputs.read_summary, outputs.SUMMARY_JSON)


def read_timeline(out_dir: Path | None) -> dict[str, Any]:
    """The trainer's timeline.json (start-up milestones, nsa.training.outputs.read_timeline); {} when missing or
    not following its contract (then {"problem": the reason} when the file exists)."""
    return _read_checked(out_dir, outputs.read_timeline, outputs.TIMELINE_JSON)


def telemetry_files(step_dir: Path | None) -> list[Path]:
    """The telemetry files of one launch in its step directory: telemetry.csv (a local launch) or
    telemetry-<node>.csv (one per node of a Slurm job), sorted; earlier launches' set-aside copies excluded."""
    if step_dir is None or not Path(step_dir).is_dir():
        return []
    return sorted(p for p in Path(step_dir).iterdir()
                  if _TELEMETRY_RE.match(p.name) and not _SET_ASIDE_RE.search(p.name) and p.is_file())


def read_telemetry(step_dir: Path | None) -> list[dict[str, Any]]:
    """Every row of a launch's telemetry files (telemetry_files), columns as in TELEMETRY_COLUMNS:
    numbers as int/float, an empty cell as None, "node" and "throttle" as text ("none" when no reason was active);
    a row cut off by a killed writer, or with an unparseable time, is left out. [] without a file."""
    rows = []
    for path in telemetry_files(step_dir):
        try:
            with open(path, newline="", encoding="utf-8", errors="replace") as f:
                for raw in _rows(csv.DictReader(f)):
                    if None in raw or any(v is None for v in raw.values()):  # a row cut off by a killed writer
                        continue
                    row = {key: (raw.get(key) or None) if key in _TEXT_COLUMNS else _number(raw.get(key))
                           for key in TELEMETRY_COLUMNS}
                    if row["time"] is None:
                        continue
                    row["node"] = row["node"] or path.stem.partition("-")[2] or None
                    rows.append(row)
        except OSError:
            continue
    return rows


def _rows(reader: csv.DictReader):
    """The rows of `reader`, each line csv cannot read left out (a field past csv's size limit; a NUL byte a node's
    crash left, which Python 3.10's csv refuses): the rows before and after it are kept."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error:
            continue


def _number(text: Any) -> int | float | None:
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):  # nan, inf: no reading (an infinite time left every telemetry row unplottable)
        return None
    return int(value) if value.is_integer() and "." not in str(text) else value
