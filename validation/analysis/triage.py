"""Performance triage analysis (issue 17, seed 000): the cost exponent of a scan, cliffs between neighbouring scan
points, bisection of a cliff, and the ranking of suspects by their effect. Pure functions, no torch; the `scan` and
`triage` step kinds (validation/kinds/scan/, triage/) measure, this module decides.

Throughput series are autocorrelated and drift, so nothing here treats per-step values as samples: a scan point is
the window mean of each of its runs (one per repeat), its noise the spread of those run means (pooled over the
points, on the log scale: a machine's noise is relative), or, for one run per point, the block means of its
per-step series (validation.analysis.significance.block_units); suspects are compared paired over interleaved repeats
(validation.analysis.significance.compare_paired) with Holm's correction over the suspects.

Block means measure only the noise within one run's window, never how much the next launch's level differs (3%
run-to-run noise at a true exponent equal to `expected` made a one-run-a-point scan call a false cliff in 16-92% of
simulated scans, the more the quieter the window). So a point's noise is held to at least one launch's share of the
runbook's declared launch noise (`compare.launch_sd`, significance.PairNoise) where it declares one; where it
declares none, a pair of one-run points whose block noise alone would call a cliff is `inconclusive`, never a cliff.

    fit_exponent     OLS of log(step time) on log(value) over every run: the slope ("cost exponent": ~1 linear,
                     ~2 quadratic), its standard error and t-interval on the residuals
    point_noise      per point: mean of log(step time), its standard error and degrees of freedom, held to the
                     declared launch noise (`floor`) where there is one
    find_cliffs      the local exponent between neighbouring points, log(t_b / t_a) / log(v_b / v_a), tested
                     one-sided against `expected` (default 1.5) with its noise; Holm over the pairs; the cliff is
                     the first pair whose exponent is significantly above `expected` and whose points' noise covers
                     the run-to-run noise (else the pair is inconclusive)
    bisect           between a good and a bad value: midpoints rounded to `multiple_of`, each classified by a
                     callable, until the interval is no wider than `resolution` or the steps are spent
    rank_suspects    each suspect's relative throughput change against the slow configuration (paired over
                     repeats), Holm over the suspects; the culprit is the largest significant improvement beyond
                     the noise floor, and only when it also beats, paired over the same repeats, every other
                     suspect whose estimated change is as large as a culprit's must be (as a sweep's winner beats
                     every other point), else None (`tied`: the suspects the data cannot tell apart)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from validation.formatting import fmt_pct
from validation.analysis.significance import (ALPHA, PairNoise, StatsError, adjust_family, block_units, compare_paired, holm,
                                     t_ppf)
from validation.analysis.stats import t_sf2

EXPECTED_EXPONENT = 1.5  # above this the cost grows faster than NSA's linear-plus-quadratic-compressed law
# A culprit explains a slowdown worth triaging: its change moves tokens/s by at least this much (seed 000's cliffs
# are several-fold; a few percent is a tuning, not the cause of a slow configuration)
CULPRIT_MIN_EFFECT = 0.10


def _json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def _plain(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def _positive(values: Sequence[float], what: str) -> np.ndarray:
    x = np.asarray([float(v) for v in values], dtype="float64")
    if x.size and not (np.all(np.isfinite(x)) and np.all(x > 0)):
        raise StatsError(f"{what}: expected positive finite numbers, got {list(values)!r}")
    return x


# ---------------------------------------------------------------------------------------------- exponent
@dataclass(frozen=True)
class Fit:
    """log(time) = intercept + slope * log(value), least squares over every run (repeats are separate points).
    ci_low/ci_high: the (1 - alpha) t-interval of the slope (residual variance, n - 2 df); r2: the fit's R^2."""

    slope: float
    intercept: float
    se: float
    df: int
    ci_low: float
    ci_high: float
    n: int
    values: int
    r2: float
    alpha: float

    def as_dict(self) -> dict[str, Any]:
        return _json(asdict(self))


