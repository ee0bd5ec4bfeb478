"""How many interleaved repeats a comparison needs: the power of the paired log-ratio t-test.

Model: repeat r gives one run mean per variant; the log-ratio d_r = log(b_r / a_r) is normal with mean
mu = log(1 + effect) and sd sqrt(2) * cv, cv being the noise of one variant's run mean once the repeat's common
level is removed (comparison.paired_cv measures it; from a single run, the relative standard error of its mean
is a lower bound). With R repeats, the test declares b better when mean(d) > t_{R-1, 1 - alpha/2} s / sqrt(R)
and exp(mean(d)) - 1 > min_floor. Its power is exact, integrating over the chi distribution of s
(the noncentral t, with the noise-floor condition added):
    power = E_u[ Phi( (mu - max(t_crit * sigma * u / sqrt(nu R), log(1 + floor))) * sqrt(R) / sigma ) ],
u ~ chi(nu), nu = R - 1, sigma = sqrt(2) cv.
A winner must also be ahead in every replication block (REPLICATION_BLOCKS: the mean of each block of repeats on
the effect's side): decision_power multiplies the test's power by prod_b Phi(mu sqrt(R_b) / sigma) over the blocks'
sizes R_b, a lower bound of the joint probability; recommended_repeats and detectable_effect plan with it. A winner among k variants must beat all k - 1 others; by Bonferroni's inequality,
per-comparison power 1 - (1 - power) / (k - 1) guarantees the joint power.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from validation.analysis.significance.comparison import ALPHA, MIN_FLOOR
from validation.analysis.significance.distributions import norm_ppf, t_ppf
from validation.analysis.stats import StatsError

POWER = 0.80
EFFECT = 0.05
# Replication (validation.analysis.significance.decision): the repeats, in run order, fall into this many consecutive blocks
# at most (every repeat its own block up to this many repeats), and a difference counts only when it goes the same
# way in every block's mean. Two or three repeats: ahead in each; twenty: ahead in the first, middle and last third,
# which a real effect of the size the repeats were planned for passes nearly always (each third's mean is itself
# an estimate of it), one odd stretch of the machine rarely.
REPLICATION_BLOCKS = 3
MAX_REPEATS = 1000
_GRID = 801  # trapezoid nodes over the chi density, and as many over Phi's step (error < 1e-4 against the noncentral t)


def _special():
    import scipy.special  # start-up: scipy loads with the first statistic, not with `nsa-validate list`

    return scipy.special


def _check(cv: float, effect: float, alpha: float, min_floor: float) -> None:
    if not (isinstance(cv, (int, float)) and math.isfinite(cv) and cv > 0):
        raise StatsError(f"cv: expected a positive coefficient of variation (0.03 = 3%), got {cv!r}")
    if not (isinstance(effect, (int, float)) and math.isfinite(effect) and effect > 0):
        raise StatsError(f"effect: expected a positive relative difference (0.05 = 5%), got {effect!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise StatsError(f"alpha: expected a value between 0 and 1, got {alpha!r}")
    if not (isinstance(min_floor, (int, float)) and math.isfinite(min_floor) and min_floor >= 0):
        raise StatsError(f"min_floor: expected a non-negative fraction, got {min_floor!r}")


def paired_power(cv: float, effect: float, repeats: int, alpha: float = ALPHA,
                 min_floor: float = MIN_FLOOR) -> float:
    """Probability that compare_paired over `repeats` repeats calls a true relative difference `effect`
    significant in its direction (p < alpha and beyond min_floor), when one run mean has noise `cv`."""
    _check(cv, effect, alpha, min_floor)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise StatsError(f"repeats: expected an integer >= 2, got {repeats!r}")
    return _paired_power(float(cv), float(effect), repeats, float(alpha), float(min_floor))


@lru_cache(maxsize=65536)
def _paired_power(cv: float, effect: float, repeats: int, alpha: float, min_floor: float) -> float:
    nu = repeats - 1
    sigma = math.sqrt(2.0) * cv
    mu = math.log1p(effect)
    crit = t_ppf(1.0 - alpha / 2.0, nu)
    floor = math.log1p(min_floor)
    mode = math.sqrt(max(nu - 1.0, 0.0))
    lo, hi = max(0.0, mode - 12.0), mode + 12.0
    u = np.linspace(lo, hi, _GRID)
    # Phi falls from 1 to 0 where the t threshold passes mu, z dropping by crit / sqrt(nu) per unit of u: with two
    # repeats and a small alpha (crit 63.7 at alpha 0.01, 636.6 at 0.001) that step is far narrower than the grid's
    # (0.015), and the trapezoid missed it (alpha 0.001: 0.0053 where the noncentral t gives 0.0016); nodes of its own
    # over z in [-10, 10] resolve it
    width = 10.0 * math.sqrt(nu) / crit
    centre = mu * math.sqrt(nu * repeats) / (crit * sigma)
    if min(hi, centre + width) > max(lo, centre - width):
        u = np.union1d(u, np.linspace(max(lo, centre - width), min(hi, centre + width), _GRID))
    with np.errstate(divide="ignore"):
        log_u = (nu - 1.0) * np.log(u) if nu > 1 else np.zeros_like(u)
    pdf = np.exp(log_u - u * u / 2.0 - (nu / 2.0 - 1.0) * math.log(2.0) - math.lgamma(nu / 2.0))
    thresh = np.maximum(crit * sigma * u / math.sqrt(nu * repeats), floor)
    z = (mu - thresh) * math.sqrt(repeats) / sigma
    phi = _special().ndtr(z)
    du = np.diff(u)
    mass = float(np.sum((pdf[1:] + pdf[:-1]) * du)) / 2.0
    weighted = phi * pdf
    val = float(np.sum((weighted[1:] + weighted[:-1]) * du)) / 2.0
    return float(min(1.0, max(0.0, val / mass)))


def decision_power(cv: float, effect: float, repeats: int, alpha: float = ALPHA, min_floor: float = MIN_FLOOR) -> float:
    """Probability that a decision (validation.analysis.significance.decide) finds a true `effect`: paired_power, times the
    probability that every replication block's mean is on the effect's side (blocks are independent:
    prod_b Phi(log(1 + effect) sqrt(R_b) / (sqrt(2) cv)) over their sizes R_b). A significant mean makes each block
    likelier to be on its side, so the product is a lower bound of the joint probability."""
    _check(cv, effect, alpha, min_floor)
    base = paired_power(cv, effect, repeats, alpha, min_floor)
    sizes = [len(b) for b in np.array_split(np.arange(repeats), min(repeats, REPLICATION_BLOCKS))]
    z = math.log1p(effect) * np.sqrt(np.asarray(sizes, dtype="float64")) / (math.sqrt(2.0) * cv)
    return float(base * np.prod(_special().ndtr(z)))


def recommended_repeats(cv: float, effect: float = EFFECT, alpha: float = ALPHA, power: float = POWER,
                        n_variants: int = 2, min_floor: float = MIN_FLOOR,
                        max_repeats: int = MAX_REPEATS) -> int | None:
    """The fewest interleaved repeats (>= 2) with which the best of `n_variants` is declared the winner (significant
    and replicated: decision_power) with
    probability >= `power` when it is `effect` better than each other one, at noise `cv` (see the module
    docstring). None when even max_repeats is not enough (e.g. effect <= min_floor)."""
    _check(cv, effect, alpha, min_floor)
    if not (isinstance(power, (int, float)) and 0 < power < 1):
        raise StatsError(f"power: expected a probability between 0 and 1, got {power!r}")
    if isinstance(n_variants, bool) or not isinstance(n_variants, int) or n_variants < 2:
        raise StatsError(f"n_variants: expected an integer >= 2, got {n_variants!r}")
    if isinstance(max_repeats, bool) or not isinstance(max_repeats, int) or max_repeats < 2:
        raise StatsError(f"max_repeats: expected an integer >= 2, got {max_repeats!r}")
    target = 1.0 - (1.0 - power) / (n_variants - 1)

    def ok(r: int) -> bool:
        return decision_power(cv, effect, r, alpha, min_floor) >= target

    if not ok(max_repeats):
        return None
    # start from the normal approximation and walk: power grows with the number of repeats
    z = norm_ppf(1.0 - alpha / 2.0) + norm_ppf(target)
    r = min(max_repeats, max(2, math.ceil((z * math.sqrt(2.0) * cv / math.log1p(effect)) ** 2)))
    if ok(r):
        while r > 2 and ok(r - 1):
            r -= 1
        return r
    lo, hi = r, r + 1
    while not ok(hi):
        lo, hi = hi, min(hi + 2 * (hi - r), max_repeats)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def detectable_effect(cv: float, repeats: int, alpha: float = ALPHA, power: float = POWER, n_variants: int = 2,
                      min_floor: float = MIN_FLOOR) -> float:
    """The smallest relative difference that `repeats` interleaved repeats detect with probability >= power
    (the inverse of recommended_repeats in the effect), to 1e-4."""
    if not (isinstance(power, (int, float)) and 0 < power < 1):
        raise StatsError(f"power: expected a probability between 0 and 1, got {power!r}")
    if isinstance(n_variants, bool) or not isinstance(n_variants, int) or n_variants < 2:
        raise StatsError(f"n_variants: expected an integer >= 2, got {n_variants!r}")
    target = 1.0 - (1.0 - power) / (n_variants - 1)
    lo, hi = 1e-6, 0.05
    while decision_power(cv, hi, repeats, alpha, min_floor) < target:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise StatsError("detectable_effect: no finite effect reaches that power")
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if decision_power(cv, mid, repeats, alpha, min_floor) >= target else (mid, hi)
    return hi
