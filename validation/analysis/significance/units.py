"""Independent units of a measurement: block means of one run's per-step series, or the means of repeated runs.

Consecutive training steps are not independent samples: throughput is autocorrelated (a slow step is followed by
slow steps: the machine's load, allocator and communication state carry over) and it drifts. A t-test on the
steps as if they were independent understates the standard error by about sqrt(g), g = 1 + 2 sum_k rho_k the
statistical inefficiency (g = 4 or more on cpu_smoke), and calls identical runs different.

block_units() therefore cuts the series into contiguous blocks of b steps and treats the block means as the
units:
  1. g is estimated twice and the larger kept: from the lag-1 autocorrelation read as an AR(1) process,
     g = (1 + r) / (1 - r), with r the small-sample bias-corrected r1 + (1 + 3 r1) / n (Marriott & Pope 1954)
     plus one sampling sd, sqrt((1 - r^2) / n) (on a short series an underestimated correlation gives intervals
     that are too narrow, an overestimated one only wider ones), that margin widened by sqrt(SHORT_WINDOW / n)
     on windows shorter than SHORT_WINDOW (30) steps (see "Short windows" below); and as 2 * tau_int, the integrated
     autocorrelation time summed up to Sokal's self-consistent window (the smallest M with M >= 5 tau_int(M)),
     which catches correlation that decays more slowly than an AR(1)'s.
  2. b = round(2 g - 1) = round(1 + 4 sum_k rho_k): one or two steps for white noise, about twice the
     correlation length otherwise, so that neighbouring block means are close to independent; at most
     n // min_blocks, so that there are at least min_blocks (4) blocks. The earliest steps that do not fill a
     block are left out.
  3. Block means of a short series are still correlated, and the sample variance of correlated means is biased
     low. The standard error of the mean is therefore the block means' s / sqrt(m) times sqrt(kappa), kappa the
     exact ratio Var(mean) / E[s^2 / m] for an AR(1) process with the same g (ar1_kappa, closed form), with
     m - 1 degrees of freedom.
On simulated AR(1) series (benchmarks/bench_significance.py, 2,000 series per cell) the 95% interval covers the
true mean in 94-97% of series for phi 0..0.85 and 20..150 steps, except 92% at phi 0.85 with 20 steps; the
per-step interval (steps taken as independent) covers 39-85% for phi 0.3..0.85.
The effective sample size reported is the number of independent steps with the same precision: s_steps^2 / se^2.

Short windows. A window of the order of the correlation time cannot measure its own correlation: at phi 0.9 (g 19)
the lag-1 autocorrelation of 10 steps is biased far beyond Marriott & Pope's first-order term and skewed towards 0,
so the one-sd margin left about a quarter of such windows with g below 5 and a standard error about 2.5 times too
small: two identical 8-12-step windows (AR(1) phi 0.9, 5% CV) were "significant" in 8.6% of 10,000 simulated
pairs (7-10% by length), and 16 steps in 7%. On a window of n < SHORT_WINDOW steps the margin is therefore
sqrt(SHORT_WINDOW / n) sampling sds (1.9 at 8 steps; the margin then shrinks as 1 / n, as the bias it covers does),
with the blocks and kappa of the larger g; from SHORT_WINDOW steps on nothing changes. In 2,000 seeded A/A pairs
per cell (AR(1) phi 0, 0.5, 0.7 and 0.9, 5% CV, 8 to 100 steps each) the rate is then at most 5.1%
(tests/validation/test_significance_short_windows.py checks the shapes above); the price is power on short
windows only (a 10% change between two 10-step white-noise windows of 5% CV: about half found, 74% before; between
two 20-step windows at phi 0.9, 18% against 21%; at 30 steps and more nothing changes). A short window compared
with a much longer one is further held to the longer one's correlation (with_inefficiency, applied by
comparison.compare_units).

run_units() takes the means of repeated runs of one variant as the units (one per run, df = runs - 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np

from validation.analysis.stats import StatsError

MIN_BLOCKS = 4           # at least this many block means (3 degrees of freedom)
SOKAL_C = 5.0            # Sokal's window: sum the autocorrelation up to M >= SOKAL_C * tau_int(M)
MAX_LAG1 = 0.95          # the bias-corrected lag-1 autocorrelation is capped here (g <= 39)
LAG1_MARGIN_SD = 1.0     # blocks are sized for the lag-1 autocorrelation plus this many sampling sds
SHORT_WINDOW = 30        # below this many steps that margin is widened by sqrt(SHORT_WINDOW / n) (module docstring)
UNIT_KINDS = ("blocks", "runs")


def finite_array(values: Sequence[float] | np.ndarray, name: str = "series") -> np.ndarray:
    """A 1-d float64 array of `values`; StatsError when any value is NaN or infinite, or it is not numeric."""
    try:
        arr = np.asarray(values, dtype="float64").ravel()
    except (TypeError, ValueError) as exc:
        raise StatsError(f"{name}: expected a sequence of numbers ({exc})") from None
    finite = np.isfinite(arr)
    if finite.all():
        return arr
    i = int(np.flatnonzero(~finite)[0])
    what = "NaN" if np.isnan(arr[i]) else "infinite"
    raise StatsError(f"{name}: value {i} is {what} ({int((~finite).sum())} non-finite values); drop missing steps "
                     f"before computing statistics")


def autocorrelation(series: Sequence[float] | np.ndarray, max_lag: int | None = None) -> np.ndarray:
    """Sample autocorrelation rho_0 = 1, rho_1, ..., rho_max_lag (the biased, positive-definite estimator:
    autocovariances divided by n and by the lag-0 autocovariance). A constant series has rho_k = 0 for k >= 1."""
    x = finite_array(series)
    n = x.size
    if n < 2:
        raise StatsError(f"autocorrelation needs at least 2 values, got {n}")
    max_lag = n - 1 if max_lag is None else int(max_lag)
    if not 0 <= max_lag < n:
        raise StatsError(f"max_lag must be between 0 and {n - 1}, got {max_lag}")
    return _acf(x)[:max_lag + 1]


def _binary_exponent(x: np.ndarray) -> int:
    """e with max |x| * 2^-e in [0.5, 1) (0 for an all-zero or empty array): np.ldexp(x, -e) rescales x exactly (a
    power of two), so that squares and sums neither overflow (values beyond ~1e154) nor underflow to 0 (below
    ~1e-154), and every statistic computed from the rescaled values is the exactly rescaled statistic."""
    top = float(np.abs(x).max()) if x.size else 0.0
    return math.frexp(top)[1] if top > 0 else 0


def _acf(x: np.ndarray) -> np.ndarray:
    """All n autocorrelations of a finite 1-d array (direct sums for short series, FFT for long ones), computed on
    the series rescaled by a power of two (the autocorrelation does not depend on the scale)."""
    n = x.size
    x = np.ldexp(x, -_binary_exponent(x))
    c = x - x.sum() / n  # x.mean(): the same sum and division, without np.mean's dispatch
    c = np.ldexp(c, -_binary_exponent(c))
    if n <= 512:
        acov = np.correlate(c, c, "full")[n - 1:]
    else:
        size = 1 << (2 * n - 1).bit_length()
        f = np.fft.rfft(c, size)
        acov = np.fft.irfft(f * np.conj(f), size)[:n]
    if not acov[0] > 0:
        out = np.zeros(n)
        out[0] = 1.0
        return out
    return acov / acov[0]


def lag1_corrected(series: Sequence[float] | np.ndarray) -> float:
    """The lag-1 autocorrelation with the small-sample bias correction r1 + (1 + 3 r1) / n, clipped to
    [0, MAX_LAG1]: for an AR(1) process with an estimated mean, E[r1] ~ phi - (1 + 3 phi) / n."""
    x = finite_array(series)
    if x.size < 3:
        raise StatsError(f"lag-1 autocorrelation needs at least 3 values, got {x.size}")
    return _lag1_corrected(_acf(x))


def _lag1_corrected(rho: np.ndarray) -> float:
    r1 = float(rho[1])
    return min(max(r1 + (1.0 + 3.0 * r1) / rho.size, 0.0), MAX_LAG1)


def _lag1_margin_sd(n: int) -> float:
    """Sampling sds added to the lag-1 autocorrelation of an n-step series: LAG1_MARGIN_SD, times
    sqrt(SHORT_WINDOW / n) below SHORT_WINDOW steps (a window of the order of the correlation time underestimates
    it by far more than one sd: the module docstring)."""
    return LAG1_MARGIN_SD * max(1.0, math.sqrt(SHORT_WINDOW / n))


def _lag1_upper(rho: np.ndarray) -> float:
    """The bias-corrected lag-1 autocorrelation plus _lag1_margin_sd(n) sampling sds, sqrt((1 - r^2) / n), capped
    at MAX_LAG1."""
    r = _lag1_corrected(rho)
    return min(r + _lag1_margin_sd(rho.size) * math.sqrt((1.0 - r * r) / rho.size), MAX_LAG1)


def sokal_inefficiency(series: Sequence[float] | np.ndarray, c: float = SOKAL_C) -> float:
    """2 * tau_int with tau_int = 1/2 + sum_{k=1}^{M} rho_k and Sokal's window M (the smallest M >= c tau_int(M));
    at least 1."""
    x = finite_array(series)
    if x.size < 2:
        raise StatsError(f"autocorrelation needs at least 2 values, got {x.size}")
    return _sokal(_acf(x), c)


def _sokal(rho: np.ndarray, c: float = SOKAL_C) -> float:
    taus = 0.5 + np.cumsum(rho[1:])
    ms = np.arange(1, rho.size)
    ok = ms >= c * taus
    tau = float(taus[int(ok.argmax())]) if ok.any() else float(taus[-1])
    return max(1.0, 2.0 * tau)


def inefficiency(series: Sequence[float] | np.ndarray) -> float:
    """The statistical inefficiency g = 1 + 2 sum_k rho_k (variance of the mean = g sigma^2 / n): the larger of
    the bias-corrected AR(1) value (1 + r1) / (1 - r1) and Sokal's windowed estimate. 1 for white noise."""
    x = finite_array(series)
    if x.size < 3:
        raise StatsError(f"inefficiency needs at least 3 values, got {x.size}")
    return _inefficiency(_acf(x))


