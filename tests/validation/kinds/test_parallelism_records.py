"""The parallelism kind's typed records (validation.kinds.parallelism.records): every committed parallelism step
decodes strictly into its Result and encodes back unchanged, the recommendation computed through the records writes
what the committed metrics hold, and what the analysis layer hands over (recommendation, traces) reads as records."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.analysis.parallelism import (Evidence, aligned_collectives, exposed_comm, recommend,
                                             recommendation)
from validation.kinds.parallelism import Strategy
from validation.kinds.parallelism.analysis import decide_recommendation, figures, strategy_figures
from validation.kinds.parallelism.records import Metrics, Result, RunInfo, Searched, Skipped, StrategyFigures
from validation.results.codec import decode, encode
from validation.results.decision import ComparisonRecord
from validation.results.model import ResultsError
from validation.results.trainer_launch import LaunchRun

REPO = Path(__file__).resolve().parents[3]
RECOMMENDATION_KEYS = ("batch_needed", "recommendation", "recommendation_reason", "regime", "recommendation_numbers")


def _steps():
    for path in sorted(REPO.glob("reports/**/results.json")):
        for name, step in json.loads(path.read_text()).get("steps", {}).items():
            if step.get("kind") == "parallelism":
                yield f"{path}: steps.{name}", step


def test_every_committed_parallelism_step_decodes_into_its_result_and_encodes_back_unchanged():
    """Strictly decoded (metrics, runs, run order), and each part written back with the same keys in the same order,
    the same values and the same JSON number types."""
    seen = 0
    for where, step in _steps():
        result = decode(Result, step, where)
        out = encode(result)
        assert set(out) == {f.name for f in dataclasses.fields(Result) if f.name in step}, where
        for key, value in out.items():
            assert json.dumps(value) == json.dumps(step[key]), (where, key)
        m = result.metrics
        assert m.strategies and all(isinstance(s, StrategyFigures) for s in m.strategies.values()), where
        assert all(isinstance(c, ComparisonRecord) for c in m.comparisons.values()), where
        assert m.batch_search is None or isinstance(m.batch_search, (Skipped, dict)), where
        assert m.recommendation in m.strategies and m.recommendation_numbers[m.recommendation].fits, where
        seen += 1
    assert seen >= 1


def test_the_recommendation_read_through_the_records_writes_what_the_committed_metrics_hold():
    """decide_recommendation on a committed step's metrics without its recommendation: the batch needed from the
    runs' micro-batch, the same strategy, regime, reason and numbers, keys in the same order."""
    seen = 0
    for where, step in _steps():
        m = copy.deepcopy(step["metrics"])
        for key in RECOMMENDATION_KEYS:
            m.pop(key)
        par = SimpleNamespace(launch=SimpleNamespace(args={}), headroom=step["metrics"]["headroom"])
        out = decide_recommendation(par, decode(Metrics, m, where), [decode(LaunchRun, r) for r in step["runs"]])
        assert json.dumps(encode(out)) == json.dumps(step["metrics"]), where
        seen += 1
    assert seen >= 1


def test_a_damaged_step_reads_leniently_and_strictly_names_the_key():
    damaged = {"metrics": {"strategies": {"ddp": None, "fsdp": {"passed": "two"}}, "comparisons": "x",
                           "capacity": 3, "batch_search": {"ddp": 3}}, "runs": [{"label": 1}], "order_seed": "s"}
    r = decode(Result, damaged, lenient=True)
    assert r.metrics.strategies == {"ddp": StrategyFigures(), "fsdp": StrategyFigures()}
    assert r.metrics.comparisons == {} and r.metrics.capacity.gb is None and r.metrics.batch_search is None
    assert r.runs == [LaunchRun()] and r.order_seed is None
    with pytest.raises(ResultsError, match=r"steps.p.metrics.strategies.fsdp.passed: expected int | None, got str"):
        decode(Result, {"metrics": {"strategies": {"fsdp": {"passed": "two"}}}}, "steps.p")
    searched = decode(Result, {"metrics": {"batch_search": {"ddp": {"largest": 2, "first_oom": 3, "error": None,
                                                                    "tried": [{"batch": 2, "fits": True}]}}}})
    assert searched.metrics.batch_search["ddp"] == Searched(2, 3, None, [searched.metrics.batch_search["ddp"].tried[0]])
    assert decode(Result, {"metrics": {"batch_search": {"skipped": "CPU"}}}).metrics.batch_search == Skipped("CPU")


