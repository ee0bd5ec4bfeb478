"""validation.analysis.metrics: reading training.csv robustly and reducing it to window statistics."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from nsa.training.outputs import MFU_COLUMN, TRAINING_COLUMNS, CsvLog
from validation.analysis.metrics import (DERIVED_KEYS, METRIC_COLUMNS, STAT_NAMES, CsvRead, MetricsError, Window,
                                read_training_csv, scaling_efficiency, select_best, summarize, window_values)

HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"


def toks(i: int) -> float:
    """Deterministic, uneven throughput values."""
    return 1000.0 + (i * 37) % 23 - 0.25 * (i % 5)


def row(i: int, loss: float | None = None, tps: float | None = None, alloc: float = 2.0, reserved: float = 3.0,
        mfu: str | None = None) -> str:
    loss = 10.0 - 0.01 * i if loss is None else loss
    tps = toks(i) if tps is None else tps
    cells = [str(i), repr(loss), "0.001", repr(tps), repr(2048 / tps), "1.5", repr(alloc), repr(reserved)]
    if mfu is not None:
        cells.append(mfu)
    return ",".join(cells)


def write(path: Path, lines: list[str], newline_at_end: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if newline_at_end else ""))
    return path


def csv_file(tmp_path: Path, n: int, **kw) -> Path:
    return write(tmp_path / "training.csv", [HEADER] + [row(i, **kw) for i in range(1, n + 1)])


def plain_json(value) -> None:
    """Only plain JSON types, recursively; and no NaN."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str)
            plain_json(v)
    else:
        assert value is None or type(value) in (int, float, str, bool), (value, type(value))
        if isinstance(value, float):
            assert math.isfinite(value)


# --- constants -------------------------------------------------------------------------------------------------

def test_metric_columns_are_trainer_columns():
    assert set(METRIC_COLUMNS) <= set(TRAINING_COLUMNS) | {MFU_COLUMN[0]}
    assert STAT_NAMES == ("mean", "median", "stdev", "cv", "min", "max", "n")


@pytest.mark.parametrize("kwargs", [{"last": 0}, {"last": -3}, {"warmup": -1}, {"last": 2.5}, {"last": True}])
def test_window_rejects_bad_values(kwargs):
    with pytest.raises(MetricsError):
        Window(**kwargs)


def test_window_defaults():
    w = Window()
    assert (w.last, w.warmup) == (50, 0)
    assert issubclass(MetricsError, ValueError)


# --- reading ---------------------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    path = tmp_path / "nope" / "training.csv"
    read = read_training_csv(path)
    assert read.problem == f"missing: {path}"
    assert read.frame.empty
    s = summarize(read, Window())
    assert s["status"] == "missing" and s["reason"] == read.problem
    assert s["steps"] == 0 and s["last_step"] is None and s["window"]["n"] == 0
    assert "toks_per_s" not in s
    assert all(s[k] is None for k in DERIVED_KEYS)
    plain_json(s)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "training.csv"
    path.write_text(content)
    read = read_training_csv(path)
    assert read.problem == f"empty: {path}"
    assert summarize(read, Window())["status"] == "empty"


def test_header_only(tmp_path):
    read = read_training_csv(write(tmp_path / "t.csv", [HEADER]))
    assert read.problem == "no data rows"
    s = summarize(read, Window())
    assert s["status"] == "empty" and s["reason"] == "no data rows"


