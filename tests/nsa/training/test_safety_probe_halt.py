"""out_dir/.HALT is a request to stop with a checkpoint (README, Safety: exit 0, status `halted`) whatever bytes it
holds: a reason written in another encoding than UTF-8 (Latin-1 by a shell under another locale) is read with its
bad bytes replaced, not raised as a UnicodeDecodeError that turned the halt into a crash (exit 1, no checkpoint)."""

from __future__ import annotations

import json

import torch

from train_utils import TINY, heartbeats

from nsa.training.safety import RunControl

LATIN1_REASON = "arrêt demandé: disque plein".encode("latin-1")  # not UTF-8: 0xea and 0xe9 stand alone


def test_halt_reason_replaces_bytes_that_are_not_utf8(tmp_path):
    (tmp_path / ".HALT").write_bytes(LATIN1_REASON + b"\n")
    control = RunControl(tmp_path, 0)
    assert control.halt_requested()
    assert control.halt_reason() == "arr\ufffdt demand\ufffd: disque plein"


def test_halt_reason_of_an_empty_a_missing_and_an_unreadable_halt(tmp_path):
    control = RunControl(tmp_path, 0)
    assert control.halt_reason() == ".HALT file"  # gone since it was seen
    (tmp_path / ".HALT").write_bytes(b" \n")
    assert control.halt_reason() == "empty .HALT file"
    (tmp_path / ".HALT").unlink()
    (tmp_path / ".HALT").mkdir()
    assert control.halt_requested() and control.halt_reason() == ".HALT file"
    (tmp_path / ".HALT").rmdir()
    (tmp_path / ".HALT").write_text("x" * 600 + "\n", encoding="utf-8")
    assert control.halt_reason() == "x" * 500


def test_a_halt_whose_reason_is_not_utf8_stops_the_run_with_a_checkpoint(tmp_path, monkeypatch):
    for name in ("NSA_FAULT", "NSA_LOSS", "NSA_KERNEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    from nsa.toggles import Toggles
    from nsa.training import distributed, trainer
    from nsa.training.config import apply_overrides, load_config

    out = tmp_path / "run"
    cfg = apply_overrides(load_config(TINY), {"train.out_dir": str(out), "train.seq_len": 64, "train.batch_size": 1,
                                              "train.steps": 3, "train.save_every": 1000})
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    tr = trainer.Trainer(cfg, str(TINY), info, Toggles.read(), False, ["nsa-train"])
    (out / ".HALT").write_bytes(LATIN1_REASON)  # after start-up, which moves an earlier run's .HALT aside
    assert tr.run() == trainer.EXIT_OK
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "halted" and status["step"] == 1 and status["checkpoint_step"] == 1, status
    assert status["reason"] == "arr\ufffdt demand\ufffd: disque plein"
    assert heartbeats(out, 0)[-1]["msg"] == "stop"
