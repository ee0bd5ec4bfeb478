"""A variant against a baseline on independent units: relative difference with a confidence interval, p-value,
noise floor and verdict; Holm's step-down over a family of comparisons.

The relative difference is rel = b / a - 1, estimated and tested on the log scale, where a ratio is a
difference and the interval maps back without going below -100%:
  - unpaired (compare_units): log(mean_b / mean_a) with the delta-method standard error
    sqrt((se_a / mean_a)^2 + (se_b / mean_b)^2) and Welch-Satterthwaite degrees of freedom;
  - paired (compare_paired): repeat r of an interleaved design gives one run mean per variant; the R log-ratios
    d_r = log(b_r / a_r) are the units (one-sample t, R - 1 df), so that whatever the machine did during repeat r
    (a slow period, a warm cache) is common to both runs and cancels. rel = exp(mean d) - 1 (ratio of geometric
    means).
A difference is significant when p < alpha AND |rel| > noise floor; then it is "better" or "worse". Otherwise it is
"same" only when its whole confidence interval lies inside the noise floor (and the floor, at most MAX_USEFUL_FLOOR,
resolves something): the data show the change is smaller than what matters. Every other row is "inconclusive": the
measurement cannot tell, and its text names the noise floor that made it so. The noise floor of a measurement is the
smallest relative change it resolves, the relative half-width of the (1 - alpha) interval of its mean (for a paired
design, of one variant's mean with the repeat-to-repeat level removed: the sd of d / sqrt(2)), never below
`min_floor` (default 1%: run-to-run effects of that size are common and rarely worth acting on); a comparison
uses the larger floor of its two sides. `noise` (a user's threshold, compare's --noise) replaces the floor.

Block means measure the noise within one run only. Two runs of the same configuration also differ as a whole (the
machine's load, clocks and caches change between runs): on cpu_smoke the means of back-to-back runs differ by
about 10% while a run's own block standard error is 2-4%. run_noise() measures how much the means of repeated
runs of one configuration spread (a sweep's or an A/B's repeats), and compare_units(..., run_noise=) never takes
a single run's mean as more precise than that: each side's variance is the larger of its own (block) variance and
the repeats' variance, so that two identical runs are not called different because the machine was busier during
one of them. (Adding only the between-run part, the repeats' variance less the runs' own, was tried: its estimate
from a few repeats is so uncertain that the smallest p-values, those Holm's correction looks at, came out far too
small: 24% of identical cpu_smoke-like run pairs had a "significant" row among 12; taking the larger variance
gives 2.5%, block means alone 38%: benchmarks/bench_significance.py --only gate (measured before units.py's
short-window margin; with it, at --reps 2000 --seed 0 and run_cv 0.08: 19%, 0.8% and 26%, against 24%, 0.8% and
38% without it), and
tests/validation/test_compare.py.) Such a comparison has at most the repeats' degrees of freedom, also where a side's
own variance is the larger: each side's variance is at least s^2, so |t| is at most that of the same difference over
sqrt(2 s^2), a Student t with the repeats' df (normal run levels), and its quantile keeps identical runs at alpha
whatever the layout of the repeats. (A side's own block df in the Satterthwaite sum gave single runs held to 1 x 2 repeats 6.5-7.3%
false positives: benchmarks/bench_significance.py --only held.)

A short window against a long one. The standard error of a window's block means rests on the correlation its own
steps show (units.py), and a window of the order of the correlation time cannot show it: a 10-step window of
AR(1) steps at phi 0.9 (g 19) compared with a 2,000-step one (whose own standard error is negligible, so nothing
averages the short side's error out) was "significant" between identical runs in 17% of 1,500 seeded pairs (5% CV),
a 20-step one in 12%, a 50-step one in 7%. compare_units therefore holds the block means of a window to at least
the inefficiency of the other side when the other covers at least SHORT_AGAINST (2) times as many steps (the more
precise estimate of the same machine's correlation; units.with_inefficiency: the same blocks, kappa of the larger
g): with units.py's short-window margin, those rates become 4.8%, 4.9% and 4.3% in 2,000 pairs (10 steps against
2,000 at phi 0.5: 6.7% before, 3.5% now; tests/validation/test_significance_short_windows.py). Two windows of equal
length are unchanged by it. It only ever widens the short side's interval: were its steps truly less correlated
than the long side's, the comparison is blunter, never falsely significant.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from validation.formatting import fmt_pct, plural
from validation.analysis.metrics import window_mean
from validation.analysis.significance.distributions import t_ppf
from validation.analysis.significance.units import Units, block_units, with_inefficiency
# MAX_USEFUL_FLOOR: a noise floor wider than this resolves nothing worth saying "same" about (defined with the
# samples' comparison it also bounds)
from validation.analysis.stats import MAX_USEFUL_FLOOR, StatsError, t_sf2

ALPHA = 0.05
MIN_FLOOR = 0.01
METHODS = ("blocks", "runs", "paired", "common")
# a window of block means is held to the correlation of the other side's when the other covers this many times as
# many steps (the module docstring: "A short window against a long one")
SHORT_AGAINST = 2
VERDICTS = ("better", "worse", "same", "inconclusive")


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise StatsError(f"alpha: expected a value between 0 and 1, got {alpha!r}")


def _check_fraction(value: float | None, name: str) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise StatsError(f"{name}: expected a non-negative fraction (0.02 = 2%), got {value!r}")


def noise_floor(units: Units, alpha: float = ALPHA, min_floor: float = MIN_FLOOR) -> float:
    """The smallest relative change the measurement resolves: t_{df, 1 - alpha/2} * se / |mean|, at least
    min_floor. inf when the mean is 0."""
    _check_alpha(alpha)
    _check_fraction(min_floor, "min_floor")
    if units.mean == 0:
        return math.inf
    if units.se == 0:
        return float(min_floor)
    return max(float(min_floor), t_ppf(1.0 - alpha / 2.0, units.df) * units.se / abs(units.mean))


@dataclass(frozen=True)
class RunNoise:
    """Run-to-run variation of a run's mean, measured from repeated runs of the same configuration.

    total:   s, the pooled sd of log(run mean) within each group of repeats: how much the mean of one run varies
             from run to run (a relative sd: 0.05 = 5%); what compare_units uses
    within:  root mean square of the runs' own relative standard errors (block means of each run's window)
    between: the part of `total` beyond the runs' own noise, sqrt(max(0, total^2 - within^2)) (for reading only)
    df:      degrees of freedom of s^2 (sum over groups of runs - 1)
    runs, groups: runs and groups of repeats used
    source:  where it was measured (free text, e.g. "bucket_sweep: 3 points x 2 repeats")
    """

    between: float
    total: float
    within: float
    df: float
    runs: int
    groups: int
    source: str = ""

    def describe(self) -> str:
        return (f"run-to-run variation {fmt_pct(self.total)} ({self.df:g} df, from {self.runs} runs in {self.groups} "
                f"group(s) of repeats" + (f": {self.source}" if self.source else "") + ")")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["text"] = self.describe()
        return out


@dataclass(frozen=True)
class PairNoise:
    """The least sd of one repeat's log-ratio between two launches of a paired comparison (sd) and where it comes
    from (source): a runbook's declared launch noise (its `compare` mapping: launch_sd, from `pairs` A/A pairs on its
    machine; pair_noise_from). It carries no degrees of freedom on purpose: the repeats measure this very variance
    themselves (r - 1 df), so the declared value only bounds it from below and the test keeps the repeats' df
    (compare_paired). compare_shift differs: the change common to every step of two runs is one draw the runs cannot
    measure at all, so a declared run_sd that sets its standard error brings its own df (pairs - 1)."""

    sd: float
    source: str = ""
    pairs: float | None = field(default=None, compare=False)  # the A/A pairs it was measured from (None: not stated)

    def launch_noise(self) -> RunNoise:
        """One launch's share of it (sd / sqrt 2) as the run-to-run variation of a single run's mean, for a
        comparison of one run each (compare_units(run_noise=)) and for compare's launches (declared_noise): its df
        pairs - 1, at least 1 (2 pairs when not stated)."""
        pairs = self.pairs if self.pairs is not None else 2.0
        share = self.sd / math.sqrt(2.0)
        return RunNoise(between=share, total=share, within=0.0, df=max(float(pairs) - 1.0, 1.0), runs=int(2 * pairs),
                        groups=int(pairs), source=self.source)

    def hold(self, run_noise: RunNoise | None) -> RunNoise:
        """`run_noise` (a single run's measured run-to-run variation, or None) held to at least launch_noise():
        the larger of the two."""
        declared = self.launch_noise()
        return declared if run_noise is None or run_noise.total < declared.total else run_noise


def pair_noise_from(declared: Any) -> PairNoise | None:
    """A runbook's `compare` mapping as stored in results.json ({"launch_sd", "pairs", ...}) -> PairNoise, or None
    when it declares no launch_sd (or is not a mapping)."""
    if not isinstance(declared, dict):
        return None
    sd, pairs = declared.get("launch_sd"), declared.get("pairs")
    if not isinstance(sd, (int, float)) or isinstance(sd, bool) or not math.isfinite(sd) or sd <= 0:
        return None
    pairs = float(pairs) if isinstance(pairs, (int, float)) and not isinstance(pairs, bool) and pairs >= 2 else 2.0
    return PairNoise(sd=float(sd),
                     source=f"the runbook's launch_sd {fmt_pct(float(sd))}, from {pairs:g} A/A pairs", pairs=pairs)


def run_noise(groups: Sequence[Sequence[tuple[float | None, float | None]]], source: str = "") -> RunNoise | None:
    """The run-to-run variation of run means (RunNoise) from groups of repeated runs of one configuration each;
    every run is (its mean, the relative standard error of that mean within the run, or None when unknown).
    Runs whose mean is missing, not finite or not positive are left out; groups with fewer than 2 runs add nothing.
    None when no group has 2 runs."""
    dev2, df, runs, used, within = 0.0, 0, 0, 0, []
    for group in groups:
        vals = [(float(m), w) for m, w in group
                if m is not None and isinstance(m, (int, float)) and math.isfinite(m) and m > 0]
        if len(vals) < 2:
            continue
        x = np.log([m for m, _ in vals])
        dev2 += float(((x - x.mean()) ** 2).sum())
        df += len(vals) - 1
        runs += len(vals)
        used += 1
        within += [float(w) ** 2 for _, w in vals
                   if w is not None and isinstance(w, (int, float)) and math.isfinite(w) and w >= 0]
    if df == 0:
        return None
    s2 = dev2 / df
    w2 = float(np.mean(within)) if within else 0.0
    return RunNoise(between=math.sqrt(max(0.0, s2 - w2)), total=math.sqrt(s2), within=math.sqrt(w2), df=float(df),
                    runs=runs, groups=used, source=source)


def _satterthwaite(terms: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance terms (variance, its df); inf when all are 0."""
    total = sum(v for v, _ in terms)
    den = sum(v * v / d for v, d in terms if v > 0)
    return total * total / den if den > 0 else math.inf


def _floor(terms: Sequence[tuple[float, float]], alpha: float, min_floor: float) -> float:
    var = sum(v for v, _ in terms)
    if var <= 0:
        return float(min_floor)
    return max(float(min_floor), t_ppf(1.0 - alpha / 2.0, _satterthwaite(terms)) * math.sqrt(var))


@dataclass(frozen=True)
class Comparison:
    """Variant b against baseline a.

    baseline, variant: labels (free text: step, run or variant names; never shortened)
    metric:            what was compared (e.g. toks_per_s)
    method:            "blocks" (block means of one run each, Welch), "runs" (run means, Welch) or "paired"
                       (per-repeat log-ratios of interleaved runs)
    mean_a, mean_b:    the two means the reports show: blocks, the Units' means (a window's figure from
                       windows.window_units: a rate's is its work over its time); runs and paired, the mean of the run
                       means by the metric's own rule (shown_mean: for a rate of equal work, RATE_METRICS, the
                       runs' work over their time, the harmonic mean; else the plain mean); the test never reads them
    rel:               the test's estimate of b / a - 1, the centre of its interval: blocks, mean_b / mean_a - 1;
                       runs, the ratio of the plain means of the run means - 1 (mean_b / mean_a - 1 but for a rate);
                       paired, the ratio of the geometric means of the run means - 1 (exp of the mean log-ratio),
                       close to mean_b / mean_a - 1 but not it
    ci_low, ci_high:   the (1 - alpha) confidence interval of rel
    p_value:           two-sided p of "no difference"
    t, df:             the test statistic (on the log scale) and its degrees of freedom
    n_a, n_b:          independent units on each side (blocks or runs; paired: pairs on both)
    ess_a, ess_b:      effective sample sizes (independent steps or runs)
    noise_floor:       the threshold |rel| must exceed (a user's `noise` when given, else the data's floor)
    floor_source:      "data" or "user"
    alpha:             the significance level
    higher_is_better:  direction of "better"
    significant:       p (p_adjusted after a family correction) < alpha and |rel| > noise_floor
    verdict:           "better" | "worse" (significant), "same" (the CI inside the noise floor) or "inconclusive"
                       (b relative to a)
    p_adjusted:        Holm-adjusted p when the comparison is part of a family, else None
    family_size:       comparisons in that family, else None
    run_to_run:        the run-to-run variation (RunNoise.total) each side's noise was held to at least, else None
    run_to_run_df:     its degrees of freedom, else None
    """

    baseline: str
    variant: str
    metric: str
    method: str
    mean_a: float
    mean_b: float
    rel: float
    ci_low: float
    ci_high: float
    p_value: float
    t: float
    df: float
    n_a: int
    n_b: int
    ess_a: float
    ess_b: float
    noise_floor: float
    floor_source: str
    alpha: float
    higher_is_better: bool
    significant: bool
    verdict: str
    p_adjusted: float | None = None
    family_size: int | None = None
    run_to_run: float | None = None
    run_to_run_df: float | None = None

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha

    def describe(self) -> str:
        """One line: '+6.2% (95% CI +3.1% .. +9.4%), p = 0.002, paired over 8 repeats'."""
        p = f"p = {_fmt_p(self.p_value)}"
        if self.p_adjusted is not None:
            p += f", Holm-adjusted p = {_fmt_p(self.p_adjusted)} over {plural(self.family_size, 'comparison')}"
        how = {"blocks": f"block means of one run each ({self.n_a} and {self.n_b} blocks)",
               "runs": f"means of {self.n_a} and {self.n_b} runs",
               "paired": f"paired over {self.n_a} interleaved repeats",
               "common": f"the change common to {self.n_a} steps (one-sample t over their log-ratios)"}[self.method]
        if self.run_to_run is not None:
            how += (f", each run's noise at least the run-to-run variation {fmt_pct(self.run_to_run)} "
                    f"({self.run_to_run_df:g} df)")
        word = f"inconclusive (noise floor {fmt_pct(self.noise_floor)}): " if self.verdict == "inconclusive" else ""
        return (f"{word}{fmt_pct(self.rel, signed=True)} ({fmt_pct(self.confidence, digits=0)} CI "
                f"{fmt_pct(self.ci_low, signed=True)} .. {fmt_pct(self.ci_high, signed=True)}), {p}, "
                f"noise floor {fmt_pct(self.noise_floor)}; {how}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, float) and not math.isfinite(v):
                out[k] = None
        out["confidence"] = self.confidence
        out["text"] = self.describe()
        return out


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def shown_mean(values: Sequence[float] | np.ndarray, metric: str) -> float:
    """The mean of run means a comparison shows (mean_a, mean_b): metrics.window_mean's rule for `metric` (a rate of
    equal work, RATE_METRICS, the runs' work over their time: n / the sum of 1 / mean; else the plain mean), the plain
    mean where that rule gives no figure."""
    x = np.asarray(values, dtype="float64")
    shown = window_mean(x, metric)
    return float(x.mean()) if shown is None else float(shown)


def _verdict(significant: bool, rel: float, higher_is_better: bool, ci_low: float, ci_high: float,
             floor: float) -> str:
    """better / worse when significant; same when the interval lies inside the (useful) noise floor; else
    inconclusive."""
    if significant:
        return "better" if (rel > 0) == bool(higher_is_better) else "worse"
    if floor <= MAX_USEFUL_FLOOR and -floor <= ci_low and ci_high <= floor:
        return "same"
    return "inconclusive"


def _finish(*, baseline: str, variant: str, metric: str, method: str, mean_a: float, mean_b: float, log_rel: float,
            se: float, df: float, n_a: int, n_b: int, ess_a: float, ess_b: float, floor: float, noise: float | None,
            alpha: float, higher_is_better: bool, run_to_run: RunNoise | None = None) -> Comparison:
    if se > 0:
        t = log_rel / se
        p = min(1.0, t_sf2(t, df))
        half = t_ppf(1.0 - alpha / 2.0, df) * se
    else:  # no variance on either side: the difference is exact
        t = 0.0 if log_rel == 0 else math.copysign(math.inf, log_rel)
        p = 1.0 if log_rel == 0 else 0.0
        half = 0.0
    threshold = float(noise) if noise is not None else floor
    rel = math.expm1(log_rel)
    significant = bool(p < alpha and abs(rel) > threshold)
    ci_low, ci_high = math.expm1(log_rel - half), math.expm1(log_rel + half)
    return Comparison(baseline=baseline, variant=variant, metric=metric, method=method, mean_a=float(mean_a),
                      mean_b=float(mean_b), rel=rel, ci_low=ci_low, ci_high=ci_high, p_value=float(p), t=float(t),
                      df=float(df), n_a=int(n_a),
                      n_b=int(n_b), ess_a=float(ess_a), ess_b=float(ess_b), noise_floor=threshold,
                      floor_source="user" if noise is not None else "data", alpha=float(alpha),
                      higher_is_better=bool(higher_is_better), significant=significant,
                      verdict=_verdict(significant, rel, higher_is_better, ci_low, ci_high, threshold),
                      run_to_run=None if run_to_run is None else float(run_to_run.total),
                      run_to_run_df=None if run_to_run is None else float(run_to_run.df))


def _held_to_longer(units: Units, other: Units) -> Units:
    """`units` held to the inefficiency of `other` when both are block means and other's window covers at least
    SHORT_AGAINST times as many steps (the module docstring); else `units`."""
    if units.kind != "blocks" or other.kind != "blocks":
        return units
    if other.n + other.dropped < SHORT_AGAINST * (units.n + units.dropped):
        return units
    return with_inefficiency(units, other.inefficiency)


def compare_units(a: Units, b: Units, *, higher_is_better: bool = True, alpha: float = ALPHA,
                  min_floor: float = MIN_FLOOR, noise: float | None = None, baseline: str = "a",
                  variant: str = "b", metric: str = "toks_per_s", run_noise: RunNoise | None = None) -> Comparison:
    """b against a on their independent units (block means or run means): Welch-Satterthwaite t on
    log(mean_b / mean_a) with the delta-method standard error. Both means must be positive. Block means of a
    window with at most 1 / SHORT_AGAINST the other's steps are held to the other's inefficiency first (the module
    docstring: "A short window against a long one").

    run_noise: the run-to-run variation of a run's mean (run_noise()): each side's relative variance is the larger
    of its own and run_noise.total^2 (a and b are single runs of a machine whose level varies between runs), with
    the degrees of freedom of the one taken, in the Satterthwaite sum and in each side's noise floor; when both
    sides take it, it is one estimate and counts once (its own df, never twice them). The comparison's df is at most
    run_noise.df: a side whose own variance is the larger still differs from the other as a whole, by an amount only
    the repeats measure. Not for run means (kind "runs"), which include it."""
    _check_alpha(alpha)
    _check_fraction(min_floor, "min_floor")
    _check_fraction(noise, "noise")
    if not (a.mean > 0 and b.mean > 0):
        raise StatsError(f"a relative difference needs positive means, got {a.mean!r} ({baseline}) and "
                         f"{b.mean!r} ({variant})")
    a, b = _held_to_longer(a, b), _held_to_longer(b, a)
    sides = [((a.se / a.mean) ** 2, a.df), ((b.se / b.mean) ** 2, b.df)]
    terms = sides  # the independent variance estimates behind se2, for the Satterthwaite df
    if run_noise is not None:
        rv = (run_noise.total ** 2, run_noise.df)
        held = [side[0] < rv[0] for side in sides]
        sides = [rv if h else side for side, h in zip(sides, held)]
        # both sides held: they hold the SAME estimate s^2, one term 2 s^2 with its df; Satterthwaite over two
        # copies would double the df (2 repeats' 1 df counted as 2: t 4.30 where 12.7 is due)
        terms = [(2.0 * rv[0], rv[1])] if all(held) else sides
    se2 = sides[0][0] + sides[1][0]
    df = _satterthwaite(terms)
    if run_noise is not None:
        # never more degrees of freedom than the run-to-run estimate: a side whose own (within-run) variance is the
        # larger still carries the between-run part of its run's level, which only the repeats measure. Each side's
        # variance is at least s^2, so |t| is at most |log ratio| / sqrt(2 s^2), a Student t with run_noise.df:
        # its quantile bounds the false positives at alpha. Satterthwaite over a side's own block df gave 1 x 2
        # repeats (1 df) 6.5-7.3% "significant" identical runs (benchmarks/bench_significance.py --only held).
        df = min(df, float(run_noise.df))
    floor = max(_floor([sides[0]], alpha, min_floor), _floor([sides[1]], alpha, min_floor))
    method = "runs" if a.kind == "runs" and b.kind == "runs" else "blocks"
    # the means shown: run means by the metric's rule (shown_mean), block means as their Units carry them; the test
    # above is on log(b.mean / a.mean) whatever is shown
    shown_a, shown_b = ((shown_mean(a.values, metric), shown_mean(b.values, metric)) if method == "runs"
                        else (a.mean, b.mean))
    return _finish(baseline=baseline, variant=variant, metric=metric, method=method, mean_a=shown_a, mean_b=shown_b,
                   log_rel=math.log(b.mean / a.mean), se=math.sqrt(se2), df=df, n_a=len(a.values),
                   n_b=len(b.values), ess_a=a.ess, ess_b=b.ess, floor=floor, noise=noise, alpha=alpha,
                   higher_is_better=higher_is_better, run_to_run=run_noise)


def compare_series(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True, alpha: float = ALPHA,
                   min_floor: float = MIN_FLOOR, noise: float | None = None, baseline: str = "a",
                   variant: str = "b", metric: str = "toks_per_s", run_noise: RunNoise | None = None) -> Comparison:
    """b against a, each one run's per-step series (after warm-up): block_units of each, then compare_units
    (with the run-to-run variation when given). What `compare` of two runs uses per row."""
    return compare_units(block_units(a), block_units(b), higher_is_better=higher_is_better, alpha=alpha,
                         min_floor=min_floor, noise=noise, baseline=baseline, variant=variant, metric=metric,
                         run_noise=run_noise)


def paired_pairs(a_runs: Sequence[float | None], b_runs: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """The (a, b) run means of the repeats where both are present and finite (None/NaN = a failed run)."""
    if len(a_runs) != len(b_runs):
        raise StatsError(f"paired runs: expected one run mean per repeat on both sides, got {len(a_runs)} and "
                         f"{len(b_runs)} repeats")
    xa = np.array([math.nan if v is None else float(v) for v in a_runs], dtype="float64")
    xb = np.array([math.nan if v is None else float(v) for v in b_runs], dtype="float64")
    keep = np.isfinite(xa) & np.isfinite(xb)
    return xa[keep], xb[keep]


def compare_paired(a_runs: Sequence[float | None], b_runs: Sequence[float | None], *, higher_is_better: bool = True,
                   alpha: float = ALPHA, min_floor: float = MIN_FLOOR, noise: float | None = None,
                   baseline: str = "a", variant: str = "b", metric: str = "toks_per_s",
                   pair_noise: PairNoise | None = None) -> Comparison:
    """b against a from interleaved repeats: a_runs[r] and b_runs[r] are the run means of repeat r (None for a
    run that failed; that repeat is left out). One-sample t on the log-ratios; at least 2 complete repeats, all
    means positive. `pair_noise`: the sd of one repeat's log-ratio is held to at least pair_noise.sd, with the
    repeats' own degrees of freedom (a lower bound makes the test blunter, never sharper than the repeats alone):
    two repeats that agree by chance do not decide."""
    _check_alpha(alpha)
    _check_fraction(min_floor, "min_floor")
    _check_fraction(noise, "noise")
    xa, xb = paired_pairs(a_runs, b_runs)
    if xa.size < 2:
        raise StatsError(f"paired comparison needs at least 2 repeats with both runs, got {xa.size}")
    if not (np.all(xa > 0) and np.all(xb > 0)):
        raise StatsError("a relative difference needs positive run means")
    d = np.log(xb / xa)
    r = d.size
    sd = float(d.std(ddof=1))
    df = float(r - 1)
    if pair_noise is not None and pair_noise.sd > sd:  # blunter, never sharper: the repeats' own df are kept
        sd = pair_noise.sd
    se = sd / math.sqrt(r)
    floor = float(min_floor)
    if sd > 0:  # one variant's resolution with the repeat level removed: sd(d) / sqrt(2) per run
        floor = max(floor, t_ppf(1.0 - alpha / 2.0, df) * sd / math.sqrt(2.0 * r))
    # the means shown are the run means' by the metric's rule (shown_mean: a rate's runs' work over their time); the
    # test is on the log-ratios d, whatever is shown
    return _finish(baseline=baseline, variant=variant, metric=metric, method="paired", mean_a=shown_mean(xa, metric),
                   mean_b=shown_mean(xb, metric), log_rel=float(d.mean()), se=se, df=df, n_a=r, n_b=r,
                   ess_a=float(r), ess_b=float(r), floor=floor, noise=noise, alpha=alpha,
                   higher_is_better=higher_is_better)


def compare_shift(log_ratios: Sequence[float], *, min_shift: float, higher_is_better: bool = True,
                  alpha: float = ALPHA, noise: float | None = None, baseline: str = "a", variant: str = "b",
                  metric: str = "toks_per_s", min_se: float | None = None,
                  min_se_df: float | None = None) -> Comparison:
    """The change common to several measurements of b against a (every step of two validation runs): one log-ratio
    log(mean_b / mean_a) per measurement, a one-sample t over them (n - 1 df), so that each measurement's own noise,
    whatever it is, enters only through their spread. Its noise floor is at least `min_shift`: two runs of one
    configuration also differ as a whole (the machine between them), which no spread within them shows. At least 3
    finite log-ratios. `min_se`: a standard error the mean change is held to at least (the sd of the whole-run change
    between two runs when nothing changed, measured from A/A pairs), with `min_se_df` degrees of freedom when taken."""
    _check_alpha(alpha)
    _check_fraction(min_shift, "min_shift")
    _check_fraction(noise, "noise")
    d = np.asarray([float(x) for x in log_ratios if x is not None and math.isfinite(float(x))], dtype="float64")
    if d.size < 3:
        raise StatsError(f"a common change needs at least 3 measurements, got {d.size}")
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(d.size)
    df = float(d.size - 1)
    if min_se is not None and min_se > se:
        if not math.isfinite(min_se):
            raise StatsError(f"min_se must be finite, got {min_se!r}")
        se, df = float(min_se), float(min_se_df if min_se_df is not None else df)
    floor = max(float(min_shift), t_ppf(1.0 - alpha / 2.0, df) * se if se > 0 else 0.0)
    return _finish(baseline=baseline, variant=variant, metric=metric, method="common", mean_a=1.0,
                   mean_b=float(math.exp(d.mean())), log_rel=float(d.mean()), se=se, df=df,
                   n_a=int(d.size), n_b=int(d.size), ess_a=float(d.size), ess_b=float(d.size), floor=floor,
                   noise=noise, alpha=alpha, higher_is_better=higher_is_better)


def paired_cv(a_runs: Sequence[float | None], b_runs: Sequence[float | None]) -> float:
    """The noise of one variant's run mean with the repeat-to-repeat level removed: sd(log(b_r / a_r)) / sqrt(2)
    (the `cv` that recommended_repeats takes)."""
    xa, xb = paired_pairs(a_runs, b_runs)
    if xa.size < 2 or not (np.all(xa > 0) and np.all(xb > 0)):
        raise StatsError("paired_cv needs at least 2 repeats with positive run means on both sides")
    return float(np.log(xb / xa).std(ddof=1)) / math.sqrt(2.0)


# --- multiple comparisons ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Holm:
    """Holm's step-down adjustment of a family of p-values.

    adjusted:  Holm-adjusted p per input (None where the input p was None: not part of the family)
    rejected:  adjusted p < alpha per input
    alpha:     the family-wise error rate controlled
    m:         family size (p-values that were not None)
    """

    adjusted: tuple[float | None, ...]
    rejected: tuple[bool, ...]
    alpha: float
    m: int
    method: str = "holm"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "alpha": self.alpha, "m": self.m, "adjusted": list(self.adjusted),
                "rejected": list(self.rejected)}


def holm(p_values: Sequence[float | None], alpha: float = ALPHA) -> Holm:
    """Holm (1979): sort the m p-values, p_(1) <= ... <= p_(m); adjusted p_(i) = max_{j <= i} min(1, (m - j + 1)
    p_(j)); reject where adjusted < alpha. The probability of one or more false rejections is <= alpha whatever
    the dependence between the tests. None entries are skipped."""
    _check_alpha(alpha)
    idx = [i for i, p in enumerate(p_values) if p is not None]
    ps = []
    for i in idx:
        p = float(p_values[i])
        if not 0.0 <= p <= 1.0:  # NaN fails too
            raise StatsError(f"p-value {i} is {p_values[i]!r}; expected a number in [0, 1]")
        ps.append(p)
    m = len(ps)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, j in enumerate(sorted(range(m), key=lambda k: ps[k])):
        running = max(running, min(1.0, (m - rank) * ps[j]))
        adjusted[idx[j]] = running
    rejected = tuple(a is not None and a < alpha for a in adjusted)
    return Holm(adjusted=tuple(adjusted), rejected=rejected, alpha=float(alpha), m=m)


@dataclass(frozen=True)
class Family:
    """Comparisons adjusted together (e.g. every row of a `compare`) and the sentence that says so."""

    comparisons: tuple[Comparison, ...]
    holm: Holm
    statement: str

    @property
    def significant(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.significant)

    @property
    def regressions(self) -> tuple[Comparison, ...]:
        """The significant comparisons whose verdict is "worse" (what a CI gate fails on)."""
        return tuple(c for c in self.comparisons if c.verdict == "worse")

    def as_dict(self) -> dict[str, Any]:
        return {"correction": self.holm.method, "alpha": self.holm.alpha, "family_size": self.holm.m,
                "statement": self.statement, "significant": len(self.significant),
                "regressions": len(self.regressions), "comparisons": [c.as_dict() for c in self.comparisons]}


def adjust_family(comparisons: Sequence[Comparison], alpha: float | None = None) -> Family:
    """Holm over all `comparisons` (family-wise error <= alpha, by default the comparisons' own alpha):
    each is returned with p_adjusted and family_size set, and significant/verdict re-decided on the adjusted p
    (the noise floor still applies)."""
    if not comparisons:
        raise StatsError("adjust_family: no comparisons")
    if alpha is None:
        alphas = {c.alpha for c in comparisons}
        if len(alphas) != 1:
            raise StatsError(f"adjust_family: comparisons use different alphas {sorted(alphas)}; pass alpha")
        alpha = alphas.pop()
    h = holm([c.p_value for c in comparisons], alpha)
    out = []
    for c, adj in zip(comparisons, h.adjusted):
        significant = bool(adj < alpha and abs(c.rel) > c.noise_floor)
        out.append(replace(c, p_adjusted=adj, family_size=h.m, alpha=float(alpha), significant=significant,
                           verdict=_verdict(significant, c.rel, c.higher_is_better, c.ci_low, c.ci_high,
                                            c.noise_floor)))
    n_sig = sum(c.significant for c in out)
    statement = (f"Holm's step-down correction over {plural(h.m, 'comparison')}: the chance of one or more false "
                 f"'significant' rows is at most {alpha:.0%}; {n_sig} row{'s' if n_sig != 1 else ''} "
                 f"significant (adjusted p < {alpha:g} and beyond the noise floor).")
    return Family(comparisons=tuple(out), holm=h, statement=statement)
