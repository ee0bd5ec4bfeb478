"""Figures of the profile and bench kinds against hand counts: an operator's call of no duration at the very start of
an outer call of the same name (a trace in whole microseconds records one) is inside it, no call of its own; a
benchmark figure that is an integer past a float's range is no number (recorded as null and named), and `best`
never raises on one."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from validation.kinds.bench import Bench, Best, Options, best_records, finite_figures
from validation.kinds.profile import profile_summary
from validation.runbook.expressions import compile_expression


def _x(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": "cpu_op", "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_a_call_of_no_duration_at_the_start_of_an_outer_call_is_inside_it(tmp_path):
    # aten::arange 100-103 us calls its out= overload (also aten::arange) recorded at 100 with 0 us; a second call
    # 200-205 us; on another thread one call 100-101 us. By hand: 3 + 5 + 1 = 9 us in 3 calls.
    events = [_x("aten::arange", 100, 0), _x("aten::arange", 100, 3), _x("aten::arange", 200, 5),
              _x("aten::arange", 100, 1, tid=2)]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert profile_summary(trace)["top_ops"] == [{"name": "aten::arange", "total_ms": 0.009, "calls": 3}]
    # written the other way round: the same figures
    trace.write_text(json.dumps({"traceEvents": events[::-1]}))
    assert profile_summary(trace)["top_ops"] == [{"name": "aten::arange", "total_ms": 0.009, "calls": 3}]


def test_calls_touching_end_to_start_stay_two_calls(tmp_path):
    # 0-5 and 5-9 us: two calls, 9 us; a call of no duration at 20 us alone: a call of its own, no time
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [_x("aten::mm", 5, 4), _x("aten::mm", 0, 5), _x("aten::mm", 20, 0)]}))
    assert profile_summary(trace)["top_ops"] == [{"name": "aten::mm", "total_ms": 0.009, "calls": 3}]


HUGE = 10 ** 400  # exact in Python's json, past a float's range (1.8e308)


def test_an_integer_past_a_floats_range_is_no_figure():
    rows = [{"model": "nsa", "toks_per_s": HUGE}, {"model": "nsa", "toks_per_s": 120},
            {"model": "dense", "toks_per_s": 200.0}]
    cleaned, found = finite_figures({"results": rows, "n": 3})
    assert cleaned == {"results": [{"model": "nsa", "toks_per_s": None}, {"model": "nsa", "toks_per_s": 120},
                                   {"model": "dense", "toks_per_s": 200.0}], "n": 3}
    assert found == ["results[0].toks_per_s (an integer past a float's range)"]
    # best over the rows as written: the huge one is no number, so the 120 row is nsa's fastest (no OverflowError)
    assert best_records(rows, Best(by="model", field="toks_per_s")) == {"nsa": rows[1], "dense": rows[2]}
    assert best_records(rows, Best(by="model", field="toks_per_s", largest=False)) == {"nsa": rows[1],
                                                                                     "dense": rows[2]}


def test_a_bench_step_records_a_huge_integer_as_null_and_its_criterion_is_an_error(tmp_path):
    step_dir = tmp_path / "bench"
    step_dir.mkdir()
    rows = [{"model": "nsa", "mode": "eager", "toks_per_s": HUGE}, {"model": "nsa", "mode": "graphs", "toks_per_s": 90},
            {"model": "dense", "mode": "eager", "toks_per_s": 200.0}]

    def launch(spec, index, total):
        (step_dir / "bench.json").write_text(json.dumps(rows))
        return SimpleNamespace(status="ok", reason="exited 0", returncode=0)

    ctx = SimpleNamespace(run_dir=tmp_path, launches=[SimpleNamespace(dir="bench")], launch=launch,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    result = Bench().run(Options(command=["b.py"], best=Best(by="model", field="toks_per_s")), ctx)
    assert result.status == "passed"
    assert result.metrics["results"][0]["toks_per_s"] is None
    assert result.metrics["best"]["nsa"]["toks_per_s"] == 90 and result.metrics["best"]["dense"]["toks_per_s"] == 200.0
    assert result.notes and "results[0].toks_per_s" in result.notes[0]
    # the runbook's criterion reads nsa's best (90): 90 >= 0.55 * 200 fails as measured, instead of passing on 1e400
    verdict = compile_expression("t.best.nsa.toks_per_s >= 0.55 * t.best.dense.toks_per_s").evaluate(
        {"t": result.metrics})
    assert verdict.status == "fail"
