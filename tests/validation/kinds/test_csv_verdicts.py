"""The verdict a completed trainer launch gets from its training.csv (validation.kinds.trainer.csv_verdict), for every
kind of damage NSA_FAULT can inject and a few it cannot: always an explicit status and reason, never an
exception. tests/validation/test_faults.py checks the same through real runs."""

from __future__ import annotations

import pytest

from nsa.training.outputs import TRAINING_COLUMNS, CsvLog
from nsa.training.safety import CSV_FAULTS_STOPPING_WRITER, damage_training_csv
from validation.analysis.metrics import Window, read_training_csv, summarize
from validation.kinds.trainer import csv_verdict as _csv_verdict

STEPS = 8


def verdict(tmp_path, kind: str | None = None, at: int = 3, trainer_steps: int | None = STEPS):
    path = tmp_path / "training.csv"
    log = CsvLog(path, list(TRAINING_COLUMNS))
    for step in range(1, STEPS + 1):
        log.write({"step": step, "loss": 4.0, "lr": 1e-3, "toks_per_s": 1000.0 + step, "step_time_s": 0.1,
                   "grad_norm": 0.5, "mem_alloc_gb": 0.3, "mem_reserved_gb": 0.3})
        if step == at and kind is not None:
            if kind in CSV_FAULTS_STOPPING_WRITER:
                log.close()
                damage_training_csv(path, kind)
                break
            damage_training_csv(path, kind)
    else:
        log.close()
    status, reason, _ = _csv_verdict(summarize(read_training_csv(path), Window(4, 1)), trainer_steps)
    return status, reason


def test_clean_file_passes_without_a_reason(tmp_path):
    assert verdict(tmp_path) == ("passed", None)


@pytest.mark.parametrize("kind, status, start", [
    ("csv_missing", "failed", "training.csv missing: "),
    ("csv_empty", "failed", "training.csv empty: "),
    ("csv_garble", "failed", "training.csv damaged: 1 unparseable row(s) left out (first at line 4: '3,x,"),
    ("csv_truncate", "failed", "training.csv ends at step 2 but the trainer completed step 8: 5 row(s) lost"),
])
def test_damage_fails_with_an_explicit_reason(tmp_path, kind, status, start):
    got_status, reason = verdict(tmp_path, kind)
    assert got_status == status and reason.startswith(start), reason


def test_a_last_line_cut_mid_row_passes_and_says_so(tmp_path):
    status, reason = verdict(tmp_path, "csv_truncate", at=STEPS)
    assert status == "passed"
    assert reason == ("training.csv: the last line was cut off mid-row and left out (1 row); statistics use steps "
                      "4-7")


def test_rows_missing_at_the_end_fail_even_when_every_row_parses(tmp_path):
    status, reason = verdict(tmp_path, trainer_steps=STEPS + 2)
    assert status == "failed" and reason.endswith("completed step 10: 2 row(s) lost")
    assert verdict(tmp_path, trainer_steps=None) == ("passed", None)  # no step in status.json: nothing to compare
