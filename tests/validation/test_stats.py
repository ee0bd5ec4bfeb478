"""validation.analysis.stats: the t distribution (scipy.special) against closed forms, Welch's t-test, A/B verdicts,
bootstrap intervals."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from validation.analysis.metrics import DERIVED_KEYS, METRIC_COLUMNS
from validation.analysis.stats import (METRIC_DIRECTIONS, StatsError, bootstrap_ci, compare_samples, higher_is_better,
                              regularized_beta, t_cdf, t_sf2, welch_t_test)


# --- the incomplete beta function and the t distribution -------------------------------------------------------

@pytest.mark.parametrize("x", [0.01, 0.2, 0.5, 0.77, 0.999])
def test_regularized_beta_closed_forms(x):
    assert regularized_beta(x, 1.0, 1.0) == pytest.approx(x, rel=1e-12)
    assert regularized_beta(x, 3.0, 1.0) == pytest.approx(x ** 3, rel=1e-12)
    assert regularized_beta(x, 1.0, 2.5) == pytest.approx(1 - (1 - x) ** 2.5, rel=1e-12)
    # I_x(1/2, 1/2) = (2/pi) asin(sqrt(x))
    assert regularized_beta(x, 0.5, 0.5) == pytest.approx(2 / math.pi * math.asin(math.sqrt(x)), rel=1e-12)
    # symmetry: I_x(a, b) = 1 - I_{1-x}(b, a)
    assert regularized_beta(x, 7.5, 3.0) == pytest.approx(1 - regularized_beta(1 - x, 3.0, 7.5), abs=1e-14)


def test_regularized_beta_edges_and_symmetric_midpoint():
    assert regularized_beta(0.0, 2.0, 3.0) == 0.0 and regularized_beta(1.0, 2.0, 3.0) == 1.0
    for a, tol in ((0.5, 1e-14), (4.0, 1e-14), (250.0, 1e-12), (50_000.0, 1e-9)):
        assert regularized_beta(0.5, a, a) == pytest.approx(0.5, abs=tol)
    with pytest.raises(StatsError):
        regularized_beta(1.5, 1.0, 1.0)
    with pytest.raises(StatsError):
        regularized_beta(0.5, 0.0, 1.0)


@pytest.mark.parametrize("t", [-25.0, -3.0, -1.0, -0.3, 0.0, 0.5, 1.0, 2.0, 10.0, 1e4])
def test_t_cdf_df1_is_cauchy(t):
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, rel=1e-12, abs=1e-15)


def test_t_cdf_known_values():
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-14)
    assert t_cdf(-1.0, 1) == pytest.approx(0.25, abs=1e-14)
    assert t_cdf(0.0, 7) == 0.5
    # textbook quantiles: t_{0.975, 10} = 2.228139, t_{0.95, 30} = 1.697261
    assert t_cdf(2.228139, 10) == pytest.approx(0.975, abs=1e-6)
    assert t_cdf(1.697261, 30) == pytest.approx(0.95, abs=1e-6)


@pytest.mark.parametrize("t", [-8.0, -2.0, -0.5, 0.25, 1.0, 3.0, 40.0])
def test_t_cdf_df2_and_df3_closed_forms(t):
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), rel=1e-12)
    u = t / math.sqrt(3)
    df3 = 0.5 + (u / (1 + u * u) + math.atan(u)) / math.pi
    assert t_cdf(t, 3) == pytest.approx(df3, rel=1e-11)


@pytest.mark.parametrize("t", [-4.0, -1.96, -0.5, 0.0, 1.0, 2.5, 5.0])
def test_t_cdf_large_df_is_normal(t):
    normal = statistics.NormalDist().cdf(t)
    assert t_cdf(t, 1e9) == pytest.approx(normal, rel=1e-7, abs=1e-12)
    assert t_cdf(t, math.inf) == pytest.approx(normal, rel=1e-12, abs=1e-15)
    # still a t distribution at df=5: heavier tails than the normal
    if abs(t) >= 2:
        assert t_sf2(t, 5) > 2 * statistics.NormalDist().cdf(-abs(t))


def test_t_cdf_fractional_df_is_monotone():
    ts = np.linspace(-6, 6, 121)
    cdf = [t_cdf(float(t), 3.7) for t in ts]
    assert all(b > a for a, b in zip(cdf, cdf[1:]))
    assert t_sf2(2.0, 3.7) == pytest.approx(2 * (1 - t_cdf(2.0, 3.7)), rel=1e-12)


# --- Welch's t-test --------------------------------------------------------------------------------------------

def test_welch_by_hand_df2():
    # a = [1, 3], b = [4, 6]: variances 2 and 2, se^2 = 2/2 + 2/2 = 2, t = (2 - 5)/sqrt(2); Welch df = 2 exactly,
    # so p = 2 * (1 - CDF_2(|t|)) = 1 - |t| / sqrt(2 + t^2).
    t, p = welch_t_test([1, 3], [4, 6])
    assert t == pytest.approx(-3 / math.sqrt(2), rel=1e-14)
    assert p == pytest.approx(1 - (3 / math.sqrt(2)) / math.sqrt(2 + 4.5), rel=1e-12)


def test_welch_statistic_from_statistics_module():
    a = [812.0, 820.5, 805.25, 818.0, 809.5, 815.0, 811.75]
    b = [830.0, 826.5, 841.0, 829.25, 835.5]
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t_expected = (statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t, p = welch_t_test(a, b)
    assert t == pytest.approx(t_expected, rel=1e-12)
    assert p == pytest.approx(2 * t_cdf(-abs(t_expected), df), rel=1e-12)
    assert p < 0.01
    t2, p2 = welch_t_test(b, a)
    assert t2 == pytest.approx(-t) and p2 == pytest.approx(p)


def test_welch_against_scipy():
    import scipy.stats as scipy_stats  # a dependency; its 2 s import only for this test
    rng = np.random.default_rng(7)
    for na, nb, shift, scale in [(5, 7, 0.5, 3.0), (50, 50, 0.1, 1.0), (3, 200, 2.0, 0.5), (2, 2, 1.0, 1.0),
                                 (40, 9, 0.0, 10.0), (30, 30, 5.0, 1.0)]:
        a = rng.normal(10.0, 1.0, na)
        b = rng.normal(10.0 + shift, scale, nb)
        t, p = welch_t_test(a, b)
        ref = scipy_stats.ttest_ind(a, b, equal_var=False)
        assert t == pytest.approx(float(ref.statistic), rel=1e-10)
        assert p == pytest.approx(float(ref.pvalue), rel=1e-8, abs=1e-300)


def test_welch_zero_variance():
    assert welch_t_test([5.0, 5.0, 5.0], [5.0, 5.0]) == (0.0, 1.0)
    t, p = welch_t_test([5.0, 5.0], [6.0, 6.0, 6.0])
    assert t == -math.inf and p == 0.0
    t, p = welch_t_test([7.0, 7.0], [6.0, 6.0])
    assert t == math.inf and p == 0.0


def test_welch_rejects_small_and_nonfinite():
    with pytest.raises(StatsError, match="at least 2"):
        welch_t_test([1.0], [1.0, 2.0])
    with pytest.raises(StatsError, match="non-finite"):
        welch_t_test([1.0, float("nan")], [1.0, 2.0])


# --- compare_samples -------------------------------------------------------------------------------------------

BASE = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0, 100.25, 99.75]


def shifted(factor: float) -> list[float]:
    return [v * factor for v in BASE]


def test_compare_better_and_worse_respect_direction():
    faster = compare_samples(BASE, shifted(1.10), higher_is_better=True)
    assert faster["verdict"] == "better" and faster["significant"] is True
    assert faster["delta"] == pytest.approx(statistics.mean(BASE) * 0.10)
    assert faster["rel_delta"] == pytest.approx(0.10)
    assert faster["mean_a"] == pytest.approx(statistics.mean(BASE))
    assert faster["stdev_a"] == pytest.approx(statistics.stdev(BASE))
    assert (faster["n_a"], faster["n_b"], faster["test"]) == (8, 8, "welch")
    assert faster["p_value"] == pytest.approx(welch_t_test(BASE, shifted(1.10))[1])
    assert compare_samples(BASE, shifted(1.10), higher_is_better=False)["verdict"] == "worse"
    assert compare_samples(BASE, shifted(0.90), higher_is_better=True)["verdict"] == "worse"
    assert compare_samples(BASE, shifted(0.90), higher_is_better=False)["verdict"] == "better"


def test_significant_but_within_noise_is_same():
    rng = np.random.default_rng(0)
    a = list(rng.normal(1000.0, 1.0, 400))
    b = list(rng.normal(1010.0, 1.0, 400))  # +1%: p ~ 0, but inside the 2% noise band
    r = compare_samples(a, b, higher_is_better=True)
    assert r["p_value"] < 1e-10
    assert r["significant"] is False and r["verdict"] == "same"
    r = compare_samples(a, b, higher_is_better=True, noise=0.005)
    assert r["significant"] is True and r["verdict"] == "better"


def test_large_but_noisy_difference_is_same():
    a = [100.0, 140.0, 60.0, 120.0]
    b = [110.0, 160.0, 70.0, 130.0]  # +8.3% mean, but the spread hides it
    r = compare_samples(a, b, higher_is_better=True)
    assert abs(r["rel_delta"]) > 0.02 and r["p_value"] > 0.05
    assert r["significant"] is False and r["verdict"] == "same"


def test_single_values_fall_back_to_noise_threshold():
    r = compare_samples([100.0], [105.0], higher_is_better=True)
    assert r["test"] == "threshold" and r["p_value"] is None and r["t"] is None
    assert r["verdict"] == "better" and r["stdev_a"] is None
    r = compare_samples([100.0], [101.0, 101.5, 100.5], higher_is_better=True)
    assert r["verdict"] == "same" and r["stdev_b"] == pytest.approx(0.5)


def test_constant_samples():
    same = compare_samples([50.0] * 5, [50.0] * 5, higher_is_better=True)
    assert same["p_value"] == 1.0 and same["verdict"] == "same" and same["rel_delta"] == 0.0
    diff = compare_samples([50.0] * 5, [45.0] * 5, higher_is_better=True)
    assert diff["p_value"] == 0.0 and diff["verdict"] == "worse" and diff["t"] is None  # t = inf -> None in JSON


def test_nonfinite_dropped_and_empty_rejected():
    r = compare_samples(BASE + [float("nan")], shifted(1.1) + [float("inf")], higher_is_better=True)
    assert r["n_a"] == 8 and r["n_b"] == 8
    with pytest.raises(StatsError, match="sample a"):
        compare_samples([float("nan")], BASE, higher_is_better=True)
    with pytest.raises(StatsError, match="sample b"):
        compare_samples(BASE, [], higher_is_better=True)
    with pytest.raises(StatsError):
        compare_samples(BASE, BASE, True, noise=-0.1)
    with pytest.raises(StatsError):
        compare_samples(BASE, BASE, True, alpha=1.5)


def test_zero_baseline_mean():
    r = compare_samples([0.0, 0.0], [1.0, 1.0], higher_is_better=True)
    assert r["rel_delta"] is None and r["verdict"] == "better"


# --- directions ------------------------------------------------------------------------------------------------

def test_metric_directions_are_summary_keys():
    assert set(METRIC_DIRECTIONS) <= set(METRIC_COLUMNS) | set(DERIVED_KEYS)
    assert set(METRIC_DIRECTIONS.values()) == {"higher", "lower"}
    assert "grad_norm" not in METRIC_DIRECTIONS
    assert higher_is_better("toks_per_s") and higher_is_better("mfu") and higher_is_better("toks_per_s_per_gpu")
    assert not higher_is_better("step_time_s") and not higher_is_better("final_loss")
    with pytest.raises(StatsError, match="grad_norm"):
        higher_is_better("grad_norm")


# --- bootstrap -------------------------------------------------------------------------------------------------

def test_bootstrap_deterministic_and_sensible():
    rng = np.random.default_rng(3)
    values = list(rng.normal(100.0, 10.0, 400))
    lo, hi = bootstrap_ci(values)
    assert (lo, hi) == bootstrap_ci(values)             # same seed, same interval
    assert (lo, hi) != bootstrap_ci(values, seed=1)
    m = statistics.mean(values)
    assert lo < m < hi
    # width close to the normal-theory interval 2 * 1.96 * s / sqrt(n)
    expected = 2 * 1.959964 * statistics.stdev(values) / math.sqrt(len(values))
    assert (hi - lo) == pytest.approx(expected, rel=0.15)
    lo80, hi80 = bootstrap_ci(values, confidence=0.80)
    assert lo < lo80 < hi80 < hi
    mlo, mhi = bootstrap_ci(values, stat="median")
    assert mlo < statistics.median(values) < mhi


def test_bootstrap_edge_cases():
    assert bootstrap_ci([4.0] * 10) == (4.0, 4.0)
    assert bootstrap_ci([2.0, float("nan"), 2.0]) == (2.0, 2.0)
    for kwargs in ({"stat": "max"}, {"confidence": 1.0}, {"n": 0}):
        with pytest.raises(StatsError):
            bootstrap_ci([1.0, 2.0], **kwargs)
    with pytest.raises(StatsError):
        bootstrap_ci([float("nan")])
