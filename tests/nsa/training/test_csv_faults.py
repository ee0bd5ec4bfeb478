"""NSA_FAULT=csv_*@STEP, the trainer's testing aid for a damaged training.csv: parsing, and what each kind does to
a file written by the real writer (nsa.training.outputs.CsvLog), read back by the validation suite's reader. The whole
path through nsa-validate (a real 2-rank run per kind) is tests/validation/test_faults.py."""

from __future__ import annotations

import pytest

from nsa import toggles
from nsa.training.outputs import TRAINING_COLUMNS, CsvLog
from nsa.training.safety import CSV_FAULTS_STOPPING_WRITER, damage_training_csv
from validation.analysis.metrics import read_training_csv

COLUMNS = list(TRAINING_COLUMNS)


def row(step: int) -> dict:
    return {"step": step, "loss": 5.0 - step / 10, "lr": 3e-4, "toks_per_s": 1000.0 + step, "step_time_s": 0.25,
            "grad_norm": 0.5, "mem_alloc_gb": 0.35, "mem_reserved_gb": 0.36}


def written(tmp_path, kind: str, at: int, steps: int = 6):
    """A training.csv written as the trainer writes it, with `kind` injected after row `at`."""
    path = tmp_path / "training.csv"
    log = CsvLog(path, COLUMNS)
    for step in range(1, steps + 1):
        if log is None:
            break
        log.write(row(step))
        if step == at:
            if kind in CSV_FAULTS_STOPPING_WRITER:
                log.close()
            damage_training_csv(path, kind)
            if kind in CSV_FAULTS_STOPPING_WRITER:
                log = None
    if log is not None:
        log.close()
    return path


@pytest.mark.parametrize("value, fault", [
    ("csv_missing@3", toggles.Fault("csv_missing", 3)),
    ("csv_truncate@8:0", toggles.Fault("csv_truncate", 8, 0)),
    ("CSV_GARBLE@1", toggles.Fault("csv_garble", 1)),
])
def test_csv_fault_values_parse(value, fault):
    assert toggles.parse("NSA_FAULT", {"NSA_FAULT": value}) == fault


@pytest.mark.parametrize("value", ["csv_missing@3:1", "csv_empty", "csv_gone@3", "csv_truncate@x",
                                   "csv_garble@0", "crash@0", "nan@0:1",  # steps count from 1: @0 never fires
                                   "crash@3:", "wait@imports:", "crash@\u0663", "crash@3:\u0661"])  # no rank; ASCII only
def test_bad_csv_fault_values_name_the_variable(value):
    with pytest.raises(ValueError, match="NSA_FAULT=.*csv_missing@STEP"):
        toggles.parse("NSA_FAULT", {"NSA_FAULT": value})


def test_missing_and_empty(tmp_path):
    assert not written(tmp_path, "csv_missing", 3).exists()
    assert read_training_csv(tmp_path / "training.csv").problem.startswith("missing:")
    path = written(tmp_path, "csv_empty", 3)
    assert path.stat().st_size == 0  # and nothing was written after the fault
    assert read_training_csv(path).problem.startswith("empty:")


def test_truncate_cuts_the_last_row_mid_line_and_stops_the_writer(tmp_path):
    path = written(tmp_path, "csv_truncate", 4)
    data = path.read_bytes()
    assert not data.endswith(b"\n") and data.count(b"\n") == 4  # header + rows 1-3, then half of row 4
    read = read_training_csv(path)
    assert read.problem is None and list(read.frame["step"]) == [1, 2, 3]
    assert read.dropped_rows == 1 and read.cut_last_line and read.first_bad_row.startswith("line 5: '4,")


def test_garble_replaces_that_row_in_place_and_later_rows_follow(tmp_path):
    path = written(tmp_path, "csv_garble", 3)
    lines = path.read_text().splitlines()
    assert len(lines) == 7 and lines[3].startswith("3,xxx") and lines[4].startswith("4,")
    assert set(lines[3].split(",", 1)[1]) <= {"x", ","}  # every number became text, the commas stay
    read = read_training_csv(path)
    assert list(read.frame["step"]) == [1, 2, 4, 5, 6] and read.dropped_rows == 1 and not read.cut_last_line
    assert read.first_bad_row.startswith("line 4: '3,xxx")


def test_damage_of_an_unknown_kind_is_refused(tmp_path):
    path = written(tmp_path, "csv_garble", 99)
    with pytest.raises(ValueError, match="not a training.csv fault"):
        damage_training_csv(path, "crash")
