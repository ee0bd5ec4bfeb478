"""The arithmetic behind verdicts against independent recomputations: the paired interval against a one-sample t
on the log-ratios written out by hand, the unpaired one against a Welch-Satterthwaite t written out by hand, the
power of the paired test against the noncentral t, the effective sample size against the steps' variance over a float64
standard error, and Holm's adjusted p-values against hand figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special as sc

from validation.analysis.significance import block_units, compare_paired, compare_units, holm, paired_power, run_units
from validation.analysis.significance.simulate import ar1


def test_the_paired_interval_is_the_one_sample_t_on_log_ratios():
    a, b = [100.0, 104.0, 98.0, 101.0, 97.0], [95.0, 99.0, 96.0, 94.0, 92.0]
    c = compare_paired(a, b)
    d = [math.log(y / x) for x, y in zip(a, b)]
    mean = sum(d) / 5
    se = math.sqrt(sum((v - mean) ** 2 for v in d) / 4 / 5)
    half = sc.stdtrit(4, 0.975) * se
    assert c.p_value == pytest.approx(2 * sc.stdtr(4, -abs(mean) / se), rel=1e-9)
    assert (c.ci_low, c.ci_high) == pytest.approx((math.expm1(mean - half), math.expm1(mean + half)), rel=1e-9)
    assert c.verdict == "worse" and c.ci_high < 0


def test_the_unpaired_interval_is_welch_on_the_log_ratio():
    a, b = [100.0, 104.0, 98.0, 101.0, 97.0], [95.0, 99.0, 96.0, 94.0, 92.0, 97.0]
    c = compare_units(run_units(a), run_units(b))
    va = np.var(a, ddof=1) / len(a) / np.mean(a) ** 2  # relative squared standard errors
    vb = np.var(b, ddof=1) / len(b) / np.mean(b) ** 2
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    log_rel = math.log(np.mean(b) / np.mean(a))
    half = sc.stdtrit(df, 0.975) * math.sqrt(va + vb)
    assert c.df == pytest.approx(df, rel=1e-9)
    assert c.p_value == pytest.approx(2 * sc.stdtr(df, -abs(log_rel) / math.sqrt(va + vb)), rel=1e-9)
    assert (c.ci_low, c.ci_high) == pytest.approx((math.expm1(log_rel - half), math.expm1(log_rel + half)), rel=1e-9)


@pytest.mark.parametrize("cv, effect, repeats", [(0.05, 0.05, 5), (0.02, 0.05, 3), (0.1, 0.05, 20)])
def test_paired_power_is_the_noncentral_t(cv, effect, repeats):
    sigma = math.sqrt(2.0) * cv
    nc = math.log1p(effect) * math.sqrt(repeats) / sigma
    ref = 1.0 - sc.nctdtr(repeats - 1, nc, sc.stdtrit(repeats - 1, 0.975))
    assert paired_power(cv, effect, repeats, min_floor=0.0) == pytest.approx(ref, abs=1e-5)


def test_the_effective_sample_size_is_the_steps_variance_over_the_squared_standard_error():
    x = 1e4 * (1.0 + ar1(np.random.default_rng(5), (60,), 0.7, 0.05))
    u = block_units(x)
    used = x[u.dropped:]
    means = used.reshape(-1, u.block_len).mean(axis=1)
    se = math.sqrt(float(np.var(means, ddof=1)) / means.size * u.kappa)
    assert u.se == pytest.approx(se, rel=1e-12) and u.mean == pytest.approx(float(used.mean()), rel=1e-12)
    assert u.ess == pytest.approx(min(used.size, float(np.var(used, ddof=1)) / se ** 2), rel=1e-9)
    assert 1.0 <= u.ess < used.size  # correlated steps: fewer independent ones than steps


def test_holm_adjusted_p_values_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04: x4 = 0.02, x3 = 0.03, x2 = 0.06, x1 = 0.04 -> running max 0.06
    h = holm([0.01, 0.04, 0.03, 0.005])
    assert h.adjusted == pytest.approx((0.03, 0.06, 0.06, 0.02))
    assert h.rejected == (True, False, False, True)