def test_partial_header_only(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("step,loss,lr,toks_")
    read = read_training_csv(path)
    assert read.problem.startswith("unparseable:")
    assert summarize(read, Window())["status"] == "corrupt"


def test_missing_columns_are_named(tmp_path):
    path = write(tmp_path / "t.csv", ["step,loss,toks_per_s,step_time_s,mem_alloc_gb,mem_reserved_gb", "1,2,3,4,5,6"])
    read = read_training_csv(path)
    assert read.problem.startswith("missing columns: lr, grad_norm ")
    assert str(path) in read.problem
    s = summarize(read, Window())
    assert s["status"] == "corrupt" and "lr, grad_norm" in s["reason"]


def test_all_rows_junk_is_unparseable(tmp_path):
    path = write(tmp_path / "t.csv", [HEADER, "a,b,c,d,e,f,g,h", "x,y,z,1,2,3,4,5", "\x00\x00\x00"])
    read = read_training_csv(path)
    assert read.problem.startswith("unparseable:")
    assert "3 data rows" in read.problem
    assert read.dropped_rows == 3
    assert summarize(read, Window())["status"] == "corrupt"


def test_trailing_partial_row_dropped_and_counted(tmp_path):
    # Killed mid-write: the last line has no newline. Even when it looks complete its last number may be cut.
    lines = [HEADER] + [row(i) for i in range(1, 11)] + [row(11)]
    read = read_training_csv(write(tmp_path / "t.csv", lines, newline_at_end=False))
    assert read.problem is None
    assert read.dropped_rows == 1
    assert list(read.frame["step"]) == list(range(1, 11))
    s = summarize(read, Window(last=5))
    assert s["dropped_rows"] == 1 and "1 unparseable" in s["note"]
    # The same file with its final newline keeps every row.
    read = read_training_csv(write(tmp_path / "t2.csv", lines, newline_at_end=True))
    assert read.dropped_rows == 0 and len(read.frame) == 11


def test_truncated_trainer_file_at_every_byte(tmp_path):
    """A file written by the trainer's own writer, cut at any byte, never raises and never yields a row whose
    values differ from what was written."""
    path = tmp_path / "training.csv"
    log = CsvLog(path, list(TRAINING_COLUMNS) + [MFU_COLUMN[0]])
    written = {}
    for i in range(1, 6):
        r = {"step": i, "loss": 5.0 - i * 0.125, "lr": 1e-3, "toks_per_s": 1000.0 + i, "step_time_s": 0.5,
             "grad_norm": 1.25, "mem_alloc_gb": 2.5, "mem_reserved_gb": 3.5, "mfu": None if i % 2 else 0.375}
        log.write(r)
        written[i] = r
    log.close()
    full = path.read_bytes()
    assert b"\r\n" in full  # the csv module's line ending
    complete = read_training_csv(path)
    assert complete.problem is None and len(complete.frame) == 5 and complete.dropped_rows == 0
    assert complete.frame["mfu"].isna().sum() == 3  # empty cells are NaN, not dropped rows
    cut = tmp_path / "cut.csv"
    for k in range(len(full) + 1):
        cut.write_bytes(full[:k])
        read = read_training_csv(cut)
        assert isinstance(read, CsvRead)
        for rec in read.frame.to_dict("records"):
            want = written[rec["step"]]
            assert rec["toks_per_s"] == want["toks_per_s"] and rec["loss"] == want["loss"]
            assert rec["mem_reserved_gb"] == want["mem_reserved_gb"]
        plain_json(summarize(read, Window(last=3)))


def test_garbled_middle_row_dropped(tmp_path):
    lines = [HEADER, row(1), row(2), "3,abc,0.001,1000,0.5,1,2,3", "4,1.0,0.001", row(5)]
    read = read_training_csv(write(tmp_path / "t.csv", lines))
    assert read.problem is None
    assert read.dropped_rows == 2
    assert list(read.frame["step"]) == [1, 2, 5]


def test_non_integer_step_is_dropped(tmp_path):
    lines = [HEADER, row(1), "2.5" + row(2)[1:], "nan" + row(3)[1:], row(4)]
    read = read_training_csv(write(tmp_path / "t.csv", lines))
    assert list(read.frame["step"]) == [1, 4] and read.dropped_rows == 2


def test_sorted_by_step_and_duplicates_keep_last(tmp_path):
    lines = [HEADER, row(3, loss=3.0), row(1, loss=1.0), row(2, loss=2.0), row(2, loss=22.0), row(4, loss=4.0)]
    read = read_training_csv(write(tmp_path / "t.csv", lines))
    assert list(read.frame["step"]) == [1, 2, 3, 4]
    assert list(read.frame["loss"]) == [1.0, 22.0, 3.0, 4.0]
    assert read.duplicate_steps == 1
    assert str(read.frame["step"].dtype) == "int64"


def test_extra_columns_numeric_kept_text_dropped(tmp_path):
    lines = [HEADER + ",phase,extra", row(1) + ",warm,7", row(2) + ",main,8"]
    read = read_training_csv(write(tmp_path / "t.csv", lines))
    assert read.problem is None and read.dropped_rows == 0
    assert "phase" not in read.frame and list(read.frame["extra"]) == [7.0, 8.0]


# --- summarize -------------------------------------------------------------------------------------------------

def test_window_statistics_match_statistics_module(tmp_path):
    read = read_training_csv(csv_file(tmp_path, 80))
    s = summarize(read, Window(last=50, warmup=10))
    assert s["status"] == "ok" and s["reason"] is None and s["note"] is None
    assert s["steps"] == 80 and s["last_step"] == 80
    assert s["window"] == {"last": 50, "warmup": 10, "n": 50, "first_step": 31, "last_step": 80}
    vals = [toks(i) for i in range(31, 81)]
    t = s["toks_per_s"]
    assert t["n"] == 50
    # the window's tokens over its time, from the file's own step times (2,048 tokens a step)
    assert t["mean"] == pytest.approx(2048 * 50 / sum(2048 / v for v in vals), rel=1e-12)
    assert t["mean"] == pytest.approx(statistics.harmonic_mean(vals), rel=1e-12)
    assert t["mean"] < statistics.mean(vals) * (1 - 1e-6)  # never the plain mean of the rates
    assert t["median"] == pytest.approx(statistics.median(vals), rel=1e-12)
    assert t["stdev"] == pytest.approx(statistics.pstdev(vals), rel=1e-9)
    assert t["cv"] == pytest.approx(statistics.pstdev(vals) / statistics.harmonic_mean(vals), rel=1e-9)
    assert (t["min"], t["max"]) == (min(vals), max(vals))
    loss = [10.0 - 0.01 * i for i in range(31, 81)]
    assert s["loss"]["mean"] == pytest.approx(statistics.mean(loss), rel=1e-12)
    assert set(t) == set(STAT_NAMES)
    assert set(METRIC_COLUMNS) - {"mfu"} <= set(s) and "mfu" not in s
    plain_json(s)
    json.dumps(s, allow_nan=False)


def test_a_stalled_step_costs_the_window_figure_what_it_costs_the_run(tmp_path):
    """Steps of 2,048 tokens at 100, 100 and 25 tokens/s take 20.48, 20.48 and 81.92 s: 6,144 tokens in 122.88 s
    are 50 tokens/s (the plain mean of the rates, 75, counts the stalled step as much as a fast one). MFU, a rate of
    the same work, is read the same way; step time and loss keep their plain mean."""
    lines = [HEADER + ",mfu"] + [row(i, tps=tps, mfu=repr(tps / 1000)) for i, tps in enumerate((100.0, 100.0, 25.0), 1)]
    s = summarize(read_training_csv(write(tmp_path / "t.csv", lines)), Window(), 2)
    assert s["toks_per_s"]["mean"] == pytest.approx(50.0, rel=1e-12)
    assert s["toks_per_s_per_gpu"] == pytest.approx(25.0, rel=1e-12)
    assert s["mfu"]["mean"] == pytest.approx(0.05, rel=1e-12)
    assert s["step_time_s"]["mean"] == pytest.approx(122.88 / 3, rel=1e-12)
    assert s["toks_per_s"]["median"] == 100.0 and s["toks_per_s"]["min"] == 25.0


def test_warmup_excludes_first_rows_even_when_window_is_large(tmp_path):
    read = read_training_csv(csv_file(tmp_path, 20))
    s = summarize(read, Window(last=10, warmup=15))
    assert s["status"] == "short"
    assert s["window"]["n"] == 5 and s["window"]["first_step"] == 16
    assert s["toks_per_s"]["mean"] == pytest.approx(statistics.harmonic_mean([toks(i) for i in range(16, 21)]))


def test_window_values(tmp_path):
    path = csv_file(tmp_path, 40)
    assert window_values(path, "toks_per_s", Window(last=10, warmup=5)) == [toks(i) for i in range(31, 41)]
    assert window_values(read_training_csv(path), "loss", Window(last=3)) == pytest.approx([9.62, 9.61, 9.6])
    assert window_values(path, "mfu", Window()) == []
    assert window_values(tmp_path / "missing.csv", "toks_per_s", Window()) == []
    lines = [HEADER] + [row(i, loss=float("nan") if i == 2 else None) for i in range(1, 4)]
    assert window_values(write(tmp_path / "n.csv", lines), "loss", Window()) == pytest.approx([9.99, 9.97])


def test_short_window(tmp_path):
    read = read_training_csv(csv_file(tmp_path, 30))
    s = summarize(read, Window(last=50))
    assert s["status"] == "short"
    assert "30 of the 50" in s["note"]
    assert s["toks_per_s"]["n"] == 30
    assert s["toks_per_s"]["mean"] == pytest.approx(statistics.harmonic_mean([toks(i) for i in range(1, 31)]))


def test_everything_in_warmup_is_empty(tmp_path):
    s = summarize(read_training_csv(csv_file(tmp_path, 5)), Window(last=50, warmup=5))
    assert s["status"] == "empty" and "warmup 5" in s["reason"]
    assert s["steps"] == 5 and "toks_per_s" not in s


def test_per_gpu_and_world_size(tmp_path):
    read = read_training_csv(csv_file(tmp_path, 60))
    one, two = summarize(read, Window(), 1), summarize(read, Window(), 2)
    assert two["toks_per_s_per_gpu"] == pytest.approx(one["toks_per_s"]["mean"] / 2)
    assert one["toks_per_s_per_gpu"] == pytest.approx(one["toks_per_s"]["mean"])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(MetricsError):
            summarize(read, Window(), bad)


def test_losses_and_peak_memory_use_all_rows(tmp_path):
    lines = [HEADER] + [row(i, reserved=9.5 if i == 2 else 3.0) for i in range(1, 61)]
    s = summarize(read_training_csv(write(tmp_path / "t.csv", lines)), Window(last=10, warmup=5))
    assert s["first_loss"] == pytest.approx(10.0 - 0.01)
    assert s["final_loss"] == pytest.approx(10.0 - 0.6)
    assert s["loss_drop"] == pytest.approx(0.59)
    assert s["mem_peak_gb"] == 9.5           # step 2: outside the window
    assert s["mem_reserved_gb"]["max"] == 3.0


def test_nonfinite_loss_becomes_none(tmp_path):
    lines = [HEADER] + [row(i) for i in range(1, 10)] + [row(10, loss=float("nan"))]
    s = summarize(read_training_csv(write(tmp_path / "t.csv", lines)), Window(last=5))
    assert s["final_loss"] is None and s["loss_drop"] is None
    assert s["loss"]["n"] == 4  # the NaN is left out of the statistics
    json.dumps(s, allow_nan=False)


def test_mfu_empty_cells(tmp_path):
    lines = [HEADER + ",mfu"] + [row(i, mfu="") for i in range(1, 6)]
    s = summarize(read_training_csv(write(tmp_path / "t.csv", lines)), Window(last=5))
    assert s["status"] == "ok" and s["mfu"]["n"] == 0 and s["mfu"]["mean"] is None
    lines = [HEADER + ",mfu"] + [row(i, mfu=str(0.25 + 0.125 * (i % 2))) for i in range(1, 6)]
    s = summarize(read_training_csv(write(tmp_path / "t2.csv", lines)), Window(last=5))
    assert s["mfu"]["mean"] == pytest.approx(statistics.harmonic_mean([0.375, 0.25, 0.375, 0.25, 0.375]))


def _alloc_file(tmp_path: Path, allocs: list[float]) -> CsvRead:
    lines = [HEADER] + [row(i + 1, alloc=a) for i, a in enumerate(allocs)]
    return read_training_csv(write(tmp_path / "m.csv", lines))


@pytest.mark.parametrize("allocs, expected", [
    ([10.0] * 20, True),                                   # flat
    ([1.0 + 0.5 * i for i in range(20)], False),           # grows steadily
    ([10.0] * 15 + [10.5] * 5, True),                      # +5.0% of 10 GB: within tolerance
    ([10.0] * 15 + [10.6] * 5, False),                     # +6%
    ([0.5] * 15 + [0.54] * 5, True),                       # +8% but only 0.04 GB: small footprints
    ([0.5] * 15 + [0.56] * 5, False),                      # +0.06 GB and +12%
    ([10.0] * 7, None),                                    # too few rows
    ([9.0, 9.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.2], True),      # the first quarter (start-up) is ignored
])
def test_mem_plateau(tmp_path, allocs, expected):
    assert summarize(_alloc_file(tmp_path, allocs), Window(last=50))["mem_plateau"] is expected


def test_throughput_stable(tmp_path):
    steady = summarize(read_training_csv(csv_file(tmp_path, 60)), Window())
    assert steady["throughput_stable"] is True
    lines = [HEADER] + [row(i, tps=1000.0 if i % 2 else 500.0) for i in range(1, 61)]
    noisy = summarize(read_training_csv(write(tmp_path / "n.csv", lines)), Window())
    assert noisy["toks_per_s"]["cv"] == pytest.approx(250 / (2 / (1 / 1000 + 1 / 500)))  # stdev over the figure
    assert noisy["throughput_stable"] is False


def _tps_file(tmp_path: Path, values: list[float]) -> CsvRead:
    return read_training_csv(write(tmp_path / "d.csv", [HEADER] + [row(i + 1, tps=v) for i, v in enumerate(values)]))


def test_a_run_that_slows_down_step_by_step_is_steady_in_its_window_but_drifts(tmp_path):
    """120 steps, each 0.2% slower than the one before: any 50-step window has a CV near 3% (steady), but the run's
    last third runs at about 0.85x its first (medians of the thirds: steps 20 and 100 of a geometric decline)."""
    values = [1000.0 * 0.998 ** i for i in range(120)]
    out = summarize(_tps_file(tmp_path, values), Window(last=50))
    assert out["throughput_stable"] is True
    expected = statistics.median(values[80:]) / statistics.median(values[:40]) - 1
    assert out["throughput_drift"] == pytest.approx(expected) and expected == pytest.approx(0.998 ** 80 - 1)
    assert out["throughput_drift"] < -0.1


@pytest.mark.parametrize("values, warmup, expected", [
    ([100.0] * 4 + [95.0] * 4 + [80.0] * 4, 0, 80 / 100 - 1),     # thirds' medians 100, 95, 80
    ([10.0] * 3 + [100.0] * 9, 3, 0.0),                            # the warmup's slow steps are not the start
    ([10.0] * 2 + [100.0] * 13, 0, 0.0),                           # nor do two slow steps of a third of five
    ([100.0] * 5 + [1.0] + [100.0] * 6, 0, 0.0),                   # one slow step (a checkpoint) moves nothing
    ([100.0, 110.0] * 6, 0, 0.0),                                  # alternating: medians 105 and 105
    ([100.0] * 8, 0, None),                                        # under 9 rows
    ([100.0] * 11, 3, None),                                       # 8 rows after the warmup
])
def test_throughput_drift_is_the_median_of_the_last_third_over_the_first(tmp_path, values, warmup, expected):
    drift = summarize(_tps_file(tmp_path, values), Window(last=50, warmup=warmup))["throughput_drift"]
    assert drift == (None if expected is None else pytest.approx(expected))


# --- scaling and selection -------------------------------------------------------------------------------------

def test_scaling_efficiency():
    assert scaling_efficiency(1800.0, 1000.0, 2) == pytest.approx(0.9)
    assert scaling_efficiency(4000.0, 1000.0, 4) == pytest.approx(1.0)
    assert scaling_efficiency(None, 1000.0, 2) is None
    assert scaling_efficiency(1800.0, 0.0, 2) is None
    assert scaling_efficiency(1800.0, float("nan"), 2) is None
    assert scaling_efficiency(1800.0, 1000.0, 0) is None


def summary(mean: float, stdev: float, status: str = "ok") -> dict:
    return {"status": status, "toks_per_s": {"mean": mean, "stdev": stdev}}


def test_select_best_highest_mean():
    label, why = select_best([("25", summary(800.0, 2.0)), ("50", summary(850.0, 9.0)), ("100", summary(820, 1.0))])
    assert label == "50"
    assert "850.0" in why and "800.0" in why and "820.0" in why


def test_select_best_tie_goes_to_lower_stdev():
    # 850 vs 845: within 1% -> tie; 845 has the lower stdev.
    label, why = select_best([("25", summary(850.0, 9.0)), ("50", summary(845.0, 3.0)), ("100", summary(700, 0.1))])
    assert label == "50"
    assert "tie" in why and "lower stdev" in why


def test_select_best_just_outside_tie():
    # 850 vs 841: 1.06% apart -> not a tie; the higher mean wins despite its larger stdev.
    label, _ = select_best([("25", summary(850.0, 9.0)), ("50", summary(841.0, 3.0))])
    assert label == "25"


def test_select_best_excludes_failed_runs():
    label, why = select_best([("25", summary(9999.0, 1.0, status="corrupt")), ("50", summary(800.0, 5.0, "short")),
                              ("100", {"status": "missing", "reason": "missing: x"})])
    assert label == "50"
    assert "25 (corrupt)" in why and "100 (missing)" in why


def test_select_best_none_usable():
    label, why = select_best([("a", {"status": "missing"}), ("b", {"status": "ok"})])
    assert label is None and "no candidate" in why
    assert select_best([])[0] is None


def test_select_best_goal_min_and_bad_goal():
    cands = [("a", {"status": "ok", "step_time_s": {"mean": 0.5, "stdev": 0.01}}),
             ("b", {"status": "ok", "step_time_s": {"mean": 0.4, "stdev": 0.05}})]
    assert select_best(cands, metric="step_time_s", goal="min")[0] == "b"
    assert select_best(cands, metric="step_time_s", goal="max")[0] == "a"
    with pytest.raises(MetricsError):
        select_best(cands, goal="best")


def test_select_best_from_real_summaries(tmp_path):
    cands = []
    for label, base in (("25", 1000.0), ("50", 1100.0), ("100", 1050.0)):
        lines = [HEADER] + [row(i, tps=base + (i % 3)) for i in range(1, 61)]
        cands.append((label, summarize(read_training_csv(write(tmp_path / f"{label}.csv", lines)), Window())))
    assert select_best(cands)[0] == "50"


def test_fast_and_row_by_row_readers_agree_on_clean_files(tmp_path, monkeypatch):
    """Clean files take pandas' C parser; its frame must equal the explaining row-by-row reader's."""
    import random

    rng = random.Random(3)
    header = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb,mfu\n"
    rows = [f"{s},{rng.uniform(1, 9):.6f},{rng.uniform(0, 1e-3):.3g},{rng.uniform(1e3, 9e4):.6f},"
            f"{rng.uniform(0.01, 2):.6f},{rng.uniform(0, 5):.6f},{rng.uniform(0, 80):.4f},{rng.uniform(0, 80):.4f},"
            f"{'' if s % 3 else f'{rng.random():.4f}'}\n" for s in [*range(1, 300), 150, 151]]  # two duplicates
    path = tmp_path / "training.csv"
    path.write_text(header + "".join(rows))
    from validation.analysis import metrics as m

    assert m._read_clean_if_complete(path) is not None  # the fast path really serves this file
    fast = read_training_csv(path)
    monkeypatch.setattr("validation.analysis.metrics._read_clean_if_complete", lambda p: None)
    slow = read_training_csv(path)
    assert fast.problem is None and slow.problem is None
    assert fast.duplicate_steps == slow.duplicate_steps == 2
    pd.testing.assert_frame_equal(fast.frame, slow.frame)
