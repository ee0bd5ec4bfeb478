"""A scan point's tokens/s over its repeats is their work over their time (each run's window is the same work at
the same value): the harmonic mean of the runs' window figures, as the A/B, sweep, scaling and parallelism kinds
take it, never the plain mean of the rates."""

from __future__ import annotations

import pytest

from validation.kinds.scan import point_rows
from validation.results.codec import decode
from validation.results.trainer_launch import LaunchMetrics, LaunchRun


def _run(value, toks, status="passed", repeat=0, mfu=None):
    return LaunchRun(label=f"v{value}", params={"args.seq_len": value}, status=status, repeat=repeat,
                     metrics=decode(LaunchMetrics, {"toks_per_s": {"mean": toks},
                                                    **({"mfu": {"mean": mfu}} if mfu is not None else {})}))


def test_a_points_tokens_per_s_is_its_runs_work_over_their_time():
    # by hand: N tokens a window at 100 tok/s take N/100 s, at 300 tok/s N/300 s: 2N tokens in 4N/300 s = 150 tok/s
    # (the plain mean of the rates, 200, counts the fast run's shorter time as much as the slow run's)
    runs = [_run(64, 100.0), _run(64, 300.0, repeat=1), _run(128, 50.0), _run(128, 1e6, status="failed", repeat=1)]
    rows = {p.value: p for p in point_rows(runs, {}, None)}
    assert rows[64].toks_per_s == pytest.approx(150.0, rel=1e-12) and rows[64].passed == 2
    # a failed run's partial window is no measurement of the point
    assert rows[128].toks_per_s == pytest.approx(50.0, rel=1e-12) and rows[128].passed == 1


def test_a_points_mfu_is_averaged_as_its_tokens_per_s():
    # MFU is tokens/s times a constant (FLOPs per token over the peak): 0.1 and 0.3 of the same work average 0.15
    runs = [_run(64, 100.0, mfu=0.1), _run(64, 300.0, repeat=1, mfu=0.3)]
    (row,) = point_rows(runs, {}, None)
    assert row.mfu == pytest.approx(0.15, rel=1e-12) and row.toks_per_s == pytest.approx(150.0, rel=1e-12)
