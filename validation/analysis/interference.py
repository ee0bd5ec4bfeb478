"""A step's record of interference (results.json step "interference"), from the interference each of its launches
recorded (validation.launch.telemetry.interference, in the launch's metrics): what step kinds use to leave disturbed
runs out of a decision, and validation.execution.evidence to judge the run. Pure functions over results records,
read as the typed records of validation.results.interference (leniently: a damaged record reads as none).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation.launch.telemetry import interference_rules
from validation.results.codec import decode, encode
from validation.results.interference import LaunchEntry, LaunchInterference, StepInterference


@dataclasses.dataclass(frozen=True)
class _Launch:
    """What a run record holds that its interference is read from: its label, repeat and metrics."""
    label: Any = None
    repeat: Any = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Measured:
    """What a launch's metrics hold of its interference (validation.launch.telemetry.interference's record)."""
    interference: LaunchInterference | None = None


@dataclasses.dataclass(frozen=True)
class _Frame:
    """What a step record holds that its interference is read from: its runs (as written: a run that is not an
    object is left out), its own metrics, and the record a kind wrote itself."""
    runs: list[Any] = dataclasses.field(default_factory=list)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    interference: dict[str, Any] | None = None


def _launches(frame: _Frame) -> list[tuple[str, Any, dict]]:
    runs = [decode(_Launch, r, lenient=True) for r in frame.runs if isinstance(r, dict)]
    if runs:
        return [(str(r.label), r.repeat, r.metrics) for r in runs]
    return [("", None, frame.metrics)]


def launch_records(result: dict) -> list[tuple[str, Any, dict]]:
    """(label, repeat, metrics) of every launch of a step that recorded metrics (the step itself, or its runs)."""
    return _launches(decode(_Frame, result, lenient=True))


def launch_interference(metrics: dict) -> LaunchInterference | None:
    """A launch's interference from its metrics; None where it has no judgement."""
    rec = decode(_Measured, metrics, lenient=True).interference
    return rec if rec is not None and rec.disturbed is not None else None


def _from_launches(frame: _Frame) -> StepInterference | None:
    launches = []
    for label, repeat, m in _launches(frame):
        rec = launch_interference(m)
        if rec is not None:
            launches.append(LaunchEntry(label=label, repeat=repeat, disturbed=bool(rec.disturbed), share=rec.share,
                                        text=str(rec.text or "")))
    if not launches:
        return None
    bad = [x for x in launches if x.disturbed]
    if not bad:
        text = f"no interference in {len(launches)} launch{'es' if len(launches) != 1 else ''}"
    elif len(launches) == 1:
        text = bad[0].text
    else:  # a step of many runs: which were disturbed, and the first one's figures in full
        text = (f"{len(bad)} of {len(launches)} runs disturbed ("
                + ", ".join(_launch_name(x).rstrip(": ") for x in bad) + f"); {_launch_name(bad[0])}{bad[0].text}")
    return StepInterference(disturbed=bool(bad), measured=len(launches), launches=launches, text=text,
                            rules=interference_rules())


def step_record(result: dict) -> StepInterference | None:
    """The step's record of interference (see step_interference) as a typed record."""
    frame = decode(_Frame, result, lenient=True)
    if frame.interference is not None:
        return decode(StepInterference, frame.interference, "interference", lenient=True)
    return _from_launches(frame)


def step_interference(result: dict) -> dict[str, Any] | None:
    """The step's record of interference (results.json step "interference"), from each launch's metrics'
    "interference": {"disturbed": any launch disturbed, "measured": launches with the figures, "launches":
    [{"label", "repeat", "disturbed", "share", "text"}], "text": the disturbed launches in words, "rules"}; a step
    kind may record its own (a benchmark's, over the whole launch). None when no launch has the figures. The JSON
    form of step_record."""
    frame = decode(_Frame, result, lenient=True)
    if frame.interference is not None:
        return frame.interference
    return encode(_from_launches(frame))


def _launch_name(x: LaunchEntry) -> str:
    if not x.label:
        return ""
    rep = f", repeat {int(x.repeat) + 1}" if isinstance(x.repeat, int) else ""
    return f"{x.label}{rep}: "


def run_disturbed(run: dict) -> bool:
    """Whether one launch (a sweep's, an A/B's, a triage's run record) was measured under interference."""
    return measured_disturbed(decode(_Launch, run, lenient=True).metrics)


def measured_disturbed(metrics: dict) -> bool:
    """Whether a launch's metrics say it was measured under interference."""
    rec = decode(_Measured, metrics, lenient=True).interference
    return bool(rec and rec.disturbed)


def disturbed(result: dict) -> bool:
    """Whether a step's evidence is disturbed: a launch of it was, and the kind did not leave that launch out of
    what it concluded (a decision that excluded its disturbed runs and still stands records
    "interference": {"disturbed": False, ...} itself)."""
    rec = step_record(result)
    return bool(rec and rec.disturbed)


def disturbed_flags(runs: list[dict], labels, repeats: int) -> dict[str, list[bool]]:
    """label -> per repeat, whether that run was disturbed (what validation.analysis.significance.decide leaves out)."""
    flags = {str(label): [False] * repeats for label in labels}
    for r in runs:
        run = decode(_Launch, r, lenient=True)
        label, repeat = str(run.label), run.repeat
        if label in flags and isinstance(repeat, int) and 0 <= repeat < repeats:
            flags[label][repeat] = run_disturbed(r)
    return flags


def decision_record(result: dict, conclusive: bool) -> dict[str, Any] | None:
    """The step record (JSON) of a step that decided from its runs with the disturbed ones left out: disturbed unless
    the decision is `conclusive` without them (a significant, replicated difference among the others), in which case
    the record says that they were left out."""
    rec = _from_launches(_Frame(runs=decode(_Frame, result, lenient=True).runs))
    if rec and rec.disturbed and conclusive:
        left = sum(1 for x in rec.launches if x.disturbed)
        rec = dataclasses.replace(rec, disturbed=False, left_out=left,
                                  text=f"{left} disturbed run(s) left out; the decision stands on the others: "
                                       f"{rec.text}")
    return encode(rec)


def launch_record(rec: LaunchInterference | None, label: str = "") -> dict[str, Any] | None:
    """The step record (JSON) of a step of one launch whose interference was judged over the whole launch (a
    benchmark), from validation.launch.telemetry.interference's result; None without one."""
    if rec is None or rec.disturbed is None:
        return None
    text = str(rec.text or "")
    return encode(StepInterference(
        disturbed=bool(rec.disturbed), measured=1,
        launches=[LaunchEntry(label=label, repeat=None, disturbed=bool(rec.disturbed), share=rec.share, text=text)],
        text=text, rules=interference_rules(), period="the whole launch"))
