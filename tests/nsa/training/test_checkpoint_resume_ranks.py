"""Two gloo ranks resuming and saving (one spawned pair of processes, one process group for every case):

- --resume: rank 0 chooses the checkpoint and every rank loads that one. A rank whose directory listing does not
  show the latest step_N/ yet (a shared file system that shows new files to some nodes later), or shows none at all,
  resumes from rank 0's all the same (it was refused, or started at step 0 beside a rank that resumed); a rank that
  cannot read rank 0's checkpoint at all stops every rank with its own error (a CheckpointError: exit 2).
- checkpoint.save where a write fails on one rank (a full disk, a permission): every rank raises CheckpointError
  naming the failing rank and its error, as load does, instead of the other ranks waiting in a barrier until the
  connection drops; no checkpoint of that step is left, its step_N.tmp/ is removed, the earlier checkpoint stays
  the latest and loads, and the next save on the same process group works.

And in one process: a lone rank's failed write and a rotation that fails after the new checkpoint is complete."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from train_utils import spawn_ranks

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny_cpu.yaml"

WORLD = 2
# (case, failing rank, what fails): each a save of step 4 after a good save of step 2
FAILURES = [("rank1_data", 1, "rank_file"), ("rank0_model", 0, "model_file"), ("rank0_mkdir", 0, "mkdir"),
            ("rank0_meta", 0, "meta")]


def _net_opt(seed: int):
    torch.manual_seed(seed)
    net = nn.Linear(4, 3)
    return net, torch.optim.AdamW(net.parameters(), lr=0.1)


def _patch(checkpoint, what: str):
    """Make `what` fail in this process; returns a function undoing it."""
    real_save, real_mkdir, real_write = checkpoint.torch.save, Path.mkdir, Path.write_text

    def save(obj, f, *args, **kwargs):
        name = Path(f).name
        if what == "rank_file" and name.startswith("rank"):
            raise OSError(28, "No space left on device", str(f))
        if what == "model_file" and name == "model_optim.pt":
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
        return real_save(obj, f, *args, **kwargs)

    def mkdir(self, *args, **kwargs):
        if what == "mkdir" and self.name.endswith(".tmp"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    def write_text(self, *args, **kwargs):
        if what == "meta" and self.name == "meta.json":
            raise OSError(122, "Disk quota exceeded", str(self))
        return real_write(self, *args, **kwargs)

    checkpoint.torch.save, Path.mkdir, Path.write_text = save, mkdir, write_text

    def undo():
        checkpoint.torch.save, Path.mkdir, Path.write_text = real_save, real_mkdir, real_write
    return undo

# (case, what rank 1's file system shows of the latest checkpoint, step_00000002): a --resume each
RESUMES = [("same", "all"), ("late", "unlisted"), ("none", "nothing"), ("unseen", "unreadable")]


def _cfg(out: Path):
    from nsa.training.config import apply_overrides, load_config

    return apply_overrides(load_config(TINY), {
        "train.out_dir": str(out), "train.seq_len": 64, "train.batch_size": 2, "train.parallel": "ddp",
        "train.steps": 2, "train.save_every": 1, "train.warmup_steps": 0, "train.lr_schedule": "constant",
        "train.log_every": 1000})


def _hide(checkpoint, shows: str):
    """Rank 1's view of the checkpoints: `shows` "all", "unlisted" (step_00000002 missing from the directory
    listing, readable by its name), "nothing" (no checkpoint listed) or "unreadable" (step_00000002 neither listed
    nor readable). Returns a function undoing it."""
    real_list, real_is_file = checkpoint.list_checkpoints, Path.is_file
    if shows == "all":
        return lambda: None

    def listed(out_dir):
        return [] if shows == "nothing" else [p for p in real_list(out_dir) if p.name != "step_00000002"]

    def is_file(self):
        return False if "step_00000002" in self.parts else real_is_file(self)

    checkpoint.list_checkpoints = listed
    if shows == "unreadable":
        Path.is_file = is_file

    def undo():
        checkpoint.list_checkpoints, Path.is_file = real_list, real_is_file
    return undo


def _resumes(results: dict, rank: int, info, out: Path) -> None:
    from nsa.toggles import Toggles
    from nsa.training import checkpoint, trainer

    tr = trainer.Trainer(_cfg(out), str(TINY), info, Toggles.read(), False, ["nsa-train"])
    results["trained"] = tr.run()  # checkpoints of steps 1 and 2
    del tr
    latest = out / "checkpoints" / "step_00000002"
    saved_model = torch.load(latest / "model_optim.pt", weights_only=False)["model"]
    saved_data = torch.load(latest / f"rank{rank}.pt", weights_only=False)["data"]
    for case, shows in RESUMES:
        undo = _hide(checkpoint, shows) if rank == 1 else (lambda: None)
        try:
            tr = trainer.Trainer(_cfg(out), str(TINY), info, Toggles.read(), True, ["nsa-train", "--resume"])
            state = tr.net.state_dict()
            results[case] = ("resumed", tr.start_step,
                             sorted(state) == sorted(saved_model)
                             and all(torch.equal(state[k], saved_model[k]) for k in saved_model),
                             tr.source.state_dict() == saved_data)
            tr._close()
            del tr
        except Exception as exc:  # noqa: BLE001 - recorded, the test says which it must be
            results[case] = (type(exc).__name__, str(exc))
        finally:
            undo()


def _rank_main(rank: int, store: str, root: str) -> None:
    for name in [k for k in os.environ if k.startswith(("NSA_", "CONFIG"))]:
        del os.environ[name]
    os.environ["NSA_TB_DISABLE"] = "1"
    torch.set_num_threads(1)
    from nsa.training import checkpoint

    # a rank left waiting in a collective fails within 20 s here, not the default half hour
    dist.init_process_group("gloo", store=dist.FileStore(store, WORLD), rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=20))
    info = checkpoint.DistInfo(rank=rank, world_size=WORLD, local_rank=rank, device=torch.device("cpu"),
                               backend="gloo")
    results: dict = {"resume": {}, "save": {}}
    try:
        for part, run in (("resume", _resumes), ("save", _saves)):
            try:
                run(results[part], rank, info, Path(root) / part)
            except Exception as exc:  # noqa: BLE001 - what a part did not record fails its tests
                results[part]["crashed"] = f"{type(exc).__name__}: {exc}"
    finally:
        torch.save(results, Path(root) / f"rank{rank}.pt")
        dist.destroy_process_group()


def _saves(results: dict, rank: int, info, out: Path) -> None:
    from nsa.training import checkpoint

    net, opt = _net_opt(0)

    def save(step: int) -> None:
        checkpoint.save(out, step, net, opt, info, data_state={"pos": 100 * step + rank}, scaler=None,
                        parallel="ddp", keep=5)

    save(2)
    for case, failing, what in FAILURES:
        undo = _patch(checkpoint, what) if rank == failing else (lambda: None)
        try:
            save(4)
            results[case] = ("saved", None)
        except Exception as exc:  # noqa: BLE001 - recorded, the test says which it must be
            results[case] = (type(exc).__name__, str(exc))
        finally:
            undo()
        dist.barrier()  # rank 0 has removed the .tmp: what the case left is what both ranks list
        results[case + "_left"] = sorted(p.name for p in (out / "checkpoints").iterdir())
        dist.barrier()  # both have listed before rank 0 starts the next save
    fresh, fresh_opt = _net_opt(1)
    results["after_failures"] = checkpoint.load(checkpoint.latest_checkpoint(out), fresh, fresh_opt, info,
                                                scaler=None)
    save(6)  # the process group is in step: the next save works
    results["next_left"] = sorted(p.name for p in (out / "checkpoints").iterdir())
    results["next"] = checkpoint.load(checkpoint.latest_checkpoint(out), fresh, fresh_opt, info, scaler=None)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn_ranks(_rank_main, tmp_path_factory.mktemp("resume_ranks"), WORLD, timeout_s=150)


# ---------------------------------------------------------------------- --resume
@pytest.mark.parametrize("case", ["same", "late", "none"])
def test_every_rank_resumes_from_the_checkpoint_rank_0_sees_whatever_its_own_listing_shows(ranks, case):
    for rank, res in enumerate(ranks):
        assert res["resume"].get("trained") == 0, res["resume"].get("crashed")
        # (resumed, step, parameters as saved, this rank's own data position as saved)
        outcome = res["resume"].get(case, ("not reached", res["resume"].get("crashed")))
        assert outcome == ("resumed", 2, True, True), (rank, outcome)
        # was: "late" refused on both ranks (rank 1 took step_00000001); "none": rank 1 at step 0 beside rank 0's
        # resume, their collectives crossed


def test_a_rank_that_cannot_read_rank_0_s_checkpoint_stops_every_rank_with_its_error(ranks):
    for rank, res in enumerate(ranks):
        kind, message = res["resume"].get("unseen", ("not reached", res["resume"].get("crashed")))
        assert kind == "CheckpointError", message
        assert "step_00000002: not a complete checkpoint (no meta.json)" in message, message
        assert ("(on rank 1)" in message) == (rank == 0), message


# ---------------------------------------------------------------------- save

@pytest.mark.parametrize("case, failing, what", FAILURES, ids=[c[0] for c in FAILURES])
def test_a_write_failing_on_one_rank_raises_a_checkpoint_error_on_every_rank_naming_it(ranks, case, failing,
                                                                                        what):
    expected = {"rank_file": "No space left on device", "model_file": "PytorchStreamWriter failed writing file",
                "mkdir": "Permission denied", "meta": "Disk quota exceeded"}[what]
    for res in ranks:
        kind, message = res["save"].get(case, ("not reached", res["save"].get("crashed")))
        assert kind == "CheckpointError", (case, kind, message)  # was: a barrier left waiting, a gloo error later
        assert "the checkpoint of step 4 is not saved" in message
        assert f"rank {failing}: " in message and expected in message, message
        # no checkpoint of step 4, no step_4.tmp: the earlier one is all there is
        assert res["save"][case + "_left"] == ["step_00000002"], res["save"][case + "_left"]


def test_after_failed_saves_the_earlier_checkpoint_loads_and_the_next_save_works(ranks):
    for rank, res in enumerate(ranks):
        assert "crashed" not in res["save"], res["save"]["crashed"]
        assert res["save"]["after_failures"] == (2, {"pos": 200 + rank})
        assert res["save"]["next_left"] == ["step_00000002", "step_00000006"]
        assert res["save"]["next"] == (6, {"pos": 600 + rank})


# ---------------------------------------------------------------------- one process
def _one_rank():
    from nsa.training import checkpoint

    return checkpoint, checkpoint.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                                           backend=None)


def test_a_lone_rank_s_failed_write_is_a_checkpoint_error_and_leaves_no_tmp(tmp_path):
    checkpoint, info = _one_rank()
    net, opt = _net_opt(0)
    checkpoint.save(tmp_path, 1, net, opt, info, data_state={}, scaler=None, parallel="none", keep=3)
    undo = _patch(checkpoint, "rank_file")
    try:
        with pytest.raises(checkpoint.CheckpointError, match="step 2 is not saved: .*No space left on device"):
            checkpoint.save(tmp_path, 2, net, opt, info, data_state={}, scaler=None, parallel="none", keep=3)
    finally:
        undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000001"]  # was: step_2.tmp left


def test_a_rotation_that_fails_after_the_rename_says_the_new_checkpoint_is_saved(tmp_path, monkeypatch):
    checkpoint, info = _one_rank()
    net, opt = _net_opt(0)
    checkpoint.save(tmp_path, 1, net, opt, info, data_state={}, scaler=None, parallel="none", keep=1)

    def unlistable(out_dir):
        raise PermissionError(13, "Permission denied", str(out_dir))

    monkeypatch.setattr(checkpoint, "list_checkpoints", unlistable)
    with pytest.raises(checkpoint.CheckpointError, match=r"step 2 is saved \(--resume continues from it\), but the "
                                                         r"older ones are not rotated: .*Permission denied"):
        checkpoint.save(tmp_path, 2, net, opt, info, data_state={}, scaler=None, parallel="none", keep=1)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_00000001", "step_00000002"]
