"""Checkpoints across two ranks (gloo, one spawned pair of processes, tiny modules, no training run): a checkpoint
saved by both ranks is loaded by both, each rank getting its own data position; ranks handed different
checkpoints (each rank takes the latest it sees: a shared file system that shows the newest step_N/ to one node
later than to the other) are refused on every rank, naming each rank's checkpoint, with nothing restored, instead
of continuing from different steps, parameters and data positions. And in one process: a rotation killed after
it deleted an old checkpoint's meta.json leaves that checkpoint's files, which the next save removes (they were
kept for good, a whole model and optimizer state each time)."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from train_utils import spawn_ranks

WORLD = 2


def _net_opt(seed: int):
    torch.manual_seed(seed)
    net = nn.Linear(4, 3)
    return net, torch.optim.AdamW(net.parameters(), lr=0.1)


def _params(net) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def _rank_main(rank: int, store: str, root: str) -> None:
    from nsa.training import checkpoint
    from nsa.training.checkpoint import CheckpointError

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, WORLD), rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    info = checkpoint.DistInfo(rank=rank, world_size=WORLD, local_rank=rank, device=torch.device("cpu"),
                               backend="gloo")
    out, results = Path(root) / "run", {}
    try:
        net, opt = _net_opt(0)
        saved = {}
        for step in (2, 4):
            net(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            checkpoint.save(out, step, net, opt, info, data_state={"pos": 100 * step + rank}, scaler=None,
                            parallel="ddp", keep=5)
            saved[step] = _params(net)
        results["saved"] = saved

        # every rank sees the same latest checkpoint
        fresh, fresh_opt = _net_opt(1)
        step, data = checkpoint.load(checkpoint.latest_checkpoint(out), fresh, fresh_opt, info, scaler=None)
        results["same"] = (step, data, _params(fresh))

        # rank 1 does not see step 4 yet: its latest is step 2
        other, other_opt = _net_opt(2)
        before = _params(other)
        name = "step_00000004" if rank == 0 else "step_00000002"
        try:
            step, data = checkpoint.load(out / "checkpoints" / name, other, other_opt, info, scaler=None)
            results["split"] = ("loaded", step, data)
        except CheckpointError as exc:
            results["split"] = ("refused", str(exc))
        results["untouched"] = all(torch.equal(a, b) for a, b in zip(before, _params(other)))
        results["moments"] = len(other_opt.state)
    finally:
        torch.save(results, Path(root) / f"rank{rank}.pt")
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn_ranks(_rank_main, tmp_path_factory.mktemp("dist_checkpoint"), WORLD, timeout_s=120)


def test_both_ranks_load_the_checkpoint_they_saved_each_with_its_own_data_position(ranks):
    for rank, res in enumerate(ranks):
        step, data, params = res["same"]
        assert (step, data) == (4, {"pos": 400 + rank})
        assert all(torch.equal(a, b) for a, b in zip(params, res["saved"][4]))


def test_ranks_handed_different_checkpoints_are_refused_on_every_rank_naming_both(ranks):
    for res in ranks:
        outcome = res["split"]
        assert outcome[0] == "refused", outcome  # was: rank 0 at step 4, rank 1 at step 2, nothing said
        assert "rank 0: step_00000004 (step 4)" in outcome[1] and "rank 1: step_00000002 (step 2)" in outcome[1]
        assert res["untouched"] and res["moments"] == 0  # nothing restored from either


# ---------------------------------------------------------------------- one process: rotation killed midway
class Killed(BaseException):
    """What a SIGKILL does to a save: it stops where it is, no handler runs."""


def test_the_next_save_removes_what_a_rotation_killed_after_the_meta_json_left(tmp_path, monkeypatch):
    from nsa.training import checkpoint

    info = checkpoint.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    net, opt = _net_opt(0)

    def save(step: int) -> Path:
        return checkpoint.save(tmp_path, step, net, opt, info, data_state={}, scaler=None, parallel="none", keep=1)

    root = tmp_path / "checkpoints"
    save(1)
    real_rmtree = shutil.rmtree

    def killed_deleting_step_1(path, *args, **kwargs):  # after _remove took its meta.json, before the rest
        if Path(path).name == "step_00000001":
            raise Killed
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_deleting_step_1)
    with pytest.raises(Killed):
        save(2)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    assert (root / "step_00000001" / "model_optim.pt").is_file()  # what the kill left: no checkpoint any more
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000002"]
    save(3)
    assert sorted(p.name for p in root.iterdir()) == ["step_00000003"]  # was: step_00000001 kept for good
