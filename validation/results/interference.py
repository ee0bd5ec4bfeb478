"""What else used the machine while a launch measured, as typed records (read and written with
validation.results.codec):

    LaunchInterference   one launch's judgement over its samples (validation.launch.telemetry.interference; a trainer
                         launch's metrics "interference", a benchmark's from its whole launch)
    StepInterference     a step's record (results.json step "interference": validation.analysis.interference's
                         step_interference, decision_record and launch_record), one LaunchEntry per launch

The keys and what they mean are those functions' docstrings. Each record encodes back to the JSON its writer wrote:
a cause's figures are written only for its kind of cause (absent() fields), a step record's "left_out" only when a
decision left its disturbed runs out and "period" only when the launch was judged whole.

This is a foundation module: the launch layer, the analyses and the report read it alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation.results.codec import absent

Num = int | float


@dataclasses.dataclass(frozen=True)
class OtherCommand:
    """One of the busiest other processes over the contended samples: its command, in how many samples it was among
    the busiest, and one sample's entry ("python3[4242] 98%")."""
    command: str | None = None
    samples: int | None = None
    example: str | None = None


@dataclasses.dataclass(frozen=True)
class Cause:
    """One cause of contention over a launch's samples: in how many samples it was seen, and its figures (cpu: the
    free cores, the other processes' cores mean and max, the busiest of them; steal: the stolen cores mean and max;
    gpu: the most other processes and their GPU memory; throttle: the slowdown reasons)."""
    samples: int | None = None
    free: Num | None = absent()
    procs: Num | None = absent()
    mem_gb: Num | None = absent()
    reasons: list[str] | None = absent()
    cores_mean: Num | None = absent()
    cores_max: Num | None = absent()
    top: list[OtherCommand] | None = absent()


@dataclasses.dataclass(frozen=True)
class LaunchInterference:
    """One launch's interference over its measured period: disturbed (at least DISTURBED_SHARE of the samples
    contended), the samples counted and contended, their share, the causes by name (cpu, steal, gpu, throttle, in the
    order first seen), the machine's CPUs and the launch's cores, the text in words and the rules applied."""
    disturbed: bool | None = None
    samples: int | None = None
    contended: int | None = None
    share: Num | None = None
    causes: dict[str, Cause] = dataclasses.field(default_factory=dict)
    ncpu: Num | None = None
    step_cores: Num | None = None
    text: str | None = None
    rules: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LaunchEntry:
    """A launch in a step's record: its run label ("" for the step's own launch), repeat, whether it was disturbed,
    the share of its samples contended and its text."""
    label: str | None = None
    repeat: Any = None  # the run's repeat (an int) or None
    disturbed: bool | None = None
    share: Num | None = None
    text: str | None = None


@dataclasses.dataclass(frozen=True)
class StepInterference:
    """A step's record of interference: disturbed, the launches measured and each one's entry, the text, the rules;
    "left_out" (the disturbed runs a decision that still stands left out) and "period" (a benchmark's: the whole
    launch) where they apply."""
    disturbed: bool | None = None
    measured: int | None = None
    launches: list[LaunchEntry] = dataclasses.field(default_factory=list)
    text: str | None = None
    rules: str | None = None
    left_out: int | None = absent()
    period: str | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
