"""What a resume does with what it finds damaged or changed, and what the trainer says of settings that cannot act:
a damaged or foreign checkpoint is refused naming the file (exit 2) and the run's heartbeat and status.json say it
ended at start-up; a damaged training.csv is repaired with the file as it was kept beside it; a resumed run keeps
its own AdamW settings (config, NSA_OPT_FUSED) and says which differ from the checkpoint's. In process, tiny runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from train_utils import TINY, heartbeats, read_csv

from nsa.training import cli as train
from nsa.training.outputs import CsvLog

CKPT = "checkpoints/step_00000004"


def _config(tmp_path, name="cfg.yaml", **train_cfg):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update(train_cfg)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def _train(out, *flags, config=TINY):
    return train.main(["--config", str(config), "--out-dir", str(out), *flags])


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """A finished 4-step run with checkpoints at steps 2 and 4 (copied by each test that damages it)."""
    out = tmp_path_factory.mktemp("base") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSA_TB_DISABLE", "1")
        assert _train(out, "--steps", "4", "--save-every", "2") == 0
    return out


@pytest.fixture
def run_copy(four_steps, tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    out = tmp_path / "out"
    shutil.copytree(four_steps, out)
    return out


def _truncate(path):
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.parametrize("damage, file", [
    (lambda c: _truncate(c / "model_optim.pt"), "model_optim.pt cannot be read"),
    (lambda c: (c / "model_optim.pt").write_bytes(b""), "model_optim.pt cannot be read (EOFError"),
    (lambda c: (c / "model_optim.pt").unlink(), "model_optim.pt is missing"),
    (lambda c: (c / "rank0.pt").unlink(), "rank0.pt is missing"),
    (lambda c: (c / "meta.json").write_text('{"step": '), "meta.json cannot be read (JSONDecodeError"),
    (lambda c: (c / "meta.json").write_text("{}"), "meta.json cannot be read (KeyError"),
], ids=["truncated", "empty", "model_missing", "rank_missing", "meta_garbled", "meta_empty"])
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_one_before(run_copy, capsys, damage, file):
    damage(run_copy / CKPT)
    assert _train(run_copy, "--steps", "6", "--resume") == 2
    err = capsys.readouterr().err
    assert f"step_00000004: {file}" in err and "to resume from step_00000002" in err, err
    assert "Traceback" not in err
    # the run ended at start-up, and says so where a watchdog and the validation suite look: not a stall at boot,
    # and not the earlier run's "completed"
    last = heartbeats(run_copy, 0)[-1]
    assert last["msg"] == "error" and last["phase"] == "start-up" and "CheckpointError" in last["error"]
    status = json.loads((run_copy / "status.json").read_text())
    assert status["status"] == "crashed" and status["reason"].startswith("start-up: CheckpointError")
    assert [int(r["step"]) for r in read_csv(run_copy / "training.csv")] == [1, 2, 3, 4]  # left as it was


def test_a_checkpoint_of_another_model_is_refused_naming_the_mismatch(run_copy, tmp_path, capsys):
    raw = yaml.safe_load(TINY.read_text())
    raw["model"]["dim"] = 32
    other = tmp_path / "dim32.yaml"
    other.write_text(yaml.safe_dump(raw))
    assert _train(run_copy, "--steps", "6", "--resume", config=other) == 2
    err = capsys.readouterr().err
    assert "does not fit this run's model config" in err and "size mismatch for" in err, err


def test_a_resume_past_the_planned_steps_is_refused(run_copy, capsys):
    assert _train(run_copy, "--steps", "3", "--resume") == 2
    assert "is at step 4, past train.steps (3)" in capsys.readouterr().err


def _groups(out, step):
    blob = torch.load(out / f"checkpoints/step_{step:08d}/model_optim.pt", weights_only=False)
    return blob["optimizer"]["param_groups"]


def test_a_resumed_run_keeps_its_own_adamw_settings_and_says_which_changed(run_copy, tmp_path):
    changed = _config(tmp_path, weight_decay=0.5, beta1=0.5, seed=7)
    assert _train(run_copy, "--steps", "6", "--resume", config=changed) == 0
    groups = _groups(run_copy, 6)
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]  # the decay split kept, the config's value taken
    assert all(tuple(g["betas"]) == (0.5, 0.95) for g in groups)
    notes = " ".join(json.loads((run_copy / "status.json").read_text())["notes"])
    assert "group 0 weight_decay 0.5 (the checkpoint's: 0.01)" in notes, notes
    assert "group 0 betas [0.5, 0.95] (the checkpoint's: [0.9, 0.95])" in notes
    # and every config key that differs from the earlier run's config.yaml, the planned steps and out_dir aside
    said = notes.split("differs from the earlier run's config.yaml: ")[1].split(";")
    assert {c.strip().split(" ")[0] for c in said if " -> " in c} == {"train.weight_decay", "train.beta1", "train.seed"}


@pytest.mark.parametrize("before, after", [("1", "0"), ("0", "1")])
def test_a_resumed_run_takes_its_own_fused_adamw_choice(tmp_path, monkeypatch, before, after):
    """NSA_OPT_FUSED belongs to the run, not to the checkpoint (torch's load_state_dict restored the saved group's
    "fused" flag, so env.json said one AdamW and another ran); unchanged hyperparameters give no note."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    out = tmp_path / "out"
    monkeypatch.setenv("NSA_OPT_FUSED", before)
    assert _train(out, "--steps", "2") == 0
    monkeypatch.setenv("NSA_OPT_FUSED", after)
    assert _train(out, "--steps", "4", "--resume") == 0
    assert [bool(g["fused"]) for g in _groups(out, 4)] == [after == "1"] * 2
    assert json.loads((out / "env.json").read_text())["optimizer"]["fused"] is (after == "1")
    assert "AdamW settings" not in " ".join(json.loads((out / "status.json").read_text())["notes"])