def test_recommend_is_the_recommendations_json_form_and_takes_records_or_their_json():
    evidence = {"ddp": {"fits": True, "peak_gb": 76, "capacity_gb": 80, "toks_per_s": 100.0},
                "fsdp": {"fits": True, "peak_gb": 50, "capacity_gb": 80, "toks_per_s": 108.0}}
    comparisons = {"fsdp:ddp": {"rel": 0.08, "ci_low": 0.05, "ci_high": 0.11, "p_value": 0.001, "significant": True}}
    out = recommend(evidence, comparisons)
    assert list(out) == ["strategy", "regime", "reason", "numbers", "headroom_required"]
    assert list(out["numbers"]["ddp"]) == ["fits", "headroom", "toks_per_s", "peak_gb", "capacity_gb",
                                           "largest_batch"]
    typed = recommendation({k: Evidence(**v) for k, v in evidence.items()},
                           {k: decode(ComparisonRecord, v) for k, v in comparisons.items()})
    assert dataclasses.asdict(typed) == out and (typed.strategy, typed.regime) == ("fsdp", "tight")


def _x(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_the_strategy_figures_read_the_runs_and_their_files_as_records():
    """What read_run gives (summary.json, the traces' figures, env.json) reads as a RunInfo, and the figures of a
    strategy are the same from the records as from their JSON form."""
    events = [_x("ProfilerStep#5", 0, 1000, cat="user_annotation"), _x("aten::mm", 0, 100),
              _x("gloo:all_reduce", 50, 200, tid=7, cat="user_annotation")]
    trace = exposed_comm(events)
    aligned = aligned_collectives([events, [dict(e, ts=e["ts"] + 20) for e in events]])
    per_step = [{"kind": "all_reduce", "calls": 2, "bytes": 66560, "sizes": [65536, 1024]}]
    summary = {"schema": 1, "world_size": 2, "steps": 10, "avg_step_time_excl_first_s": 0.2, "peak_mem_alloc_gb": 0.5,
               "peak_mem_reserved_gb": None, "memory_kind": "cpu_rss",
               "memory_model": {"strategy": "ddp", "world_size": 2, "params": 4, "grads": 4, "optimizer_state": 8,
                                "buffers": 4, "activations": 16, "total": 36},
               "comm_time_s": 0.5, "comm_share": 0.2, "comm": {"counted_by": "ddp_comm_hook", "per_step": per_step},
               "comm_model": {"strategy": "ddp", "per_step": {"all_reduce": {"calls": 2, "bytes": 66560}}},
               "comm_model_matches": True}
    info = {"summary": summary, "trace": trace, "env": {"devices": [{"memory_gb": 80}]}, "aligned": aligned}
    record = decode(RunInfo, info, lenient=True)
    assert record.trace.per_step_exposed_s == trace["per_step_exposed_s"] and record.trace.steps == 1
    assert record.aligned.per_step_s == aligned["per_step_s"] and record.env.devices[0].memory_gb == 80
    assert record.summary.comm.per_step[0].sizes == [65536, 1024] and record.summary.memory_model.total == 36
    runs = [{"label": "ddp", "status": "passed", "repeat": i, "metrics": {"toks_per_s": {"mean": m}}}
            for i, m in enumerate((100.0, 110.0))]
    as_json = strategy_figures("ddp", Strategy(strategy="ddp"), runs, [info, info], None, "n/a")
    typed = figures("ddp", Strategy(strategy="ddp"), [decode(LaunchRun, r) for r in runs], [record, record], None,
                    "n/a")
    assert as_json == encode(typed)
    assert as_json["per_step"] == per_step and as_json["memory_model"] == summary["memory_model"]
    assert typed.comm_bytes_counted == typed.comm_bytes_model == 66560 and typed.comm_model_matches is True
    assert "comm_predicted_by_kind" not in as_json and typed.exposed_source.endswith("1 profiled step(s) each")
