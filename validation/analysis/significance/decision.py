"""The decision of a sweep or an A/B step: a winner only when the data say so, else the default is kept.

Rule (decide()):
  1. Each variant's runs are reduced to a level: one run each -> block means of its steps (block_units);
     repeats -> run means, compared pairwise by repeat (compare_paired) so that drift cancels.
  2. The variants are ranked by level (a rate's level: the runs' work over their time, as the comparison shows it);
     the best is compared with every other one (variant = best, baseline = the other).
  3. The best is the winner only when it beats every other variant significantly (p < alpha) and by more than the
     noise floor. For two variants that is the two-sided test at level alpha; with more, the best must also be
     ahead of the others and clear each of them, so a false winner is rarer still: 0.5-0.9% of simulated
     3-variant sweeps without a true difference, with repeats or without drift; 5% with one run per variant
     under cpu_smoke's drift, which block means of single runs cannot see (min_repeats=2 refuses those).
  4. Otherwise there is no winner. The "top group" is the best and every variant it does not beat. The default
     (or the first stated preference) is kept: "no significant difference", a passed decision. Only when the best
     beats the default at p < alpha / (k - 1) (Bonferroni over the k - 1 variants that could have beaten it: with
     no true difference this path leaves the default in at most alpha / 2 of the decisions) but cannot be
     separated from another variant, the choice moves to the first stated preference in the top group that itself beats
     the default significantly (and, with repeats, in every replication block: rule 6), else to the best, and the
     decision says so (significant: True).
  5. recommended_repeats says how many interleaved repeats would detect `effect` (5%) with `power` (80%) at the
     noise measured, so that a report can say what it would take.
  6. Replicated, undisturbed effects only. Runs measured while other work used the machine (`disturbed`) are left
     out before anything is compared. With interleaved repeats, a difference counts (a winner, the default beaten)
     only when it goes the same way in every interleaved block (REPLICATION_BLOCKS: each repeat up to three, then
     the first, middle and last third), not only on average: one odd stretch can make a paired t significant on
     its own. Where the runbook declares how much one launch differs from the next when nothing changed
     (`pair_noise`: its `compare.launch_sd`, measured from A/A pairs), one repeat's noise is held to at least that:
     two repeats that agree by chance (a paired t with 1 degree of freedom) decide nothing.
  7. The random run orders, not only the t model. Each repeat's order is drawn at random (interleaved_order), so
     with no true difference the sign of each repeat's log-ratio is a fair coin whatever the machine's drift did: the
     sign-flip test over the 2^R orders the repeats could have had (order_randomization_p) is exact. The paired t
     is not where the drift between a repeat's runs is about as large in every repeat as the runs' own noise: its
     log-ratios are then +-D plus noise, and repeats whose coin flips agree look like a replicated effect. Two
     identical arms, 20,000 simulated A/Bs a cell (benchmarks/bench_significance.py --only ab): the t and
     replication alone gave 5.1% false winners with 6 repeats of cpu_smoke's model and 6.5% (6.1-6.8%) with quieter
     runs (1% step noise) under the same kind of drift; with this test 2.6% and 3.1%. So wherever the sign-flip test
     can reach the level (6 or more repeats at p < 0.05: 2 / 2^R < alpha) a difference counts only when it, too, is
     below the level; that keeps false winners at alpha or below whatever the drift. Its price is at 6-7 repeats
     (there it needs nearly every repeat the same way: a true 5% found in 7.2% of cpu_smoke's 6-repeat A/Bs instead
     of 13.5%), little from 10 (20.6% against 21.7%), none at 20. With 2-5 repeats no order test can reach
     p < 0.05 and the t model stands alone: 5.7-6.6% false winners under cpu_smoke's model, 7.1-8.2% with the
     quieter runs; a runbook's declared launch_sd (pair_noise) is the bound those decisions rest on.
     A decision is `recommendable` (its setting may be exported, validation.execution.acceptance)
     only when it rests on a significant, replicated difference of interleaved repeats; one run per variant can
     choose what later steps run with, never what a user is told to set.
interleaved_order() gives the run order for repeats: each repeat runs every variant once, in a random order
(plain A B C A B C would give B a constant head start over A under a steady drift; see its docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from validation.analysis import metrics
from validation.formatting import fmt_pct
from validation.analysis.significance.comparison import (ALPHA, MIN_FLOOR, Comparison, PairNoise, RunNoise,
                                                         compare_paired, compare_units, paired_cv, paired_pairs,
                                                         shown_mean)
from validation.analysis.significance.power import EFFECT, POWER, REPLICATION_BLOCKS, recommended_repeats
from validation.analysis.significance.units import MIN_BLOCKS, Units, run_units
from validation.analysis.significance.windows import window_units
from validation.analysis.stats import StatsError

RunData = Sequence[float] | float | None  # one run: its per-step series (after warm-up), its mean, or None (failed)




def replicated_blocks(d: Sequence[float] | np.ndarray, blocks: int = REPLICATION_BLOCKS) -> bool:
    """Whether the per-repeat differences `d` (in run order, signed so that the effect is positive) have a positive
    mean in each of min(len(d), blocks) consecutive blocks."""
    d = np.asarray(d, dtype="float64")
    k = min(int(d.size), int(blocks))
    return bool(k > 0 and all(part.mean() > 0 for part in np.array_split(d, k)))


# sign patterns of the order test enumerated exactly up to this many repeats; beyond, a seeded sample of them
EXACT_ORDER_REPEATS = 16
ORDER_SAMPLES = 1 << 16


def order_test_reaches(repeats: int, level: float) -> bool:
    """Whether the sign-flip test over `repeats` randomly ordered repeats can give p < level: its smallest two-sided
    p is 2 / 2^repeats (every repeat the same way, and its mirror)."""
    return repeats >= 2 and 2.0 ** (1 - repeats) < level


def order_randomization_p(d: Sequence[float] | np.ndarray) -> float:
    """Two-sided p of "no difference" from the random run orders alone: the share of the 2^R sign patterns of the
    per-repeat log-ratios `d` whose sum is at least as far from 0 as the observed one. With no true difference and
    each repeat's order drawn at random, swapping a repeat's two runs only flips its log-ratio's sign, so every
    pattern is equally likely whatever the machine did: the p is exact (a uniform draw of the patterns, counted
    with the observed one, (b + 1) / (m + 1), beyond EXACT_ORDER_REPEATS repeats; seeded: the same d, the same p)."""
    d = np.asarray(d, dtype="float64").ravel()
    if d.size < 1 or not np.all(np.isfinite(d)):
        raise StatsError(f"order_randomization_p: expected finite log-ratios, got {d.tolist()!r}")
    a = np.abs(d)
    observed = abs(float(d.sum()))
    tol = 1e-12 * max(float(a.sum()), 1e-300)
    sums = np.abs(_signed_sums(a))
    if d.size <= EXACT_ORDER_REPEATS:
        return float(np.mean(sums >= observed - tol))
    return float((np.sum(sums >= observed - tol) + 1) / (ORDER_SAMPLES + 1))


def _sign_patterns(repeats: int) -> np.ndarray:
    """The +-1 sign patterns order_randomization_p sums over, [patterns, repeats] in float64: all 2^repeats up to
    EXACT_ORDER_REPEATS, else ORDER_SAMPLES drawn by a generator seeded with the repeat count (the same for every
    call with as many repeats). Made once per repeat count, as their bytes (_pattern_codes)."""
    if repeats <= EXACT_ORDER_REPEATS:
        bits = (np.arange(1 << repeats)[:, None] >> np.arange(repeats)[None, :]) & 1
        patterns = 1.0 - 2.0 * bits
    else:
        patterns = np.random.default_rng(repeats).choice((-1.0, 1.0), size=(ORDER_SAMPLES, repeats))
    return patterns


# repeats per byte of a sign pattern: each byte's signed sums are one table of 256, looked up for every pattern
ORDER_BYTE = 8
_BYTE_SIGNS = _sign_patterns(ORDER_BYTE)  # all 256 (ORDER_BYTE <= EXACT_ORDER_REPEATS)


@lru_cache(maxsize=2)
def _pattern_codes(repeats: int) -> np.ndarray:
    """_sign_patterns(repeats) as bytes, [ceil(repeats / 8), patterns] (intp, the index type a lookup uses without a
    copy): bit j of byte g set where repeat 8g + j is negated. Kept for the two repeat counts used last: drawing
    65,536 x 50 patterns took about 0.1-0.3 s a decision."""
    negated = _sign_patterns(repeats) < 0
    weights = 1 << np.arange(ORDER_BYTE)
    codes = np.stack([negated[:, g:g + ORDER_BYTE] @ weights[:min(ORDER_BYTE, repeats - g)]
                      for g in range(0, repeats, ORDER_BYTE)]).astype(np.intp)
    codes.flags.writeable = False
    return codes


def _signed_sums(a: np.ndarray) -> np.ndarray:
    """sum_j s_ij a_j for every sign pattern s_i of _sign_patterns(a.size), a byte at a time: the 256 signed sums of
    each byte's repeats, looked up by every pattern's byte and added. The same sums as the [patterns, repeats] matmul
    (to rounding), which read 52 MB of patterns a call at 100 repeats: 4-5x slower, most of a simulated sweep's time."""
    codes = _pattern_codes(a.size)
    total = np.zeros(codes.shape[1])
    for g in range(codes.shape[0]):
        part = a[g * ORDER_BYTE:(g + 1) * ORDER_BYTE]
        total += (_BYTE_SIGNS[:, :part.size] @ part)[codes[g]]
    return total