def _inefficiency(rho: np.ndarray) -> float:
    r1 = _lag1_corrected(rho)
    return max((1.0 + r1) / (1.0 - r1), _sokal(rho))


def ar1_kappa(phi: float, block_len: int, blocks: int) -> float:
    """For an AR(1) process with lag-1 correlation phi cut into `blocks` means of `block_len` steps:
    Var(mean of all) / E[s^2 / blocks], s^2 the sample variance of the block means (>= 1; 1 when phi <= 0).

    With unit marginal variance, Var(block mean) = V0 = (1 + 2 sum_{k<b} (1 - k/b) phi^k) / b and
    Cov(block i, block i+L) = phi^(L b - b + 1) ((1 - phi^b) / (1 - phi))^2 / b^2 for L >= 1; then
    Var(mean) = (m V0 + 2 sum_L (m - L) C_L) / m^2 and E[s^2] = m (V0 - Var(mean)) / (m - 1)."""
    b, m = int(block_len), int(blocks)
    if phi <= 0.0 or m < 2:
        return 1.0
    # the sums in closed form: sum_{k=1}^{b-1} (1 - k/b) phi^k, and sum_{L=1}^{m-1} (m - L) rho^(L-1), rho = phi^b
    inner = phi / (1.0 - phi) - phi * (1.0 - phi ** b) / (b * (1.0 - phi) ** 2)
    v0 = (1.0 + 2.0 * inner) / b
    q = (1.0 - phi ** b) / (1.0 - phi)
    rho, gaps = phi ** b, m - 1
    lagged = (gaps * (1.0 - rho) - rho * (1.0 - rho ** gaps)) / (1.0 - rho) ** 2
    var_mean = (m * v0 + 2.0 * phi * q * q / (b * b) * lagged) / (m * m)
    expected_s2 = m * (v0 - var_mean) / (m - 1)
    if expected_s2 <= 0.0:
        return 1.0
    return max(1.0, var_mean / (expected_s2 / m))


