"""validation.analysis.significance.power against independent references: the noncentral t (no noise floor) and an
integral over the mean log-ratio instead of over its standard deviation (with the floor), at two repeats and small
alphas, where the t's critical value is large and Phi's step in the chi integral is narrow."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special as sp

from validation.analysis.significance.power import paired_power


def _power_over_the_mean(cv: float, effect: float, repeats: int, alpha: float, min_floor: float) -> float:
    """P(mean(d) > max(t_crit s / sqrt(R), log(1 + min_floor))) integrated over the mean m ~ N(mu, sigma^2 / R):
    given m > 0, P(s < m sqrt(R) / t_crit) = P(chi2_nu < nu (m sqrt(R) / (t_crit sigma))^2), on a dense grid."""
    nu, sigma, mu = repeats - 1, math.sqrt(2.0) * cv, math.log1p(effect)
    crit = float(sp.stdtrit(nu, 1.0 - alpha / 2.0))
    sd_mean = sigma / math.sqrt(repeats)
    z = np.linspace(-40.0, 40.0, 800_001)
    m = mu + sd_mean * z
    ok = m > max(math.log1p(min_floor), 0.0)
    q = nu * (m * math.sqrt(repeats) / (crit * sigma)) ** 2
    f = np.where(ok, np.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi) * sp.chdtr(nu, q), 0.0)
    return float(np.sum((f[1:] + f[:-1]) * np.diff(z)) / 2.0)


@pytest.mark.parametrize("cv, effect, alpha, expected", [
    # 1 - nct.cdf(t.ppf(1 - alpha / 2, 1), 1, log(1 + effect) sqrt(2) / (sqrt(2) cv)), scipy.stats 1.17
    (1.16895, 3.0, 0.001, 0.001558710175042261),
    (10.0, 0.001, 0.01, 0.005000626343162725),
    (0.02, 0.05, 0.01, None),
    (0.2, 0.3, 0.001, None),
])
def test_two_repeats_at_a_small_alpha_match_the_noncentral_t(cv, effect, alpha, expected):
    """Two repeats (1 df) at alpha 0.01 / 0.001: the t's critical value is 63.7 / 636.6, and Phi falls from 1 to 0
    within less than one node of the chi grid. It was missed: 0.00528 where the noncentral t gives 0.00156 (cv 1.17,
    +300%, alpha 0.001), 0.00539 for 0.00500 (the power of a near-null effect is alpha / 2)."""
    import scipy.stats as st

    delta = math.log1p(effect) * math.sqrt(2) / (math.sqrt(2) * cv)
    exact = float(st.nct.sf(st.t.ppf(1 - alpha / 2, 1), 1, delta))
    if expected is not None:
        assert exact == pytest.approx(expected, rel=1e-6)
    assert paired_power(cv, effect, 2, alpha=alpha, min_floor=0.0) == pytest.approx(exact, abs=1e-4)


@pytest.mark.parametrize("cv, effect, repeats, alpha, min_floor", [
    (1.16895, 3.0, 2, 0.001, 0.01),
    (0.5, 0.2, 2, 0.01, 0.05),
    (0.05, 0.05, 2, 0.001, 0.01),
    (0.03, 0.05, 3, 0.001, 0.01),
    (0.03, 0.05, 6, 0.05, 0.01),
    (0.1, 0.05, 40, 0.05, 0.02),
])
def test_power_with_the_noise_floor_matches_an_integral_over_the_mean(cv, effect, repeats, alpha, min_floor):
    assert paired_power(cv, effect, repeats, alpha=alpha, min_floor=min_floor) == pytest.approx(
        _power_over_the_mean(cv, effect, repeats, alpha, min_floor), abs=1e-4)


def test_the_reference_integral_agrees_with_the_noncentral_t():
    """The reference itself, without a floor, against scipy's noncentral t (so that it checks something)."""
    import scipy.stats as st

    for cv, effect, repeats, alpha in ((0.03, 0.05, 2, 0.05), (0.2, 0.3, 2, 0.001), (0.05, 0.05, 7, 0.01)):
        delta = math.log1p(effect) * math.sqrt(repeats) / (math.sqrt(2) * cv)
        exact = float(st.nct.sf(st.t.ppf(1 - alpha / 2, repeats - 1), repeats - 1, delta))
        assert _power_over_the_mean(cv, effect, repeats, alpha, 0.0) == pytest.approx(exact, abs=2e-5)
