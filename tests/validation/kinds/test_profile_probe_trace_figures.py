"""The profile kind's figures from a hand-made torch profiler trace whose durations are known: each operator's time
(the time its events cover per thread or stream: an operator nested in itself, as aten::arange calls its out=
overload, counted once; other threads and streams counted in full), the top-k, the nsa.* ranges, the attribution of
step time (the step's own thread only: no other thread's events, no GPU copy of a range) against hand-computed
shares; a trace without events of a kind, a trace of the wrong format or cut off inside a character, and a trace an
earlier launch left in the directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.analysis.attribution import attribute_events
from validation.kinds import profile as profile_mod
from validation.kinds.blocks import Bullets, Paragraph
from validation.kinds.profile import Options, Profile, profile_summary
from validation.kinds.trainer import Launched
from validation.results.trainer_launch import LaunchMetrics


def _x(name: str, cat: str, ts: float, dur: float, pid: int = 1, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


# One profiled step (microseconds): nsa.step 0-10,000 then nsa.optim 10,000-12,000 on thread 1 of process 1.
TRACE = [
    _x("ProfilerStep#3", "user_annotation", 0, 13_000),
    _x("nsa.step", "user_annotation", 0, 10_000),
    _x("aten::arange", "cpu_op", 100, 30), _x("aten::arange", "cpu_op", 105, 21),  # the out= overload inside
    _x("aten::mm", "cpu_op", 1_000, 2_000),
    _x("nsa.sel", "user_annotation", 4_000, 2_000), _x("nsa.sel.topk", "user_annotation", 4_200, 500),
    _x("aten::mm", "cpu_op", 5_000, 500),
    _x("aten::add", "cpu_op", 7_000, 1_000),
    _x("nsa.optim", "user_annotation", 10_000, 2_000),
    _x("Optimizer.step#AdamW.step", "cpu_op", 10_100, 1_800),
    _x("aten::mm", "cpu_op", 1_500, 2_000, tid=2),  # another thread, overlapping thread 1's aten::mm
    _x("sgemm", "kernel", 1_000, 800, pid=0, tid=7), _x("sgemm", "kernel", 1_200, 800, pid=0, tid=8),  # two streams
    _x("nsa.sel", "gpu_user_annotation", 4_000, 2_000, pid=0, tid=7),  # Kineto's device copy of the range
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
    {"ph": "i", "name": "marker", "ts": 50, "pid": 1, "tid": 1},
]


def test_operator_times_calls_and_top_k_match_the_known_durations(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": TRACE}))
    summary = profile_summary(trace)
    # aten::mm: 2,000 + 500 us on thread 1, 2,000 us on thread 2; sgemm 800 us on each of two streams; the inner
    # aten::arange lies inside the outer one: 30 us, one call
    assert [(o["name"], o["total_ms"], o["calls"]) for o in summary["top_ops"]] == [
        ("aten::mm", 4.5, 3), ("Optimizer.step#AdamW.step", 1.8, 1), ("sgemm", 1.6, 2), ("aten::add", 1.0, 1),
        ("aten::arange", 0.03, 1)]
    assert [o["name"] for o in profile_summary(trace, top=3)["top_ops"]] == [
        "aten::mm", "Optimizer.step#AdamW.step", "sgemm"]
    assert summary["nvtx_ranges"] == ["nsa.optim", "nsa.sel", "nsa.sel.topk", "nsa.step"]


def test_an_operator_overlapping_its_own_end_counts_the_time_covered(tmp_path):
    trace = tmp_path / "t.json"
    events = [_x("aten::copy_", "cpu_op", 0, 100), _x("aten::copy_", "cpu_op", 60, 90),  # covers 0-150
              _x("aten::copy_", "cpu_op", 150, 10), _x("aten::copy_", "cpu_op", 500, 0)]
    trace.write_text(json.dumps({"traceEvents": events}))
    assert profile_summary(trace)["top_ops"] == [{"name": "aten::copy_", "total_ms": 0.16, "calls": 3}]


def test_attribution_shares_match_the_hand_computed_timeline():
    att = attribute_events(TRACE)
    step_us = 12_000.0  # nsa.step 10,000 + nsa.optim 2,000
    # idle 0-100, 130-1,000, 3,000-4,000, 6,000-7,000, 8,000-10,000; thread 2's aten::mm and the GPU copy of
    # nsa.sel are not the step thread's
    expected = {"importance and top-k": 500, "attention branches": 200 + 1_300, "communication": 0,
                "optimizer": 2_000, "data": 0, "MLP/GEMM": 2_000, "other": 30 + 1_000,
                "idle": 100 + 870 + 1_000 + 1_000 + 2_000}
    assert sum(expected.values()) == step_us
    assert att["steps"] == 1 and att["step_time_ms"] == pytest.approx(12.0)
    assert att["categories"] == pytest.approx({k: v / step_us for k, v in expected.items()})
    assert att["ranges"] == pytest.approx({"nsa.sel": 2_000 / step_us, "nsa.sel.topk": 500 / step_us})


def _run(tmp_path: Path, traces: dict[str, bytes], monkeypatch, old: tuple[str, ...] = ()):
    """Profile.run over a launch of 60 s that passed, its out/profile holding `traces`; those named in `old` were
    last written an hour before it started."""
    out = tmp_path / "prof" / "out" / "profile"
    out.mkdir(parents=True)
    hour_ago = time.time() - 3600
    for name, data in traces.items():
        (out / name).write_bytes(data)
        if name in old:
            os.utime(out / name, (hour_ago, hour_ago))
    spec = SimpleNamespace(dir="prof", out_dir="prof/out", wrapper=None)
    one = Launched(spec, SimpleNamespace(status="ok", duration_s=60.0), "passed", None, LaunchMetrics())
    monkeypatch.setattr(profile_mod, "launch_one", lambda ctx: one)
    ctx = SimpleNamespace(run_dir=tmp_path, rel=lambda p: str(Path(p).relative_to(tmp_path)))
    return Profile().run(Options(), ctx)


def _trace(events: list) -> bytes:
    return json.dumps({"traceEvents": events}).encode()


def test_a_trace_cut_off_inside_a_character_fails_the_step_naming_it(tmp_path, monkeypatch):
    text = json.dumps({"traceEvents": [_x("nsa.step", "user_annotation", 0, 10), _x("café", "cpu_op", 1, 2)]},
                      ensure_ascii=False).encode()
    cut = text[:text.index("é".encode()) + 1]  # the first byte of two
    result = _run(tmp_path, {"trace_rank0_step4.json": cut}, monkeypatch)
    assert result.status == "failed"
    assert "prof/out/profile/trace_rank0_step4.json" in result.reason and "not valid JSON" in result.reason
    assert result.metrics.profile.top_ops == [] and result.metrics.profile.nvtx_ranges == []


def test_a_trace_that_is_a_bare_event_list_fails_the_step(tmp_path, monkeypatch):
    result = _run(tmp_path, {"trace_rank0_step4.json": json.dumps(TRACE).encode()}, monkeypatch)
    assert result.status == "failed" and "no traceEvents list" in result.reason


def test_a_trace_an_earlier_launch_left_is_not_this_launchs(tmp_path, monkeypatch):
    earlier = [dict(e, name="aten::earlier") if e["name"] == "aten::mm" else e for e in TRACE]
    # a resumed earlier run's trace of a later step, left beside this launch's
    result = _run(tmp_path, {"trace_rank0_step50.json": _trace(earlier), "trace_rank0_step7.json": _trace(TRACE)},
                  monkeypatch, old=("trace_rank0_step50.json",))
    assert result.status == "passed", result.reason
    assert result.metrics.profile.trace == "prof/out/profile/trace_rank0_step7.json"
    assert result.metrics.profile.top_ops[0].name == "aten::mm"
    assert "prof/out/profile/trace_rank0_step50.json" not in result.artifacts


def test_only_an_earlier_launchs_trace_fails_the_step(tmp_path, monkeypatch):
    result = _run(tmp_path, {"trace_rank0_step7.json": _trace(TRACE)}, monkeypatch, old=("trace_rank0_step7.json",))
    assert result.status == "failed" and "no profiler trace was written" in result.reason
    assert "earlier launch" in result.reason
    assert result.metrics.profile.trace is None and result.metrics.profile.nvtx_ranges == []


def test_a_trace_without_steps_or_operators_passes_with_nothing_attributed(tmp_path, monkeypatch):
    ranges_only = [e for e in TRACE if e.get("cat") == "user_annotation" and e["name"] not in ("nsa.step",)]
    result = _run(tmp_path, {"trace_rank0_step7.json": _trace(ranges_only)}, monkeypatch)
    prof = result.metrics.profile
    assert result.status == "passed"
    assert prof.top_ops == [] and prof.nvtx_ranges == ["nsa.optim", "nsa.sel", "nsa.sel.topk"]
    assert prof.attribution.steps == 0 and prof.attribution.categories == {}
    blocks = Profile().blocks(result)
    assert any(isinstance(b, Paragraph) and "No operator table" in b.text for b in blocks)
    bullets = [item for b in blocks if isinstance(b, Bullets) for item in b.items]
    assert not any(item.startswith("Step time by category") for item in bullets)
