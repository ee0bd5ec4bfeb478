"""A checkpoint gets its name step_N/ only once all its files are on disk: a machine that crashes or loses power
right after the rename (not only a killed process) must not leave a step_N/ with meta.json whose model or rank files
are empty or missing, which a resume would take as the latest checkpoint and refuse. Recorded by wrapping os.fsync
and the rename of step_N.tmp/ on a real save to a temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from nsa.training import checkpoint

INFO = checkpoint.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


@pytest.fixture
def synced(monkeypatch):
    """The paths fsync'd so far, and a snapshot of them taken at each rename (by the rename's target name)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to name an fsync'd descriptor's file")
    done: list[Path] = []
    at_rename: dict[str, list[Path]] = {}
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd):
        done.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(self, target):
        at_rename[Path(target).name] = list(done)
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    return done, at_rename


def _save(out: Path, step: int, keep: int = 10) -> Path:
    net = nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    return checkpoint.save(out, step, net, opt, INFO, data_state={"pos": step}, scaler=None, parallel="none",
                           keep=keep)


def test_every_file_of_a_checkpoint_is_on_disk_before_it_is_named_step_n(tmp_path, synced):
    done, at_rename = synced
    path = _save(tmp_path.resolve(), 3)
    tmp = path.with_name(path.name + ".tmp")
    before = set(at_rename[path.name])
    assert {tmp / "model_optim.pt", tmp / "rank0.pt", tmp / "meta.json", tmp} <= before, sorted(before)
    assert path.parent in done[len(at_rename[path.name]):]  # the rename itself, in checkpoints/


def test_a_rotated_checkpoints_meta_json_is_gone_on_disk_before_its_other_files(tmp_path, synced, monkeypatch):
    done, _ = synced
    out = tmp_path.resolve()
    old = _save(out, 1)
    order: list[tuple] = []
    real_rmtree = checkpoint.shutil.rmtree

    def rmtree(path, *args, **kwargs):
        order.append((Path(path), (Path(path) / "meta.json").exists(), list(done)))
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    _save(out, 2, keep=1)
    (meta_left, synced_then), = [o[1:] for o in order if o[0] == old]
    assert not meta_left and old in synced_then  # the directory without meta.json on disk before the rest goes
