"""The trainer's output files against their readers: what a resume (CsvLog) keeps of a training.csv that a writer left
cut short or with rows of another shape, read back by validation.analysis.metrics.read_training_csv; and the JSON
contracts' readers (read_summary, read_timeline) refusing figures the writers never write (NaN, infinity)."""

from __future__ import annotations

import json
import math

import pytest

from nsa.training import outputs
from nsa.training.outputs import ContractError, CsvLog, read_summary, read_timeline
from nsa.training.safety import damage_training_csv
from nsa.training.summary import SummaryAccumulator
from validation.analysis.metrics import read_training_csv

COLUMNS = list(outputs.TRAINING_COLUMNS)


def _row(step: int) -> dict:
    # figures chosen so that every one is written exactly: lr 0.00125 * step, loss 3 - step / 8
    return {"step": step, "loss": 3.0 - step / 8, "lr": 0.00125 * step, "toks_per_s": 1000.0, "step_time_s": 0.5,
            "grad_norm": 1.5, "mem_alloc_gb": 0.25, "mem_reserved_gb": 0.5}


def _written(path, steps, columns=COLUMNS, extra=None):
    log = CsvLog(path, columns)
    for step in steps:
        log.write({**_row(step), **(extra(step) if extra else {})})
    log.close()


def test_a_last_row_cut_by_the_writer_is_not_kept_by_a_resume(tmp_path):
    """NSA_FAULT=csv_truncate leaves step 4's row cut in half: "4,2.5,0.005,1000" with no newline. A resume from
    the checkpoint of step 4 kept it, rewrote it as a whole row with empty cells, and the reader, which drops a cut
    last line, then took it as step 4's figures."""
    path = tmp_path / "training.csv"
    _written(path, range(1, 5))
    damage_training_csv(path, "csv_truncate")
    before = path.read_bytes()
    assert not before.endswith(b"\n")
    assert read_training_csv(path).frame["step"].tolist() == [1, 2, 3]  # the reader leaves the cut row out

    log = CsvLog(path, COLUMNS, resume_step=4)
    log.close()
    read = read_training_csv(path)
    assert read.frame["step"].tolist() == [1, 2, 3] and read.dropped_rows == 0
    assert log.dropped == 1 and log.kept_aside is not None and log.kept_aside.read_bytes() == before


def test_a_row_cut_mid_number_leaves_no_wrong_figure(tmp_path):
    path = tmp_path / "training.csv"
    _written(path, range(1, 5))
    whole = path.read_bytes()
    path.write_bytes(whole[:whole.rindex(b"0.005") + 3])  # step 4's lr 0.005 cut to "0.0"
    log = CsvLog(path, COLUMNS, resume_step=4)
    log.write(_row(5))
    log.close()
    frame = read_training_csv(path).frame
    assert frame["step"].tolist() == [1, 2, 3, 5]
    assert frame["lr"].tolist() == pytest.approx([0.00125, 0.0025, 0.00375, 0.00625], rel=1e-12)  # never 0.0


def test_a_cut_row_whose_first_digits_are_an_earlier_step_does_not_replace_it(tmp_path):
    """Step 12's row cut after its first character reads as step 1: kept, it became a second step-1 row of empty
    cells, and the reader (a duplicated step keeps its last row) lost step 1's loss."""
    path = tmp_path / "training.csv"
    _written(path, range(1, 12))
    with open(path, "ab") as f:
        f.write(b"1")
    log = CsvLog(path, COLUMNS, resume_step=11)
    log.close()
    read = read_training_csv(path)
    assert read.duplicate_steps == 0 and read.frame["step"].tolist() == list(range(1, 12))
    assert read.frame["loss"].iloc[0] == 2.875  # 3 - 1/8
    assert log.dropped == 1 and log.kept_aside is not None


def test_a_row_with_another_number_of_cells_is_dropped_as_the_reader_drops_it(tmp_path):
    path = tmp_path / "training.csv"
    _written(path, range(1, 4))
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    lines[2] = "2,2.75\r\n"  # step 2's row: two cells of the header's eight
    path.write_text("".join(lines))
    assert read_training_csv(path).frame["step"].tolist() == [1, 3]
    log = CsvLog(path, COLUMNS, resume_step=3)
    log.close()
    assert read_training_csv(path).frame["step"].tolist() == [1, 3]
    assert log.dropped == 1 and log.kept_aside is not None


