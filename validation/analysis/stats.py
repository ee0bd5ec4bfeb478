"""Comparisons between two samples of per-step values (A/B steps, `nsa-validate compare`).

Welch's t-test with scipy.special's Student t CDF (stdtr). A difference counts only when it is both statistically
significant (p < alpha) and larger than the noise threshold (|relative delta| > noise), as asv/pytest-benchmark
compare runs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


class StatsError(ValueError):
    """Invalid input: an empty or non-finite sample, a bad threshold."""


# Which summary metrics are better higher or lower (validation.analysis.metrics defines the names). Metrics that are
# neither (grad_norm, lr, loss_drop, first_loss) are not compared with a verdict.
METRIC_DIRECTIONS: dict[str, str] = {
    "toks_per_s": "higher",
    "toks_per_s_per_gpu": "higher",
    "mfu": "higher",
    "step_time_s": "lower",
    "loss": "lower",
    "final_loss": "lower",
    "mem_peak_gb": "lower",
    "mem_alloc_gb": "lower",
    "mem_reserved_gb": "lower",
}
VERDICTS = ("better", "worse", "same", "inconclusive")
# A noise band wider than this resolves nothing worth saying "same" about: a measurement that cannot tell a change
# of a quarter (a regression anyone would act on) from no change says "inconclusive", whatever its interval or
# threshold (validation.analysis.significance.comparison's noise floors are held to it too)
MAX_USEFUL_FLOOR = 0.25


def higher_is_better(metric: str) -> bool:
    """METRIC_DIRECTIONS[metric] == "higher"; StatsError for a metric without a direction."""
    try:
        return METRIC_DIRECTIONS[metric] == "higher"
    except KeyError:
        raise StatsError(f"metric {metric!r} has no better direction; comparable metrics: "
                         f"{', '.join(METRIC_DIRECTIONS)}") from None


def _special():
    import scipy.special  # start-up: scipy loads with the first statistic, not with `nsa-validate list`

    return scipy.special


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1 and a, b > 0."""
    if not (a > 0 and b > 0):
        raise StatsError(f"regularized_beta: a and b must be positive, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise StatsError(f"regularized_beta: x must be in [0, 1], got {x}")
    return float(_special().betainc(a, b, x))


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail probability P(|T| >= |t|) of Student's t with df degrees of freedom (df = inf: the normal)."""
    if not df > 0:
        raise StatsError(f"degrees of freedom must be positive, got {df}")
    return float(2.0 * _special().stdtr(df, -abs(t)))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom (df may be fractional, as in Welch's test)."""
    if not df > 0:
        raise StatsError(f"degrees of freedom must be positive, got {df}")
    return float(_special().stdtr(df, t))


def _finite(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(list(values), dtype="float64").ravel()
    if not np.all(np.isfinite(arr)):
        raise StatsError(f"sample {name} holds non-finite values (NaN or inf)")
    return arr


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's unequal-variance t-test: (t, two-sided p-value), t = (mean(a) - mean(b)) / standard error
    (the sign convention of scipy.stats.ttest_ind). Each sample needs at least 2 finite values. With zero
    variance on both sides: identical means give (0.0, 1.0), different ones (+-inf, 0.0)."""
    x, y = _finite(a, "a"), _finite(b, "b")
    if x.size < 2 or y.size < 2:
        raise StatsError(f"welch_t_test needs at least 2 values per sample, got {x.size} and {y.size}")
    mx, my = float(x.mean()), float(y.mean())
    vx, vy = float(x.var(ddof=1)) / x.size, float(y.var(ddof=1)) / y.size
    se2 = vx + vy
    if se2 == 0.0:
        if mx == my:
            return 0.0, 1.0
        return math.copysign(math.inf, mx - my), 0.0
    t = (mx - my) / math.sqrt(se2)
    # Welch-Satterthwaite, on each side's share of se2 (the shares sum to 1, so the denominator is at least
    # 1 / (4 (n - 1))): the squares of the variances themselves underflow to 0 for spreads below ~1e-81
    fx, fy = vx / se2, vy / se2
    df = 1.0 / (fx * fx / (x.size - 1) + fy * fy / (y.size - 1))
    return t, min(1.0, t_sf2(t, df))


def compare_samples(a: Sequence[float], b: Sequence[float], higher_is_better: bool, noise: float = 0.02,
                    alpha: float = 0.05) -> dict[str, Any]:
    """Compare sample b (the variant) with sample a (the baseline). Non-finite values are left out first.

    Returns a JSON-ready dict:
      mean_a, mean_b, stdev_a, stdev_b (sample stdev, None under 2 values), n_a, n_b,
      delta = mean_b - mean_a, rel_delta = delta / |mean_a| (None when mean_a == 0 and delta != 0),
      test: "welch" (both samples have >= 2 values) or "threshold" (otherwise: no variance estimate),
      t, p_value (None for "threshold"),
      significant: p < alpha and |rel_delta| > noise; for "threshold" (a single value on a side) only the noise
                   threshold can decide: |rel_delta| > noise,
      verdict: "better" | "worse" (b relative to a, respecting higher_is_better) when significant; else "same" when
               the change is at most MAX_USEFUL_FLOOR (25%), and "inconclusive" beyond it (a change from a zero
               baseline too): samples that cannot resolve a change of 88% do not show that nothing changed.
    An empty sample (after dropping non-finite values) raises StatsError: there is nothing to compare.
    """
    if not (noise >= 0 and math.isfinite(noise)):
        raise StatsError(f"noise: expected a non-negative fraction, got {noise!r}")
    if not 0 < alpha < 1:
        raise StatsError(f"alpha: expected a value between 0 and 1, got {alpha!r}")
    x = np.asarray(list(a), dtype="float64").ravel()
    y = np.asarray(list(b), dtype="float64").ravel()
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if x.size == 0 or y.size == 0:
        raise StatsError(f"cannot compare: sample {'a' if x.size == 0 else 'b'} has no finite values")
    mean_a, mean_b = float(x.mean()), float(y.mean())
    delta = mean_b - mean_a
    rel = delta / abs(mean_a) if mean_a != 0 else (0.0 if delta == 0 else None)
    beyond_noise = rel is None or abs(rel) > noise
    t = p = None
    if x.size >= 2 and y.size >= 2:
        t, p = welch_t_test(x, y)
        significant = p < alpha and beyond_noise
        test = "welch"
    else:
        significant = beyond_noise
        test = "threshold"
    verdict = "same" if rel is not None and abs(rel) <= MAX_USEFUL_FLOOR else "inconclusive"
    if significant:
        verdict = "better" if (delta > 0) == bool(higher_is_better) else "worse"

    def num(v: float | None) -> float | None:
        return None if v is None or not math.isfinite(v) else float(v)

    return {
        "mean_a": mean_a, "mean_b": mean_b,
        "stdev_a": float(x.std(ddof=1)) if x.size >= 2 else None,
        "stdev_b": float(y.std(ddof=1)) if y.size >= 2 else None,
        "n_a": int(x.size), "n_b": int(y.size),
        "delta": delta, "rel_delta": rel,
        "test": test, "t": num(t), "p_value": p,
        "significant": bool(significant), "verdict": verdict,
    }


BOOTSTRAP_STATS = ("mean", "median")


def bootstrap_ci(values: Sequence[float], stat: str = "mean", confidence: float = 0.95, n: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean or median of `values` (non-finite values left
    out), from n resamples drawn with numpy's default generator seeded with `seed` (deterministic)."""
    if stat not in BOOTSTRAP_STATS:
        raise StatsError(f"stat: expected one of {', '.join(BOOTSTRAP_STATS)}, got {stat!r}")
    if not 0 < confidence < 1:
        raise StatsError(f"confidence: expected a value between 0 and 1, got {confidence!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise StatsError(f"n: expected a positive number of resamples, got {n!r}")
    arr = np.asarray(list(values), dtype="float64").ravel()
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        raise StatsError("bootstrap_ci: no finite values")
    rng = np.random.default_rng(seed)
    chunk = max(1, 4_000_000 // arr.size)  # resamples per batch: bounded memory for long runs
    parts = []
    for start in range(0, n, chunk):
        samples = arr[rng.integers(0, arr.size, size=(min(chunk, n - start), arr.size))]
        parts.append(samples.mean(axis=1) if stat == "mean" else np.median(samples, axis=1))
    stats = np.concatenate(parts)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [tail, 1.0 - tail])
    return float(lo), float(hi)