@dataclass(frozen=True)
class Units:
    """Independent units of one measurement and the standard error of its mean.

    kind:         "blocks" (block means of one run's steps) or "runs" (one mean per repeated run)
    values:       the units (block means, or run means in repeat order)
    mean:         mean of the units (for blocks: the mean of the steps used)
    se:           standard error of `mean` (blocks: inflated by sqrt(kappa), see the module docstring)
    df:           degrees of freedom of `se` (units - 1)
    n:            steps used (blocks) or runs
    block_len:    steps per block (None for runs)
    dropped:      earliest steps left out so that the blocks are whole (0 for runs)
    lag1:         bias-corrected lag-1 autocorrelation of the steps (None for runs)
    inefficiency: g the blocks were sized for (the conservative estimate of step 1; 1.0 for runs)
    kappa:        small-sample correction of the block variance (1.0 for runs)
    ess:          effective sample size: independent steps (blocks) or runs with the same precision
    """

    kind: str
    values: tuple[float, ...]
    mean: float
    se: float
    df: float
    n: int
    block_len: int | None = None
    dropped: int = 0
    lag1: float | None = None
    inefficiency: float = 1.0
    kappa: float = 1.0
    ess: float = 0.0

    @property
    def rel_se(self) -> float:
        """se / |mean| (inf when the mean is 0)."""
        return self.se / abs(self.mean) if self.mean != 0 else math.inf

    @property
    def cv(self) -> float:
        """Coefficient of variation of the units (sample stdev / |mean|)."""
        return self.se * math.sqrt(len(self.values) / self.kappa) / abs(self.mean) if self.mean != 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["values"] = list(self.values)
        out["rel_se"] = _json_num(self.rel_se)
        out["cv"] = _json_num(self.cv)
        return out


