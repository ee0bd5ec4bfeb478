"""A stopped-and-resumed run is the same run as an uninterrupted one (CPU fp32, bit for bit): stopped by .HALT at a
step that is not a checkpoint step, crashed after a periodic checkpoint with rows written past it, resumed twice;
with gradient accumulation 2 and evaluation, on synthetic data and on a text corpus. The reference is the same
config run once without a stop: every step's loss and gradient norm, training.csv and val.csv, the final model and
AdamW state and every rank's data position must equal it. Single process, in this process; the 2-rank DDP and
FSDP2 variants launch torchrun eight times and are `slow`."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml

from train_utils import TINY, flat_items, heartbeats, read_csv, run

from nsa.training import cli as train
from nsa.training import trainer as trainer_module
from nsa.training.checkpoint import latest_checkpoint, list_checkpoints

STEPS, SAVE_EVERY, EVAL_EVERY = 7, 3, 2


def _config(tmp_path, dataset: str, **train_cfg):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"steps": STEPS, "save_every": SAVE_EVERY, "keep_checkpoints": 10, "accum": 2,
                         "batch_size": 1, "seq_len": 64, "eval_every": EVAL_EVERY, "eval_batches": 1,
                         "warmup_steps": 2, "log_every": 1, **train_cfg})
    if dataset == "text":
        words = ["sparse", "native", "attention", "token", "block", "window", "select", "compress", "gate", "head"]
        rng = random.Random(0)
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(" ".join(rng.choice(words) for _ in range(3000)))  # ~22k tokens: no epoch ends
        raw["data"] = {"dataset": "text", "path": str(corpus)}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _assert_final_state_equal(got_dir, want_dir, ranks: int) -> None:
    """The latest checkpoints of two runs hold the same step, model, AdamW state (moments and step counts) and
    every rank's data position: bit for bit."""
    got, want = latest_checkpoint(got_dir), latest_checkpoint(want_dir)
    assert got.name == want.name
    a = dict(flat_items(torch.load(got / "model_optim.pt", map_location="cpu", weights_only=False)))
    b = dict(flat_items(torch.load(want / "model_optim.pt", map_location="cpu", weights_only=False)))
    assert set(a) == set(b) and any("exp_avg_sq" in k for k in a)
    for key, value in b.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(a[key], value), key
        else:
            assert a[key] == value, key
    for rank in range(ranks):
        data = [torch.load(d / f"rank{rank}.pt", weights_only=False)["data"] for d in (got, want)]
        assert data[0] == data[1], (rank, data)


def _step_records(out_dir, rank=0) -> dict[int, tuple]:
    """step -> (loss, this rank's loss, grad norm) at full float precision, the last record of each step."""
    return {h["step"]: (h["loss"], h["local_loss"], h["grad_norm"])
            for h in heartbeats(out_dir, rank) if h["msg"] == "step"}


def _assert_files_equal(got_dir, want_dir) -> None:
    """training.csv and val.csv: one row per step (no duplicates, no gaps), the same values as the reference's
    (the time and memory columns aside)."""
    for name, keys in (("training.csv", ("step", "loss", "lr", "grad_norm")), ("val.csv", ("step", "val_loss"))):
        got, want = read_csv(got_dir / name), read_csv(want_dir / name)
        assert [[r[k] for k in keys] for r in got] == [[r[k] for k in keys] for r in want], name
    assert [int(r["step"]) for r in read_csv(got_dir / "training.csv")] == list(range(1, STEPS + 1))
    assert [int(r["step"]) for r in read_csv(got_dir / "val.csv")] == [2, 4, 6, 7]


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")

    def train_once(cfg, out, *flags, fault=None, halt_after=None):
        with pytest.MonkeyPatch.context() as mp:
            if fault is not None:
                mp.setenv("NSA_FAULT", fault)
            if halt_after is not None:  # .HALT appears once step `halt_after` is recorded, as a person would touch it
                record = trainer_module.Trainer._record

                def record_then_halt(self, step, *args, **kwargs):
                    record(self, step, *args, **kwargs)
                    if step == halt_after:
                        (self.out / ".HALT").write_text("stop requested by the test")
                mp.setattr(trainer_module.Trainer, "_record", record_then_halt)
            try:
                return train.main(["--config", str(cfg), "--out-dir", str(out), *flags])
            except Exception as exc:  # NSA_FAULT=crash raises out of the trainer, as in a real crash
                return exc
    return train_once


