"""Quantiles of the normal and Student t distributions, and the normal CDF: scipy.special's (ndtr, ndtri, stdtrit),
with this package's StatsError for a bad probability or degrees of freedom. The t CDF is validation.analysis.stats'.
"""

from __future__ import annotations

from validation.analysis.stats import StatsError


def _special():
    import scipy.special  # start-up: scipy loads with the first statistic, not with `nsa-validate list`

    return scipy.special


def norm_cdf(z: float) -> float:
    """P(Z <= z) for a standard normal Z."""
    return float(_special().ndtr(z))


def norm_ppf(p: float) -> float:
    """The standard normal quantile: z with P(Z <= z) = p, for 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise StatsError(f"norm_ppf: p must be strictly between 0 and 1, got {p!r}")
    return float(_special().ndtri(p))


def t_ppf(p: float, df: float) -> float:
    """The Student t quantile: t with P(T <= t) = p, for 0 < p < 1 and df > 0 (fractional df allowed, as in
    Welch's test; df = inf is the normal)."""
    if not 0.0 < p < 1.0:
        raise StatsError(f"t_ppf: p must be strictly between 0 and 1, got {p!r}")
    if not df > 0:
        raise StatsError(f"t_ppf: degrees of freedom must be positive, got {df!r}")
    if p == 0.5:
        return 0.0  # exactly: scipy < 1.17 (cdflib's stdtrit) gives ~1e-16
    return float(_special().stdtrit(df, p))