def _json_num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def block_units(series: Sequence[float] | np.ndarray, *, min_blocks: int = MIN_BLOCKS, warmup: int = 0) -> Units:
    """Block means of a per-step series (after dropping its first `warmup` values), with the block length
    chosen from the series' autocorrelation (see the module docstring). Needs at least 2 * min_blocks steps
    after the warmup; StatsError for fewer, for NaN/inf values, or for a bad argument."""
    if isinstance(min_blocks, bool) or not isinstance(min_blocks, int) or min_blocks < 2:
        raise StatsError(f"min_blocks: expected an integer >= 2, got {min_blocks!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise StatsError(f"warmup: expected a non-negative integer, got {warmup!r}")
    x = finite_array(series)[warmup:]
    n = x.size
    if n < 2 * min_blocks:
        raise StatsError(f"block means need at least {2 * min_blocks} steps after the warmup "
                         f"({min_blocks} blocks of 2), got {n}")
    # computed on the series rescaled by a power of two, the mean, se and block means scaled back exactly: the
    # squared deviations of values beyond ~1e154 overflowed (a NaN inefficiency, then a ValueError) and those of
    # values below ~1e-154 underflowed to a standard error of 0 (an "exact", significant difference)
    scale = _binary_exponent(x)
    x = np.ldexp(x, -scale)
    rho = _acf(x)
    r1 = _lag1_corrected(rho)
    r_up = _lag1_upper(rho)
    g = max((1.0 + r_up) / (1.0 - r_up), _sokal(rho))
    b = max(1, min(int(math.floor(2.0 * g - 0.5)), n // min_blocks))
    m = n // b
    used = x[n - m * b:]
    # each mean as np.mean computes it (numpy's pairwise sum, then one division) without its dispatch: this runs
    # tens of thousands of times in the decisions' calibration tests
    means = used.reshape(m, b).sum(axis=1) / b
    phi = (g - 1.0) / (g + 1.0)  # the AR(1) with the same inefficiency
    kappa = ar1_kappa(phi, b, m)
    dev = means - means.sum() / m
    se = math.sqrt(float(dev @ dev) / (m - 1) / m * kappa)
    used_mean = used.sum() / (m * b)
    dev = used - used_mean
    var_steps = float(dev @ dev) / (m * b - 1)
    ess = float(m * b) if se == 0.0 else min(float(m * b), max(1.0, var_steps / (se * se)))
    means, mean, se = np.ldexp(means, scale), float(np.ldexp(used_mean, scale)), math.ldexp(se, scale)
    return Units(kind="blocks", values=tuple(means.tolist()), mean=mean, se=se,
                 df=float(m - 1), n=int(m * b), block_len=int(b), dropped=int(n - m * b), lag1=float(r1),
                 inefficiency=float(g), kappa=float(kappa), ess=ess)


def with_inefficiency(units: Units, g: float) -> Units:
    """`units` (block means) with the statistical inefficiency held to at least `g`, an estimate of the same
    series' correlation from a longer window (comparison.compare_units: a short window cannot measure its own):
    the same blocks, kappa that of the AR(1) with inefficiency g (ar1_kappa), the standard error and effective
    sample size scaled by it, df unchanged; g at most that of the lag-1 cap MAX_LAG1, as a window's own. Unchanged
    when g is not larger, kappa would not grow, or the units are run means."""
    if units.kind != "blocks" or units.block_len is None or not math.isfinite(g) or g <= units.inefficiency:
        return units
    g = min(float(g), (1.0 + MAX_LAG1) / (1.0 - MAX_LAG1))
    kappa = ar1_kappa((g - 1.0) / (g + 1.0), units.block_len, len(units.values))
    if not kappa > units.kappa:
        return units
    ratio = kappa / units.kappa
    return replace(units, se=units.se * math.sqrt(ratio), inefficiency=g, kappa=kappa,
                   ess=max(1.0, units.ess / ratio))


def run_units(run_means: Sequence[float] | np.ndarray) -> Units:
    """The means of repeated runs of one variant as independent units (at least 2 runs)."""
    x = finite_array(run_means, "run means")
    if x.size < 2:
        raise StatsError(f"run means: need at least 2 runs for a standard error, got {x.size}")
    scale = _binary_exponent(x)  # as in block_units: no overflow or underflow of the squared deviations
    se = math.ldexp(float(np.ldexp(x, -scale).std(ddof=1)), scale) / math.sqrt(x.size)
    return Units(kind="runs", values=tuple(float(v) for v in x), mean=float(x.mean()), se=se,
                 df=float(x.size - 1), n=int(x.size), ess=float(x.size))