@pytest.mark.parametrize("dataset", ["synthetic", "text"])
def test_a_run_halted_crashed_and_resumed_twice_is_the_uninterrupted_run_bitwise(tmp_path, in_process, dataset):
    cfg = _config(tmp_path, dataset)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert in_process(cfg, full) == 0

    # .HALT seen at step 4 (not a checkpoint step): a checkpoint of step 4, exit 0, status halted
    assert in_process(cfg, cut, halt_after=3) == 0
    status = json.loads((cut / "status.json").read_text())
    assert (status["status"], status["step"]) == ("halted", 4), status
    assert [c.name for c in list_checkpoints(cut)] == ["step_00000003", "step_00000004"]
    # resumed (the .HALT moved aside), then a crash at step 6: step 5's row is written past the latest checkpoint (4)
    crashed = in_process(cfg, cut, "--resume", fault="crash@6")
    assert isinstance(crashed, Exception) and "crash at step 6" in str(crashed)
    assert not (cut / ".HALT").exists() and (cut / ".HALT.prev").exists()
    assert [int(r["step"]) for r in read_csv(cut / "training.csv")] == [1, 2, 3, 4, 5]
    assert latest_checkpoint(cut).name == "step_00000004"
    # the second resume: from step 4 again, step 5's row replaced, to the end
    assert in_process(cfg, cut, "--resume") == 0
    status = json.loads((cut / "status.json").read_text())
    assert (status["status"], status["step"]) == ("completed", STEPS)
    assert any("resumed from" in n and "step_00000004" in n for n in status["notes"]), status["notes"]

    full_steps, cut_steps = _step_records(full), _step_records(cut)
    assert sorted(cut_steps) == list(range(1, STEPS + 1))
    assert cut_steps == full_steps  # bitwise: the same floats at every step, those run twice included
    _assert_files_equal(cut, full)
    _assert_final_state_equal(cut, full, ranks=1)

    # summary.json covers the steps this process ran (5..7), once each; env.json says where it resumed
    summary, reference = (json.loads((d / "summary.json").read_text()) for d in (cut, full))
    assert (summary["steps"], summary["first_step"], summary["last_step"]) == (3, 5, STEPS)
    assert summary["final_loss"] == reference["final_loss"] and summary["steps_planned"] == STEPS
    assert json.loads((cut / "env.json").read_text())["resumed_from_step"] == 4
    ends = [(h["msg"], h["step"]) for h in heartbeats(cut, 0) if h["msg"] in ("stopping", "stop", "error", "done")]
    # the halt: its reason before its checkpoint ("stopping", not an end), its end
    assert ends == [("stopping", 4), ("stop", 4), ("error", 6), ("done", STEPS)], ends


def _launch_variant(tmp_path, mode: str, dataset: str):
    cfg = _config(tmp_path, dataset, steps=5, save_every=2)
    flags = ("--ddp", "1") if mode == "ddp" else ("--fsdp",)
    env = {"NSA_TB_DISABLE": "1"}
    full, cut = tmp_path / "full", tmp_path / "cut"
    code, out = run(full, *flags, nproc=2, config=cfg, env=env)
    assert code == 0, out[-3000:]
    code, out = run(cut, *flags, nproc=2, config=cfg, env={**env, "NSA_FAULT": "crash@3"})
    assert code != 0
    code, out = run(cut, *flags, "--resume", nproc=2, config=cfg, env={**env, "NSA_FAULT": "crash@5"})
    assert code != 0 and "step_00000002" in out
    code, out = run(cut, *flags, "--resume", nproc=2, config=cfg, env=env)
    assert code == 0 and "step_00000004" in out, out[-3000:]
    return full, cut


@pytest.mark.slow
@pytest.mark.parametrize("mode, dataset", [("ddp", "synthetic"), ("fsdp", "text")])
def test_two_ranks_crashed_twice_and_resumed_are_the_uninterrupted_run_bitwise(tmp_path, mode, dataset):
    full, cut = _launch_variant(tmp_path, mode, dataset)
    for rank in (0, 1):
        assert _step_records(cut, rank) == _step_records(full, rank), rank
    for name, keys in (("training.csv", ("step", "loss", "lr", "grad_norm")), ("val.csv", ("step", "val_loss"))):
        got, want = read_csv(cut / name), read_csv(full / name)
        assert [[r[k] for k in keys] for r in got] == [[r[k] for k in keys] for r in want], name
    assert [int(r["step"]) for r in read_csv(cut / "training.csv")] == [1, 2, 3, 4, 5]
    _assert_final_state_equal(cut, full, ranks=2)


def test_a_resume_on_an_edited_corpus_is_a_note_in_status_json(tmp_path, in_process):
    """The text corpus edited (one character, the same length) between the run and its resume: the resumed run trains
    on other text, and status.json's notes say so beside the resume (the source's fingerprint of the stream)."""
    cfg = _config(tmp_path, "text", steps=4, save_every=2, eval_every=0)
    out = tmp_path / "run"
    assert in_process(cfg, out, halt_after=2) == 0
    corpus = tmp_path / "corpus.txt"
    text = corpus.read_text()
    corpus.write_text(text[:100] + ("X" if text[100] != "X" else "Y") + text[101:])
    assert in_process(cfg, out, "--resume") == 0
    notes = json.loads((out / "status.json").read_text())["notes"]
    assert any("changed since the checkpoint" in n and "fingerprint" in n for n in notes), notes
    # the same corpus again: no such note
    assert in_process(cfg, tmp_path / "again", halt_after=2) == 0
    assert in_process(cfg, tmp_path / "again", "--resume") == 0
    notes = json.loads((tmp_path / "again" / "status.json").read_text())["notes"]
    assert not any("changed since the checkpoint" in n for n in notes), notes
