"""Checkpoints: everything needed to continue a run exactly where it stopped.

    out_dir/checkpoints/step_00000042/
        model_optim.pt   rank 0: full (unsharded) model and optimizer state, GradScaler state
        rank{r}.pt       every rank: its data position and RNG states (CUDA: its own current device's generator)
        meta.json        step, world size, parallel mode; written last: a directory without it is incomplete

A checkpoint is written into `step_N.tmp/` and renamed once every rank's files are in and on disk (fsync), so a
crash mid-save (of the process, or of the machine) never leaves a checkpoint that looks complete; rotation (the last
`keep` by step number) deletes a checkpoint's meta.json before the rest, and the next save removes the `.tmp/`
directories of saves killed midway and every older `step_N/` that a deletion killed midway left without its
meta.json. A write that fails on one rank (a full disk, a permission) fails the save on every rank alike, with that
rank's error, and leaves the earlier checkpoints as they were. Only `step_N/` directories are checkpoints: other
names in checkpoints/ are neither loaded nor deleted. A resume loads the checkpoint rank 0 chooses on every rank
(nsa.training.trainer).
The same full state dicts serve single-process, DDP and FSDP2 runs (torch.distributed.checkpoint.state_dict), so a
run can be resumed under another parallel mode, but not with another world size (each rank's data position belongs
to its shard).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from nsa.training.distributed import DistInfo

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
META = "meta.json"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used for this run (missing, incomplete, other world size)."""


def _step_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR / f"step_{step:08d}"