COLUMNS = ["step", "loss"]


@pytest.mark.parametrize("tail, dropped", [
    (b"garbage,row\n", 1),
    (b"\x00" * 8, 0),  # what a file can hold after a power loss: no row, but damaged
    (b"5,1.0\n\xff\xfe,2\n", 1),
], ids=["text_row", "nul_bytes", "not_utf8"])
def test_a_resume_drops_rows_without_a_step_and_keeps_the_file_as_it_was(tmp_path, tail, dropped):
    path = tmp_path / "training.csv"
    original = b"step,loss\n1,3.5\n2,3.25\n3,3.0\n" + tail
    path.write_bytes(original)
    log = CsvLog(path, COLUMNS, resume_step=2)
    log.write({"step": 3, "loss": 2.75})
    log.close()
    assert path.read_text() == "step,loss\n1,3.5\n2,3.25\n3,2.75\n"
    assert log.dropped == dropped and log.kept_aside is not None
    assert log.kept_aside.read_bytes() == original and log.kept_aside.name.startswith("training.csv.damaged-")


def test_a_training_csv_with_another_header_is_kept_aside_whole(tmp_path):
    path = tmp_path / "training.csv"
    path.write_text("foo,bar\n1,2\n3,4\n")
    log = CsvLog(path, COLUMNS, resume_step=5)
    log.close()
    assert path.read_text() == "step,loss\n" and log.dropped == 2
    assert log.kept_aside.read_text() == "foo,bar\n1,2\n3,4\n"


def test_an_undamaged_training_csv_is_not_kept_aside(tmp_path):
    path = tmp_path / "training.csv"
    path.write_text("step,loss\n1,3.5\n2,x\n3,3.0\n")  # a garbled value (NSA_FAULT=csv_garble) with its step: kept
    log = CsvLog(path, COLUMNS, resume_step=2)
    log.close()
    assert path.read_text() == "step,loss\n1,3.5\n2,x\n" and log.kept_aside is None and log.dropped == 0


def test_the_trainer_resumes_past_a_damaged_training_csv_and_says_so(run_copy):
    with open(run_copy / "training.csv", "ab") as f:
        f.write(b"garbage,row\n\x00\x00")
    assert _train(run_copy, "--steps", "6", "--resume") == 0
    assert [int(r["step"]) for r in read_csv(run_copy / "training.csv")] == [1, 2, 3, 4, 5, 6]
    kept = list(run_copy.glob("training.csv.damaged-*"))
    assert len(kept) == 1 and kept[0].read_bytes().endswith(b"garbage,row\n\x00\x00")
    notes = " ".join(json.loads((run_copy / "status.json").read_text())["notes"])
    assert ("training.csv was damaged: 1 damaged row(s) (cut short, another number of cells, or no readable step) "
            f"were dropped; the file as it was is {kept[0].name}") in notes


@pytest.mark.parametrize("where, says", [
    (lambda tmp: tmp / "afile", "it exists and is not a directory"),
    (lambda tmp: tmp / "afile" / "sub", "cannot be created (Not a directory)"),
])
def test_an_out_dir_that_cannot_be_made_is_a_usage_error(tmp_path, monkeypatch, capsys, where, says):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    (tmp_path / "afile").write_text("x")
    assert _train(where(tmp_path), "--steps", "1") == 2
    assert says in capsys.readouterr().err


def test_settings_that_cannot_act_are_said(tmp_path, monkeypatch):
    """A single process asked for FSDP2, a profiler window the run never reaches, and an MFU above 1 (a peak below
    the device's): each ran before without a word."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    cfg = _config(tmp_path, peak_tflops=1e-6)
    out = tmp_path / "out"
    assert _train(out, "--fsdp", "--steps", "3", "--profile-steps", "2", config=cfg) == 0
    notes = " ".join(json.loads((out / "status.json").read_text())["notes"])
    assert "train.parallel=fsdp is ignored: this is a single process" in notes
    assert "train.profile_steps=2: no profiler trace will be written" in notes and not (out / "profile").exists() \
        or not list((out / "profile").iterdir())
    assert "is above 1, which no device does" in notes and "train.peak_tflops" in notes
