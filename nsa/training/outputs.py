"""The trainer's output files in out_dir, defined in one place (DESIGN.md "Contracts").

    training.csv            one row per optimizer step, columns TRAINING_COLUMNS, then COMM_COLUMNS (+ "mfu" when a
                            peak is known)
    summary.json            the Training Summary (rank 0, at the end of every run): SUMMARY_FIELDS; read_summary
    timeline.json           start-up milestones in seconds since process start: TIMELINE_MILESTONES; read_timeline
    val.csv                 one row per evaluation, columns VAL_COLUMNS
    heartbeat_rank{r}.jsonl every rank, one JSON object per line (nsa.training.heartbeat)
    env.json                versions, devices, world size, resolved config, git sha and git_dirty (tracked files
                            changed since that commit), NSA_*/NCCL_*/TORCH_* vars
    config.yaml             the resolved run config
    status.json             how the run ended: completed | halted | terminated | nonfinite | crashed ("phase":
                            "start-up" when it failed, or a KeyboardInterrupt ended it ("terminated"), before its
                            first step; a SIGTERM or SIGINT during start-up stops the run at its first step, with a
                            checkpoint, as in the loop), its step, checkpoint_step (the latest
                            complete checkpoint, where --resume continues; null when none), its notes. A run
                            stopped on a non-finite loss or gradient writes no checkpoint (its parameters were not
                            checked since their last update): the latest one stays the last good state, and the
                            reason names its step
    *.csv.damaged-<time>    a training.csv / val.csv a resume found damaged, as it was (CsvLog)
    error_rank{r}.txt       a failed rank's traceback, in the loop or at start-up (none for a KeyboardInterrupt:
                            a second Ctrl-C, or one before the stop handlers; the run ends "terminated")
    checkpoints/step_N/     checkpoints (nsa.training.checkpoint)
    sdpa_audit.json         NSA_SDPA_AUDIT=1: SDPA backend per call site (rank 0)
    stackdump_rank{r}*.txt  SIGUSR1 stack dumps
    tb/                     TensorBoard scalars (unless NSA_TB_DISABLE=1)
    profile/                torch profiler traces (train.profile_steps > 0)
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Mapping


TRAINING_CSV = "training.csv"
VAL_CSV = "val.csv"
ENV_JSON = "env.json"
STATUS_JSON = "status.json"
CONFIG_YAML = "config.yaml"
SDPA_AUDIT_JSON = "sdpa_audit.json"
SUMMARY_JSON = "summary.json"
TIMELINE_JSON = "timeline.json"

# Every training.csv column and what it means (the one place they are documented).
TRAINING_COLUMNS = {
    "step": "optimizer step, 1-based",
    "loss": "mean next-token cross entropy (nats) over every micro-batch of every rank in this step; "
            "not divided by the accumulation count",
    "lr": "learning rate used for this step",
    "toks_per_s": "GLOBAL tokens per second: world_size * batch_size * accum * seq_len / step_time_s",
    "step_time_s": "wall time of the step: data, forward, backward, communication, optimizer "
                   "(CUDA synchronized before the clock is read)",
    "grad_norm": "global L2 norm of all gradients before clipping (after the all-reduce)",
    "mem_alloc_gb": "rank 0 memory now, GiB: CUDA allocated by tensors; CPU resident set size",
    "mem_reserved_gb": "rank 0 peak memory, GiB: CUDA peak reserved by the caching allocator; CPU peak RSS",
}
# Optional columns (readers must not require them: files written before they existed lack them).
COMM_COLUMNS = {
    "comm_bytes": "bytes rank 0 sent through gradient / parameter collectives in this step (DDP bucket all-reduces; "
                  "FSDP2 all-gathers and reduce-scatters), nccl-tests message sizes (nsa.training.comm_count); "
                  "0 for a single process",
    "comm_time_s": "seconds in this step during which at least one of those collectives was in flight on rank 0 "
                   "(CPU/gloo only; empty on CUDA, where the profiler measures it)",
}
MFU_COLUMN = ("mfu", "model FLOPs utilization: flops_per_token * toks_per_s / (world_size * device peak); only "
                     "when the device's peak is known (GPU table in nsa.training.metrics or train.peak_tflops)")
VAL_COLUMNS = {"step": "optimizer step", "val_loss": "mean cross entropy over the evaluation batches of all ranks",
               "val_ppl": "exp(val_loss)"}

# What a run leaves in out_dir (archive_previous_run moves these aside for a fresh run).
RUN_ARTIFACTS = (TRAINING_CSV, VAL_CSV, ENV_JSON, STATUS_JSON, CONFIG_YAML, SDPA_AUDIT_JSON, SUMMARY_JSON,
                 TIMELINE_JSON, "heartbeat_rank*.jsonl",
                 "stackdump_*.txt", "error_rank*.txt", "checkpoints", "tb", "profile", ".HALT",
                 "*.csv.damaged-*")  # a damaged training.csv / val.csv as a resume found it (CsvLog)
# a node's record in env.json (nsa.training.distributed) and in a snapshot step's nodes/ (validation.launch.environment):
NODE_NAME_VARS = ("NSA_NODE_NAME", "SLURMD_NODENAME")  # the node's name: set by the launcher, else Slurm's, else host
NODE_ENV_PREFIXES = ("NCCL_", "UCX_", "MLX5_", "IBV_", "FI_", "GLOO_", "SLURM_JOB_ID", "SLURM_NNODES",
                     "SLURM_JOB_NODELIST", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
PREVIOUS_RUNS = "previous_runs"

# status.json "status" values
STATUSES = ("running", "completed", "halted", "terminated", "nonfinite", "crashed")


# ---------------------------------------------------------------------- summary.json (the Training Summary)
SUMMARY_SCHEMA = 1
# The collectives nsa.training.comm_count counts (the one definition; summary.json's comm entries name them).
COMM_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")

# Every summary.json field and what it means (the one place they are documented). Rank 0 writes the file at the end
# of every run (completed, halted, terminated, nonfinite, crashed), with what the run got to; the statistics cover
# the steps this process ran (after --resume, training.csv also holds the earlier process's rows). "Global"
# means all ranks together. Numbers a run cannot have (no step ran; memory reserved on CPU) are null.
SUMMARY_FIELDS = {
    "schema": f"summary.json format version ({SUMMARY_SCHEMA})",
    "status": "how the run ended: one of " + " | ".join(STATUSES[1:]),
    "parallel": "none | ddp | fsdp",
    "fsdp_reshard": "FSDP2 reshard_after_forward (true: full shard; false: the SHARD_GRAD_OP equivalent); null "
                    "unless FSDP2",
    "world_size": "ranks",
    "device": "cpu | cuda",
    "steps": "optimizer steps this process ran (= its training.csv rows)",
    "first_step": "step number of the first of them (null when none ran)",
    "last_step": "step number of the last of them (null when none ran)",
    "steps_planned": "train.steps",
    "tokens_per_step": "global tokens per optimizer step: world_size * batch_size * accum * seq_len",
    "samples_per_step": "global sequences per optimizer step: world_size * batch_size * accum",
    "avg_step_time_s": "mean of training.csv step_time_s over these steps",
    "min_step_time_s": "minimum step_time_s",
    "max_step_time_s": "maximum step_time_s",
    "avg_step_time_excl_first_s": "mean step_time_s without the first step (lazy init, compilation); null with "
                                  "one step",
    "samples_per_s": "global throughput over every step this process ran, the first included: steps * "
                     "samples_per_step / total step time",
    "tokens_per_s": "global throughput over every step this process ran, the first (lazy init, compilation, "
                    "Triton autotuning) included: steps * tokens_per_step / total step time",
    "throughput_first_step": "the first step the *_excl_first figures cover (first_step + 1; they end at last_step); "
                             "null with fewer than two steps",
    "samples_per_s_excl_first": "global steady-state throughput: samples_per_s without this process's first step "
                                "(as the validation suite's statistics leave out their warm-up); null with fewer "
                                "than two steps",
    "tokens_per_s_excl_first": "global steady-state throughput: tokens_per_s without this process's first step; null "
                               "with fewer than two steps",
    "mean_step_toks_per_s": "mean of training.csv's toks_per_s column (per-step rates averaged)",
    "avg_loss": "mean of training.csv's loss over these steps",
    "final_loss": "loss of the last step",
    "memory_kind": "cuda: CUDA caching-allocator figures of rank 0 | cpu_rss: rank 0's resident set size (the "
                   "whole process, runtime included; nothing is 'reserved' on CPU)",
    "peak_mem_alloc_gb": "GiB; cuda: torch.cuda.max_memory_allocated; cpu_rss: the process's peak RSS",
    "avg_mem_alloc_gb": "GiB; mean over steps of allocated memory after the step (cpu_rss: RSS)",
    "peak_mem_reserved_gb": "GiB; cuda: torch.cuda.max_memory_reserved; null on CPU",
    "avg_mem_reserved_gb": "GiB; cuda: mean over steps of torch.cuda.memory_reserved; null on CPU",
    "comm_time_s": "seconds, summed over steps, during which a gradient/parameter collective was in flight on rank "
                   "0 (CPU/gloo: measured at the calls; null on CUDA: use the profiler) - not 'exposed' time",
    "comm_share": "comm_time_s / total step time (null where comm_time_s is)",
    "comm_time_method": "how comm_time_s was measured, or why it was not",
    "comm": "collectives rank 0 issued in its training steps, counted at the calls from the tensors sent "
            "(nsa.training.comm_count): {counted_by, steps, per_step, first_step, total, constant, trainer}; "
            "per_step (the last step: DDP's steady state after its first iteration), first_step and total are "
            "lists of {kind, calls, bytes} with kind in " + " | ".join(COMM_KINDS) + " and bytes the nccl-tests "
            "message size; constant: every step after the first equal to per_step; trainer: the trainer's own "
            "per-step all-reduce of loss and stop flags ({per_step, total}), not part of the byte model",
    "comm_model": "the byte model's prediction for this run (nsa.training.comm_model.CommPrediction.to_dict): "
                  "{strategy, world_size, per_step, first_step, bytes_per_step, detail}, per_step/first_step as "
                  "{kind: {calls, bytes}}",
    "comm_model_matches": "true when the counted per_step and first_step equal the prediction exactly; null "
                          "when nothing was counted",
    "memory_model": "bytes per rank predicted by nsa.training.comm_model.memory_model (params, grads, "
                    "optimizer_state, buffers, activations, total) beside the measured peaks above; "
                    "activations_basis: whether activations (and so total) is the exact CPU count or, off CPU, an "
                    "estimate (nsa.training.comm_model.activations_basis)",
}
# fields added to schema 1 later: a summary.json written before them lacks them and is still read
SUMMARY_OPTIONAL = ("throughput_first_step", "samples_per_s_excl_first", "tokens_per_s_excl_first")
SUMMARY_REQUIRED = ("schema", "status", "parallel", "world_size", "device", "steps", "tokens_per_step",
                    "samples_per_step", "memory_kind", "comm")

# timeline.json: start-up milestones in seconds since the process started, in the order they happen.
TIMELINE_SCHEMA = 1
TIMELINE_MILESTONES = {
    "process_start": "0 by definition: the process's start (/proc/self/stat), else the first import of "
                     "nsa.training (see process_start_source)",
    "imports_done": "nsa-train's command line parsed and the trainer's modules (torch with them) imported",
    "process_group_ready": "distributed.init returned: device chosen and, with several ranks, the process group up",
    "model_built": "the model constructed and initialized on the host",
    "model_on_device": "the model moved to its device",
    "model_wrapped": "DDP / FSDP2 wrapping done (DDP broadcasts the weights here; before it, DDP runs one no_grad "
                     "probe forward for the byte model's bucket order); single process: no wrapping",
    "compiled": "only with train.compile: torch.compile wrapper created; compilation itself happens in the first "
                "forward, so it is inside first_forward",
    "setup_done": "optimizer, data source, resume, env.json done: the training loop starts",
    "first_forward": "the first micro-batch's forward returned",
    "first_optimizer_step": "the first optimizer step returned",
    "first_logged_step": "the first step's training.csv row and heartbeat written: the time to first step",
}
TIMELINE_OPTIONAL = ("compiled",)
TIMELINE_FIELDS = {
    "schema": f"timeline.json format version ({TIMELINE_SCHEMA})",
    "process_start_source": "/proc/self/stat, or the fallback used",
    "process_start_unix": "rank 0's process start as unix time",
    "world_size": "ranks",
    "milestones": "rank 0: {milestone: seconds since its process started}, milestones in TIMELINE_MILESTONES order",
    "ranks": "every rank's milestones {rank: {milestone: seconds}} up to first_logged_step (gathered once, right "
             "after the first step); null when the run stopped before",
    "slowest": "{milestone: {rank, s}}: the rank that reached each milestone last and when; null with ranks",
    "time_to_first_step_s": "rank 0's first_logged_step (null when no step completed)",
}


class ContractError(ValueError):
    """A trainer output file that does not follow its contract; the message is one line naming the file."""


def _load_json(path: Path, what: str) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContractError(f"{path}: no {what} (the run wrote none, or this is not a trainer out_dir)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ContractError(f"{path}: not a readable JSON {what} ({exc})") from None
    if not isinstance(data, dict):
        raise ContractError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def _is_number(v: Any) -> bool:
    """A finite JSON number: the writers write a non-finite figure as null (json would write NaN / Infinity)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (isinstance(v, int) or math.isfinite(v))


