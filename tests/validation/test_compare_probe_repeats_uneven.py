"""compare between two runs that ran a sweep label a different number of times (1 repeat in one, 2 or 3 in the
other): the launches both can be paired on are compared launch against launch, held to the run-to-run variation the
repeated side measures, and the warnings say how many repeats each run ran and which launches were not compared.
Hand-built results.json and flat training.csv files, so that every figure is known by hand."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/validation: the record builders
from decision_support import write_csv  # noqa: E402
from results_records import run_record  # noqa: E402

from validation.analysis.significance import adjust_family  # noqa: E402
from validation.analysis.significance.comparison import compare_shift  # noqa: E402
from validation.report.compare import compare_runs  # noqa: E402


def _sweep_run(run_dir: Path, levels: list[float], status: str = "passed") -> dict:
    """A run whose sweep step `sw` ran its point X=25 once per entry of `levels` (repeat 1, 2, ...), each launch a
    flat 20-step window at that many tokens/s, final loss 4.0."""
    runs = []
    for r, level in enumerate(levels):
        rel = f"sw/25_r{r + 1}/out/training.csv"
        write_csv(run_dir / rel, [level] * 20)
        runs.append({"label": "X=25", "repeat": r, "status": "passed",
                     "metrics": {"csv": rel, "window": {"last": 20, "warmup": 0}, "final_loss": 4.0}})
    results = run_record({"steps": {"sw": {"kind": "sweep", "status": status, "runs": runs}}})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results))
    return results


def _toks(out: dict) -> list[dict]:
    return [r for r in out["rows"] if r["metric"] == "toks_per_s"]


def test_a_label_run_once_is_compared_with_the_other_runs_repeat_1(tmp_path):
    """A ran sw[X=25] once at 1,000 tokens/s, B twice (1,100 and 1,120): A's launch is compared with B's repeat 1
    (+10.0%), each side's noise held to the run-to-run variation of B's two repeats, |ln(1120/1100)| / sqrt 2 =
    1.274% with 1 df, so the 95% interval is ln 1.1 +- t(0.975, 1) x sqrt 2 x 1.274% (-12.5% .. +38.3%); the
    warning says A ran 1 repeat and B 2, and names B's repeat 2 as not compared."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a, b = _sweep_run(a_dir, [1000.0]), _sweep_run(b_dir, [1100.0, 1120.0])
    out = compare_runs(a, b, a_dir, b_dir)

    (row,) = _toks(out)
    assert row["step"] == "sw[X=25, repeat 1]" and row["tested"] is True
    assert (row["mean_a"], row["mean_b"]) == (pytest.approx(1000.0), pytest.approx(1100.0))
    assert row["rel_delta"] == pytest.approx(0.10)
    side = abs(math.log(1120.0 / 1100.0)) / math.sqrt(2.0)
    assert row["run_to_run"] == pytest.approx(side) and row["run_to_run_df"] == 1
    half = sps.t.ppf(0.975, 1) * math.sqrt(2.0) * side
    assert row["ci_low"] == pytest.approx(math.expm1(math.log(1.1) - half), rel=1e-6)
    assert row["ci_high"] == pytest.approx(math.expm1(math.log(1.1) + half), rel=1e-6)
    assert (round(row["ci_low"] * 100, 1), round(row["ci_high"] * 100, 1)) == (-12.5, 38.3)  # written out
    assert out["run_noise"]["sw"]["source"] == "sw (B: 1 x 2 runs)"

    (uneven,) = [w for w in out["warnings"] if w.startswith("step sw ")]
    assert uneven.startswith("step sw ran 1 repeat in A and 2 in B (sw[X=25]): A's one launch compared with B's "
                             "repeat 1")
    assert uneven.endswith("1 trainer launch of B not compared (sw[X=25, repeat 2])")
    assert not any("none of the same label" in w for w in out["warnings"])


def test_a_label_repeated_in_a_and_run_once_in_b_is_compared_the_same_way(tmp_path):
    """The mirror case: A ran sw[X=25] twice (1,000 and 1,020), B once (900): A's repeat 1 against B's launch
    (-10.0%), A's repeat 2 not compared, and the warning names which run ran how many repeats."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a, b = _sweep_run(a_dir, [1000.0, 1020.0]), _sweep_run(b_dir, [900.0])
    out = compare_runs(a, b, a_dir, b_dir)
    (row,) = _toks(out)
    assert row["step"] == "sw[X=25, repeat 1]" and row["rel_delta"] == pytest.approx(-0.10)
    assert row["run_to_run"] == pytest.approx(abs(math.log(1020.0 / 1000.0)) / math.sqrt(2.0))
    (uneven,) = [w for w in out["warnings"] if w.startswith("step sw ")]
    assert uneven.startswith("step sw ran 2 repeats in A and 1 in B (sw[X=25]): B's one launch compared with A's "
                             "repeat 1")
    assert uneven.endswith("1 trainer launch of A not compared (sw[X=25, repeat 2])")


def test_two_repeats_against_three_say_the_counts_and_the_step_that_did_not_pass(tmp_path):
    """A ran 2 repeats of 3 before its step timed out, B all 3: repeats 1 and 2 compared launch by launch (+5%,
    +10%), B's repeat 3 not compared, and the warning says the counts differ (not "none of the same label") and how
    A's step ended."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = _sweep_run(a_dir, [1000.0, 1000.0], status="timeout")
    b = _sweep_run(b_dir, [1050.0, 1100.0, 1000.0])
    out = compare_runs(a, b, a_dir, b_dir)
    rows = {r["step"]: r for r in _toks(out)}
    assert sorted(rows) == ["sw[X=25, repeat 1]", "sw[X=25, repeat 2]"]
    assert rows["sw[X=25, repeat 1]"]["rel_delta"] == pytest.approx(0.05)
    assert rows["sw[X=25, repeat 2]"]["rel_delta"] == pytest.approx(0.10)
    (uneven,) = [w for w in out["warnings"] if w.startswith("step sw ")]
    assert uneven == ("step sw ran 2 repeats in A and 3 in B (sw[X=25]): the 2 repeats both ran compared launch by "
                      "launch; 1 trainer launch of B not compared (sw[X=25, repeat 3]); A's step timeout")


def test_holm_over_one_comparison_is_said_in_the_singular():
    """One tested row: the family statement and the row's text say "over 1 comparison", not "1 comparisons"."""
    family = adjust_family([compare_shift([0.01, 0.02, 0.03], min_shift=0.05, metric="toks_per_s")])
    assert family.statement.startswith("Holm's step-down correction over 1 comparison: ")
    (c,) = family.comparisons
    assert "over 1 comparison," in c.describe() and "comparisons" not in c.describe()
    two = adjust_family([compare_shift([0.01, 0.02, 0.03], min_shift=0.05, metric="toks_per_s")] * 2)
    assert two.statement.startswith("Holm's step-down correction over 2 comparisons: ")
