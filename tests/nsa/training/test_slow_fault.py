"""NSA_FAULT=slow_step@SHARE: every step of every rank made slower by SHARE of its own time, so tokens/s drops by
SHARE / (1 + SHARE) (0.25: 20%), for measuring whether a comparison of runs detects a real slowdown
(benchmarks/bench_aa_compare.py). The sleep must be a share of the step's OWN time and lie inside the timed step:
checked against the trainer's own clock (no timed assertion that depends on the machine's speed)."""

from __future__ import annotations

import csv
import json

import pytest

from nsa import toggles
from nsa.training import model_faults, safety
from train_utils import TINY


@pytest.mark.parametrize("text,share", [("slow_step@0.25", 0.25), (" SLOW_STEP@1 ", 1.0), ("slow_step@.5", 0.5),
                                        ("slow_step@10", 10.0)])
def test_fault_syntax(text, share):
    fault = toggles.parse("NSA_FAULT", {"NSA_FAULT": text})
    assert fault == toggles.Fault("slow_step", None, share=share)
    assert not any(fault.fires(step, rank) for step in range(5) for rank in range(3))  # never a one-step fault
    assert toggles.check("NSA_FAULT", text) is None  # what `nsa-validate plan` accepts
    record = toggles.Toggles.read({"NSA_FAULT": text}).record()["fault"]
    assert record == str({"kind": "slow_step", "step": None, "rank": None, "seq_len": None, "stage": None,
                          "share": share})


@pytest.mark.parametrize("text", ["slow_step@", "slow_step", "slow_step@0", "slow_step@-0.5", "slow_step@x",
                                  "slow_step@0.25:1", "slow_step@11", "slow_step@nan", "slow_step@inf",
                                  "slow_step@1e-1", "slow_step@1.2.3"])
def test_bad_values_are_one_line_errors(text):
    with pytest.raises(ValueError) as err:
        toggles.parse("NSA_FAULT", {"NSA_FAULT": text})
    message = str(err.value)
    assert "NSA_FAULT" in message and "slow_step@SHARE" in message and "\n" not in message


def test_the_other_faults_keep_their_record():
    """env.json's "toggles" text of every other fault is what it always was (no "share" key)."""
    record = toggles.Toggles.read({"NSA_FAULT": "crash@3:1"}).record()["fault"]
    assert record == "{'kind': 'crash', 'step': 3, 'rank': 1, 'seq_len': None, 'stage': None}"


def test_run_control_sleeps_the_share_of_the_step_time(tmp_path):
    slept = []
    control = safety.RunControl(tmp_path, 0, toggles.Fault("slow_step", None, share=0.25))
    assert control.slow_step(0.4, sleep=slept.append) == pytest.approx(0.1)
    assert slept == [pytest.approx(0.1)]  # (1 + 0.25) x the step time: tokens/s 1 / 1.25 = 80%, 20% lower
    assert control.slow_step(0.0, sleep=slept.append) == 0.0 and len(slept) == 1
    for fault in (None, toggles.Fault("crash", 3), toggles.Fault("sel_v1_quadratic", None, None, 256)):
        assert safety.RunControl(tmp_path, 0, fault).slow_step(0.4, sleep=slept.append) == 0.0
    assert len(slept) == 1


def test_it_is_no_model_fault():
    from nsa_test_utils import make_attn, make_cfg

    layer = make_attn(make_cfg(selection="v1"), seed=1)
    assert model_faults.install(layer, toggles.Fault("slow_step", None, share=0.25)) == 0


def test_the_trainer_sleeps_the_share_inside_each_timed_step(tmp_path, monkeypatch):
    """A tiny CPU run in this process with slow_step@0.5: RunControl.slow_step is called once per step with the time
    the step took so far, and training.csv's step_time_s of that step includes the sleep: at least (1 + 0.5) x that
    time, so tokens/s is the step's tokens over the slowed time."""
    from nsa.training import distributed, trainer
    from nsa.training.cli import resolve_config
    from nsa.training.flags import build_parser

    calls = []
    real = safety.RunControl.slow_step

    def spy(self, step_s, sleep=None):
        pause = real(self, step_s, sleep)
        calls.append((step_s, pause))
        return pause

    monkeypatch.setattr(safety.RunControl, "slow_step", spy)
    out = tmp_path / "out"
    argv = ["--config", str(TINY), "--out-dir", str(out), "--steps", "4", "--batch-size", "1", "--seq-len", "128",
            "--save-every", "1000"]
    cfg, path = resolve_config(build_parser().parse_args(argv), environ={})
    tg = toggles.Toggles.read({"NSA_FAULT": "slow_step@0.5", "NSA_TB_DISABLE": "1"})
    info = distributed.init(cfg.train.device, cfg.train.pg_timeout_s)
    assert trainer.Trainer(cfg, path, info, tg, False, ["nsa-train", *argv]).run() == trainer.EXIT_OK
    with open(out / "training.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(calls) == len(rows) == 4
    tokens = cfg.train.batch_size * cfg.train.seq_len * cfg.train.accum
    for (step_s, pause), row in zip(calls, rows):
        assert step_s > 0 and pause == pytest.approx(0.5 * step_s)
        step_time = float(row["step_time_s"])
        assert step_time >= step_s + pause - 1e-6, (step_s, pause, step_time)  # the sleep is inside the step
        assert step_time < 10 * (step_s + pause) + 1.0  # and nothing else of that size (a generous bound)
        assert float(row["toks_per_s"]) == pytest.approx(tokens / step_time, rel=1e-4)  # as rounded in the csv
    notes = json.loads((out / "status.json").read_text())["notes"]
    assert any("slow_step@0.5" in n and "33%" in n for n in notes), notes  # 0.5 / 1.5: tokens/s a third lower
    assert not any("ignored" in n for n in notes)
