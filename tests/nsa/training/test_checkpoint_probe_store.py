"""The checkpoint store (nsa.training.checkpoint) against its contract: checkpoints are step_N/ directories with a
meta.json written last, ordered by step number (not by name), and rotated to the last `keep`; a save or a rotation
killed midway never leaves a directory that looks complete with files missing, nor one that a resume loads; names
that are not step_N (a save's .tmp, a copy kept beside a checkpoint, stray files) are neither loaded nor deleted;
a damaged meta.json is refused naming the file; a load restores the RNG states so that the next random numbers
are those of the run that saved. Tiny modules, no training run."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from nsa.training import checkpoint
from nsa.training.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints

INFO = checkpoint.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def _net_opt(seed: int = 0):
    torch.manual_seed(seed)
    net = nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    net(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return net, opt


def _save(out: Path, step: int, keep: int = 10) -> Path:
    net, opt = _net_opt()
    return checkpoint.save(out, step, net, opt, INFO, data_state={"pos": step}, scaler=None, parallel="none",
                           keep=keep)


def _fake_checkpoint(out: Path, name: str, step: int) -> Path:
    d = out / "checkpoints" / name
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"step": step, "world_size": 1, "parallel": "none"}))
    return d


# ---------------------------------------------------------------------- ordering
@pytest.mark.parametrize("names", [
    ["step_00000100", "step_00000009", "step_00000010"],
    ["step_100", "step_9", "step_10"],  # written by hand, not zero-padded
    ["step_100000000", "step_99999999", "step_00000010"],  # past the 8 digits of the format
], ids=["padded", "unpadded", "nine_digits"])
def test_checkpoints_are_ordered_by_step_number(tmp_path, names):
    steps = {name: int(name[5:]) for name in names}
    for name in names:
        _fake_checkpoint(tmp_path, name, steps[name])
    want = sorted(names, key=steps.get)
    assert [p.name for p in list_checkpoints(tmp_path)] == want
    assert latest_checkpoint(tmp_path).name == want[-1]
    assert checkpoint.latest_step(tmp_path) == max(steps.values())


def test_rotation_past_eight_digits_keeps_the_checkpoint_just_written(tmp_path):
    """step_100000000 sorted before step_99999999 by name: keep=1 deleted the checkpoint just written."""
    _save(tmp_path, 99_999_999, keep=1)
    written = _save(tmp_path, 100_000_000, keep=1)
    assert written.name == "step_100000000" and (written / "model_optim.pt").is_file()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_100000000"]


def test_names_that_are_not_step_n_are_neither_loaded_nor_rotated(tmp_path):
    """A save killed after its meta.json but before the rename (step_6.tmp), a damaged checkpoint the user kept
    aside inside checkpoints/ (step_6.damaged), a stray directory with a meta.json (step_foo) and stray files: none is
    a checkpoint, so a resume takes step 4 and rotation leaves the user's copies alone."""
    _save(tmp_path, 4)
    root = tmp_path / "checkpoints"
    shutil.copytree(root / "step_00000004", root / "step_00000006.tmp")
    (root / "step_00000006.tmp" / "meta.json").write_text(json.dumps({"step": 6, "world_size": 1}))
    kept_aside = _fake_checkpoint(tmp_path, "step_00000006.damaged", 6)
    stray = _fake_checkpoint(tmp_path, "step_foo", 7)
    (root / "step_00000009").write_text("a file, not a checkpoint")
    (root / "README.txt").write_text("notes")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000004"]
    assert latest_checkpoint(tmp_path).name == "step_00000004"

    written = _save(tmp_path, 8, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000008"]
    assert (written / "model_optim.pt").is_file() and (written / "rank0.pt").is_file()
    assert kept_aside.is_dir() and stray.is_dir()
    assert (root / "step_00000009").is_file() and (root / "README.txt").is_file()


# ---------------------------------------------------------------------- a save killed midway
class Killed(BaseException):
    """What a SIGKILL does to a save: it stops where it is, no handler runs."""


def test_a_save_killed_after_its_first_file_leaves_the_previous_checkpoint_the_latest(tmp_path, monkeypatch):
    _save(tmp_path, 2)
    real_save = torch.save
    calls = []

    def killed_after_first_file(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) > 1:
            raise Killed
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", killed_after_first_file)
    with pytest.raises(Killed):
        _save(tmp_path, 3)
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    root = tmp_path / "checkpoints"
    assert (root / "step_00000003.tmp" / "model_optim.pt").is_file()  # the half-written save is there
    assert latest_checkpoint(tmp_path).name == "step_00000002"
    net, opt = _net_opt(seed=1)
    step, data = checkpoint.load(latest_checkpoint(tmp_path), net, opt, INFO, scaler=None)
    assert (step, data) == (2, {"pos": 2})
    # the next save that completes removes what the killed one left (a full model and optimizer, never loaded)
    _save(tmp_path, 4)
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002", "step_00000004"]


def test_a_rotation_killed_midway_leaves_no_checkpoint_that_looks_complete(tmp_path, monkeypatch):
    """Deleting an old checkpoint removed meta.json whenever the directory listing reached it: killed before, the
    old checkpoint had meta.json without its model_optim.pt, listed as complete and named as the one to resume from
    when the latest is damaged."""
    _save(tmp_path, 1)
    real_rmtree = shutil.rmtree

    def killed_while_deleting(path, *args, **kwargs):
        model = Path(path) / "model_optim.pt"
        if model.is_file():
            model.unlink()
            raise Killed
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_while_deleting)
    with pytest.raises(Killed):
        _save(tmp_path, 2, keep=1)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002"]
    latest = latest_checkpoint(tmp_path)
    (latest / "model_optim.pt").write_bytes(b"")
    net, opt = _net_opt()
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(latest, net, opt, INFO, scaler=None)
    assert "step_00000002: model_optim.pt cannot be read" in str(err.value)
    assert "no earlier complete checkpoint" in str(err.value), str(err.value)