def test_a_cut_row_after_the_resume_step_is_dropped_without_calling_the_file_damaged(tmp_path):
    """A writer killed in step 5's row after the checkpoint of step 4: the row goes, as every row after the resume
    step does; the rows before it are whole, so nothing is kept aside."""
    path = tmp_path / "training.csv"
    _written(path, range(1, 5))
    with open(path, "ab") as f:
        f.write(b"5,2.375,0.006")
    log = CsvLog(path, COLUMNS, resume_step=4)
    log.close()
    assert read_training_csv(path).frame["step"].tolist() == [1, 2, 3, 4]
    assert log.dropped == 0 and log.kept_aside is None


def test_a_resume_keeps_the_earlier_runs_mfu_column(tmp_path):
    """A run with a known peak wrote "mfu"; its resume without one (train.peak_tflops dropped, a device not in the
    table) rewrote the file under its own columns and lost the earlier rows' mfu."""
    path = tmp_path / "training.csv"
    with_mfu = COLUMNS + [outputs.MFU_COLUMN[0]]
    _written(path, range(1, 4), with_mfu, extra=lambda step: {"mfu": 0.25 * step})
    log = CsvLog(path, COLUMNS, resume_step=3)
    log.write(_row(4))
    log.close()
    assert path.read_text().count("step,") == 1  # one header
    frame = read_training_csv(path).frame
    assert frame["step"].tolist() == [1, 2, 3, 4]
    assert frame["mfu"].tolist()[:3] == [0.25, 0.5, 0.75] and math.isnan(frame["mfu"].iloc[3])
    assert frame["loss"].tolist() == [2.875, 2.75, 2.625, 2.5]


def test_a_header_cut_short_gives_no_column_to_the_resumed_file(tmp_path):
    path = tmp_path / "training.csv"
    path.write_text("step,loss,lr,toks")  # a header cut in its fourth name, no row
    log = CsvLog(path, COLUMNS, resume_step=3)
    log.close()
    assert path.read_text().splitlines() == [",".join(COLUMNS)] and log.kept_aside is None


def test_resume_writes_nan_and_inf_that_the_reader_takes_back(tmp_path):
    path = tmp_path / "training.csv"
    log = CsvLog(path, COLUMNS)
    log.write({**_row(1), "grad_norm": math.inf})
    log.write({**_row(2), "grad_norm": math.nan, "mem_reserved_gb": None})
    log.close()
    log = CsvLog(path, COLUMNS, resume_step=2)
    log.close()
    assert log.kept_aside is None
    frame = read_training_csv(path).frame
    assert frame["grad_norm"].iloc[0] == math.inf and math.isnan(frame["grad_norm"].iloc[1])
    assert math.isnan(frame["mem_reserved_gb"].iloc[1])


# ---------------------------------------------------------------------- JSON readers: what the writers never write
def _summary(tmp_path) -> dict:
    acc = SummaryAccumulator(parallel="none", world_size=1, device_type="cpu", tokens_per_step=8,
                             samples_per_step=2, steps_planned=2)
    acc.add(1, 0.5, 16.0, 3.0, 0.1, None)
    acc.set_peaks(0.2, None)
    return acc.build("completed", None, None, None, None)


@pytest.mark.parametrize("key, value", [("tokens_per_s", math.inf), ("avg_loss", math.nan),
                                        ("final_loss", -math.inf)])
def test_read_summary_refuses_a_non_finite_figure(tmp_path, key, value):
    """The summary's writer writes a non-finite figure as null; a NaN or Infinity in the file is not its output
    and is not taken as a figure (json reads NaN / Infinity as floats)."""
    path = tmp_path / outputs.SUMMARY_JSON
    data = _summary(tmp_path)
    outputs.write_json(path, data)
    assert read_summary(path)["tokens_per_s"] == 16.0
    path.write_text(json.dumps({**data, key: value}))
    with pytest.raises(ContractError, match=f"{key} must be a number or null") as err:
        read_summary(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_read_timeline_refuses_non_finite_seconds(tmp_path, value):
    path = tmp_path / outputs.TIMELINE_JSON
    marks = {"process_start": 0.0, "imports_done": 2.0}
    doc = {"schema": 1, "process_start_source": "/proc/self/stat", "process_start_unix": 1.0, "world_size": 1,
           "milestones": marks, "ranks": None, "slowest": None, "time_to_first_step_s": None}
    outputs.write_json(path, doc)
    assert read_timeline(path)["milestones"] == marks
    path.write_text(json.dumps({**doc, "milestones": {**marks, "model_built": value}}))
    with pytest.raises(ContractError, match="model_built must be non-negative seconds"):
        read_timeline(path)
