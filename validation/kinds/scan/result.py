"""What a `scan` step records (validation.kinds.scan), as typed records read with validation.results.codec: its
Result, the step record (validation.results.run.Step: runs, a LaunchRun each with its "source" scan or bisect, run
order, ...) whose metrics are the Metrics below (the keys and what they mean: the kind's module docstring). Encoding a
decoded record gives back the same JSON: a key written only when it applies is an absent() field, and every key not
declared here is kept in `extra`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation.results.codec import absent
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import Num


@dataclasses.dataclass(frozen=True)
class ExponentFit:
    """The cost exponent's fit as results.json holds it (validation.analysis.triage.Fit.as_dict: a non-finite figure
    is null)."""
    slope: Num | None = None
    intercept: Num | None = None
    se: Num | None = None
    df: int | None = None
    ci_low: Num | None = None
    ci_high: Num | None = None
    n: int | None = None
    values: int | None = None
    r2: Num | None = None
    alpha: Num | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PairRecord:
    """Neighbouring points a < b and their local exponent (validation.analysis.triage.Pair.as_dict); `inconclusive`
    (written only when true): significant on the block noise of one run a point alone, the run-to-run noise unknown,
    so no cliff."""
    a: Num | None = None
    b: Num | None = None
    exponent: Num | None = None
    ci_low: Num | None = None
    ci_high: Num | None = None
    p: Num | None = None
    p_adjusted: Num | None = None
    cliff: bool | None = None
    time_ratio: Num | None = None
    inconclusive: bool | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BisectionRecord:
    """The bisection of a cliff (validation.analysis.triage.Bisection.as_dict): the interval [good, bad] it ended
    with, its width, the resolution asked for, whether it is localised, the points measured [value, verdict] and why
    it stopped."""
    interval: list[Num] = dataclasses.field(default_factory=list)
    width: Num | None = None
    resolution: Num | None = None
    localised: bool | None = None
    points: list[list[Any]] = dataclasses.field(default_factory=list)
    stopped: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Point:
    """One value of the scan (point_rows): means over its passed runs measured undisturbed."""
    value: Num | None = None
    source: str | None = None  # scan or bisect
    runs: int | None = None
    passed: int | None = None
    disturbed: int | None = absent()  # passed runs measured under interference, left out of its figures (when any)
    step_time_s: Num | None = None
    run_step_times_s: list[Num] = dataclasses.field(default_factory=list)
    toks_per_s: Num | None = None
    mfu: Num | None = absent()  # recorded since points carry the MFU (null where the device peak is unknown)
    time_to_first_step_s: Num | None = None
    peak_mem_gb: Num | None = None
    exponent_to_next: Num | None = None
    cliff_to_next: bool | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's metrics (the module docstring), in the order run() writes them; the reasons, the noise source,
    what covers the run-to-run noise and the declared launch noise are written only when they apply. `cliff` is
    null (and `cliff_localised` with it) when a cliff is inconclusive: one run a point, no declared launch noise."""
    setting: str | None = None
    values: list[Num] = dataclasses.field(default_factory=list)
    repeats: int | None = None
    expected_exponent: Num | None = None
    exponent: Num | None = None
    exponent_ci: list[Num | None] | None = None
    exponent_fit: ExponentFit | None = None
    cliff: bool | None = None
    cliff_pair: PairRecord | None = None
    cliff_interval: list[Num] | None = None
    cliff_localised: bool | None = None
    bisection: BisectionRecord | None = None
    pairs: list[PairRecord] = dataclasses.field(default_factory=list)
    exponent_reason: str | None = absent()
    cliff_reason: str | None = absent()
    noise_source: str | None = absent()
    run_to_run: str | None = absent()  # repeats | measured | declared | unknown: what covers the noise between launches
    launch_sd: Num | None = absent()  # the runbook's declared compare.launch_sd the points' noise is held to
    points: list[Point] = dataclasses.field(default_factory=list)
    runs: int | None = None
    passed: int | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A scan step's record: the step record (runs, run order, ...) with its metrics."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)