def interleaved_order(labels: Sequence[str], repeats: int, seed: int | None = None) -> list[tuple[int, str]]:
    """(repeat, label) in run order: every repeat runs each variant once, in an order drawn at random for that
    repeat (a randomized complete block design; `seed` makes it reproducible: derive it from the run, record it).

    Why random: the paired test needs each repeat's log-ratio to carry the drift between its two runs as noise
    around zero. Simulated with cpu_smoke's noise, 3-10 repeats of 3 variants, no true difference
    (benchmarks/bench_significance.py, orders): a fixed order (A B C A B C) gives B a constant head start over A
    under a steady drift of 0.1%/step and its paired test rejects in 10-28% of sweeps; rotations (A B C, B C A,
    ...) and serpentines (A B C, C B A, ...) cancel a linear drift but not one that turns within a few repeats
    (10-18% under cpu_smoke's drift); random orders give 4-7% under all three drifts. Random orders are also what
    makes the decision's sign-flip test exact (order_randomization_p, rule 7), which keeps false winners at alpha
    from 6 repeats on whatever the drift.
    """
    labels = list(labels)
    if not labels or len(set(labels)) != len(labels):
        raise StatsError(f"interleaved_order: expected distinct labels, got {labels!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise StatsError(f"repeats: expected a positive integer, got {repeats!r}")
    rng = np.random.default_rng(seed)
    return [(r, labels[i]) for r in range(repeats) for i in rng.permutation(len(labels))]


@dataclass(frozen=True)
class Decision:
    """What a sweep or an A/B decided.

    winner:              the variant that beats every other one significantly and beyond the noise floor, else None
    choice:              the variant to use: the winner; else the default/preference kept; else (the default
                         beaten) the best of the top group; None when there is no winner and nothing to keep
    default:             the runbook's default (None when it named none)
    kept_default:        choice == default without a significant result against it
    significant:         the choice rests on a significant difference (a winner, or the default beaten)
    comparison:          the comparison behind the decision: best vs runner-up (or best vs the default when it
                         was beaten); None with fewer than 2 measured variants
    comparisons:         best vs each other variant
    ranking:             measured variants, best first, with their means
    method:              "blocks" (one run per variant), "paired" (interleaved repeats) or "runs"; None when
                         nothing was compared
    repeats:             runs per variant used (the fewest over variants)
    noise_floor:         the runner-up comparison's noise floor
    cv:                  noise of one run mean behind recommended_repeats (paired: sd of log-ratios / sqrt 2;
                         one run each: the largest relative standard error of a run mean, a lower bound)
    recommended_repeats: interleaved repeats that detect `effect` with `power` at that noise (None: more than
                         MAX_REPEATS, or no noise estimate)
    effect, power, alpha: the targets behind recommended_repeats and the significance level
    excluded:            variants without usable data, with the reason
    reason:              the decision in words
    replicated:          the decisive difference went the same way in every interleaved repeat (None: no repeats,
                         or nothing significant to replicate)
    recommendable:       significant, replicated and from interleaved repeats: a setting a user may be told to use
    recommendation:      why the choice is or is not recommendable, in words
    disturbed_runs:      (label, repeat) of the runs left out because other work used the machine while they ran
    """

    winner: str | None
    choice: str | None
    default: str | None
    kept_default: bool
    significant: bool
    comparison: Comparison | None
    comparisons: tuple[Comparison, ...]
    ranking: tuple[tuple[str, float], ...]
    method: str | None
    repeats: int
    noise_floor: float | None
    cv: float | None
    recommended_repeats: int | None
    effect: float
    power: float
    alpha: float
    excluded: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    reason: str = ""
    replicated: bool | None = None
    recommendable: bool = False
    recommendation: str = ""
    disturbed_runs: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner, "choice": self.choice, "default": self.default,
            "kept_default": self.kept_default, "significant": self.significant,
            "comparison": self.comparison.as_dict() if self.comparison else None,
            "comparisons": [c.as_dict() for c in self.comparisons],
            "ranking": [{"label": k, "mean": v} for k, v in self.ranking],
            "method": self.method, "repeats": self.repeats, "noise_floor": self.noise_floor, "cv": self.cv,
            "recommended_repeats": self.recommended_repeats, "effect": self.effect, "power": self.power,
            "alpha": self.alpha, "excluded": [{"label": k, "reason": v} for k, v in self.excluded],
            "reason": self.reason, "replicated": self.replicated, "recommendable": self.recommendable,
            "recommendation": self.recommendation,
            "disturbed_runs": [{"label": k, "repeat": r} for k, r in self.disturbed_runs],
        }


