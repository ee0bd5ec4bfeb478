"""Corners of nsa-train: a launch environment outside its own world is refused naming the variable (exit 2); an
accumulation count too large for a 64-bit integer is a config error before anything runs; a resumed run's boot
heartbeat is at the step it resumes from; a run stopped on a non-finite loss keeps its last good checkpoint and says
which step that is (status.json, the reason); env.json says whether the tree differed from the commit it names.
In process, tiny runs; the git checks in a temporary repository."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from train_utils import TINY, heartbeats, read_csv

from nsa.training import checkpoint, distributed, outputs
from nsa.training import cli as train
from nsa.training.config import TRAIN_INT_MAX, ConfigError, apply_overrides, load_config

SMALL = ("--seq-len", "64", "--batch-size", "1")


def _train(out, *flags):
    return train.main(["--config", str(TINY), "--out-dir", str(out), *SMALL, *flags])


@pytest.fixture(autouse=True)
def _no_tensorboard(monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")


# ---------------------------------------------------------------------- launch environment
@pytest.mark.parametrize("env, needle", [
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: the number of ranks must be at least 1"),
    ({"WORLD_SIZE": "-2"}, "WORLD_SIZE=-2: the number of ranks must be at least 1"),
    ({"RANK": "1", "WORLD_SIZE": "1"}, "RANK=1 is outside the launch's ranks 0 to 0"),
    ({"RANK": "-1"}, "RANK=-1 is outside the launch's ranks 0 to 0"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is outside the launch's ranks 0 to 1"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 must not be negative"),
], ids=["world0", "world_negative", "rank_past_world", "rank_negative", "rank_equals_world", "local_negative"])
def test_a_rank_outside_its_launch_is_refused_before_a_process_group_starts(monkeypatch, env, needle):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(distributed.LaunchError, match=needle.replace("(", r"\(")):
        distributed.init("cpu")


@pytest.mark.parametrize("env, needle", [({"RANK": "x"}, "RANK='x' is not an integer"),
                                         ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0")])
def test_a_bad_launch_variable_exits_2_with_one_line(tmp_path, monkeypatch, capsys, env, needle):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _train(tmp_path / "out", "--steps", "1") == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()  # refused before the trainer made its out_dir


def test_every_rank_of_a_launch_is_accepted():
    for world in (1, 2, 8):
        for rank in range(world):
            distributed.check_launch(rank, world, rank % 4)


# ---------------------------------------------------------------------- accumulation
def test_an_accumulation_count_beyond_a_64_bit_integer_is_a_config_error_naming_the_key():
    cfg = load_config(TINY)
    with pytest.raises(ConfigError, match=r"train\.accum must be at most 2\*\*63 - 1"):
        apply_overrides(cfg, {"train.accum": TRAIN_INT_MAX + 1})
    assert apply_overrides(cfg, {"train.accum": 64}).train.accum == 64  # more micro-batches than batch_size: fine
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=r"train\.accum must be positive"):
            apply_overrides(cfg, {"train.accum": bad})


def test_a_huge_accum_exits_2_before_anything_runs(tmp_path, capsys):
    """It used to start and fail in the first step's loss / accum with an OverflowError traceback (exit 1)."""
    assert _train(tmp_path / "out", "--steps", "1", "--accum", str(10 ** 23)) == 2
    err = capsys.readouterr().err
    assert "train.accum must be at most 2**63 - 1" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- non-finite stop, resume
def _status(out) -> dict:
    return json.loads((out / "status.json").read_text())


def test_a_nonfinite_stop_keeps_the_last_good_checkpoint_and_a_resume_boots_at_its_step(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("NSA_FAULT", "nan@4")
    assert _train(out, "--steps", "5", "--save-every", "2") == 3
    status = _status(out)
    assert status["status"] == "nonfinite" and status["step"] == 3
    # steps 1-3 ran; step 4's loss was NaN: no checkpoint of the state after step 3, the one of step 2 is the latest
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["step_00000002"]
    assert status["checkpoint_step"] == 2
    assert "the last good checkpoint is step 2: --resume continues from it" in status["reason"], status["reason"]
    assert "at step 4" in status["reason"]

    monkeypatch.delenv("NSA_FAULT")
    assert _train(out, "--steps", "5", "--save-every", "2", "--resume") == 0
    beats = heartbeats(out, 0)
    boots = [b for b in beats if b["msg"] == "boot"]
    assert [b["step"] for b in boots] == [0, 2]  # the first run from 0, the resumed one from its checkpoint
    after_boot = beats[beats.index(boots[1]) + 1:]
    assert [b["step"] for b in after_boot if b["msg"] == "step"] == [3, 4, 5]
    assert all(b["step"] >= 2 for b in after_boot)
    assert [int(r["step"]) for r in read_csv(out / "training.csv")] == [1, 2, 3, 4, 5]
    assert _status(out)["status"] == "completed" and _status(out)["checkpoint_step"] == 5


def test_a_nonfinite_stop_before_any_checkpoint_says_a_resume_starts_over(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("NSA_FAULT", "nan@1")
    assert _train(out, "--steps", "2") == 3
    status = _status(out)
    assert status["status"] == "nonfinite" and status["checkpoint_step"] is None
    assert "there is no checkpoint: --resume starts again at step 0" in status["reason"], status["reason"]
    assert checkpoint.list_checkpoints(out) == []


def test_checkpoint_step_reads_meta_json_and_is_none_where_it_cannot(tmp_path):
    step_dir = tmp_path / "checkpoints" / "step_00000007"
    step_dir.mkdir(parents=True)
    assert checkpoint.checkpoint_step(None) is None
    assert checkpoint.checkpoint_step(step_dir) is None  # no meta.json: incomplete
    for text, expected in (('{"step": 7, "world_size": 1}', 7), ('{"step": ', None), ("{}", None),
                           ('{"step": "7"}', None), ('{"step": -1}', None), ('{"step": true}', None)):
        (step_dir / checkpoint.META).write_text(text)
        assert checkpoint.checkpoint_step(step_dir) == expected, text


# ---------------------------------------------------------------------- git state in env.json
def _git(repo, *args) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    (path / "code.py").write_text("x = 1\n")
    _git(path, "add", "code.py")
    _git(path, "commit", "-q", "-m", "first")
    return path


def test_git_dirty_says_whether_tracked_files_differ_from_the_commit(repo, tmp_path):
    assert outputs.git_dirty(repo) is False
    (repo / "notes.txt").write_text("untracked\n")
    assert outputs.git_dirty(repo) is False  # an untracked file is not part of the code that ran
    (repo / "code.py").write_text("x = 2\n")
    assert outputs.git_dirty(repo) is True
    _git(repo, "add", "code.py")
    assert outputs.git_dirty(repo) is True  # staged, not committed
    _git(repo, "commit", "-q", "-m", "second")
    assert outputs.git_dirty(repo) is False
    outside = tmp_path / "plain"
    outside.mkdir()
    assert outputs.git_dirty(outside) is None and outputs.git_sha(outside) is None


def test_env_json_records_the_commit_and_whether_the_tree_was_modified(repo, monkeypatch):
    head = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(outputs, "SOURCE_DIR", repo)
    env = outputs.environment({}, None, 1, "cpu", [])
    assert (env["git_sha"], env["git_dirty"]) == (head, False)
    (repo / "code.py").write_text("x = 3\n")
    env = outputs.environment({}, None, 1, "cpu", [])
    assert (env["git_sha"], env["git_dirty"]) == (head, True)  # the same sha: only git_dirty tells them apart
