"""What a step that decides between trainer launches records (a sweep's points, an A/B's variants), as typed records
read with validation.results.codec:

    d = decode(DecisionRecord, step["decision"], lenient=True)       d.choice, d.comparison.rel, d.ranking[0].label
    c = decode(Choice, step["choice"], lenient=True)                 c.label, c.params, c.significant

The writers are the analysis layer's: a ComparisonRecord is validation.analysis.significance.Comparison.as_dict() (the
dataclass's fields with a non-finite figure written as null, then "confidence" and "text"), a DecisionRecord is
significance.Decision.as_dict() plus the keys the deciding kind adds (the run order, the points, the variants left
out). Those dataclasses hold what was computed; these hold what results.json holds (tests/validation/test_codec.py
checks that the two name the same keys in the same order). A decision that could not be computed ("no decision: ...")
holds its reason, `significant` and `choice` only: the computed decision's keys are absent() beside `comparisons`.

This is a foundation module: the kinds, the analyses and the report read it alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation.results.codec import absent

Num = int | float  # a figure as its writer gave it (an int stays an int)


@dataclasses.dataclass(frozen=True)
class ComparisonRecord:
    """Variant b against baseline a (significance.Comparison's docstring says what each field means)."""
    baseline: str | None = None
    variant: str | None = None
    metric: str | None = None
    method: str | None = None  # blocks, runs, paired or common
    mean_a: Num | None = None
    mean_b: Num | None = None
    rel: Num | None = None
    ci_low: Num | None = None
    ci_high: Num | None = None
    p_value: Num | None = None
    t: Num | None = None
    df: Num | None = None
    n_a: int | None = None
    n_b: int | None = None
    ess_a: Num | None = None
    ess_b: Num | None = None
    noise_floor: Num | None = None
    floor_source: str | None = None
    alpha: Num | None = None
    higher_is_better: bool | None = None
    significant: bool | None = None
    verdict: str | None = None  # better, worse, same or inconclusive
    p_adjusted: Num | None = None
    family_size: int | None = None
    run_to_run: Num | None = None
    run_to_run_df: Num | None = None
    confidence: Num | None = None
    text: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Ranked:
    label: str | None = None
    mean: Num | None = None


@dataclasses.dataclass(frozen=True)
class Excluded:
    label: str | None = None
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class DisturbedRun:
    label: str | None = None
    repeat: int | None = None


_COMPUTED = "comparisons"  # the key a computed decision always has ([] when nothing was compared)
_RECOMMENDATION = "recommendable"  # the keys decisions recorded since recommendations need replicated effects have


@dataclasses.dataclass(frozen=True)
class DecisionRecord:
    """A sweep's or an A/B's decision (significance.Decision's docstring), then what its kind adds."""
    winner: str | None = absent(beside=_COMPUTED)
    choice: str | None = None
    default: str | None = absent(beside=_COMPUTED)
    kept_default: bool | None = absent(beside=_COMPUTED)
    significant: bool | None = None
    comparison: ComparisonRecord | None = absent(beside=_COMPUTED)
    comparisons: list[ComparisonRecord] | None = absent()
    ranking: list[Ranked] | None = absent(beside=_COMPUTED)
    method: str | None = absent(beside=_COMPUTED)
    repeats: int | None = absent(beside=_COMPUTED)
    noise_floor: Num | None = absent(beside=_COMPUTED)
    cv: Num | None = absent(beside=_COMPUTED)
    recommended_repeats: int | None = absent(beside=_COMPUTED)
    effect: Num | None = absent(beside=_COMPUTED)
    power: Num | None = absent(beside=_COMPUTED)
    alpha: Num | None = absent(beside=_COMPUTED)
    excluded: list[Excluded] | None = absent(beside=_COMPUTED)
    reason: str | None = None
    replicated: bool | None = absent(beside=_RECOMMENDATION)
    recommendable: bool | None = absent()
    recommendation: str | None = absent(beside=_RECOMMENDATION)
    disturbed_runs: list[DisturbedRun] | None = absent(beside=_RECOMMENDATION)
    # the deciding kind's: the random run order (sweep, ab), the points by label (sweep) and where the point kept
    # without a significant difference came from (prefer, runbook or first), the variants left out because the
    # trainer ignored their settings (ab)
    order_seed: int | None = absent()
    order: list[str] | None = absent()
    default_source: str | None = absent()
    points: dict[str, dict[str, Any]] | None = absent()
    excluded_ignored: list[str] | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The point or variant later steps use (a step's "choice"; its "winner" when significant). `significant` and
    `kept_default` are absent from results written before decisions were recorded."""
    label: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    explanation: str | None = None
    significant: bool | None = absent()
    kept_default: bool | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LaunchNoise:
    """The launch-to-launch noise a figure that is a ratio of launches stands on (a scaling efficiency's 95%
    interval: validation.kinds.scaling, validation.kinds.train): its source (repeats, declared, measured or unknown),
    sd (of one launch's log tokens/s), df, and a sentence saying where it comes from (for unknown: the fix)."""
    source: str | None = None
    sd: Num | None = None
    df: Num | None = None
    detail: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