def _check_counts(path: Path, where: str, rows: Any) -> None:
    if not isinstance(rows, list):
        raise ContractError(f"{path}: {where} must be a list of {{kind, calls, bytes}}, got {type(rows).__name__}")
    for row in rows:
        if not isinstance(row, dict) or row.get("kind") not in COMM_KINDS:
            raise ContractError(f"{path}: {where}: bad entry {row!r:.80} (kind must be one of {', '.join(COMM_KINDS)})")
        for key in ("calls", "bytes"):
            if not isinstance(row.get(key), int) or isinstance(row.get(key), bool) or row[key] < 0:
                raise ContractError(f"{path}: {where}: {row['kind']}.{key} must be a non-negative integer, "
                                    f"got {row.get(key)!r}")


def _open_contract(path: str | Path, name: str, schema: Any, fields) -> tuple[Path, dict[str, Any]]:
    """(the file, its JSON object) of one of the trainer's JSON outputs: `path` is the file or an out_dir holding
    `name`; the schema must be `schema` and every one of `fields` present. Raises ContractError otherwise."""
    path = Path(path)
    if path.is_dir():
        path = path / name
    data = _load_json(path, name)
    if data.get("schema") != schema:
        raise ContractError(f"{path}: schema {data.get('schema')!r} is not the supported {schema}")
    missing = [k for k in fields if k not in data]
    if missing:
        raise ContractError(f"{path}: missing field(s) {', '.join(missing)}")
    return path, data


