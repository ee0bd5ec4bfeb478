"""benchmarks/bench_train.py's table row from the repeats of a case (summarize): the figures derived from tokens/s
(per rank, TFLOP/s, MFU) follow the median tokens/s the row shows, also with an even number of runs, where the
median is between two runs."""

from __future__ import annotations

import pytest

from benchmark_scripts import load

bench = load("bench_train")

FPT = 1e9  # FLOPs per token
PEAK = 1e15  # FLOP/s of one device


def _run(tps: float, ranks: int = 1, peak_gb: float = 4.0, stdev: float = 1.0, repeat: int = 0) -> dict:
    """A run as run_case returns it: its figures derived from its mean tokens/s as run_case derives them."""
    return {"case": "c", "ranks": ranks, "toks_per_s": tps, "toks_per_s_stdev": stdev,
            "toks_per_s_per_rank": tps / ranks, "achieved_tflops": FPT * tps / 1e12,
            "mfu": FPT * tps / (PEAK * ranks), "peak_mem_gb": peak_gb, "params_m": 1.0,
            "flops_per_token_g": FPT / 1e9, "final_loss": 1.0, "wall_s": 1.0, "csv": "c.csv", "repeat": repeat}


@pytest.mark.parametrize("ranks", [1, 2])
def test_two_runs_derived_figures_follow_the_median(ranks):
    row = bench.summarize([_run(100_000, ranks, 5.0, 10.0, 0), _run(200_000, ranks, 4.0, 30.0, 1)])
    assert (row["toks_per_s_min"], row["toks_per_s"], row["toks_per_s_max"]) == (100_000, 150_000, 200_000)
    assert row["toks_per_s_per_rank"] == pytest.approx(150_000 / ranks)
    assert row["achieved_tflops"] == pytest.approx(FPT * 150_000 / 1e12)
    assert row["mfu"] == pytest.approx(FPT * 150_000 / (PEAK * ranks))
    assert row["peak_mem_gb"] == 5.0  # the case's peak: the larger of its runs'
    assert row["toks_per_s_stdev"] == pytest.approx(20.0)
    line = bench.table([row]).splitlines()[-1]
    assert "100,000 / 150,000 / 200,000" in line and f"| {FPT * 150_000 / 1e12:.4f} |" in line


def test_odd_runs_are_the_middle_run_and_no_peak_is_no_mfu():
    runs = [_run(t) for t in (300.0, 100.0, 200.0)]
    for r in runs:
        r["mfu"] = None  # no device peak (CPU without --peak-tflops)
    row = bench.summarize(runs)
    assert row["toks_per_s"] == 200.0 and row["achieved_tflops"] == pytest.approx(FPT * 200 / 1e12)
    assert row["mfu"] is None and "n/a" in bench.table([row])