def _name_step(name: str) -> int | None:
    """N for a directory named step_N (ASCII digits only), else None: a save's step_N.tmp, a copy kept beside a
    checkpoint (step_N.bak, step_N.damaged) or any other name is not a checkpoint."""
    digits = name[len("step_"):]
    if name.startswith("step_") and digits.isascii() and digits.isdigit():
        return int(digits)
    return None


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints (step_N/ with meta.json), oldest first: by step number, not by name (step_100000000
    comes after step_99999999)."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir()
             if (step := _name_step(p.name)) is not None and p.is_dir() and (p / META).is_file()]
    return [p for _, p in sorted(found, key=lambda sp: (sp[0], sp[1].name))]


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def checkpoint_step(path: Path | None) -> int | None:
    """The step of checkpoint `path` as its meta.json says, or None where there is no checkpoint or its meta.json
    cannot be read (load then refuses it, naming what is wrong). For what a run reports before or without loading
    one: the step a resume starts from, the last checkpoint a stopped run leaves."""
    if path is None:
        return None
    try:
        step = json.loads((Path(path) / META).read_text())["step"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return step if _count(step, 0) else None


def _count(value: Any, least: int) -> bool:
    """Whether a meta.json value is an integer (not a bool, a string or a float) of at least `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def latest_step(out_dir: Path) -> int | None:
    """checkpoint_step of the latest checkpoint under `out_dir` (where --resume continues), or None."""
    return checkpoint_step(latest_checkpoint(out_dir))


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        # this rank's own CUDA generator: its current device's (nsa.training.distributed.init sets LOCAL_RANK's),
        # with that device's index; a resume restores it onto its current device, whichever devices it sees
        device = torch.cuda.current_device()
        state["cuda"] = {"device": device, "state": torch.cuda.get_rng_state(device)}
    return state


def _set_rng_state(state: dict[str, Any], path: Path | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        _set_cuda_rng_state(state["cuda"], path)


def _set_cuda_rng_state(saved: Any, path: Path | None) -> None:
    """Restore this rank's CUDA generator onto its current device: the saving rank's own generator, or, from an
    older checkpoint (a list of the generators of every device the saving rank saw, in device order), the entry of
    the current device's index; where that list has no such entry, a warning says what is not restored."""
    device = torch.cuda.current_device()
    if isinstance(saved, dict):
        torch.cuda.set_rng_state(saved["state"], device)
        return
    if device < len(saved):
        torch.cuda.set_rng_state(saved[device], device)
        return
    where = f"{path}: " if path is not None else ""
    log.warning(f"{where}the CUDA random generator of cuda:{device} is not restored: this older checkpoint holds "
                f"the generators of {len(saved)} device(s) only (cuda:0 to cuda:{len(saved) - 1}, every device the "
                "saving rank saw); this rank's CUDA random numbers differ from the run it continues")


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def save(out_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo, *,
         data_state: dict, scaler: torch.amp.GradScaler | None, parallel: str, keep: int) -> Path:
    """Collective: every rank must call it. Returns the checkpoint directory.

    A write that fails on any rank (a full disk, a permission, a file system gone) raises CheckpointError on every
    rank, naming the failing rank and its error: the ranks agree after each stage, as load does, so that none
    waits in a barrier for a rank that gave up (until the connection drops, with an error that names neither).
    A failed save leaves no checkpoint of its step and the earlier ones as they were (the rotation runs only once
    the new one is complete); its step_N.tmp/ is removed, or where that fails too, by the next save."""
    final = _step_dir(out_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    error = None
    if info.is_main:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except Exception as exc:  # noqa: BLE001 - every rank raises it (_agree_saved)
            error = _unwritable(tmp, exc)
    _agree_saved(info, error, step, tmp)
    # every rank takes part in gathering the full state (FSDP2 all-gathers; rank 0 receives it)
    model_state = get_model_state_dict(model, options=_FULL)
    optim_state = get_optimizer_state_dict(model, optimizer, options=_FULL)
    try:
        if info.is_main:
            torch.save({"model": model_state, "optimizer": optim_state,
                        "scaler": scaler.state_dict() if scaler is not None else None}, tmp / "model_optim.pt")
            _sync(tmp / "model_optim.pt")
        torch.save({"rank": info.rank, "data": data_state, "rng": _rng_state()}, tmp / f"rank{info.rank}.pt")
        _sync(tmp / f"rank{info.rank}.pt")
    except Exception as exc:  # noqa: BLE001 - torch.save of a full disk raises RuntimeError, not OSError
        error = _unwritable(tmp, exc)
    _agree_saved(info, error, step, tmp)
    if info.is_main:
        try:
            (tmp / META).write_text(json.dumps({"step": step, "world_size": info.world_size, "parallel": parallel}))
            _sync(tmp / META)
            _sync(tmp, directory=True)
            if final.exists():
                _remove(final)
            tmp.rename(final)
            _sync(final.parent, directory=True)
        except Exception as exc:  # noqa: BLE001
            error = _unwritable(tmp, exc)
    _agree_saved(info, error, step, tmp)
    if info.is_main:  # step_N/ is complete: a failure from here on leaves it, the one --resume takes
        try:
            for old in list_checkpoints(out_dir)[:-keep]:
                _remove(old)
            for stale in final.parent.glob("step_*.tmp"):  # left by saves killed midway: never complete, never loaded
                if _name_step(stale.name[:-len(".tmp")]) is not None and stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
            for stale in final.parent.glob("step_*"):  # older step_N/ without meta.json: a deletion killed midway
                older = _name_step(stale.name)
                if older is not None and older < step and stale.is_dir() and not (stale / META).exists():
                    shutil.rmtree(stale, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001
            error = f"{final.parent}: cannot rotate ({type(exc).__name__}: {_first_line(exc)})"
    _agree_saved(info, error, step, tmp, complete=True)
    return final


def _unwritable(path: Path, exc: BaseException) -> str:
    return f"{path}: cannot be written ({type(exc).__name__}: {_first_line(exc)})"


def _agree_saved(info: DistInfo, error: str | None, step: int, tmp: Path, complete: bool = False) -> None:
    """A stage of save done on every rank (in place of a barrier): CheckpointError on every rank where any rank's
    `error` is set, naming the first failing rank and its error. Rank 0 removes the save's `tmp` first (an
    incomplete checkpoint, never loaded; where the removal fails, the next save removes it). `complete`: the
    checkpoint was renamed to step_N/ before the error (in the rotation of the older ones), and is kept."""
    errors = [error]
    if info.distributed:
        errors = [None] * info.world_size
        dist.all_gather_object(errors, error)
    failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
    if not failed:
        return
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    rank, message = failed[0]
    where = f"rank {rank}: " if info.distributed else ""
    if complete:
        raise CheckpointError(f"the checkpoint of step {step} is saved (--resume continues from it), but the older "
                              f"ones are not rotated: {where}{message}")
    raise CheckpointError(f"the checkpoint of step {step} is not saved: {where}{message}; the earlier checkpoints "
                          "are kept as they were")


def _remove(path: Path) -> None:
    """Delete checkpoint `path`, its meta.json first: a process killed while the rest is being deleted leaves an
    incomplete directory (skipped like a save's .tmp), never one that looks complete with files missing."""
    try:
        (path / META).unlink(missing_ok=True)
    except OSError:
        pass
    _sync(path, directory=True)  # the unlink on disk before any other file goes, a machine's crash included
    shutil.rmtree(path, ignore_errors=True)


def _sync(path: Path, *, directory: bool = False) -> None:
    """fsync `path`: a file's data, or a directory's entries (best effort: some file systems refuse it). A checkpoint
    is renamed to step_N/ only once every file in it is on disk, so that a machine that loses power or crashes
    right after (not only a killed process) never leaves a step_N/ with meta.json whose other files are empty or
    missing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo, *,
         scaler: torch.amp.GradScaler | None) -> tuple[int, dict]:
    """Restore model, optimizer, scaler and this rank's RNG; returns (step, this rank's data state). A checkpoint
    that cannot be read (a damaged or missing file) or does not fit this run (another model, another world size)
    raises CheckpointError naming the file and what is wrong: nothing is restored from it, and nothing falls back
    silently to an older one (the error names it). Collective in a distributed run: every rank reads its files,
    then the ranks agree, so that a file only one rank cannot read (its rank{r}.pt) stops every rank with that
    rank's error, not the others with a broken connection later; ranks handed different checkpoints stop with a
    CheckpointError naming each rank's (the trainer hands every rank the one rank 0 chooses). The optimizer's
    param_groups are the checkpoint's afterwards, its settings included: the trainer puts this run's back
    (nsa.training.optim.keep_settings)."""
    path = Path(path)
    error, blob, mine, step = None, None, None, -1
    try:
        step = _read_meta(path, info)
        blob = _read(path, "model_optim.pt", ("model", "optimizer"))
        mine = _read(path, f"rank{info.rank}.pt", ("data", "rng"))
    except CheckpointError as exc:
        error = str(exc)
    reports = [(error, path.name, step)]
    if info.distributed:
        reports = [None] * info.world_size
        dist.all_gather_object(reports, (error, path.name, step))
    failed = [(rank, message) for rank, (message, _, _) in enumerate(reports) if message is not None]
    if failed:
        rank, message = failed[0]
        if rank != info.rank and f"rank{rank}.pt" not in message:
            message += f" (on rank {rank})"
        raise CheckpointError(message)
    if len({(name, at) for _, name, at in reports}) > 1:
        # each rank picks the latest checkpoint it sees: a shared file system that shows a new step_N/ to some
        # nodes later (a cached directory listing) would have the ranks continue from different steps, parameters
        # and data positions, with nothing said
        seen = ", ".join(f"rank {rank}: {name} (step {at})" for rank, (_, name, at) in enumerate(reports))
        raise CheckpointError(f"{path.parent}: the ranks would resume from different checkpoints ({seen}); every "
                              "rank must see the same latest checkpoint (a file system that shows new files to some "
                              "nodes later?): resume again once they do")
    try:
        set_model_state_dict(model, blob["model"], options=StateDictOptions(full_state_dict=True))
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: its model does not fit this run's model config "
                              f"({_first_line(exc)}); resume with the config it was written with") from None
    try:
        set_optimizer_state_dict(model, optimizer, blob["optimizer"], options=StateDictOptions(full_state_dict=True))
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: its optimizer state does not fit this run's parameters "
                              f"({_first_line(exc)})") from None
    if scaler is not None and blob.get("scaler"):
        scaler.load_state_dict(blob["scaler"])
    _set_rng_state(mine["rng"], path)
    return step, mine["data"]


def _read_meta(path: Path, info: DistInfo) -> int:
    """The step of checkpoint `path` from its meta.json; CheckpointError where it is missing, cannot be read or was
    written by another number of ranks."""
    meta_file = path / META
    if not meta_file.is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {META})")
    try:
        meta = json.loads(meta_file.read_text())
        step, world_size = meta["step"], meta["world_size"]
        for key, value, least in (("step", step, 0), ("world_size", world_size, 1)):
            if not _count(value, least):
                raise ValueError(f"{key} {value!r} is not an integer of at least {least}")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise _damaged(path, META, exc) from None
    if world_size != info.world_size:
        raise CheckpointError(f"{path}: written by {world_size} rank(s), this run has {info.world_size}; "
                              "resume with the same number of ranks")
    return step


def _read(path: Path, name: str, keys: tuple[str, ...]) -> dict:
    """torch.load of one file of checkpoint `path`, which must hold `keys`; CheckpointError where it cannot."""
    try:
        blob = torch.load(path / name, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {name} is missing{_older(path)}") from None
    except Exception as exc:  # torch.load of a damaged file raises RuntimeError, EOFError, UnpicklingError, ...
        raise _damaged(path, name, exc) from None
    if not isinstance(blob, dict) or any(k not in blob for k in keys):
        raise _damaged(path, name, ValueError(f"expected a mapping with {', '.join(keys)}"))
    return blob


def _damaged(path: Path, name: str, exc: BaseException) -> CheckpointError:
    return CheckpointError(f"{path}: {name} cannot be read ({type(exc).__name__}: {_first_line(exc)}){_older(path)}")


def _older(path: Path) -> str:
    """Advice for a damaged checkpoint: the complete one before it, if any (resumed from only when the user moves
    the damaged one aside: a silent fallback would repeat steps without saying so)."""
    step = _name_step(path.name)
    earlier = [p for p in list_checkpoints(path.parent.parent) if step is not None and _name_step(p.name) < step]
    return (f"; move {path.name} out of {path.parent} to resume from {earlier[-1].name}" if earlier
            else "; no earlier complete checkpoint")


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (with the next one where it ends in a colon), cut after its first
    sentence when longer than 200 characters (torch.load's messages go on with advice of their own)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or [""]
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:  # "Error(s) in loading state_dict for NSAModel:" and the first error
        line = f"{line} {lines[1]}"
    if len(line) > 200 and ". " in line[:200]:
        line = line[:line.index(". ") + 1]
    return line if len(line) <= 200 else line[:200] + "..."


def param_digest(net: nn.Module) -> str:
    """sha256 of every parameter's name and bytes: equal on all DDP ranks when they are in sync."""
    h = hashlib.sha256()
    for name, p in net.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()