def read_summary(path: str | Path) -> dict[str, Any]:
    """summary.json (a file or an out_dir holding one) as a dict, checked against SUMMARY_FIELDS: every field present
    (unknown extra fields are kept), the required ones not null, numbers where numbers belong, comm counts well
    formed. Raises ContractError with a one-line message otherwise."""
    path, data = _open_contract(path, SUMMARY_JSON, SUMMARY_SCHEMA,
                                [k for k in SUMMARY_FIELDS if k not in SUMMARY_OPTIONAL])
    for key in SUMMARY_OPTIONAL:
        data.setdefault(key, None)
    nulls = [k for k in SUMMARY_REQUIRED if data[k] is None]
    if nulls:
        raise ContractError(f"{path}: field(s) {', '.join(nulls)} must not be null")
    if data["status"] not in STATUSES:
        raise ContractError(f"{path}: status {data['status']!r} is not one of {', '.join(STATUSES)}")
    for key in ("world_size", "steps", "tokens_per_step", "samples_per_step"):
        if not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < 0:
            raise ContractError(f"{path}: {key} must be a non-negative integer, got {data[key]!r}")
    first = data["throughput_first_step"]
    if first is not None and (not isinstance(first, int) or isinstance(first, bool) or first < 1):
        raise ContractError(f"{path}: throughput_first_step must be a positive integer or null, got {first!r}")
    numeric = [k for k in SUMMARY_FIELDS if k.endswith(("_s", "_gb", "_loss", "_share", "_excl_first"))
               and k != "comm_time_method"]
    for key in numeric:
        if data[key] is not None and not _is_number(data[key]):
            raise ContractError(f"{path}: {key} must be a number or null, got {data[key]!r}")
    if data["steps"] > 0 and any(data[k] is None for k in ("avg_step_time_s", "tokens_per_s", "final_loss")):
        raise ContractError(f"{path}: {data['steps']} step(s) ran but the step statistics are null")
    comm = data["comm"]
    if not isinstance(comm, dict):
        raise ContractError(f"{path}: comm must be an object, got {type(comm).__name__}")
    for key in ("per_step", "first_step", "total"):
        _check_counts(path, f"comm.{key}", comm.get(key))
    trainer = comm.get("trainer")
    if not isinstance(trainer, dict):
        raise ContractError(f"{path}: comm.trainer must be an object")
    for key in ("per_step", "total"):
        _check_counts(path, f"comm.trainer.{key}", trainer.get(key))
    return data