def fit_exponent(points: Sequence[tuple[float, float]], alpha: float = ALPHA) -> Fit:
    """The cost exponent of (value, step time) pairs: at least 3 pairs over at least 2 distinct values, all > 0."""
    if len(points) < 3:
        raise StatsError(f"an exponent fit needs at least 3 runs, got {len(points)}")
    x = np.log(_positive([p[0] for p in points], "scan values"))
    y = np.log(_positive([p[1] for p in points], "step times"))
    if np.unique(x).size < 2:
        raise StatsError("an exponent fit needs at least 2 distinct values")
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - ym)).sum() / sxx)
    intercept = float(ym - slope * xm)
    resid = y - (intercept + slope * x)
    df = x.size - 2
    s2 = float(resid @ resid) / df
    se = math.sqrt(s2 / sxx)
    half = t_ppf(1.0 - alpha / 2.0, df) * se
    syy = float(((y - ym) ** 2).sum())
    r2 = 1.0 - float(resid @ resid) / syy if syy > 0 else 1.0
    return Fit(slope=slope, intercept=intercept, se=se, df=int(df), ci_low=slope - half, ci_high=slope + half,
               n=int(x.size), values=int(np.unique(x).size), r2=r2, alpha=float(alpha))


# ---------------------------------------------------------------------------------------------- noise per point
@dataclass(frozen=True)
class PointNoise:
    """One scan point on the log scale: mean of log(step time) over its runs, the standard error of that mean,
    its degrees of freedom (None: no noise estimate) and where the noise came from ("repeats": pooled spread of
    the run means of all points; "blocks": block means of the one run's series; "declared": one launch's share of
    the runbook's declared launch noise, which the other figure was below or missing; "none"). `run_noise`: whether
    se covers the run-to-run noise (repeats, or held to the declared launch noise); block means alone never do."""

    value: float
    log_mean: float
    se: float | None
    df: float | None
    runs: int
    source: str
    run_noise: bool = False


def point_noise(runs: Mapping[float, Sequence[float]],
                series: Mapping[float, Sequence[float]] | None = None,
                floor: PairNoise | None = None) -> dict[float, PointNoise]:
    """{value: PointNoise} from each point's run-level step times (one per repeat). With repeats at any point, the
    spread of log run means pooled over the points (sum of within-point squares / sum of (runs - 1)) gives every
    point's se = s / sqrt(runs). Otherwise a point whose per-step series (`series`, its window) has enough steps
    gets its noise from block_units (relative se of the block means); else it has none (se None).
    `floor`: the runbook's declared launch noise (significance.PairNoise: sd of one launch pair's log-ratio); every
    point's se is held to at least one launch's share of it, floor.sd / sqrt 2, over sqrt(runs), as
    significance.decision holds one repeat's noise: with repeats keeping their pooled degrees of freedom, with one
    run a point taking the declared figure's (floor.launch_noise(): pairs - 1) where it is the larger."""
    groups = {float(v): np.log(_positive(ts, f"step times at {v}")) for v, ts in runs.items() if len(ts)}
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in groups.values())
    dof = sum(g.size - 1 for g in groups.values())
    pooled = math.sqrt(ss / dof) if dof > 0 else None
    declared = floor.launch_noise() if floor is not None else None
    out = {}
    for v, g in sorted(groups.items()):
        least = declared.total / math.sqrt(g.size) if declared is not None else None
        if pooled is not None:
            se = pooled / math.sqrt(g.size)
            out[v] = PointNoise(v, float(g.mean()), se if least is None else max(se, least), float(dof), int(g.size),
                                "repeats", True)
            continue
        se = df = None
        source = "none"
        seq = (series or {}).get(v)
        if seq is not None:
            try:
                u = block_units(list(seq))
                se, df, source = u.rel_se, u.df, "blocks"
            except StatsError:
                pass
        if least is not None and (se is None or se < least):
            se, df, source = least, declared.df, "declared"
        out[v] = PointNoise(v, float(g.mean()), se, df, int(g.size), source, least is not None)
    return out


# ---------------------------------------------------------------------------------------------- cliffs
@dataclass(frozen=True)
class Pair:
    """Neighbouring points a < b: the local exponent log(t_b / t_a) / log(v_b / v_a), its (1 - alpha) interval,
    the one-sided p of "exponent <= expected" (None without noise), Holm-adjusted over the pairs, and whether it
    is a cliff (adjusted p < alpha: the exponent is above `expected` by more than its noise). `inconclusive`: the
    adjusted p is below alpha but a point's noise is its window's block means alone (one run, no declared launch
    noise): the run-to-run noise is unknown, so it is no cliff (as_dict writes the key only when true)."""

    a: float
    b: float
    exponent: float
    ci_low: float | None
    ci_high: float | None
    p: float | None
    p_adjusted: float | None
    cliff: bool
    time_ratio: float
    inconclusive: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = _json(asdict(self))
        if not self.inconclusive:
            del out["inconclusive"]
        return out


