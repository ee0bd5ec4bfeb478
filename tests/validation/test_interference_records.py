"""The interference records (validation.results.interference) and the telemetry sample: what
validation.launch.telemetry.interference judges and validation.analysis.interference records for a step encodes to
the JSON those functions always wrote (keys in the same order, a cause's figures only for its kind) and decodes back
strictly to the same record."""

from __future__ import annotations

import dataclasses

from validation import contracts
from validation.analysis import interference as step_records
from validation.launch import telemetry
from validation.results.codec import decode, encode
from validation.results.interference import LaunchInterference, StepInterference


def _rows(n: int = 8) -> list[dict]:
    """Samples a second apart: steal from the second sample, then a neighbour's CPU, a GPU neighbour, a throttle."""
    out = []
    for i in range(n):
        base = {"time": 1000.0 + i, "node": "n0", "sample": i, "ncpu": 2, "step_cores": 2, "gpu": None,
                "other_cpu_pct": None if i == 0 else (150.0 if i >= 3 else 0.0), "steal_pct": 30.0,
                "other_top": "cc1[77] 90%; python3[42] 60%" if i >= 3 else None}
        out.append({**base, "gpu": 0, "ours": 1, "other_gpu_procs": 1 if i >= 5 else 0, "other_gpu_mem_gb": 2.5,
                    "throttle": "sw_power_cap+hw_slowdown" if i == 7 else "none"})
    return out


def test_the_sample_has_a_field_per_telemetry_column():
    assert [f.name for f in dataclasses.fields(telemetry.Sample)] == list(contracts.TELEMETRY_COLUMNS)
    assert telemetry.Sample.of({"time": 1.0, "unknown": 2}) == telemetry.Sample(time=1.0)


def test_a_launch_record_writes_its_causes_in_the_order_seen_and_round_trips():
    rec = telemetry.interference(_rows())
    data = encode(rec)
    assert list(data) == ["disturbed", "samples", "contended", "share", "causes", "ncpu", "step_cores", "text",
                          "rules"]
    assert list(data["causes"]) == ["steal", "cpu", "gpu", "throttle"]  # first seen first
    assert data["causes"]["cpu"] == {"samples": 5, "free": 0.0, "cores_mean": 1.5, "cores_max": 1.5,
                                     "top": [{"command": "cc1", "samples": 5, "example": "cc1[77] 90%"},
                                             {"command": "python3", "samples": 5, "example": "python3[42] 60%"}]}
    assert data["causes"]["steal"] == {"samples": 7, "cores_mean": 0.3, "cores_max": 0.3}
    assert data["causes"]["gpu"] == {"samples": 3, "procs": 1.0, "mem_gb": 2.5}
    assert data["causes"]["throttle"] == {"samples": 1, "reasons": ["hw_slowdown"]}
    assert decode(LaunchInterference, data, "interference") == rec
    assert encode(decode(LaunchInterference, data, "interference")) == data


def test_the_step_records_round_trip():
    rec = encode(telemetry.interference(_rows()))
    quiet = encode(telemetry.interference(_rows(2)[:1] + [{**_rows(2)[1], "steal_pct": 0.0, "other_gpu_procs": 0,
                                                                                 "other_cpu_pct": 0.0}]))
    step = {"runs": [{"label": "a", "repeat": 0, "metrics": {"interference": rec}},
                     {"label": "b", "repeat": 0, "metrics": {"interference": quiet}}]}
    written = step_records.step_interference(step)
    assert list(written) == ["disturbed", "measured", "launches", "text", "rules"]
    assert written["text"].startswith("1 of 2 runs disturbed (a, repeat 1); a, repeat 1: the hypervisor stole")
    left = step_records.decision_record(step, conclusive=True)
    assert list(left) == ["disturbed", "measured", "launches", "text", "rules", "left_out"]
    assert left["disturbed"] is False and left["left_out"] == 1
    whole = step_records.launch_record(telemetry.interference(_rows()), "x")
    assert list(whole) == ["disturbed", "measured", "launches", "text", "rules", "period"]
    for data in (written, left, whole):
        assert encode(decode(StepInterference, data, "interference")) == data
    assert step_records.step_record(step) == decode(StepInterference, written, "interference")
    assert step_records.disturbed(step) and not step_records.disturbed({**step, "interference": left})