def read_timeline(path: str | Path) -> dict[str, Any]:
    """timeline.json (a file or an out_dir holding one) as a dict, checked against TIMELINE_FIELDS: known milestone
    names with non-negative seconds that do not decrease in TIMELINE_MILESTONES order, per rank too. A run that
    stopped early has fewer milestones; `missing_milestones` in the result lists the required ones it lacks.
    Raises ContractError with a one-line message otherwise."""
    path, data = _open_contract(path, TIMELINE_JSON, TIMELINE_SCHEMA, TIMELINE_FIELDS)

    def check(marks: Any, where: str) -> None:
        if not isinstance(marks, dict):
            raise ContractError(f"{path}: {where} must be an object of milestone: seconds")
        unknown = [k for k in marks if k not in TIMELINE_MILESTONES]
        if unknown:
            raise ContractError(f"{path}: {where}: unknown milestone {unknown[0]!r}")
        last_name, last = None, 0.0
        for name in TIMELINE_MILESTONES:
            if name not in marks:
                continue
            value = marks[name]
            if not _is_number(value) or value < 0:
                raise ContractError(f"{path}: {where}.{name} must be non-negative seconds, got {value!r}")
            if value < last:
                raise ContractError(f"{path}: {where}: {name} ({value} s) comes before {last_name} ({last} s)")
            last_name, last = name, value

    check(data["milestones"], "milestones")
    if data["ranks"] is not None:
        if not isinstance(data["ranks"], dict):
            raise ContractError(f"{path}: ranks must be an object of rank: milestones, or null")
        for rank, marks in data["ranks"].items():
            check(marks, f"ranks.{rank}")
    data["missing_milestones"] = [k for k in TIMELINE_MILESTONES
                                  if k not in data["milestones"] and k not in TIMELINE_OPTIONAL]
    return data


