"""validation.analysis.stats.compare_samples never calls a change it cannot resolve "same" when that change is
beyond any useful noise band (25%): -88% from two noisy values a side, or from one value a side under a wide
--noise, is "inconclusive"; a small unresolved change stays "same"."""

from __future__ import annotations

import math

import pytest

from validation.analysis.stats import compare_samples


def test_an_unresolved_change_of_minus_88_percent_is_not_same():
    r = compare_samples([100.0, 200.0], [20.0, 16.0], higher_is_better=True)
    # by hand: means 150 and 18 (-88%); squared standard errors 5000 / 2 and 8 / 2; t = 132 / sqrt(2504);
    # Welch df = 2504^2 / (2500^2 + 4^2) ~ 1.003, so p ~ 1 - 2 atan(t) / pi (Student t with 1 df)
    t = 132.0 / math.sqrt(2504.0)
    assert r["rel_delta"] == pytest.approx(-0.88) and r["t"] == pytest.approx(t)
    assert r["p_value"] == pytest.approx(1.0 - 2.0 * math.atan(t) / math.pi, abs=2e-3)
    assert r["significant"] is False and r["verdict"] == "inconclusive"


def test_a_wide_noise_threshold_never_makes_minus_88_percent_same():
    r = compare_samples([1000.0], [120.0], higher_is_better=True, noise=0.9)
    assert r["test"] == "threshold" and r["significant"] is False and r["verdict"] == "inconclusive"
    r = compare_samples([1000.0, 1010.0, 990.0], [120.0, 121.0, 119.0], higher_is_better=True, noise=0.9)
    assert r["p_value"] < 1e-4 and r["verdict"] == "inconclusive"


def test_a_small_unresolved_change_is_still_same():
    r = compare_samples([100.0, 140.0, 60.0, 120.0], [110.0, 160.0, 70.0, 130.0], higher_is_better=True)
    assert r["rel_delta"] == pytest.approx(470.0 / 420.0 - 1.0) and r["rel_delta"] < 0.25
    assert r["verdict"] == "same"
    r = compare_samples([1000.0], [1300.0], higher_is_better=True, noise=0.5)  # +30%: beyond the useful band
    assert r["verdict"] == "inconclusive"
