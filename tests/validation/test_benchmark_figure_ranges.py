"""A benchmark record's rates and times have physical ranges too (validation.analysis.plausibility): a negative
tokens/s in bench_train's `best.dense` let `best.nsa.toks_per_s >= 0.55 * best.dense.toks_per_s` pass."""

from __future__ import annotations

from validation.analysis.plausibility import implausible


def test_a_negative_rate_or_time_in_a_benchmark_record_is_implausible():
    record = {"best": {"nsa": {"toks_per_s": 1200.0}, "dense": {"toks_per_s": -100.0}},
              "results": [{"model": "nsa", "toks_per_s": 1200.0, "step_time_ms": -3.5}],
              "by_seq_len": [{"seq_len": 256, "forward_v1_ms": 1.2, "wall_s": 0.0, "ranges_speedup": 2.0}]}
    bad = {b["metric"] for b in implausible(record)}
    assert bad == {"best.dense.toks_per_s", "results.0.step_time_ms"}


def test_signed_figures_without_those_names_are_left_alone():
    assert implausible({"delta": -5.0, "rel_delta": -0.2, "throughput_drift": -0.3, "steps": 3}) == []