def columns_markdown() -> str:
    rows = ["| column | meaning |", "|---|---|"]
    rows += [f"| `{k}` | {v} |" for k, v in TRAINING_COLUMNS.items()]
    rows += [f"| `{k}` | {v} (optional) |" for k, v in COMM_COLUMNS.items()]
    rows.append(f"| `{MFU_COLUMN[0]}` | {MFU_COLUMN[1]} |")
    return "\n".join(rows)


class CsvLog:
    """Appends rows to a CSV with a header. On resume from step k, rows after k (written after the checkpoint
    by a run that then died) are dropped first so the file holds one row per step. Rows whose step cannot be read
    (a damaged file: text, NUL bytes, another header) are dropped too, and so are rows up to k that are incomplete:
    the last line without its line ending (a writer stopped mid-row: its last number may be cut short, its step
    may be the first digits of a later one) or a row with another number of cells than the header (as
    validation.analysis.metrics.read_training_csv drops them); the file as it was is then kept beside it
    (`kept_aside`, `dropped` rows), so nothing is lost. The kept rows are rewritten atomically, under this run's
    columns followed by any other column of the file's header (an earlier run's "mfu" stays with its rows)."""

    def __init__(self, path: Path, columns: list[str], resume_step: int | None = None):
        self.path, self.columns = Path(path), list(columns)
        self.dropped, self.kept_aside = 0, None
        existing: list[dict] = []
        if resume_step is not None and self.path.exists():
            raw = self.path.read_bytes()
            existing, self.dropped, damaged, header = _rows_up_to(raw, resume_step)
            self.columns += [c for c in dict.fromkeys(header) if c and c not in self.columns]
            if damaged:
                self.kept_aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
                self.kept_aside.write_bytes(raw)
        text = io.StringIO(newline="")
        head = csv.DictWriter(text, fieldnames=self.columns, extrasaction="ignore")
        head.writeheader()
        for row in existing:
            head.writerow(row)
        atomic_write(self.path, text.getvalue())
        self._file = self.path.open("a", newline="", buffering=1)
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")

    def write(self, row: Mapping[str, Any]) -> None:
        self._writer.writerow({k: _fmt(row.get(k)) for k in self.columns})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _rows_up_to(raw: bytes, last_step: int) -> tuple[list[dict], int, bool, list[str]]:
    """(the whole rows of CSV text `raw` up to step `last_step`, how many rows were dropped as damaged, whether the
    file was damaged, its header's columns ([] when it has no "step" column or is cut short)). Damaged: bytes that
    are not UTF-8, NUL bytes, a header without "step", a row whose step cannot be read, or a row up to `last_step`
    that is incomplete (the last line without its line ending, another number of cells than the header); rows
    after `last_step` are dropped whole or not, as a resume drops them."""
    text = raw.decode("utf-8", errors="replace").replace("\x00", "")
    damaged = "\ufffd" in text or b"\x00" in raw
    lines = [_cells(line) for line in text.splitlines()]
    if not lines:
        return [], 0, damaged, []
    header, rows = lines[0] or [], lines[1:]
    if "step" not in header:
        return [], sum(1 for cells in rows if cells != []), True, []
    at = header.index("step")
    cut = len(rows) - 1 if not text.endswith(("\n", "\r")) else None  # the last row, written in part
    if cut == -1:  # the header itself, written in part: no row, and its last name may be cut short
        return [], 0, damaged, []
    kept, dropped = [], 0
    for i, cells in enumerate(rows):
        if cells == []:  # a blank line
            continue
        try:
            step = int(cells[at])
        except (TypeError, IndexError, ValueError):  # TypeError: a line that is not CSV (_cells)
            dropped += 1
            continue
        if step > last_step:
            continue
        if i == cut or len(cells) != len(header):
            dropped += 1
            continue
        kept.append(dict(zip(header, cells)))
    return kept, dropped, damaged or dropped > 0, header


