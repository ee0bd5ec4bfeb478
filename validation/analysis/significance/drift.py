"""The throughput drift's interval: how far noise alone moves the ratio of the medians of a run's last and first
thirds (validation.analysis.metrics' throughput_drift), with autocorrelated steps in mind (block means: units)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from validation.analysis.metrics import drift_rows
from validation.analysis.significance.distributions import t_ppf
from validation.analysis.significance.units import block_units

if TYPE_CHECKING:  # the CLI's light commands load the kinds, which must not load pandas
    import pandas as pd

DRIFT_CONFIDENCE = 0.95           # throughput_drift_interval: the confidence of its interval ...
DRIFT_CI_MIN_ROWS = 24            # ... None below this many rows after the warmup (8 a third: 4 block means of 2)


def throughput_drift_interval(frame: pd.DataFrame, warmup: int) -> tuple[float, float] | None:
    """The DRIFT_CONFIDENCE (95%) interval (low, high) of the throughput drift (validation.analysis.metrics'
    throughput_drift: the ratio of the thirds' medians, minus 1), on the log scale: log(median last / median first) +- t
    * se, mapped back (never below -100%). Steps are autocorrelated, so each third's standard error is that of its block
    means (significance.units.block_units: AR(1)-aware, the blocks sized for the third's own correlation), relative to
    its mean, times the variance of a median over that of a mean for a Gaussian AR(1) with the same inefficiency
    (median_variance_ratio: pi/2 for independent steps, 1.10 at phi 0.9); the two thirds' variances add, with
    Welch-Satterthwaite degrees of freedom. None below DRIFT_CI_MIN_ROWS rows after the warmup (with a finite tokens/s),
    or without positive medians and means.

    The drift alone judges no noise: with no true drift, AR(1) steps (phi 0.9) of 5% CV give drifts with an sd of
    4.6% over 115 rows (cpu_smoke's long run after its warmup), 9.2% at 10% CV, so that "drift >= -10%" failed in
    13% of such runs. In 2,000 seeded runs per cell (phi 0 / 0.5 / 0.7 / 0.9, CV 5% / 10%, 115 rows) this interval
    covers the true drift (none, or a 20% step down half way) in 96.4-97.0% of runs; with no drift, a drift below
    -10% whose interval lies below 0 (what the runbooks' "holds" criterion warns on) came out in at most 1.6% (phi
    0.9, CV 10%; 0-0.8% elsewhere). A true 20% decline (a step, or a steady slide) warns in 83-100% of runs at phi
    <= 0.5, 49-96% at phi 0.7 and 24-80% at phi 0.9 (50-80% at 5% CV): a third of 38 strongly correlated steps holds
    only a few independent ones, and the drift alone, which warned on 90-100% of them, warned on 13% of runs that
    did not slow."""
    rows = drift_rows(frame, warmup)
    if rows is None or rows[1].size < DRIFT_CI_MIN_ROWS:
        return None
    values, third = rows[1], rows[1].size // 3
    first, last = values[:third], values[-third:]
    med_first, med_last = float(np.median(first)), float(np.median(last))
    if not (med_first > 0 and med_last > 0):
        return None
    terms = []
    for part in (first, last):
        units = block_units(part)
        if not units.mean > 0:
            return None
        terms.append(((units.se / units.mean) ** 2 * median_variance_ratio(units.inefficiency), units.df))
    var = terms[0][0] + terms[1][0]
    den = sum(v * v / d for v, d in terms if v > 0)
    df = var * var / den if den > 0 else math.inf
    centre = math.log(med_last / med_first)
    half = t_ppf(0.5 + DRIFT_CONFIDENCE / 2.0, df) * math.sqrt(var) if var > 0 else 0.0
    low, high = math.expm1(centre - half), math.expm1(centre + half)
    return (float(low), float(high)) if math.isfinite(low) and math.isfinite(high) else None


def median_variance_ratio(inefficiency: float) -> float:
    """Var(median) / Var(mean) of n steps of a stationary Gaussian AR(1) process with statistical inefficiency g
    (phi = (g - 1) / (g + 1)), for large n: (pi/2 + 2 sum_k arcsin(phi^k)) / g (the median's Bahadur representation:
    Cov(1{X_0 <= m}, 1{X_k <= m}) = arcsin(rho_k) / (2 pi)). pi/2 for independent steps (g <= 1), falling as the
    correlation grows (1.21 at phi 0.5, 1.10 at phi 0.9, towards pi/2 ln 2 = 1.089 as phi -> 1)."""
    g = float(inefficiency)
    if not g > 1.0:
        return math.pi / 2.0
    limit = math.pi / 2.0 * math.log(2.0)  # as phi -> 1: the integral of arcsin(u) / u over (0, 1)
    if not math.isfinite(g):
        return limit
    phi = (g - 1.0) / (g + 1.0)
    k = np.arange(1, min(int(math.log(1e-12) / math.log(phi)) + 2, 100_000))
    return max(limit, (math.pi / 2.0 + 2.0 * float(np.arcsin(phi ** k).sum())) / g)