def local_exponent(pa: PointNoise, pb: PointNoise, expected: float = EXPECTED_EXPONENT,
                   alpha: float = ALPHA) -> Pair:
    """The local exponent between two points and its one-sided test against `expected` (not yet adjusted)."""
    dlog = math.log(pb.value / pa.value)
    if dlog <= 0:
        raise StatsError(f"local exponent: expected {pb.value} > {pa.value}")
    e = (pb.log_mean - pa.log_mean) / dlog
    ratio = math.exp(pb.log_mean - pa.log_mean)
    if pa.se is None or pb.se is None or pa.df is None or pb.df is None:
        return Pair(pa.value, pb.value, e, None, None, None, None, False, ratio)
    va, vb = pa.se ** 2, pb.se ** 2
    se = math.sqrt(va + vb) / dlog
    if pa.source == pb.source and pa.source in ("repeats", "declared"):
        df = pa.df  # one pooled estimate, or the one declared launch noise
    else:
        num, den = (va + vb) ** 2, (va ** 2 / pa.df if pa.df > 0 else 0) + (vb ** 2 / pb.df if pb.df > 0 else 0)
        df = num / den if den > 0 else max(pa.df, pb.df, 1.0)
    df = max(float(df), 1.0)
    if se == 0:
        p = 0.0 if e > expected else 1.0
        half = 0.0
    else:
        t = (e - expected) / se
        tail = 0.5 * t_sf2(t, df)
        p = tail if t > 0 else 1.0 - tail
        half = t_ppf(1.0 - alpha / 2.0, df) * se
    return Pair(pa.value, pb.value, e, e - half, e + half, float(p), None, False, ratio)


@dataclass(frozen=True)
class Cliffs:
    """Every neighbouring pair (Holm-adjusted), the cliff (the first pair that is one) or None, and why not;
    `inconclusive`: the first pair that would be a cliff on its points' block noise alone, whose run-to-run noise
    is unknown (one run a point, no declared launch noise), when no pair is a cliff, else None."""

    pairs: tuple[Pair, ...]
    cliff: Pair | None
    expected: float
    reason: str
    inconclusive: Pair | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"pairs": [p.as_dict() for p in self.pairs], "cliff": self.cliff.as_dict() if self.cliff else None,
                "expected": self.expected, "reason": self.reason,
                "inconclusive": self.inconclusive.as_dict() if self.inconclusive else None}


# What a scan with one run a point and no declared launch noise is told to change (validation.kinds.scan)
RUN_NOISE_FIX = ("use repeats >= 2 per point (their spread measures it) or declare the runbook's launch noise, "
                 "`compare: {launch_sd, pairs}` from A/A pairs (benchmarks/bench_aa_compare.py)")


