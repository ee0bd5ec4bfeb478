"""Checkpoints: everything needed to continue a run exactly where it stopped.

    out_dir/checkpoints/step_00000042/
        model_optim.pt   rank 0: full (unsharded) model and optimizer state, GradScaler state
        rank{r}.pt       every rank: its data position and RNG states
        meta.json        step, world size, parallel mode; written last: a directory without it is incomplete

A checkpoint is written into `step_N.tmp/` and renamed once every rank's files are in, so a crash mid-save never
leaves a checkpoint that looks complete. The same full state dicts serve single-process, DDP and FSDP2 runs
(torch.distributed.checkpoint.state_dict), so a run can be resumed under another parallel mode, but not with
another world size (each rank's data position belongs to its shard).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from nsa.training.distributed import DistInfo, barrier

CHECKPOINT_DIR = "checkpoints"
META = "meta.json"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used for this run (missing, incomplete, other world size)."""


def _step_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR / f"step_{step:08d}"


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints (meta.json present), oldest first."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")
             and not p.name.endswith(".tmp") and (p / META).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def save(out_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo, *,
         data_state: dict, scaler: torch.amp.GradScaler | None, parallel: str, keep: int) -> Path:
    """Collective: every rank must call it. Returns the checkpoint directory."""
    final = _step_dir(out_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(info)
    # every rank takes part in gathering the full state (FSDP2 all-gathers; rank 0 receives it)
    model_state = get_model_state_dict(model, options=_FULL)
    optim_state = get_optimizer_state_dict(model, optimizer, options=_FULL)
    if info.is_main:
        torch.save({"model": model_state, "optimizer": optim_state,
                    "scaler": scaler.state_dict() if scaler is not None else None}, tmp / "model_optim.pt")
    torch.save({"rank": info.rank, "data": data_state, "rng": _rng_state()}, tmp / f"rank{info.rank}.pt")
    barrier(info)
    if info.is_main:
        (tmp / META).write_text(json.dumps({"step": step, "world_size": info.world_size, "parallel": parallel}))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier(info)
    return final


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo, *,
         scaler: torch.amp.GradScaler | None) -> tuple[int, dict]:
    """Restore model, optimizer, scaler and this rank's RNG; returns (step, this rank's data state)."""
    path = Path(path)
    meta_file = path / META
    if not meta_file.is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {META})")
    meta = json.loads(meta_file.read_text())
    if meta["world_size"] != info.world_size:
        raise CheckpointError(f"{path}: written by {meta['world_size']} rank(s), this run has {info.world_size}; "
                              "resume with the same number of ranks")
    blob = torch.load(path / "model_optim.pt", map_location="cpu", weights_only=False)
    set_model_state_dict(model, blob["model"], options=StateDictOptions(full_state_dict=True))
    set_optimizer_state_dict(model, optimizer, blob["optimizer"], options=StateDictOptions(full_state_dict=True))
    if scaler is not None and blob.get("scaler"):
        scaler.load_state_dict(blob["scaler"])
    mine = torch.load(path / f"rank{info.rank}.pt", map_location="cpu", weights_only=False)
    _set_rng_state(mine["rng"])
    return int(meta["step"]), mine["data"]


def param_digest(net: nn.Module) -> str:
    """sha256 of every parameter's name and bytes: equal on all DDP ranks when they are in sync."""
    h = hashlib.sha256()
    for name, p in net.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()
