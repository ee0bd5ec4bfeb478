"""What the README promises about nsa-train, checked in this process: a value the trainer cannot use is a usage error
(exit 2) naming the key before anything runs; a misspelt NSA_* variable and a fault that cannot fire are said, not
silently ignored; a --resume that finds no checkpoint loses none of the earlier run's files."""

from __future__ import annotations

import json

import pytest
import yaml

from train_utils import TINY, read_csv

from nsa.toggles import Toggles
from nsa.training import cli as train
from nsa.training.config import ConfigError, apply_overrides, load_config

SMALL = ("--steps", "1", "--seq-len", "64", "--batch-size", "1")


def _main(tmp_path, *flags):
    out = tmp_path / "out"
    return train.main(["--config", str(TINY), "--out-dir", str(out), *flags]), out


@pytest.mark.parametrize("seed", [2 ** 64, -(2 ** 63) - 1, 10 ** 30])
def test_a_seed_torch_cannot_take_is_a_config_error_naming_the_key(seed):
    with pytest.raises(ConfigError, match=r"train\.seed must be an integer from -2\*\*63 to 2\*\*64 - 1"):
        apply_overrides(load_config(TINY), {"train.seed": seed})


@pytest.mark.parametrize("seed", [2 ** 64 - 1, -(2 ** 63), -5, 0])
def test_every_seed_torch_takes_is_accepted(seed):
    assert apply_overrides(load_config(TINY), {"train.seed": seed}).train.seed == seed


def test_a_huge_seed_exits_2_before_anything_runs(tmp_path, capsys):
    code, out = _main(tmp_path, "--seed", str(2 ** 64))
    assert code == 2
    assert "train.seed must be an integer" in capsys.readouterr().err
    assert not out.exists()  # refused before the trainer made its out_dir


def test_misspelt_toggles_are_named_with_the_closest_known_one():
    tg = Toggles.read({"NSA_DDP_COMPRES": "bf16", "NSA_SEL_RANGES_V2": "1", "NCCL_ALGO": "Ring"})
    assert tg.ddp_compress == "none"
    assert tg.unknown == ("NSA_DDP_COMPRES is not a known NSA_* variable (did you mean NSA_DDP_COMPRESS?)",)
    assert "unknown" not in tg.record()  # env.json's "toggles" keep their keys


def test_the_trainer_says_what_it_ignores(tmp_path, monkeypatch):
    """A misspelt toggle, and a fault at a step this run never reaches: each named in a note, not silently
    dropped (the run itself completes)."""
    monkeypatch.setenv("NSA_DDP_COMPRES", "bf16")
    monkeypatch.setenv("NSA_FAULT", "crash@5")
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _main(tmp_path, *SMALL)
    assert code == 0
    notes = json.loads((out / "status.json").read_text())["notes"]
    assert "NSA_DDP_COMPRES is not a known NSA_* variable (did you mean NSA_DDP_COMPRESS?): ignored" in notes
    assert "NSA_FAULT=crash@5 will not fire: this run trains steps 1 to 1" in notes


def test_a_resume_without_a_checkpoint_moves_the_earlier_runs_files_aside(tmp_path, monkeypatch):
    """An earlier run that crashed before its first checkpoint: --resume starts at step 0, and the earlier run's
    rows, heartbeats and error file are kept in previous_runs/, not replaced by or mixed with the new run's."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    out = tmp_path / "out"
    out.mkdir()
    earlier_csv = "step,loss\n1,5.5\n2,5.4\n"
    (out / "training.csv").write_text(earlier_csv)
    (out / "heartbeat_rank0.jsonl").write_text(json.dumps({"ts": 1.0, "rank": 0, "step": 2, "msg": "error"}) + "\n")
    (out / "error_rank0.txt").write_text("Traceback: the earlier run's crash\n")
    (out / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": 4}}))
    code, _ = _main(tmp_path, *SMALL, "--resume")
    assert code == 0
    archives = list((out / "previous_runs").iterdir())
    assert len(archives) == 1
    assert (archives[0] / "training.csv").read_text() == earlier_csv
    assert (archives[0] / "error_rank0.txt").is_file() and not (out / "error_rank0.txt").exists()
    assert [r["step"] for r in read_csv(out / "training.csv")] == ["1"]
    beats = [json.loads(line) for line in (out / "heartbeat_rank0.jsonl").read_text().splitlines()]
    assert beats[0]["msg"] == "boot" and beats[-1]["msg"] == "done"
    notes = json.loads((out / "status.json").read_text())["notes"]
    assert any("--resume found no checkpoint to continue from" in n for n in notes), notes
