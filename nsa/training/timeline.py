"""Start-up milestones of this process, in seconds since it started (timeline.json; fields in
nsa.training.outputs.TIMELINE_MILESTONES).

The process start comes from /proc/self/stat (field 22, starttime, in clock ticks since boot) read against
CLOCK_BOOTTIME, so interpreter start-up and imports before any trainer code ran are included. Where /proc is
not available the start is the earliest moment trainer code ran: when this module was first imported (the
trainer package imports it first). No torch import here.
"""

from __future__ import annotations

import os
import time
from typing import Any

_IMPORTED = time.monotonic()

from nsa.training import outputs  # noqa: E402 - after _IMPORTED, the fallback process start


def _boottime() -> float | None:
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None


def _process_age() -> float | None:
    """Seconds since this process started, from /proc/self/stat; None where that cannot be read or is implausible."""
    now = _boottime()
    if now is None:
        return None
    try:
        stat = open("/proc/self/stat").read()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22; fields after "(comm)" start at 3
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    age = now - start_ticks / ticks
    return age if 0 <= age < 30 * 86400 else None


class Timeline:
    """Milestones of this process: `mark(name)` once per milestone (a later mark of the same name is ignored)."""

    def __init__(self) -> None:
        age = _process_age()
        now = time.monotonic()
        if age is not None:
            self.start, self.source = now - age, "/proc/self/stat"
        else:
            self.start, self.source = _IMPORTED, "first import of nsa.training (no /proc/self/stat)"
        self.start_unix = time.time() - (now - self.start)
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> float:
        """Record milestone `name` now (seconds since process start); returns its value."""
        if name not in self.marks:
            self.marks[name] = round(time.monotonic() - self.start, 6)
        return self.marks[name]

    def has(self, name: str) -> bool:
        return name in self.marks


_current: Timeline | None = None


def current() -> Timeline:
    """This process's timeline (created at the first call)."""
    global _current
    if _current is None:
        _current = Timeline()
    return _current


def reset() -> Timeline:
    """A fresh timeline for a new run in the same process (in-process runs from tests); the start stays the
    process's start."""
    global _current
    _current = Timeline()
    return _current


def document(tl: Timeline, per_rank: list[dict] | None, world_size: int) -> dict[str, Any]:
    """timeline.json's content: this process's milestones (rank 0), every rank's when `per_rank` was gathered,
    and for each milestone the rank that reached it last (`slowest`). Field names: nsa.training.outputs."""
    marks = dict(tl.marks)
    slowest = None
    if per_rank is not None:
        slowest = {}
        for name in outputs.TIMELINE_MILESTONES:
            reached = [(m[name], r) for r, m in enumerate(per_rank) if name in m]
            if reached:
                seconds, rank = max(reached)
                slowest[name] = {"rank": rank, "s": seconds}
    order = {name: i for i, name in enumerate(outputs.TIMELINE_MILESTONES)}

    def ordered(m: dict) -> dict:
        return dict(sorted(m.items(), key=lambda kv: order.get(kv[0], len(order))))

    return {"schema": outputs.TIMELINE_SCHEMA, "process_start_source": tl.source,
            "process_start_unix": tl.start_unix, "world_size": world_size,
            "milestones": ordered({"process_start": 0.0, **marks}),
            "ranks": None if per_rank is None else {str(r): ordered({"process_start": 0.0, **m})
                                                    for r, m in enumerate(per_rank)},
            "slowest": slowest, "time_to_first_step_s": marks.get("first_logged_step")}
