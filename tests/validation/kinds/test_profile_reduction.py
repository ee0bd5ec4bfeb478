"""The profile kind's reduction of its trainer's profiler trace (validation.kinds.profile): operators' times in ms from
the trace's microseconds, summed per name (inclusive), never negative; the nsa.* ranges seen; the latest step's trace
by its step number; a trace cut off or empty (a trainer killed while exporting it) fails the step naming the file,
instead of passing with an empty profile."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.kinds import profile as profile_mod
from validation.kinds.profile import Options, Profile, profile_summary
from validation.kinds.trainer import Launched
from validation.results.trainer_launch import LaunchMetrics

EVENTS = [{"ph": "X", "name": "nsa.step", "cat": "user_annotation", "ts": 0, "dur": 10_000, "pid": 1, "tid": 1},
          {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 100, "dur": 2_500, "pid": 1, "tid": 1},
          {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 3_000, "dur": 1_500, "pid": 1, "tid": 1},
          {"ph": "X", "name": "nsa.sel.ranges_v2", "cat": "user_annotation", "ts": 5_000, "dur": 1_000,
           "pid": 1, "tid": 1}]


def _run(tmp_path: Path, traces: dict[str, str], monkeypatch, status: str = "passed"):
    out = tmp_path / "prof" / "out"
    (out / "profile").mkdir(parents=True)
    for name, text in traces.items():
        (out / "profile" / name).write_text(text)
    spec = SimpleNamespace(dir="prof", out_dir="prof/out", wrapper=None)
    one = Launched(spec, SimpleNamespace(status="ok", duration_s=None), status, None, LaunchMetrics())
    monkeypatch.setattr(profile_mod, "launch_one", lambda ctx: one)
    ctx = SimpleNamespace(run_dir=tmp_path, rel=lambda p: str(Path(p).relative_to(tmp_path)))
    return Profile().run(Options(), ctx)


def test_a_readable_trace_gives_ms_per_operator_and_the_ranges(tmp_path, monkeypatch):
    result = _run(tmp_path, {"trace_rank0_step3.json": json.dumps({"traceEvents": EVENTS})}, monkeypatch)
    prof = result.metrics.profile
    assert result.status == "passed"
    assert [(o.name, o.total_ms, o.calls) for o in prof.top_ops] == [("aten::mm", 4.0, 2)]  # 2500 + 1500 us
    assert prof.nvtx_ranges == ["nsa.sel.ranges_v2", "nsa.step"]
    assert prof.trace == "prof/out/profile/trace_rank0_step3.json"


@pytest.mark.parametrize("text, words", [("", "empty"), ('{"traceEvents": [{"ph": "X", "na', "not valid JSON"),
                                         ('{"schemaVersion": 1}', "no traceEvents")])
def test_an_unreadable_trace_fails_the_step_naming_it(tmp_path, monkeypatch, text, words):
    result = _run(tmp_path, {"trace_rank0_step3.json": text}, monkeypatch)
    assert result.status == "failed"
    assert "prof/out/profile/trace_rank0_step3.json" in result.reason and words in result.reason
    assert result.metrics.profile.top_ops == []


def test_a_launch_that_failed_keeps_its_own_reason(tmp_path, monkeypatch):
    result = _run(tmp_path, {"trace_rank0_step3.json": ""}, monkeypatch, status="failed")
    assert result.status == "failed" and result.reason is None  # the launch's (None here), not the trace's


def test_the_latest_steps_trace_is_read_by_its_step_number(tmp_path, monkeypatch):
    late = [dict(e, name="aten::late") if e["name"] == "aten::mm" else e for e in EVENTS]
    result = _run(tmp_path, {"trace_rank0_step9.json": json.dumps({"traceEvents": EVENTS}),
                             "trace_rank0_step10.json": json.dumps({"traceEvents": late})}, monkeypatch)
    assert result.metrics.profile.trace.endswith("trace_rank0_step10.json")
    assert result.metrics.profile.top_ops[0].name == "aten::late"


def test_a_negative_duration_is_no_time(tmp_path):
    events = EVENTS + [{"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": 0, "dur": -5_000}]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    ops = profile_summary(trace)["top_ops"]
    assert all(o["total_ms"] >= 0 for o in ops) and [o["name"] for o in ops] == ["aten::mm"]