def _cells(line: str) -> list[str] | None:
    """The cells of one CSV line ([] for a blank one), None when it cannot be parsed."""
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return None


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e-3 or abs(value) >= 1e6 else f"{value:.6f}".rstrip("0").rstrip(".")
    return "" if value is None else value


def archive_previous_run(out_dir: Path) -> Path | None:
    """Move an earlier run's files out of the way of a fresh (not resumed) run into
    out_dir/previous_runs/<time>/, so nothing is lost and nothing is mixed: its heartbeats would confuse a
    watchdog, its checkpoints a later --resume. Returns the archive directory, or None when there was nothing."""
    out_dir = Path(out_dir)
    found = sorted({p for pattern in RUN_ARTIFACTS for p in out_dir.glob(pattern)})
    if not found:
        return None
    archive = out_dir / PREVIOUS_RUNS / time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while archive.exists():
        n += 1
        archive = archive.with_name(f"{archive.name.split('.')[0]}.{n}")
    archive.mkdir(parents=True)
    for path in found:
        path.rename(archive / path.name)
    return archive


def atomic_write(path: Path, data: bytes | str) -> Path:
    """Write `data` (str: UTF-8) to `path` atomically and durably: a temp file beside it, fsync, os.replace. Readers
    see the old file or the new one, never half a file; on any error (disk full, permission) the temp file is
    removed, the old file is left as it was, and the OSError propagates, its filename `path`. The one atomic write
    of the project: the trainer's files, its config.yaml, and everything nsa-validate writes into a run directory
    use it."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # named as the file written (not its temp file, gone by now, nor only its directory)
        if exc.errno is None:
            raise
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    finally:
        try:
            os.unlink(tmp)  # gone already after the rename; after a failure it must not be left behind
        except OSError:
            pass
    try:  # the rename itself durable too (best effort: not every filesystem can fsync a directory)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """atomic_write of a text (UTF-8)."""
    return atomic_write(path, text)


def write_error(out_dir: Path, rank: int, exc: BaseException) -> Path:
    """out_dir/error_rank{rank}.txt: the failed rank's traceback, written atomically (a reader never sees half of
    it: validation.contracts.error_files, the suite's diagnosis of the failing rank)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return atomic_write_text(Path(out_dir) / f"error_rank{rank}.txt", text)


