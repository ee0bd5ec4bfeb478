"""The figures criteria read of a trainer launch's training.csv (validation.analysis.metrics.summarize), each checked
against a hand computation: the window at the edges of warm-up + window, and rows whose cell count differs from the
header's, which both readers (pandas' C parser for a clean file, the row-by-row reader) leave out and count."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsa.training.outputs import COMM_COLUMNS, MFU_COLUMN, TRAINING_COLUMNS, CsvLog
from validation.analysis import metrics
from validation.analysis.metrics import Window, read_training_csv, summarize
from validation.kinds.trainer import csv_verdict

TOKENS = 1000.0  # tokens per step (all ranks)


def trainer_row(step: int, tps: float) -> dict:
    return {"step": step, "loss": 5.0 - step / 100, "lr": 1e-3, "toks_per_s": tps, "step_time_s": TOKENS / tps,
            "grad_norm": 1.0, "mem_alloc_gb": 2.0, "mem_reserved_gb": 3.0, "comm_bytes": 0, "comm_time_s": 0.0,
            "mfu": tps / 10_000}


def trainer_file(path: Path, rates: list[float]) -> Path:
    """A training.csv as the trainer writes it (CsvLog: every column, CRLF line ends)."""
    log = CsvLog(path, list(TRAINING_COLUMNS) + list(COMM_COLUMNS) + [MFU_COLUMN[0]])
    for step, tps in enumerate(rates, 1):
        log.write(trainer_row(step, tps))
    log.close()
    return path


def both_readers(path: Path, monkeypatch) -> list[metrics.CsvRead]:
    """The file read as a clean file may be (the C parser first) and by the row-by-row reader alone."""
    first = read_training_csv(path)
    with monkeypatch.context() as m:
        m.setattr(metrics, "_read_clean_if_complete", lambda p: None)
        return [first, read_training_csv(path)]


@pytest.mark.parametrize("rows, n, first_step, status", [
    (6, 2, 5, "short"),   # warm-up 4 + window 3, one row less: the window holds steps 5-6
    (7, 3, 5, "ok"),      # exactly warm-up + window: steps 5-7
    (8, 3, 6, "ok"),      # one row more: the last 3 steps, 6-8 (step 5 leaves the window)
])
def test_the_window_is_the_last_steps_after_the_warmup_at_its_edges(tmp_path, rows, n, first_step, status):
    # step k runs at 100 * k tokens/s: 1,000 tokens in 10 / k s
    rates = [100.0 * s for s in range(1, rows + 1)]
    s = summarize(read_training_csv(trainer_file(tmp_path / "training.csv", rates)), Window(last=3, warmup=4), 2)
    steps = range(first_step, rows + 1)
    assert s["status"] == status and s["steps"] == rows
    assert s["window"] == {"last": 3, "warmup": 4, "n": n, "first_step": first_step, "last_step": rows}
    seconds = sum(TOKENS / (100.0 * k) for k in steps)          # the window's time
    figure = n * TOKENS / seconds                                # its tokens over its time
    assert s["toks_per_s"]["mean"] == pytest.approx(figure, rel=1e-12)
    assert s["toks_per_s_per_gpu"] == pytest.approx(figure / 2, rel=1e-12)
    assert s["mfu"]["mean"] == pytest.approx(figure / 10_000, rel=1e-12)
    plain = sum(100.0 * k for k in steps) / n
    pstdev = (sum((100.0 * k - plain) ** 2 for k in steps) / n) ** 0.5
    assert s["toks_per_s"]["stdev"] == pytest.approx(pstdev, rel=1e-12)
    assert s["toks_per_s"]["cv"] == pytest.approx(pstdev / figure, rel=1e-12)
    assert (s["toks_per_s"]["min"], s["toks_per_s"]["max"]) == (100.0 * first_step, 100.0 * rows)
    assert s["step_time_s"]["mean"] == pytest.approx(seconds / n, rel=1e-6)  # written to 6 decimals
    assert s["first_loss"] == pytest.approx(4.99) and s["final_loss"] == pytest.approx(5.0 - rows / 100)


def test_a_row_with_fewer_cells_than_the_header_is_left_out_of_a_clean_file(tmp_path, monkeypatch):
    """Step 3 lost its last two cells (comm_time_s, mfu): a damaged row, as the row-by-row reader says. Steps 1, 2
    and 4 at 100 tokens/s and step 3 at 400: without step 3 the window is 3,000 tokens in 30 s, 100 tokens/s (with
    it, 4,000 in 32.5 s: 123.1)."""
    path = trainer_file(tmp_path / "training.csv", [100.0, 100.0, 400.0, 100.0])
    lines = path.read_bytes().split(b"\r\n")
    lines[3] = lines[3].rsplit(b",", 2)[0]
    path.write_bytes(b"\r\n".join(lines))
    for read in both_readers(path, monkeypatch):
        assert list(read.frame["step"]) == [1, 2, 4]
        assert read.dropped_rows == 1 and read.first_bad_row.startswith("line 4: '3,")
        s = summarize(read, Window(last=10))
        assert s["toks_per_s"]["mean"] == pytest.approx(100.0, rel=1e-12) and s["toks_per_s"]["n"] == 3
        status, reason, _ = csv_verdict(s, 4)
        assert status == "failed" and reason.startswith("training.csv damaged: 1 unparseable row(s)")


def test_rows_with_one_cell_more_than_the_header_are_not_read_as_their_neighbours_columns(tmp_path, monkeypatch):
    """Every row has a ninth cell under an eight-name header: no column can be told, no row is read (pandas alone
    takes the first cell as an index and shifts each column's values under its neighbour's name: step 7 read as
    the loss, tokens/s 0.5 as the step time)."""
    header = ",".join(TRAINING_COLUMNS)
    path = tmp_path / "training.csv"
    path.write_text(f"{header}\n1,7,0.001,2000,0.5,1,2,3,9\n2,6,0.001,2000,0.5,1,2,3,9\n")
    for read in both_readers(path, monkeypatch):
        assert read.problem.startswith("unparseable:") and read.dropped_rows == 2
        s = summarize(read, Window())
        assert s["status"] == "corrupt" and "toks_per_s" not in s


def test_the_trainers_own_file_still_takes_the_c_parser(tmp_path, monkeypatch):
    """CRLF line ends, blank lines and empty cells (comm_time_s on CUDA, a missing mfu) keep a file clean: the C
    parser serves it and both readers give the same frame."""
    path = trainer_file(tmp_path / "training.csv", [100.0, 200.0, 400.0])
    text = path.read_bytes().replace(b"\r\n2,", b"\r\n\r\n2,").replace(b",0.04\r\n", b",\r\n")
    path.write_bytes(text.replace(b",0,0,", b",0,,"))
    assert metrics._read_clean_if_complete(path) is not None
    fast, slow = both_readers(path, monkeypatch)
    assert fast.dropped_rows == slow.dropped_rows == 0
    assert fast.frame.equals(slow.frame) and list(fast.frame["step"]) == [1, 2, 3]
    assert fast.frame["comm_time_s"].isna().all()
    assert fast.frame["mfu"].isna().tolist() == [False, False, True]


def test_a_resumed_runs_repeated_steps_count_once_with_the_resumed_processs_rows(tmp_path):
    """A first process wrote steps 1-4 at 100 tokens/s and died; the resumed one wrote steps 3-6 again at 200 (a
    file no resume rewrote). The window of the last 4 steps is steps 3-6, each once, all the resumed process's:
    200 tokens/s (with the dead process's 3 and 4 it would read 8,000 tokens in 60 s: 133.3)."""
    rows = [trainer_row(k, 100.0) for k in (1, 2, 3, 4)] + [trainer_row(k, 200.0) for k in (3, 4, 5, 6)]
    path = tmp_path / "training.csv"
    path.write_text("\n".join([",".join(rows[0])] + [",".join(str(r[c]) for c in rows[0]) for r in rows]) + "\n")
    read = read_training_csv(path)
    assert read.duplicate_steps == 2 and list(read.frame["step"]) == [1, 2, 3, 4, 5, 6]
    s = summarize(read, Window(last=4, warmup=1))
    assert s["window"]["first_step"] == 3 and s["window"]["n"] == 4
    assert s["toks_per_s"]["mean"] == pytest.approx(200.0, rel=1e-12) and s["toks_per_s"]["min"] == 200.0
    assert s["first_loss"] == pytest.approx(4.99) and s["final_loss"] == pytest.approx(4.94)
