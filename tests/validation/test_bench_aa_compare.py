"""benchmarks/bench_aa_compare.py's counting, on simulated inputs: the Wilson interval against known values, the share
flagged from compare's exit codes (errors left out), and simulated A/A pairs through the real compare."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_aa_compare", REPO / "benchmarks" / "bench_aa_compare.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_wilson_interval_matches_its_formula_and_known_values():
    assert bench.wilson(0, 20) == pytest.approx((0.0, 0.16113), abs=1e-4)   # the "rule of three"-like bound
    low, high = bench.wilson(1, 20)
    assert (low, high) == pytest.approx((0.00888, 0.23613), abs=1e-4)
    low, high = bench.wilson(10, 20)
    assert low == pytest.approx(1 - high) and low == pytest.approx(0.29929, abs=1e-4)
    # the score interval: the p whose z-test against k/n is at the edge, both ends
    for p in bench.wilson(3, 40):
        assert abs(3 / 40 - p) == pytest.approx(1.959963984540054 * math.sqrt(p * (1 - p) / 40), rel=1e-9)
    assert bench.wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        bench.wilson(5, 4)


def test_summary_counts_exit_1_as_flagged_and_leaves_errors_out():
    s = bench.summarize([0] * 18 + [1, 2])
    assert (s["pairs"], s["flagged"], s["errors"]) == (19, 1, 1)
    assert s["share"] == pytest.approx(1 / 19) and s["ci_high"] > bench.GOAL and not s["within_goal"]
    s = bench.summarize([0] * 100)
    assert s["share"] == 0 and s["within_goal"]  # 0 of 100: the interval's top is 3.7%
    lines = bench.report_lines(bench.summarize([0, 1] * 10), "python benchmarks/bench_aa_compare.py --pairs 20")
    assert lines[0] == "A/A pairs: 20, flagged by compare (exit 1): 10"
    assert "share flagged: 50.0% (95% Wilson CI" in lines[1] and lines[1].endswith("missed")
    assert lines[-1] == "command: python benchmarks/bench_aa_compare.py --pairs 20"


def test_simulated_pairs_go_through_compare(tmp_path):
    rng = np.random.default_rng(0)
    codes = bench.run_pairs(6, lambda i: bench.simulated_pair(tmp_path / f"p{i}", rng), log=lambda _: None)
    assert len(codes) == 6 and set(codes) <= {0, 1}
    # a pair whose B is 40% slower everywhere is flagged: the counting sees compare's exit 1
    from validation.compare import compare_runs

    slow = np.random.default_rng(1)
    bench.simulated_pair(tmp_path / "s", slow)
    import json

    b = json.loads((tmp_path / "s/b/results.json").read_text())
    for step in b["steps"].values():
        for m in [step["metrics"]] + [r["metrics"] for r in step["runs"]]:
            if m.get("csv"):
                path = tmp_path / "s/b" / m["csv"]
                lines = path.read_text().splitlines()
                rows = [ln.split(",") for ln in lines[1:]]
                for r in rows:
                    r[3] = f"{float(r[3]) * 0.6:.3f}"
                path.write_text("\n".join([lines[0]] + [",".join(r) for r in rows]) + "\n")
    a = json.loads((tmp_path / "s/a/results.json").read_text())
    assert compare_runs(a, b, tmp_path / "s/a", tmp_path / "s/b")["exit_code"] == 1
