"""A step's record of interference (results.json step "interference"), from the interference each of its launches
recorded (validation.launch.telemetry.interference, in the launch's metrics): what step kinds use to leave disturbed
runs out of a decision, and validation.execution.evidence to judge the run. Pure functions over results records.
"""

from __future__ import annotations

from typing import Any

from validation.formatting import as_dict, as_list
from validation.launch.telemetry import interference_rules


def launch_records(result: dict) -> list[tuple[str, Any, dict]]:
    """(label, repeat, metrics) of every launch of a step that recorded metrics (the step itself, or its runs)."""
    runs = [as_dict(r) for r in as_list(result.get("runs")) if isinstance(r, dict)]
    if runs:
        return [(str(r.get("label")), r.get("repeat"), as_dict(r.get("metrics"))) for r in runs]
    return [("", None, as_dict(result.get("metrics")))]


def step_interference(result: dict) -> dict[str, Any] | None:
    """The step's record of interference (results.json step "interference"), from each launch's metrics'
    "interference": {"disturbed": any launch disturbed, "measured": launches with the figures, "launches":
    [{"label", "repeat", "disturbed", "share", "text"}], "text": the disturbed launches in words, "rules"}; a step
    kind may record its own (a benchmark's, over the whole launch). None when no launch has the figures."""
    if isinstance(result.get("interference"), dict):
        return result["interference"]
    launches = []
    for label, repeat, m in launch_records(result):
        rec = m.get("interference")
        if isinstance(rec, dict) and "disturbed" in rec:
            launches.append({"label": label, "repeat": repeat, "disturbed": bool(rec.get("disturbed")),
                             "share": rec.get("share"), "text": str(rec.get("text") or "")})
    if not launches:
        return None
    bad = [x for x in launches if x["disturbed"]]
    if not bad:
        text = f"no interference in {len(launches)} launch{'es' if len(launches) != 1 else ''}"
    elif len(launches) == 1:
        text = bad[0]["text"]
    else:  # a step of many runs: which were disturbed, and the first one's figures in full
        text = (f"{len(bad)} of {len(launches)} runs disturbed ("
                + ", ".join(_launch_name(x).rstrip(": ") for x in bad) + f"); {_launch_name(bad[0])}{bad[0]['text']}")
    return {"disturbed": bool(bad), "measured": len(launches), "launches": launches, "text": text,
            "rules": interference_rules()}


def _launch_name(x: dict) -> str:
    if not x.get("label"):
        return ""
    rep = f", repeat {int(x['repeat']) + 1}" if isinstance(x.get("repeat"), int) else ""
    return f"{x['label']}{rep}: "


def run_disturbed(run: dict) -> bool:
    """Whether one launch (a sweep's, an A/B's, a triage's run record) was measured under interference."""
    rec = as_dict(as_dict(as_dict(run).get("metrics")).get("interference"))
    return bool(rec.get("disturbed"))


def disturbed(result: dict) -> bool:
    """Whether a step's evidence is disturbed: a launch of it was, and the kind did not leave that launch out of
    what it concluded (a decision that excluded its disturbed runs and still stands records
    "interference": {"disturbed": False, ...} itself)."""
    rec = step_interference(as_dict(result))
    return bool(rec and rec.get("disturbed"))


def disturbed_flags(runs: list[dict], labels, repeats: int) -> dict[str, list[bool]]:
    """label -> per repeat, whether that run was disturbed (what validation.analysis.significance.decide leaves out)."""
    flags = {str(label): [False] * repeats for label in labels}
    for r in runs:
        label, repeat = str(r.get("label")), r.get("repeat")
        if label in flags and isinstance(repeat, int) and 0 <= repeat < repeats:
            flags[label][repeat] = run_disturbed(r)
    return flags


def decision_record(result: dict, conclusive: bool) -> dict[str, Any] | None:
    """The step record of a step that decided from its runs with the disturbed ones left out: disturbed unless the
    decision is `conclusive` without them (a significant, replicated difference among the others), in which case the
    record says that they were left out."""
    rec = step_interference({"runs": result.get("runs")})
    if rec and rec["disturbed"] and conclusive:
        left = sum(1 for x in rec["launches"] if x["disturbed"])
        rec = {**rec, "disturbed": False, "left_out": left,
               "text": f"{left} disturbed run(s) left out; the decision stands on the others: {rec['text']}"}
    return rec


def launch_record(rec: dict[str, Any] | None, label: str = "") -> dict[str, Any] | None:
    """The step record of a step of one launch whose interference was judged over the whole launch (a benchmark),
    from validation.launch.telemetry.interference's result; None without one."""
    if not isinstance(rec, dict) or "disturbed" not in rec:
        return None
    return {"disturbed": bool(rec["disturbed"]), "measured": 1,
            "launches": [{"label": label, "repeat": None, "disturbed": bool(rec["disturbed"]),
                          "share": rec.get("share"), "text": str(rec.get("text") or "")}],
            "text": str(rec.get("text") or ""), "rules": interference_rules(), "period": "the whole launch"}