def write_json(path: Path, data: Any, indent: int | None = 2) -> Path:
    """Atomic, durable JSON write (atomic_write_text): readers never see half a file."""
    return atomic_write_text(path, json.dumps(data, indent=indent, default=str) + "\n")


# where git_sha and git_dirty look for the checkout: this package's own directory (the code that runs)
SOURCE_DIR = Path(__file__).resolve().parent


def git_output(args: list[str], start: Path | None = None) -> str | None:
    """`git ARGS` in `start` (else SOURCE_DIR): its stripped stdout, None where git fails (no git, not a checkout).
    The one runner of git for env.json and results.json's environment (validation.launch.environment)."""
    try:
        out = subprocess.run(["git", *args], cwd=start or SOURCE_DIR, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_sha(start: Path | None = None) -> str | None:
    """HEAD of the git checkout holding this package (or `start`), None outside one."""
    return git_output(["rev-parse", "HEAD"], start) or None


def git_changes(start: Path | None = None) -> int | None:
    """How many tracked files of the git checkout holding this package (or `start`) differ from its HEAD, staged or
    not (the lines of `git status --porcelain --untracked-files=no`: an untracked file alone changes nothing), None
    outside a checkout."""
    status = git_output(["status", "--porcelain", "--untracked-files=no"], start)
    return None if status is None else len([line for line in status.splitlines() if line.strip()])


def git_dirty(start: Path | None = None) -> bool | None:
    """Whether tracked files differ from HEAD (git_changes): a run from a modified tree is not the commit git_sha
    names. None outside a checkout."""
    changes = git_changes(start)
    return None if changes is None else changes > 0


ENV_PREFIXES = ("NSA_", "NCCL_", "TORCH_")


def environment(config: Mapping[str, Any], config_path: str | None, world_size: int, device,
                argv: list[str]) -> dict[str, Any]:
    """The env.json record."""
    import torch  # here, not at module level: the orchestrator imports this module's contracts without torch

    cuda = torch.cuda.is_available()
    devices = ([{"index": i, "name": torch.cuda.get_device_name(i),
                 "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 1024 ** 3, 2)}
                for i in range(torch.cuda.device_count())] if cuda else [])
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - NCCL absent from this build
            nccl = None
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": nccl,
        "device": str(device),
        "devices": devices,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "config_path": config_path,
        "config": dict(config),
        "git_sha": git_sha(),
        "git_dirty": git_dirty(),
        "argv": list(argv),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
