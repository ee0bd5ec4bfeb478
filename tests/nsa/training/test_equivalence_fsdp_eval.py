"""FSDP2 with evaluation (2 ranks, gloo): an evaluation between two training steps leaves the model as a training
step does, sharded, so every step issues the collectives of the strategy's byte model.

An evaluation forward runs under no_grad, so no backward reshards what forward leaves gathered: the root (FSDP2
never reshards it after forward) and, with --fsdp-no-reshard, every block. Before the fix the step after an
evaluation skipped their all-gathers (the root's 131,328 bytes at the tiny config's width; all of the model with
--fsdp-no-reshard) and summary.json's comm_model_matches was False, which fails runbooks/parallelism_cpu.yaml's
criterion for a run that merely evaluates.
"""

from __future__ import annotations

import pytest
import yaml

from train_utils import TINY, read_csv, run

from nsa.training import outputs
from nsa.training.outputs import read_summary

STEPS = 3


@pytest.mark.parametrize("mode", ["--fsdp", "--fsdp-no-reshard"])
def test_an_evaluation_leaves_the_fsdp_model_sharded_for_the_next_step(tmp_path, mode):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"steps": STEPS, "seq_len": 128, "batch_size": 1, "accum": 1, "eval_every": 1,
                         "eval_batches": 1, "lr_schedule": "constant", "warmup_steps": 0, "save_every": 1000})
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    code, log = run(out, mode, nproc=2, config=cfg, env={"NSA_TB_DISABLE": "1"})
    assert code == 0, log[-3000:]
    assert len(read_csv(out / outputs.VAL_CSV)) == STEPS  # an evaluation after every step
    summary = read_summary(out)
    predicted = summary["comm_model"]["bytes_per_step"]
    # every step, the first and those after an evaluation, sends what the byte model predicts
    sent = [int(r["comm_bytes"]) for r in read_csv(out / outputs.TRAINING_CSV)]
    assert sent == [predicted] * STEPS, (sent, predicted)
    assert summary["comm"]["constant"] is True
    assert summary["comm_model_matches"] is True
