"""benchmarks/bench_selection.py's figures: the two arms called alternately (the order reversed every round, one
untimed warm-up call each), each call's time recorded, min / median / max per arm, the ratio of the medians and the
min / median / max of the rounds' ratios; the command that reproduces the figures printed. Times come from a fake
clock that each call advances by a known amount, so that the figures are checked exactly, never timed."""

from __future__ import annotations

import json
import types

import pytest

from benchmark_scripts import load

bench = load("bench_selection")


class Clock:
    """perf_counter that only the fake calls move."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_alternated_calls_and_their_figures(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    order = []
    durations = {"sort": iter([99.0, 1.0, 2.0, 3.0, 4.0]), "topk": iter([99.0, 0.5, 3.0, 1.5, 1.0])}

    def arm(name):
        def call():
            order.append(name)
            clock.now += next(durations[name])  # the first (99 s) is the warm-up: never a sample
        return call

    times = bench._alternated({"sort": arm("sort"), "topk": arm("topk")}, "cpu", 4)
    assert order == ["sort", "topk"] + ["sort", "topk", "topk", "sort"] * 2  # warm-ups, then A B B A A B B A
    assert times == {"sort": [1.0, 2.0, 3.0, 4.0], "topk": [0.5, 3.0, 1.5, 1.0]}
    f = bench._figures(times, "sort", "topk")
    assert f["sort"] == {"min": 1.0, "median": 2.5, "max": 4.0}
    assert f["topk"] == {"min": 0.5, "median": 1.25, "max": 3.0}
    assert f["ratio"] == pytest.approx(1.25 / 2.5)  # topk / sort of the medians: below 1, topk faster
    # each round's topk / sort: 0.5, 1.5, 0.5, 0.25
    assert (f["ratio_min"], f["ratio_rounds_median"], f["ratio_max"]) == pytest.approx((0.25, 0.5, 1.5))


def test_default_run_prints_its_figures_and_the_reproduce_command(tmp_path, capsys):
    """The range builders at a tiny S on CPU: the reproduce line, min/median/max per arm, and JSON figures that are
    the medians' ratios."""
    out = tmp_path / "sel.json"
    argv = ["--seq-lens", "64", "--repeats", "2", "--json", str(out)]
    assert bench.main(argv) == 0
    text = capsys.readouterr().out
    assert f"reproduce: python benchmarks/bench_selection.py --seq-lens 64 --repeats 2 --json {out}" in text
    line = next(x for x in text.splitlines() if x.startswith("S 64:"))
    assert line.count("/") >= 8 and "rounds" in line  # ranges and forward: two triples and a ratio range each
    (row,) = json.loads(out.read_text())["by_seq_len"]
    assert row["ranges_speedup"] == pytest.approx(row["ranges_v1_ms"] / row["ranges_v2_ms"])
    assert row["forward_speedup"] == pytest.approx(row["forward_v1_ms"] / row["forward_v2_ms"])


def test_the_topk_ab_on_cpu_without_the_interpreter_is_refused_naming_it(monkeypatch, capsys):
    """--topk-ab runs the Triton selection kernels: on CPU only through Triton's interpreter. Without it, a clear
    error (exit 2) instead of Triton's "0 active drivers" traceback from the first launch."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--topk-ab", "--device", "cpu", "--seq-lens", "256", "--repeats", "1"])
    assert exit_.value.code == 2 and "set TRITON_INTERPRET=1" in capsys.readouterr().err