def find_cliffs(noise: Mapping[float, PointNoise], expected: float = EXPECTED_EXPONENT,
                alpha: float = ALPHA) -> Cliffs:
    """Test every neighbouring pair of points (sorted by value) for a local exponent above `expected`, Holm over
    the pairs that have a noise estimate; the cliff is the lowest such pair whose points' noise covers the
    run-to-run noise (PointNoise.run_noise). A pair significant on block noise alone (one run a point, no declared
    launch noise) is inconclusive, not a cliff: one window's block means cannot see how far the next launch's level
    lies, and a scan at the expected exponent with 3% run-to-run noise called such false cliffs in most scans."""
    pts = [noise[v] for v in sorted(noise)]
    if len(pts) < 2:
        raise StatsError(f"cliff detection needs at least 2 points, got {len(pts)}")
    raw = [local_exponent(a, b, expected, alpha) for a, b in zip(pts, pts[1:])]
    known = [a.run_noise and b.run_noise for a, b in zip(pts, pts[1:])]
    h = holm([p.p for p in raw], alpha)
    pairs = tuple(Pair(**{**asdict(p), "p_adjusted": adj, "cliff": bool(rej) and ok,
                          "inconclusive": bool(rej) and not ok})
                  for p, adj, rej, ok in zip(raw, h.adjusted, h.rejected, known))
    cliff = next((p for p in pairs if p.cliff), None)
    unsure = next((p for p in pairs if p.inconclusive), None) if cliff is None else None
    if cliff is not None:
        reason = (f"between {cliff.a:g} and {cliff.b:g} the step time grows x{cliff.time_ratio:.2f}: a local exponent "
                  f"of {cliff.exponent:.2f} (95% CI {cliff.ci_low:.2f} .. {cliff.ci_high:.2f}), above {expected:g} "
                  f"(Holm-adjusted p = {cliff.p_adjusted:.2g} over {h.m} pairs)")
    elif unsure is not None:
        reason = (f"inconclusive: between {unsure.a:g} and {unsure.b:g} the step time grows x{unsure.time_ratio:.2f}, "
                  f"a local exponent of {unsure.exponent:.2f}, above {expected:g} beyond the noise within each "
                  f"run's window (Holm-adjusted p = {unsure.p_adjusted:.2g} over {h.m} pairs), but with one run a "
                  "point and no declared launch noise the run-to-run noise is unknown, so no cliff is established; "
                  + RUN_NOISE_FIX)
    elif h.m == 0:
        reason = ("no noise estimate for the points (one run each with too few steps for block means): "
                  "no cliff can be called; " + RUN_NOISE_FIX)
    else:
        top = max(pairs, key=lambda p: p.exponent)
        reason = (f"no local exponent significantly above {expected:g} (largest {top.exponent:.2f} between "
                  f"{top.a:g} and {top.b:g})")
    return Cliffs(pairs=pairs, cliff=cliff, expected=float(expected), reason=reason, inconclusive=unsure)


# ---------------------------------------------------------------------------------------------- bisection
@dataclass
class Bisection:
    """The interval [good, bad] the cliff lies in after bisection, the points measured ((value, verdict) with
    verdict "bad", "good" or None = undecided), whether width <= resolution, and why the search stopped."""

    good: float
    bad: float
    resolution: float
    points: list[tuple[float, str | None]] = field(default_factory=list)
    stopped: str = ""

    @property
    def width(self) -> float:
        return self.bad - self.good

    @property
    def localised(self) -> bool:
        return self.width <= self.resolution

    def as_dict(self) -> dict[str, Any]:
        return {"interval": [_plain(self.good), _plain(self.bad)], "width": self.width, "resolution": self.resolution,
                "localised": self.localised, "points": [[_plain(v), verdict] for v, verdict in self.points], "stopped": self.stopped}


def midpoint(good: float, bad: float, multiple_of: int | float = 1) -> float | None:
    """The midpoint rounded to the nearest multiple of `multiple_of` strictly between good and bad, else None."""
    m = multiple_of
    mid = round((good + bad) / 2.0 / m) * m
    if not min(good, bad) < mid < max(good, bad):  # rounded onto an end: try the multiples next to it
        inside = [c for c in (mid - m, mid + m) if min(good, bad) < c < max(good, bad)]
        if not inside:
            return None
        mid = min(inside, key=lambda c: abs(c - (good + bad) / 2.0))
    return int(mid) if float(mid).is_integer() else mid


def bisect(classify: Callable[[float], bool | None], good: float, bad: float, *, resolution: float,
           steps: int, multiple_of: int | float = 1) -> Bisection:
    """Bisect between `good` (no cliff at or below it) and `bad` (past the cliff): classify(mid) is True when mid
    is past the cliff (bad), False when not (good), None when it cannot tell (the search stops there). Stops when
    the interval is no wider than `resolution`, after `steps` measurements, or when no multiple of `multiple_of`
    lies strictly inside the interval."""
    if not good < bad:
        raise StatsError(f"bisect: expected good < bad, got {good!r} and {bad!r}")
    if not resolution > 0 or not multiple_of > 0 or steps < 0:
        raise StatsError("bisect: resolution and multiple_of must be positive, steps >= 0")
    b = Bisection(good=good, bad=bad, resolution=resolution)
    while True:
        if b.localised:
            b.stopped = f"interval width {b.width:g} <= resolution {resolution:g}"
            break
        if len(b.points) >= steps:
            b.stopped = f"{steps} bisection steps spent"
            break
        mid = midpoint(b.good, b.bad, multiple_of)
        if mid is None:
            b.stopped = f"no multiple of {multiple_of:g} inside ({b.good:g}, {b.bad:g})"
            break
        verdict = classify(mid)
        b.points.append((mid, None if verdict is None else "bad" if verdict else "good"))
        if verdict is None:
            b.stopped = f"could not classify {mid:g} (its runs failed or their noise is unknown)"
            break
        if verdict:
            b.bad = mid
        else:
            b.good = mid
    return b


