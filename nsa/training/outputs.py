"""The trainer's output files in out_dir, defined in one place (DESIGN.md "Contracts").

    training.csv            one row per optimizer step, columns TRAINING_COLUMNS (+ "mfu" when a peak is known)
    val.csv                 one row per evaluation, columns VAL_COLUMNS
    heartbeat_rank{r}.jsonl every rank, one JSON object per line (nsa.training.heartbeat)
    env.json                versions, devices, world size, resolved config, git sha, NSA_*/NCCL_*/TORCH_* vars
    config.yaml             the resolved run config
    status.json             how the run ended: completed | halted | terminated | nonfinite | crashed
    checkpoints/step_N/     checkpoints (nsa.training.checkpoint)
    sdpa_audit.json         NSA_SDPA_AUDIT=1: SDPA backend per call site (rank 0)
    stackdump_rank{r}*.txt  SIGUSR1 stack dumps
    tb/                     TensorBoard scalars (unless NSA_TB_DISABLE=1)
    profile/                torch profiler traces (train.profile_steps > 0)
"""

from __future__ import annotations

import csv
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping


TRAINING_CSV = "training.csv"
VAL_CSV = "val.csv"
ENV_JSON = "env.json"
STATUS_JSON = "status.json"
CONFIG_YAML = "config.yaml"
SDPA_AUDIT_JSON = "sdpa_audit.json"

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
MFU_COLUMN = ("mfu", "model FLOPs utilization: flops_per_token * toks_per_s / (world_size * device peak); only "
                     "when the device's peak is known (GPU table in nsa.training.metrics or train.peak_tflops)")
VAL_COLUMNS = {"step": "optimizer step", "val_loss": "mean cross entropy over the evaluation batches of all ranks",
               "val_ppl": "exp(val_loss)"}

# What a run leaves in out_dir (archive_previous_run moves these aside for a fresh run).
RUN_ARTIFACTS = (TRAINING_CSV, VAL_CSV, ENV_JSON, STATUS_JSON, CONFIG_YAML, SDPA_AUDIT_JSON, "heartbeat_rank*.jsonl",
                 "stackdump_*.txt", "error_rank*.txt", "checkpoints", "tb", "profile", ".HALT")
PREVIOUS_RUNS = "previous_runs"

# status.json "status" values
STATUSES = ("running", "completed", "halted", "terminated", "nonfinite", "crashed")


def columns_markdown() -> str:
    rows = ["| column | meaning |", "|---|---|"]
    rows += [f"| `{k}` | {v} |" for k, v in TRAINING_COLUMNS.items()]
    rows.append(f"| `{MFU_COLUMN[0]}` | {MFU_COLUMN[1]} |")
    return "\n".join(rows)


class CsvLog:
    """Appends rows to a CSV with a header. On resume from step k, rows after k (written after the checkpoint
    by a run that then died) are dropped first so the file holds one row per step."""

    def __init__(self, path: Path, columns: list[str], resume_step: int | None = None):
        self.path, self.columns = Path(path), list(columns)
        existing: list[dict] = []
        if resume_step is not None and self.path.exists():
            with self.path.open(newline="") as f:
                existing = [row for row in csv.DictReader(f) if int(row["step"]) <= resume_step]
        self._file = self.path.open("w", newline="", buffering=1)
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._writer.writeheader()
        for row in existing:
            self._writer.writerow(row)
        self._file.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        self._writer.writerow({k: _fmt(row.get(k)) for k in self.columns})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


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
    removed, the old file is left as it was, and the OSError propagates. The one atomic write of the project: the
    trainer's files, its config.yaml, and everything nsa-validate writes into a run directory use it."""
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


def write_json(path: Path, data: Any, indent: int | None = 2) -> Path:
    """Atomic, durable JSON write (atomic_write_text): readers never see half a file."""
    return atomic_write_text(path, json.dumps(data, indent=indent, default=str) + "\n")


def git_sha(start: Path | None = None) -> str | None:
    """HEAD of the git checkout holding this package (or `start`), None outside one."""
    where = start or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


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
        "argv": list(argv),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
