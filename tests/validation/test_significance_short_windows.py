"""Short, strongly autocorrelated windows: two windows of one configuration (A/A) are called different at most
about as often as the declared 5%, also when the windows are 8-12 steps of AR(1) steps at phi 0.9 and when a
10-step window is compared with a 2,000-step one; windows of 30 steps and more decide exactly as before.
Seeded simulations (numpy), figures of the earlier rule measured on the same seeds and stated by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from validation.analysis.significance import block_units, compare_series, compare_units
from validation.analysis.significance.simulate import ar1

LEVEL, CV = 1e4, 0.05
ALLOWED = 0.07  # the nominal 5% with room for the sampling error of a few hundred to 2,000 pairs


def _series(rng: np.random.Generator, reps: int, steps: int, phi: float) -> np.ndarray:
    return LEVEL * (1.0 + ar1(rng, (reps, steps), phi, CV))


def _aa_rate(seed: int, phi: float, lengths: list[tuple[int, int]]) -> float:
    """Share of identical-configuration pairs (lengths[i] = steps of a and of b) called significant."""
    rng = np.random.default_rng(seed)
    flagged = 0
    for na, nb in lengths:
        a, b = _series(rng, 1, na, phi)[0], _series(rng, 1, nb, phi)[0]
        flagged += compare_series(a, b).significant
    return flagged / len(lengths)


@pytest.mark.parametrize("phi, pairs, seed", [
    (0.9, 1500, 1),   # the earlier rule: 7.2% of these pairs (2.8% now)
    (0.5, 500, 2),
])
def test_identical_short_windows_of_8_to_12_steps_are_rarely_called_different(phi, pairs, seed):
    lengths = [(8 + i % 5, 8 + i % 5) for i in range(pairs)]
    assert _aa_rate(seed, phi, lengths) <= ALLOWED


@pytest.mark.parametrize("steps", [16, 20, 30, 50])
@pytest.mark.parametrize("phi", [0.5, 0.9])
def test_identical_windows_of_16_to_50_steps_stay_near_the_nominal_rate(phi, steps):
    assert _aa_rate(100 + steps, phi, [(steps, steps)] * 300) <= ALLOWED


@pytest.mark.parametrize("phi, pairs, seed", [
    (0.9, 600, 3),    # the earlier rule: 18.0% of these pairs (5.3% now)
    (0.5, 300, 4),
])
def test_a_short_window_against_a_long_one_is_rarely_called_different(phi, pairs, seed):
    rng = np.random.default_rng(seed)
    short, long_ = _series(rng, pairs, 10, phi), _series(rng, pairs, 2000, phi)
    assert sum(compare_series(short[i], long_[i]).significant for i in range(pairs)) / pairs <= ALLOWED
    assert sum(compare_series(long_[i], short[i]).significant for i in range(pairs)) / pairs <= ALLOWED


def test_a_ten_percent_change_at_50_steps_is_found_as_often_as_before():
    """AR(1) phi 0.9, 5% CV, 50 steps each, b 10% slower: 600 seeded pairs, of which the earlier rule found
    195 (measured on the same seed); the short-window rules leave 50-step windows as they were."""
    rng = np.random.default_rng(5)
    a, b = _series(rng, 600, 50, 0.9), 0.9 * _series(rng, 600, 50, 0.9)
    found = sum(compare_series(a[i], b[i]).verdict == "worse" for i in range(600))
    assert found >= 195


@pytest.mark.parametrize("steps, seed, p_before", [
    (30, 7, 0.31224682717653945),
    (50, 8, 0.3463781245916529),
    (200, 9, 0.8419910579504093),
])
def test_windows_of_30_steps_and_more_are_compared_as_before(steps, seed, p_before):
    """Equal windows of 30 steps and more: the p-value the earlier rule gave for this seeded pair (stated by hand)."""
    rng = np.random.default_rng(seed)
    a, b = _series(rng, 1, steps, 0.9)[0], _series(rng, 1, steps, 0.9)[0]
    assert compare_series(a, b).p_value == pytest.approx(p_before, rel=1e-9)


def _ar1_mean_var(phi: float, n: int) -> float:
    """Var(mean of n steps) / Var(step) of a stationary AR(1), from its n x n correlation matrix."""
    idx = np.arange(n)
    return float((phi ** np.abs(idx[:, None] - idx[None, :])).sum()) / (n * n)


def _expected_s2_over_m(phi: float, b: int, m: int) -> float:
    """E[s^2 / m] of m block means of b steps, over Var(step), from the block means' covariance matrix."""
    idx = np.arange(b * m)
    cov = phi ** np.abs(idx[:, None] - idx[None, :])
    blocks = np.kron(np.eye(m), np.ones((1, b)) / b)
    cm = blocks @ cov @ blocks.T
    centre = np.eye(m) - 1.0 / m
    return float(np.trace(centre @ cm)) / (m - 1) / m


def test_a_window_held_to_a_longer_windows_correlation_takes_its_ar1_variance():
    """with_inefficiency(units, g): the block means' s^2 / m scaled to the variance of the mean of an AR(1) with
    inefficiency g, recomputed here from the AR(1) covariance matrix."""
    from validation.analysis.significance.units import with_inefficiency

    x = LEVEL * (1.0 + 0.05 * np.random.default_rng(12).standard_normal(10))  # a white-noise 10-step window
    own = block_units(x)
    g = 19.0
    assert own.inefficiency < g
    phi = (g - 1.0) / (g + 1.0)
    held = with_inefficiency(own, g)
    m, b = len(own.values), own.block_len
    s2_over_m = float(np.var(own.values, ddof=1)) / m
    expected = s2_over_m * _ar1_mean_var(phi, m * b) / _expected_s2_over_m(phi, b, m)
    assert held.se == pytest.approx(math.sqrt(expected), rel=1e-9)
    assert held.inefficiency == g and held.df == own.df and held.values == own.values
    assert with_inefficiency(own, 1.0) == own  # never lowered


def _log_se(c) -> float:
    return abs(math.log(c.mean_b / c.mean_a) / c.t)


def test_a_short_window_is_held_to_a_longer_windows_correlation_only_from_twice_its_steps():
    from validation.analysis.significance.units import with_inefficiency

    rng = np.random.default_rng(11)
    long_ = _series(rng, 1, 400, 0.9)[0]
    short = LEVEL * (1.0 + 0.05 * rng.standard_normal(20))  # white noise: its own inefficiency is small
    ua, ub, uc = block_units(short), block_units(long_), block_units(long_[-30:])
    assert ua.inefficiency < min(ub.inefficiency, uc.inefficiency)
    held = with_inefficiency(ua, ub.inefficiency)
    assert held.se > 1.5 * ua.se
    # 400 steps against 20: the short side's standard error is the held one
    assert _log_se(compare_units(ua, ub)) == pytest.approx(math.hypot(held.se / held.mean, ub.se / ub.mean), rel=1e-9)
    # 30 steps against 20 (less than twice): each side's own
    assert _log_se(compare_units(ua, uc)) == pytest.approx(math.hypot(ua.se / ua.mean, uc.se / uc.mean), rel=1e-9)