# ---------------------------------------------------------------------------------------------- suspects
@dataclass(frozen=True)
class Ranking:
    """Suspects ranked by effect (largest improvement of the metric first): validation.analysis.significance Comparisons of
    each suspect against the slow configuration, Holm-adjusted over the suspects; the culprit, and why."""

    comparisons: tuple[Any, ...]
    culprit: str | None
    reason: str
    statement: str
    unranked: dict[str, str] = field(default_factory=dict)  # suspect -> why it could not be compared
    # no single culprit: the suspect that would be it and the suspects it does not beat (ranking order), else ()
    tied: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"ranking": [c.variant for c in self.comparisons], "culprit": self.culprit, "reason": self.reason,
                "statement": self.statement,
                "suspects": {c.variant: c.as_dict() for c in self.comparisons}, "unranked": dict(self.unranked),
                "tied": list(self.tied)}


def rank_suspects(baseline: Sequence[float | None], suspects: Mapping[str, Sequence[float | None]], *,
                  higher_is_better: bool = True, alpha: float = ALPHA, metric: str = "toks_per_s",
                  noise: float | None = None, min_effect: float = CULPRIT_MIN_EFFECT,
                  pair_noise: PairNoise | None = None) -> Ranking:
    """baseline[r], suspects[name][r]: the run means of repeat r (None: failed run). Each suspect is compared with
    the baseline, paired over repeats; Holm over the suspects; ranked by the improvement (rel, signed so that
    better is larger). The culprit: the suspect whose change improves the metric the most among those significant
    (adjusted p < alpha and beyond the noise floor), by at least `min_effect`, and in every repeat (a replicated
    effect, not one repeat's luck); None when none is. That suspect is the culprit only when it also beats every
    other suspect whose estimated change is at least `min_effect` too (one that could itself be named), each
    compared with it paired over the same repeats as a decision's best is with every other point (significantly,
    beyond the noise floor and ahead in every repeat: an intersection of tests at `alpha`, so no further
    correction); else there is no single culprit, and `tied` holds it and the suspects it does not beat (the data
    cannot tell them apart: config 100/102/98/101 tok/s, a 150/155/146/151 and b 149/154/147/150.5 are both +50% on
    the configuration, a only +0.2% on b, 95% CI -0.8% .. +1.3%). `pair_noise`: the least sd of one repeat's
    log-ratio (the runbook's declared launch noise, significance.PairNoise). A suspect that cannot be compared
    (fewer than 2 repeats with both runs measured: its runs failed or were left out) is left out of the ranking and
    of Holm's family, and named in `unranked` and the reason; StatsError only when no suspect can be compared."""
    if not suspects:
        raise StatsError("triage needs at least one suspect")
    comps, unranked = [], {}
    for name, runs in suspects.items():
        try:
            comps.append(compare_paired(baseline, runs, higher_is_better=higher_is_better, alpha=alpha, noise=noise,
                                        baseline="config", variant=name, metric=metric, pair_noise=pair_noise))
        except StatsError as exc:
            unranked[str(name)] = str(exc)
    if not comps:
        if len(unranked) == 1:
            raise StatsError(next(iter(unranked.values())))
        raise StatsError("no suspect could be compared: " + "; ".join(f"{k}: {v}" for k, v in unranked.items()))
    family = adjust_family(comps, alpha)
    sign = 1.0 if higher_is_better else -1.0
    ranked = tuple(sorted(family.comparisons, key=lambda c: -sign * c.rel))

    def every_repeat(name: str, against: Sequence[float | None] = baseline) -> bool:
        """The suspect's change improves the metric in every repeat where both runs were measured (against the
        configuration, or another suspect's runs)."""
        pairs = [(a, b) for a, b in zip(against, suspects[name]) if a and b and a > 0 and b > 0]
        return bool(pairs) and all(sign * math.log(b / a) > 0 for a, b in pairs)

    def head_to_head(c: Any, other: Any) -> tuple[bool, str]:
        """Whether suspect c beats suspect `other` paired over the repeats both were measured in (significantly,
        beyond the noise floor, ahead in every one), and the comparison in words; where they share fewer than 2
        such repeats the data cannot order them."""
        try:
            h = compare_paired(suspects[other.variant], suspects[c.variant], higher_is_better=higher_is_better,
                               alpha=alpha, noise=noise, baseline=other.variant, variant=c.variant, metric=metric,
                               pair_noise=pair_noise)
        except StatsError as exc:
            return False, f"not compared directly: {exc}"
        ahead = every_repeat(c.variant, suspects[other.variant])
        beats = h.significant and h.verdict == "better" and ahead
        return beats, h.describe() + ("" if ahead or not h.significant else "; not ahead in every repeat")

    better = [c for c in ranked if c.significant and c.verdict == "better"]
    named = [c for c in better if sign * c.rel >= min_effect and every_repeat(c.variant)]
    tied: tuple[str, ...] = ()
    if named:
        c = named[0]
        # the other contenders: suspects whose estimated change is itself as large as a culprit's must be
        # (one below it cannot be named, so cannot tie; comparing with every suspect would also cost power for
        # nothing: a +30% culprit among two suspects without effect, 3 repeats of 5% noise, named in 45% of
        # simulated triages instead of 53%)
        against = {o.variant: head_to_head(c, o) for o in ranked
                   if o.variant != c.variant and sign * o.rel >= min_effect}
        rivals = [o for o in ranked if o.variant in against and not against[o.variant][0]]
        if not rivals:
            reason = f"changing {c.variant} alone: {c.describe()}; ahead in every repeat"
            if against:  # the runner-up first: the ranking's order
                runner_up = next(iter(against))
                reason += f"; against the runner-up {runner_up}: {against[runner_up][1]}" + (
                    f"; it beats the other {len(against) - 1} suspect(s) of at least {min_effect:.0%} too"
                    if len(against) > 1 else "")
            culprit = c.variant
        else:
            culprit = None
            tied = (c.variant, *(o.variant for o in rivals))
            reason = (f"no single culprit: {c.variant} changes {metric} {fmt_pct(c.rel, signed=True)} (Holm-adjusted "
                      f"p = {c.p_adjusted:.2g}) but the data cannot tell it apart from "
                      + ", ".join(f"{o.variant} ({fmt_pct(o.rel, signed=True)}, Holm-adjusted p = "
                                  f"{o.p_adjusted:.2g})" for o in rivals)
                      + ": " + "; ".join(f"{c.variant} against {o.variant}: {against[o.variant][1]}" for o in rivals)
                      + "; tied: " + ", ".join(tied))
    else:
        culprit = None
        top = ranked[0]
        if better:
            c = better[0]
            why = (f"below the {min_effect:.0%} a culprit must explain" if sign * c.rel < min_effect
                   else "not ahead in every repeat")
            reason = (f"no culprit: {c.variant} changes {metric} significantly ({fmt_pct(c.rel, signed=True)}, "
                      f"Holm-adjusted p = {c.p_adjusted:.2g}) but {why}")
        else:
            worse = [c for c in ranked if c.significant]  # significant, and none better: they make it worse
            if worse:
                reason = (f"no suspect improves {metric} significantly beyond the noise floor; significantly worse: "
                          + ", ".join(f"{c.variant} {fmt_pct(c.rel, signed=True)} (Holm-adjusted p = "
                                      f"{c.p_adjusted:.2g})" for c in worse))
            else:
                reason = (f"no suspect changes {metric} significantly beyond the noise floor (largest: {top.variant} "
                          f"{fmt_pct(top.rel, signed=True)}, Holm-adjusted p = {top.p_adjusted:.2g})")
    if unranked:
        reason += "; not compared: " + "; ".join(f"{k} ({v})" for k, v in unranked.items())
    return Ranking(comparisons=ranked, culprit=culprit, reason=reason, statement=family.statement, unranked=unranked,
                   tied=tied)
