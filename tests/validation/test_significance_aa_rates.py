"""Two runs of one configuration (A/A) are rarely called different, a large real change is found, and degenerate
series give a clear verdict or a StatsError: seeded simulations of AR(1) steps (phi 0.9) with a drift or a level
shift common to both runs, 400 pairs each, held to at most twice the declared 5% rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from validation.analysis.significance import StatsError, compare_series, decide
from validation.analysis.significance.simulate import ar1

PAIRS = 400
ALLOWED = 2 * 0.05


def _pairs(seed: int, steps: int, common: np.ndarray | None = None, phi: float = 0.9) -> np.ndarray:
    x = 1e4 * (1.0 + ar1(np.random.default_rng(seed), (PAIRS, 2, steps), phi, 0.05))
    return x if common is None else x + 1e4 * common


@pytest.mark.parametrize("steps, common", [
    (50, None),
    (20, None),
    (60, 0.10 * np.arange(60) / 60),               # the machine slows by 10% over each run
    (60, 0.10 * (np.arange(60) >= 30)),            # a level shift half-way through each run
])
def test_identical_configurations_are_rarely_called_different(steps, common):
    x = _pairs(11 + steps, steps, common)
    flagged = sum(compare_series(x[i, 0], x[i, 1]).significant for i in range(PAIRS))
    assert flagged / PAIRS <= ALLOWED


def test_a_one_run_decision_between_identical_variants_rarely_has_a_winner():
    x = _pairs(23, 30)
    winners = sum(decide({"a": [x[i, 0]], "b": [x[i, 1]]}, default="a").winner is not None for i in range(PAIRS))
    assert winners / PAIRS <= ALLOWED


def test_a_real_change_is_found_and_a_large_one_always():
    x = _pairs(31, 50)[:200]
    found = [compare_series(x[i, 0], 0.8 * x[i, 1]) for i in range(200)]
    assert sum(c.verdict == "worse" for c in found) / 200 >= 0.6
    assert not any(c.verdict in ("better", "same") for c in found)
    assert all(compare_series(x[i, 0], 0.12 * x[i, 1]).verdict == "worse" for i in range(200))


def test_constant_series_give_an_exact_verdict():
    same = compare_series([1000.0] * 20, [1000.0] * 20)
    assert same.verdict == "same" and same.p_value == 1.0 and same.rel == 0.0
    tiny = compare_series([1000.0] * 20, [999.5] * 20)  # -0.05%: exact, and inside the 1% floor
    assert tiny.verdict == "same" and not tiny.significant
    drop = compare_series([1000.0] * 20, [120.0] * 20)
    assert drop.verdict == "worse" and drop.rel == pytest.approx(-0.88)


@pytest.mark.parametrize("b", [
    [1000.0], [1000.0, 1001.0], [1000.0, 999.0, 1001.0],       # too short for block means
    [1000.0] * 10 + [math.nan] + [1000.0] * 10,                 # a missing step
    [1000.0] * 10 + [math.inf] + [1000.0] * 10,
    [0.0] * 20, [-1000.0] * 20,                                 # no positive mean: no relative difference
])
def test_degenerate_series_raise_a_clear_error(b):
    with pytest.raises(StatsError):
        compare_series([1000.0 + (i % 3) for i in range(20)], b)
