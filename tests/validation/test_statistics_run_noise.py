"""The run-to-run variation in comparisons of single runs: its degrees of freedom, and which runs measure it.

1. compare_units(..., run_noise=): when both sides are held to the run-to-run variation they hold ONE estimate s^2
   (its df), not two independent ones; Welch-Satterthwaite over two copies doubled the df (1 -> 2: the 97.5% t
   quantile 4.30 instead of 12.71). Simulated A/A pairs of single runs with 10% run-to-run level noise measured
   from 2 x 2 repeats were "significant" in 8.5% +- 0.9% of 1,000 (95% CI coverage 90%) before, 5.4% +- 0.7% after.
2. measured_run_noise leaves out runs measured under interference (as measured_run_noise_by_step does): a disturbed
   repeat's slowdown is the other work's, not the machine's run-to-run variation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from nsa.training.outputs import TRAINING_COLUMNS
from validation.analysis.significance import RunNoise, Units, block_units, compare_units, run_noise
from validation.analysis.significance.windows import measured_run_noise
from validation.analysis.stats import t_sf2


def _blocks(mean: float, rel_se: float) -> Units:
    return Units(kind="blocks", values=(mean,) * 5, mean=mean, se=rel_se * mean, df=4.0, n=20, block_len=4)


def test_both_sides_held_to_the_run_noise_count_its_df_once():
    rn = RunNoise(between=0.1, total=0.1, within=0.01, df=1.0, runs=2, groups=1)
    a, b = _blocks(100.0, 0.01), _blocks(190.0, 0.01)  # each run's own noise far below the run-to-run 10%
    c = compare_units(a, b, run_noise=rn)
    se = math.sqrt(2.0) * 0.1
    t = math.log(1.9) / se
    assert c.df == pytest.approx(1.0)
    assert c.t == pytest.approx(t)
    assert c.p_value == pytest.approx(t_sf2(t, 1.0))  # 0.144; with the doubled df (2): 0.047, "significant"
    assert not c.significant and c.verdict == "inconclusive"
    # the interval uses t_{1, 0.975} = 12.706
    assert c.ci_high == pytest.approx(math.expm1(math.log(1.9) + 12.706204736 * se), rel=1e-9)


def test_one_side_held_keeps_the_satterthwaite_sum_of_two_independent_terms():
    rn = RunNoise(between=0.05, total=0.05, within=0.01, df=3.0, runs=4, groups=1)
    a, b = _blocks(100.0, 0.01), _blocks(110.0, 0.08)  # a held to 5% (3 df), b keeps its own 8% (4 df)
    c = compare_units(a, b, run_noise=rn)
    va, vb = 0.05 ** 2, 0.08 ** 2
    assert c.df == pytest.approx((va + vb) ** 2 / (va * va / 3.0 + vb * vb / 4.0))


def test_run_noise_dominated_pairs_are_not_significant_beyond_alpha():
    """Seeded, small: 400 A/A pairs of single 20-step runs (AR(1) phi 0.5, CV 1% within) under 10% run-to-run level
    noise, measured from 2 groups of 2 repeats (2 df): the t of log(b / a) is then Student's t with 2 df, and
    "significant" should be 5% (20 of 400, binomial sd 4.4); with the df doubled to 4 it was 32 of 400 with this seed,
    against 14 now."""
    rng = np.random.default_rng(20)
    n, reps, hits = 20, 400, 0

    def run() -> np.ndarray:
        e = rng.standard_normal(n) * (0.01 * math.sqrt(1 - 0.25))
        x = np.empty(n)
        x[0] = rng.standard_normal() * 0.01
        for t in range(1, n):
            x[t] = 0.5 * x[t - 1] + e[t]
        return 1000.0 * (1.0 + rng.normal(0.0, 0.1)) * (1.0 + x)

    for _ in range(reps):
        groups = [[(r.mean(), block_units(r).rel_se) for r in (run(), run())] for _ in range(2)]
        # noise=0: the test alone decides (the data's noise floor, t_{2, 0.975} s per side, would hide part of it)
        c = compare_units(block_units(run()), block_units(run()), run_noise=run_noise(groups), noise=0.0)
        hits += c.significant
    assert hits <= 28, f"{hits} of {reps} identical pairs significant"


def _csv(path: Path, level: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cols = list(TRAINING_COLUMNS)
    lines = [",".join(cols)]
    for step in range(30):
        row = {c: 1.0 for c in cols}
        row["toks_per_s"] = level * (1.0 + 0.02 * rng.standard_normal())
        lines.append(",".join(str(step) if c == "step" else repr(float(row[c])) for c in cols))
    path.write_text("\n".join(lines) + "\n")


def test_measured_run_noise_leaves_out_disturbed_runs(tmp_path):
    _csv(tmp_path / "a.csv", 1000.0, 1)
    _csv(tmp_path / "b.csv", 1010.0, 2)
    _csv(tmp_path / "c.csv", 1500.0, 3)  # a repeat measured beside other work: 50% off

    def launch(csv: str, disturbed: bool) -> dict:
        metrics = {"csv": csv, "window": {"last": 20, "warmup": 0}}
        if disturbed:
            metrics["interference"] = {"disturbed": True}
        return {"label": "x", "status": "passed", "metrics": metrics}

    results = {"steps": {"sweep": {"runs": [launch("a.csv", False), launch("b.csv", False),
                                            launch("c.csv", True)]}}}
    rn = measured_run_noise(results, tmp_path)
    assert rn is not None and rn.runs == 2 and rn.df == 1.0
    assert rn.total < 0.03  # the two quiet runs differ by ~1%; with the disturbed one it was 23%