def test_a_damaged_checkpoint_names_the_complete_one_before_it_by_step_number(tmp_path):
    _save(tmp_path, 99_999_998)
    _save(tmp_path, 99_999_999)
    latest = _save(tmp_path, 100_000_000)
    (latest / "rank0.pt").unlink()
    net, opt = _net_opt()
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(latest, net, opt, INFO, scaler=None)
    assert str(err.value).endswith("to resume from step_99999999"), str(err.value)


# ---------------------------------------------------------------------- load
@pytest.mark.parametrize("meta", [
    {"step": -2, "world_size": 1},
    {"step": True, "world_size": 1},
    {"step": "4", "world_size": 1},
    {"step": 4.5, "world_size": 1},
    {"step": 4, "world_size": 0},
], ids=["negative", "bool", "string", "float", "no_ranks"])
def test_a_meta_json_without_a_step_count_is_refused_naming_it(tmp_path, meta):
    """int() took all of these: a resume started at step -2 (or 1 for true), where checkpoint_step (status.json's
    checkpoint_step, the boot heartbeat) called the same file unreadable."""
    path = _save(tmp_path, 4)
    (path / "meta.json").write_text(json.dumps(meta))
    assert checkpoint.checkpoint_step(path) is (None if meta["world_size"] else 4)
    net, opt = _net_opt()
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(path, net, opt, INFO, scaler=None)
    assert "step_00000004: meta.json cannot be read (ValueError" in str(err.value), str(err.value)


def test_a_checkpoint_of_another_world_size_is_refused_naming_both(tmp_path):
    path = _save(tmp_path, 4)
    two = checkpoint.DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend=None)
    net, opt = _net_opt(seed=1)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(path, net, opt, two, scaler=None)
    assert "step_00000004: written by 1 rank(s), this run has 2" in str(err.value)
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, net.parameters()))  # nothing restored


def _draws():
    return (torch.rand(3).tolist(), random.random(), np.random.rand(2).tolist())


def test_a_load_restores_the_random_streams_of_the_run_that_saved(tmp_path):
    torch.manual_seed(11)
    random.seed(12)
    np.random.seed(13)
    net = nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    path = checkpoint.save(tmp_path, 5, net, opt, INFO, data_state={}, scaler=None, parallel="none", keep=1)
    uninterrupted = _draws()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    _draws()
    fresh = nn.Linear(4, 3)
    step, _ = checkpoint.load(path, fresh, torch.optim.AdamW(fresh.parameters(), lr=0.1), INFO, scaler=None)
    assert step == 5 and _draws() == uninterrupted
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), fresh.parameters()))
