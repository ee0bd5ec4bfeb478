"""Block means and run means of series far from 1 (values beyond ~1e154 or below ~1e-154): the statistics of a
series scaled by c are those of the series times c (the block length, inefficiency and p-values do not change),
checked against a float64 recomputation of the standard error (block means by reshaping, kappa from the AR(1)
covariance matrix written out), never a crash or a standard error of 0."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from validation.analysis.significance import (autocorrelation, block_units, compare_series, decide, inefficiency,
                                             run_units)
from validation.analysis.significance.simulate import ar1
from validation.report.compare import compare_runs

sys.path.insert(0, str(Path(__file__).resolve().parent / "validation"))
from decision_support import write_csv  # noqa: E402


def _series(seed: int, n: int = 40, phi: float = 0.6, cv: float = 0.05) -> np.ndarray:
    return 1.0 + ar1(np.random.default_rng(seed), (n,), phi, cv)


def _se_reference(x: np.ndarray, block_len: int, inefficiency: float) -> tuple[float, float]:
    """(mean of the steps used, standard error) recomputed in float64 from the block length and inefficiency: the
    block means' s / sqrt(m) times sqrt(kappa), kappa = Var(mean) / E[s^2 / m] from the AR(1) covariance matrix."""
    n = x.size
    m = n // block_len
    used = x[n - m * block_len:]
    means = used.reshape(m, block_len).mean(axis=1)
    phi = (inefficiency - 1.0) / (inefficiency + 1.0)
    idx = np.arange(m * block_len)
    cov = phi ** np.abs(idx[:, None] - idx[None, :])
    w = np.full(m * block_len, 1.0 / (m * block_len))
    blocks = np.kron(np.eye(m), np.full((1, block_len), 1.0 / block_len))
    c = blocks @ cov @ blocks.T
    kappa = float(w @ cov @ w) / ((np.trace(c) - c.sum() / m) / (m - 1) / m)
    return float(used.mean()), math.sqrt(float(np.var(means, ddof=1)) / m * kappa)


@pytest.mark.parametrize("scale", [1e300, 1e200, 1e-200, 1e-300])
def test_block_units_of_a_scaled_series_are_the_scaled_units(scale):
    x = _series(1)
    ref = block_units(x)
    mean, se = _se_reference(x, ref.block_len, ref.inefficiency)
    assert ref.mean == pytest.approx(mean, rel=1e-12) and ref.se == pytest.approx(se, rel=1e-9)
    u = block_units(x * scale)  # before: ValueError (NaN inefficiency) above ~1e154, se 0.0 below ~1e-154
    assert u.block_len == ref.block_len and u.inefficiency == pytest.approx(ref.inefficiency, rel=1e-9)
    assert u.mean == pytest.approx(mean * scale, rel=1e-12) and u.se == pytest.approx(se * scale, rel=1e-9)
    assert u.ess == pytest.approx(ref.ess, rel=1e-9) and u.se > 0


@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_the_autocorrelation_does_not_depend_on_the_scale(scale):
    x = _series(6)
    c = x - x.mean()
    lag1 = float(c[1:] @ c[:-1]) / float(c @ c)  # by hand: the lag-1 autocovariance over the variance
    rho = autocorrelation(x * scale, 3)  # before: NaN at 1e300 (squares overflowed), 0 at 1e-300 (underflowed)
    assert rho[0] == 1.0 and rho[1] == pytest.approx(lag1, rel=1e-9)
    assert inefficiency(x * scale) == pytest.approx(inefficiency(x), rel=1e-9)


def test_run_units_of_huge_means_have_a_finite_standard_error():
    u = run_units([1e300, 1.5e300, 1.25e300])
    assert u.se == pytest.approx(0.25e300 / math.sqrt(3), rel=1e-12)  # sd 0.25e300 by hand, over sqrt(3)


def test_a_level_shift_of_tiny_values_is_no_exact_difference():
    """A series of 1e-300 then 2e-300 varies: its standard error is not 0, so a 1% lower copy is no exact
    (p = 0, significant) difference; before, the squared deviations underflowed to se = 0 and it was "worse"."""
    x = np.array([1e-300] * 20 + [2e-300] * 20)
    u = block_units(x)
    assert u.se > 0.1e-300
    c = compare_series(x, x * 0.99)
    assert not c.significant and c.p_value > 0.5


def test_a_series_of_huge_values_compares_and_decides_without_a_crash():
    a, b = _series(2) * 1e300, _series(3) * 1e300
    c = compare_series(a, b)
    assert math.isfinite(c.p_value) and math.isfinite(c.ci_low) and math.isfinite(c.ci_high)
    assert c.ci_low < c.rel < c.ci_high and c.rel == pytest.approx(compare_series(a / 1e300, b / 1e300).rel, abs=1e-6)
    d = decide({"x": [a], "y": [b]}, default="x")
    assert d.method == "blocks" and d.choice in ("x", "y")


def _results() -> dict:
    metrics = {"csv": "baseline/out/training.csv", "window": {"last": 20, "warmup": 0}, "final_loss": 4.0}
    return {"runbook": {"name": "rb"}, "verdict": "GO", "environment": {"host": "a"},
            "steps": {"baseline": {"name": "baseline", "runs": [], "metrics": metrics}}}


def test_compare_of_runs_with_huge_throughput_values_ends_without_a_traceback(tmp_path):
    """A training.csv of absurd figures (1e300 tokens/s, nothing bounds it without the device's peak) is compared,
    not a ValueError out of `nsa-validate compare`; two copies of one run are no regression."""
    values = list(_series(4, 20) * 1e300)
    write_csv(tmp_path / "a/baseline/out/training.csv", values)
    write_csv(tmp_path / "b/baseline/out/training.csv", values)
    out = compare_runs(_results(), _results(), tmp_path / "a", tmp_path / "b")
    row = out["rows"][0]
    assert row["metric"] == "toks_per_s" and row["tested"] and row["rel"] == pytest.approx(0.0, abs=1e-9)
    assert out["exit_code"] == 0 and row["verdict"] != "worse"
    assert row["p_value"] == pytest.approx(1.0)
