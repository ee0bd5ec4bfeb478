"""The physical range of every metric that has one, declared once, and the check of figures against it: a
scaling efficiency above 1.1 or at most 0 (a train step's `scaling_efficiency`, and a `scaling` step's
`strong`/`weak` efficiencies: `efficiency.min`, `.last` and each row's), a tokens/s CV above 50%, an MFU above
100%, a negative time. A figure
outside its range is a bug in the measurement, not a result (validation.execution.evidence: a criterion reading it is an error,
inconclusive when its step was disturbed; the report lists it among the open problems). Pure; no kind imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from validation.formatting import finite, fmt_num


@dataclass(frozen=True)
class Range:
    """The physical range of a metric: `low` < value (<= with low_closed), value <= `high` (< with not
    high_closed); None: unbounded on that side."""

    pattern: str  # a dotted metric name, "<i>" standing for a list index: "toks_per_s.cv", "weak.rows.<i>.efficiency"
    low: float | None
    high: float | None
    low_closed: bool = True
    high_closed: bool = True
    reason: str = ""

    def holds(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (value == self.low and not self.low_closed)):
            return False
        if self.high is not None and (value > self.high or (value == self.high and not self.high_closed)):
            return False
        return True

    def text(self) -> str:
        low = "-inf" if self.low is None else fmt_num(self.low)
        high = "inf" if self.high is None else fmt_num(self.high)
        return f"{'[' if self.low_closed and self.low is not None else '('}{low}, {high}" \
               f"{']' if self.high_closed and self.high is not None else ')'}"


_EFFICIENCY = "N ranks cannot do more than N times the work of one, beyond a cache effect of a few percent"
_TIMES = ("step_time_s", "time_to_first_step_s", "startup.imports_s", "startup.init_s", "startup.first_step_s",
          "summary.avg_step_time_s", "summary.min_step_time_s", "summary.max_step_time_s", "summary.comm_time_s")
RANGES: tuple[Range, ...] = (
    Range("scaling_efficiency", 0.0, 1.1, low_closed=False, reason=_EFFICIENCY),
    *(Range(f"{mode}.{at}", 0.0, 1.1, low_closed=False, reason=_EFFICIENCY)
      for mode in ("strong", "weak") for at in ("efficiency.min", "efficiency.last", "rows.<i>.efficiency")),
    Range("toks_per_s.cv", 0.0, 0.5,
          reason="a window whose tokens/s vary by more than half their mean measures the machine, not the run"),
    *(Range(f"toks_per_s.{s}", 0.0, None) for s in ("mean", "median", "min", "max")),
    Range("toks_per_s_per_gpu", 0.0, None), Range("tflops_per_s", 0.0, None),
    *(Range(f"mfu.{s}", 0.0, 1.0, reason="no device does more FLOP/s than its peak")
      for s in ("mean", "median", "min", "max")),
    *(Range(f"{t}.{s}" if t == "step_time_s" else t, 0.0, None, reason="a time is never negative")
      for t in _TIMES for s in (("mean", "median", "min", "max") if t == "step_time_s" else ("",))),
    Range("summary.comm_share", 0.0, 1.0, reason="a share of the step time"),
)


def _range_for(path: tuple) -> Range | None:
    """The declared range of a metric at `path` (the leading "runs.<label>" or "<variant>" of a multi-run kind's
    record left to the caller), or None."""
    for r in RANGES:
        parts = r.pattern.split(".")
        if len(parts) == len(path) and all(p == str(k) or (p == "<i>" and _index(k)) for p, k in zip(parts, path)):
            return r
    return None


def _index(key: Any) -> bool:
    """Whether a key of a metric path is a list index (an int, or its digits in a dotted name)."""
    return (isinstance(key, int) and not isinstance(key, bool)) or (isinstance(key, str) and key.isdigit())


def range_of(name: str) -> Range | None:
    """The declared range of the metric named `name` ("scaling_efficiency", "toks_per_s.cv"), or None."""
    return _range_for(tuple(name.split("."))) if name else None


def implausible(metrics: Any, at: tuple = (), shown: tuple = ()) -> list[dict[str, Any]]:
    """Every figure in `metrics` outside its declared range: [{"metric" (dotted, after `shown`), "value", "range",
    "reason"}]. `metrics` is a launch's metrics, or the part of them at key path `at` (what a criterion read)."""
    out = []

    def walk(value: Any, path: tuple) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, path + (key,))
            return
        v = finite(value)
        if v is None or isinstance(value, bool):
            return
        r = _range_for(tuple(at) + path)
        if r is not None and not r.holds(v):
            out.append({"metric": ".".join(str(k) for k in tuple(shown) + path), "value": v, "range": r.text(),
                        "reason": r.reason or "outside its physical range"})

    walk(metrics, ())
    return out


def figure_problem(name: str, value: Any) -> str | None:
    """Why a figure shown on its own (a key figure: "scaling_efficiency") is not a result, or None."""
    v = finite(value)
    r = _range_for(tuple(name.split(".")))
    if v is None or r is None or r.holds(v):
        return None
    return f"{fmt_num(round(v, 4))} is outside the physical range {r.text()} of {name}: {r.reason}"


def value_at(namespace: dict, step: str, path: tuple) -> Any:
    value: Any = namespace.get(step)
    for key in path:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
            value = value[key]
        else:
            return None
    return value


def implausible_reads(namespace: dict, reads: Iterable[tuple[str, tuple]]) -> list[str]:
    """"step.metric = value outside (range): reason" for every value the reads take that is outside its range
    (a read of a multi-run kind's run, runs.<label>..., is judged as that launch's metric)."""
    out = []
    for step, path in reads:
        at = tuple(path)[2:] if len(path) >= 2 and path[0] == "runs" else tuple(path)
        shown = (step, *path)
        for bad in implausible(value_at(namespace, step, path), at, shown):
            out.append(f"{bad['metric']} = {fmt_num(round(bad['value'], 4))} outside {bad['range']}: {bad['reason']}")
    return out
