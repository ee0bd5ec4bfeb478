"""The learning rate a run uses at every step (training.csv's `lr`), against the schedule written out by hand: linear
warmup to train.lr, then a cosine to min_lr_ratio * lr over train.decay_steps, or, with decay_steps unset, over the
rest of the run, so that its last step is at the floor; and what a resume with a larger --steps does to it. In
process, single-step-sized runs of the tiny model."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from train_utils import TINY, read_csv

from nsa.training import cli as train

LR, WARMUP, FLOOR = 3e-3, 2, 0.1


def by_hand(step: int, cosine_steps: int) -> float:
    if step <= WARMUP:
        return LR * step / WARMUP
    progress = min(1.0, (step - WARMUP) / cosine_steps)
    return LR * FLOOR + (LR - LR * FLOOR) * (1 + math.cos(math.pi * progress)) / 2


def _train(tmp_path, out_name, *flags, **train_cfg):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"lr": LR, "warmup_steps": WARMUP, "min_lr_ratio": FLOOR, "lr_schedule": "cosine",
                         "seq_len": 64, "batch_size": 1, "save_every": 1000, **train_cfg})
    cfg = tmp_path / f"{out_name}.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / out_name
    assert train.main(["--config", str(cfg), "--out-dir", str(out), *flags]) == 0
    return out


def _lrs(out) -> list[float]:
    rows = read_csv(out / "training.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    return [float(r["lr"]) for r in rows]


def _approx(values):
    return pytest.approx(values, rel=1e-5, abs=5e-7)  # training.csv keeps 6 decimals / 6 significant digits


@pytest.fixture(autouse=True)
def _no_tensorboard(monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")


def test_with_decay_steps_unset_the_cosine_spans_the_rest_of_the_run_and_ends_at_the_floor(tmp_path):
    out = _train(tmp_path, "unset", steps=6, decay_steps=None)
    lrs = _lrs(out)
    assert lrs == _approx([by_hand(s, cosine_steps=6 - WARMUP) for s in range(1, 7)])
    assert lrs[WARMUP - 1] == pytest.approx(LR) and lrs[-1] == pytest.approx(LR * FLOOR)


def test_a_resume_with_more_steps_stretches_an_unset_decay_and_says_so(tmp_path):
    """The first process's rows keep the schedule they ran with (4 steps); the steps after the resume follow the
    schedule of the new length (7 steps), and the resume says that the decay changed."""
    out = _train(tmp_path, "run", steps=4, decay_steps=None)
    raw = yaml.safe_load((tmp_path / "run.yaml").read_text())
    raw["train"]["steps"] = 7
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    assert train.main(["--config", str(tmp_path / "run.yaml"), "--out-dir", str(out), "--resume"]) == 0
    lrs = _lrs(out)
    assert lrs[:4] == _approx([by_hand(s, cosine_steps=4 - WARMUP) for s in range(1, 5)])
    assert lrs[4:] == _approx([by_hand(s, cosine_steps=7 - WARMUP) for s in range(5, 8)])
    assert lrs[-1] == pytest.approx(LR * FLOOR)
    notes = json.loads((out / "status.json").read_text())["notes"]
    said = [n for n in notes if "train.steps 4 -> 7" in n]
    assert said and "decay_steps unset" in said[0] and "step 7" in said[0] and "step 5 on" in said[0], notes


def test_with_decay_steps_set_the_cosine_takes_that_many_steps_then_stays_at_the_floor_across_a_resume(tmp_path):
    out = _train(tmp_path, "run", steps=4, decay_steps=3)
    assert train.main(["--config", str(tmp_path / "run.yaml"), "--out-dir", str(out), "--resume",
                       "--steps", "6"]) == 0
    lrs = _lrs(out)
    assert lrs == _approx([by_hand(s, cosine_steps=3) for s in range(1, 7)])  # one schedule throughout
    assert lrs[-2:] == _approx([LR * FLOOR, LR * FLOOR])  # steps 5 and 6: at the floor
    notes = json.loads((out / "status.json").read_text())["notes"]
    assert not any("decay_steps unset" in n for n in notes), notes