@dataclass
class _Variant:
    label: str
    means: list[float | None]          # per repeat
    series: list[np.ndarray | None]    # per repeat (None: a mean was given, or the run failed)
    level: float = math.nan
    units: Units | None = None


def _as_runs(label: str, data: Sequence[RunData] | RunData, metric: str) -> _Variant:
    runs = list(data) if isinstance(data, (list, tuple)) else [data]
    means: list[float | None] = []
    series: list[np.ndarray | None] = []
    for r, run in enumerate(runs):
        if run is None:
            means.append(None)
            series.append(None)
        elif isinstance(run, (int, float, np.floating, np.integer)) and not isinstance(run, bool):
            v = float(run)
            means.append(v if math.isfinite(v) else None)
            series.append(None)
        else:
            x = np.asarray(run, dtype="float64").ravel()
            x = x[np.isfinite(x)]
            means.append(metrics.window_mean(x, metric) if x.size else None)  # the run's figure of its window
            series.append(x if x.size else None)
    return _Variant(label, means, series)


def _held_runs(units: Units, pair_noise: PairNoise | None) -> Units:
    """The means of a variant's repeated runs (run_units) with the standard error of their mean held to at least
    what the declared launch noise gives that many runs: one launch's share of a repeat's log-ratio sd,
    pair_noise.sd / sqrt 2, over sqrt(runs). Blunter, never sharper, the runs' own degrees of freedom kept (as
    compare_paired holds its log-ratios): two runs a side that agree by chance decide nothing. Unchanged without
    pair_noise."""
    if pair_noise is None or units.n < 1:
        return units
    least = abs(units.mean) * pair_noise.sd / math.sqrt(2.0 * units.n)
    return units if units.se >= least else replace(units, se=float(least))


