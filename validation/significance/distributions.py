"""Quantiles of the normal and Student t distributions, and the normal CDF, without scipy.

The t CDF itself is validation.stats' (regularized incomplete beta); here it is inverted by Newton's method from a
Cornish-Fisher starting point, which converges in a few steps for every df >= 1 and to machine precision.
"""

from __future__ import annotations

import math
from functools import lru_cache

from validation.stats import StatsError, t_cdf

# Acklam's rational approximation of the normal quantile (relative error < 1.2e-9), refined by one Halley step.
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
      -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
      -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
      4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
_P_LOW = 0.02425


def norm_cdf(z: float) -> float:
    """P(Z <= z) for a standard normal Z."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def norm_ppf(p: float) -> float:
    """The standard normal quantile: z with P(Z <= z) = p, for 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise StatsError(f"norm_ppf: p must be strictly between 0 and 1, got {p!r}")
    if p < _P_LOW:
        q = math.sqrt(-2.0 * math.log(p))
        x = ((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
             / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    elif p <= 1.0 - _P_LOW:
        q = p - 0.5
        r = q * q
        x = ((((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q
             / (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0))
    else:
        q = math.sqrt(-2.0 * math.log1p(-p))
        x = -((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
              / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    # one Halley step on the exact CDF
    e = norm_cdf(x) - p
    u = e * math.sqrt(2.0 * math.pi) * math.exp(x * x / 2.0)
    return x - u / (1.0 + x * u / 2.0)


def _t_pdf(t: float, df: float) -> float:
    log_c = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1.0) / 2.0 * math.log1p(t * t / df))


@lru_cache(maxsize=4096)
def t_ppf(p: float, df: float) -> float:
    """The Student t quantile: t with P(T <= t) = p, for 0 < p < 1 and df > 0 (fractional df allowed, as in
    Welch's test; df = inf is the normal). Accurate to ~1e-12 relative."""
    if not 0.0 < p < 1.0:
        raise StatsError(f"t_ppf: p must be strictly between 0 and 1, got {p!r}")
    if not df > 0:
        raise StatsError(f"t_ppf: degrees of freedom must be positive, got {df!r}")
    if p == 0.5:
        return 0.0
    if df > 1e10:  # the normal, to ~1/(4 df); the t CDF itself loses digits out here
        return norm_ppf(p)
    if df == 1.0:  # Cauchy, written so that the tails keep their digits
        return -1.0 / math.tan(math.pi * p) if p < 0.5 else 1.0 / math.tan(math.pi * (1.0 - p))
    if df == 2.0:
        return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))
    # Cornish-Fisher expansion around the normal quantile (Abramowitz & Stegun 26.7.5) as a start
    z = norm_ppf(p)
    z3, z5, z7 = z ** 3, z ** 5, z ** 7
    t = (z + (z3 + z) / (4 * df) + (5 * z5 + 16 * z3 + 3 * z) / (96 * df ** 2)
         + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df ** 3))
    if df < 3 or abs(z) > 5:  # the expansion can be poor in the far tail of a small df: start from a safe bracket
        t = math.copysign(min(abs(t), 1e6), z)
    for _ in range(100):
        f = t_cdf(t, df) - p
        step = f / _t_pdf(t, df)
        new = t - step
        if math.copysign(1.0, new) != math.copysign(1.0, t) or abs(new) > 4 * abs(t) + 1:
            new = t / 2.0 if abs(new) < abs(t) else t * 2.0  # keep Newton from jumping across 0 or far out
        if abs(new - t) <= 1e-13 * (1.0 + abs(new)):
            return new
        t = new
    return t