def _unusable(v: _Variant, repeats_mode: bool, min_blocks: int) -> str | None:
    present = [m for m in v.means if m is not None]
    if not present:
        return "no measured run"
    if any(m <= 0 for m in present):
        return "a run mean is not positive"
    if repeats_mode and len(present) < 2:
        return f"{len(present)} of {len(v.means)} runs measured (repeats need 2)"
    if not repeats_mode:
        s = v.series[0] if v.series else None
        if s is None:
            return "one run without its per-step values"
        if s.size < 2 * min_blocks:
            return f"{s.size} steps (block means need {2 * min_blocks})"
    return None


def decide(runs: Mapping[str, Sequence[RunData] | RunData], *, default: str | None = None,
           preference: Sequence[str] = (), higher_is_better: bool = True, metric: str = "toks_per_s",
           alpha: float = ALPHA, min_floor: float = MIN_FLOOR, effect: float = EFFECT, power: float = POWER,
           min_blocks: int = MIN_BLOCKS, min_repeats: int = 1, run_noise: RunNoise | None = None,
           disturbed: Mapping[str, Sequence[bool]] | None = None, pair_noise: PairNoise | None = None) -> Decision:
    """Decide a sweep or an A/B (see the module docstring).

    runs: label -> the variant's runs in repeat order; each run is its per-step series of `metric` after
          warm-up (a sequence of floats), its mean (a float; only with repeats), or None (the run failed).
          One run per variant -> block means; two or more -> paired by repeat index.
    default: the runbook's default label (kept when there is no significant difference).
    preference: labels to prefer, in order, among variants that cannot be separated (after the default).
    run_noise: with one run per variant, the run-to-run variation measured elsewhere (comparison.run_noise, e.g.
          from repeated runs earlier in the same validation run), the least noise of each side of a block comparison;
          ignored with repeats, whose paired comparisons include it.
    min_repeats: declare a winner (or leave the default) only with at least this many runs per variant; 2 refuses
          single-run winners, whose significance cannot include drift between the runs.
    disturbed: label -> per repeat, whether that run was measured under interference (validation.launch.telemetry
          .interference); those runs are left out as if they had failed, and the decision says so.
    pair_noise: with repeats, the least sd of one repeat's log-ratio (comparison.PairNoise: the runbook's declared
          launch noise), so that a few repeats agreeing by chance do not decide; also behind the repeats advice.
          With one run each, each run's noise is held to at least one launch's share of it (PairNoise.launch_noise,
          taken as run_noise where that is smaller), as `compare` holds the same launches.
    """
    if isinstance(min_repeats, bool) or not isinstance(min_repeats, int) or min_repeats < 1:
        raise StatsError(f"min_repeats: expected a positive integer, got {min_repeats!r}")
    if not runs:
        raise StatsError("decide: no variants")
    labels = list(runs)
    for name in [default, *preference]:
        if name is not None and name not in runs:
            raise StatsError(f"decide: {name!r} (default/preference) is not one of the variants "
                             f"{', '.join(map(repr, labels))}")
    shaken: list[tuple[str, int]] = []
    if disturbed:
        cleaned: dict[str, list] = {}
        for k in labels:
            listed = list(runs[k]) if isinstance(runs[k], (list, tuple)) else [runs[k]]
            flags = list(disturbed.get(k) or [])
            for r, run in enumerate(listed):
                if r < len(flags) and flags[r] and run is not None:
                    shaken.append((k, r))
                    listed[r] = None
            cleaned[k] = listed
        runs = cleaned
    variants = [_as_runs(k, runs[k], metric) for k in labels]
    longest = max(len(v.means) for v in variants)
    repeats_mode = longest >= 2
    if not repeats_mode and pair_noise is not None:
        # one run each: each run's noise at least one launch's share of the declared launch noise, as `compare`
        # holds the same launches (a difference two single launches show when nothing changed decides nothing)
        run_noise = pair_noise.hold(run_noise)
    for v in variants:  # a variant with fewer runs listed lacks the last repeats
        v.means += [None] * (longest - len(v.means))
        v.series += [None] * (longest - len(v.series))
    excluded = []
    usable = []
    for v in variants:
        why = _unusable(v, repeats_mode, min_blocks)
        if why:
            excluded.append((v.label, why))
        else:
            usable.append(v)
    sign = 1.0 if higher_is_better else -1.0
    for v in usable:
        if repeats_mode:
            # the level the ranking shows is the comparison's (shown_mean): for a rate, the runs' work over their
            # time, so a ranking row and the comparison row of the same variant show one figure
            v.level = shown_mean([m for m in v.means if m is not None], metric)
        else:
            # the run's level is the mean over every step of its window, the figure its table shows: the
            # decision's comparison is then the A/B table's (windows.compare_windows) number for number
            v.units = window_units(v.series[0], min_blocks=min_blocks, metric=metric)
            v.level = v.units.mean
    usable.sort(key=lambda v: (-sign * v.level, labels.index(v.label)))
    ranking = tuple((v.label, v.level) for v in usable)
    common = dict(effect=effect, power=power, alpha=alpha, excluded=tuple(excluded), disturbed_runs=tuple(shaken))
    excl_text = ("; excluded: " + ", ".join(f"{k} ({why})" for k, why in excluded)) if excluded else ""
    if shaken:
        excl_text += ("; left out because other work used the machine while they ran: "
                      + ", ".join(f"{k} (repeat {r + 1})" for k, r in shaken))

    if len(usable) < 2:
        only = usable[0].label if usable else None
        # the default was measured, but its runs were left out as disturbed: nothing was compared, so it is kept
        default_shaken = default is not None and any(k == default for k, _ in shaken)
        choice = default if default_shaken or only is None else only
        how = " undisturbed" if shaken else ""
        text = (f"only {only} was measured{how}: nothing to compare" if only else f"no variant was measured{how}")
        if (only is None or default_shaken) and default is not None:
            text += f"; the default {default} is kept"
        return Decision(winner=None, choice=choice, default=default,
                        kept_default=choice is not None and choice == default, significant=False, comparison=None,
                        comparisons=(), ranking=ranking, method=None, repeats=0, noise_floor=None, cv=None,
                        recommended_repeats=None, reason=text + excl_text + ".",
                        recommendation="nothing is recommended: " + text, **common)

    kw = dict(higher_is_better=higher_is_better, alpha=alpha, min_floor=min_floor, metric=metric)

    def compare(base: _Variant, var: _Variant) -> Comparison:
        if repeats_mode:
            xa, _ = paired_pairs(base.means, var.means)
            if xa.size >= 2:
                return compare_paired(base.means, var.means, baseline=base.label, variant=var.label,
                                      pair_noise=pair_noise, **kw)
            # the repeats do not pair (disturbed or failed runs left out of different repeats): run means compared
            # unpaired, each held to the declared launch noise as the paired test holds its log-ratios (rule 6)
            ua = _held_runs(run_units([m for m in base.means if m is not None]), pair_noise)
            ub = _held_runs(run_units([m for m in var.means if m is not None]), pair_noise)
            return compare_units(ua, ub, baseline=base.label, variant=var.label, **kw)
        return compare_units(base.units, var.units, baseline=base.label, variant=var.label, run_noise=run_noise,
                             **kw)

    best, runner_up = usable[0], usable[1]
    try:
        comps = tuple(compare(v, best) for v in usable[1:])
    except StatsError as exc:  # e.g. a variant with repeats but fewer than 2 usable runs
        raise StatsError(f"decide: cannot compare the variants: {exc}") from None
    def same_way(base: _Variant, var: _Variant) -> bool | None:
        """Whether `var` is ahead of `base` in every replication block (None without repeats)."""
        if not repeats_mode:
            return None
        xa, xb = paired_pairs(base.means, var.means)
        if xa.size < 2:
            return None
        return replicated_blocks(np.log(xb / xa) * sign)

    def order_p(base: _Variant, var: _Variant) -> float | None:
        """The sign-flip p of `var` against `base` over the repeats' random orders (rule 7; None without repeats)."""
        if not repeats_mode:
            return None
        xa, xb = paired_pairs(base.means, var.means)
        return order_randomization_p(np.log(xb / xa)) if xa.size >= 2 else None

    def beyond_orders(base: _Variant, var: _Variant, level: float) -> bool:
        """Whether the difference is beyond what the random run orders alone give at `level`, where the sign-flip
        test can reach it (rule 7); True where it cannot, or without repeats."""
        xa, _ = paired_pairs(base.means, var.means) if repeats_mode else (np.empty(0), None)
        if not order_test_reaches(int(xa.size), level):
            return True
        p = order_p(base, var)
        return p is None or p < level

    by_label = {v.label: v for v in usable}
    unreplicated = [c.baseline for c in comps if c.significant and c.verdict == "better"
                    and same_way(by_label[c.baseline], best) is False]
    unordered = [c.baseline for c in comps if c.significant and c.verdict == "better"
                 and c.baseline not in unreplicated and not beyond_orders(by_label[c.baseline], best, alpha)]
    beaten = {c.baseline for c in comps if c.significant and c.verdict == "better"
              and c.baseline not in unreplicated and c.baseline not in unordered}
    top = [best.label] + [v.label for v in usable[1:] if v.label not in beaten]
    method = comps[0].method
    n_rep = min(sum(m is not None for m in v.means) for v in usable)

    # the noise of one run mean, behind the repeats advice
    if method == "paired":
        cv = paired_cv(runner_up.means, best.means)
        if pair_noise is not None:
            cv = max(cv, pair_noise.sd / math.sqrt(2.0))
    elif method == "runs":
        cv = max(float(np.std([m for m in v.means if m is not None], ddof=1)) / v.level for v in usable)
        if pair_noise is not None:
            cv = max(cv, pair_noise.sd / math.sqrt(2.0))
    else:
        floor_cv = run_noise.total if run_noise is not None else 0.0
        cv = max(max(v.units.rel_se, floor_cv) for v in usable)
    rec = recommended_repeats(cv, effect, alpha, power, len(usable), min_floor) if cv > 0 else 2
    if rec and order_test_reaches(rec, alpha) and not order_test_reaches(rec - 1, alpha):
        # there the order test (rule 7) needs every repeat the same way: at the effect the t finds with 80% power
        # in 6 repeats it does in 70-75% of simulated decisions, with one repeat more in 80% (from 7 repeats on the
        # t's advice holds as it is)
        rec += 1
    if method == "blocks" and run_noise is not None:
        design = (f"one run per variant (block means), each run's noise at least the {run_noise.describe()}")
    elif method == "blocks":
        design = ("one run per variant (block means): differences between runs, such as drift, are not "
                  "measured, so this rests on the runs' own noise only")
    else:
        design = f"{n_rep} repeats per variant"
    advice = (f"detecting a {effect:.0%} difference with {power:.0%} power at this noise (run-mean CV {fmt_pct(cv)}"
              + (", a lower bound from within the runs" if method == "blocks" and run_noise is None else "")
              + ") needs "
              + (f"{rec} interleaved repeats" if rec else "more than 1000 interleaved repeats"))

    main = comps[0]
    kept = False
    too_few = n_rep < min_repeats
    winner = best.label if len(beaten) == len(comps) and not too_few else None
    significant = winner is not None
    candidates = [c for c in dict.fromkeys([default, *preference]) if c is not None]
    if winner is not None:
        choice = winner
        reason = (f"{winner} is the winner: against the runner-up {runner_up.label}, {metric} "
                  f"{main.describe()}" + (f"; it beats the other {len(comps) - 1} variant(s) too"
                                          if len(comps) > 1 else "") + f"; {design}")
    elif (default in by_label and default not in top and not too_few  # the default measured, and beaten
          and next(c for c in comps if c.baseline == default).p_value < alpha / len(comps)
          and same_way(by_label[default], best) is not False
          and beyond_orders(by_label[default], best, alpha / len(comps))):
        # the default is beaten, but the best cannot be separated from some other variant
        main = next(c for c in comps if c.baseline == default)
        significant = True
        choice = best.label
        dv = next(v for v in usable if v.label == default)
        for p in [c for c in preference if c in top and c != best.label]:
            pv = next(v for v in usable if v.label == p)
            against_default = compare(dv, pv)
            # the preference's own difference from the default must be replicated too (rule 6): else the
            # recommendation below would rest on best's replication for a variant that was not ahead every time
            if (against_default.significant and against_default.verdict == "better"
                    and same_way(dv, pv) is not False and beyond_orders(dv, pv, alpha)):
                choice = p
                break
        others = [t for t in top if t != best.label]
        reason = (f"no single winner, but the default {default} is beaten: against it, {best.label} is "
                  f"{main.describe()}; {best.label} cannot be separated from {', '.join(others)}; {choice} is "
                  f"chosen ({'the stated preference' if choice != best.label else 'the highest mean'}); {design}")
    else:
        if default is not None:
            choice = default
        else:
            in_top = [c for c in candidates if c in top or too_few]
            choice = in_top[0] if in_top else None
        kept = choice is not None and choice == default
        if too_few:
            lead = (f"no winner declared with {n_rep} run(s) per variant (at least {min_repeats} required): "
                    f"{best.label} against {runner_up.label} is {main.describe()}")
        elif unordered and not unreplicated:
            worst = max(unordered, key=lambda k: order_p(by_label[k], best))
            pairs = paired_pairs(by_label[worst].means, best.means)[0].size
            lead = (f"no winner: {best.label} is significantly ahead of {', '.join(unordered)} on the paired t but "
                    f"not beyond what the random run orders of the repeats give on their own (sign-flip p = "
                    f"{order_p(by_label[worst], best):.2g} against {worst} over the {2 ** pairs} orders its {pairs} "
                    f"repeats could have had): {metric} {main.describe()}")
        elif unreplicated:
            lead = (f"no winner: {best.label} is significantly ahead of {', '.join(unreplicated)} on average but not "
                    f"in every interleaved block of repeats, so the difference is not replicated: {metric} "
                    f"{main.describe()}")
        else:
            lead = (f"no significant difference between the best, {best.label}, and {runner_up.label}: "
                    f"{metric} {main.describe()}")
        if choice is None:
            reason = f"{lead}; there is no default to keep, so nothing is recommended"
        elif kept and default not in by_label:
            # none of its runs usable (failed, disturbed or too short): nothing was compared with it, nothing beat it
            why = next((w for k, w in excluded if k == default), "no usable run")
            reason = f"{lead}; the default {default} is kept: it was not measured ({why}), so no variant beat it"
        elif kept and default not in top and not too_few:
            against = next(c for c in comps if c.baseline == default)
            reason = (f"{lead}; the default {default} is kept: {best.label} is ahead of it by {against.describe()}, "
                      f"short of the p < {alpha / len(comps):.3g} needed to leave the default when "
                      f"{len(comps)} variants could have beaten it")
        elif kept:
            reason = f"{lead}; the default {default} is kept"
        else:
            reason = f"{lead}; the stated preference {choice} is kept"
        reason += f"; {design}"
    replicated = same_way(by_label[main.baseline], by_label[main.variant]) if significant else None
    if significant and method == "paired" and replicated:
        recommendable = True
        blocks = min(n_rep, REPLICATION_BLOCKS)
        recommendation = (f"{choice} is recommended: significant and ahead in every one of {blocks} interleaved "
                          f"block{'s' if blocks != 1 else ''} of its {n_rep} repeats"
                          + (", from the runs left after the disturbed ones" if shaken else ""))
    else:
        recommendable = False
        if not significant:
            why = "no significant difference" if not shaken else (
                "no significant difference among the undisturbed runs")
        elif method != "paired":
            why = ("one run per variant: an effect is recommended only when it is replicated in interleaved "
                   "repeats (set repeats: 2 or more)")
        else:
            why = "the difference was not the same in every interleaved block of repeats"
        recommendation = f"no recommendation: {why}"
    return Decision(winner=winner, choice=choice, default=default, kept_default=kept, significant=significant,
                    comparison=main, comparisons=comps, ranking=ranking, method=method, repeats=n_rep,
                    noise_floor=main.noise_floor, cv=cv, recommended_repeats=rec,
                    reason=f"{reason}; {advice}{excl_text}.", replicated=replicated, recommendable=recommendable,
                    recommendation=recommendation, **common)
