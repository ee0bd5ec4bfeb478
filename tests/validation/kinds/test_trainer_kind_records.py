"""The scan, triage, scaling, comm and profile kinds read their step records as typed Results: every committed step of
each decodes strictly into its Result (validation.results.codec) and encodes back to the same parts of the step
record, each with its keys in the same order and its numbers of the same JSON type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation.kinds.comm import Metrics as CommMetrics
from validation.kinds.profile import Metrics as ProfileMetrics
from validation.kinds.scan import Result as ScanResult
from validation.results.codec import decode, encode

REPO = Path(__file__).resolve().parents[3]


def _steps(kind):
    for path in sorted(REPO.glob("reports/**/results.json")):
        for name, step in json.loads(path.read_text()).get("steps", {}).items():
            if step.get("kind") == kind:
                yield f"{path}: steps.{name}", step


@pytest.mark.parametrize("kind, result_type", [("comm", CommMetrics), ("profile", ProfileMetrics)])
def test_a_kind_reads_and_writes_its_committed_metrics_through_the_codec(kind, result_type):
    """A Result of the step's metrics only (the kind writes nothing else of the record)."""
    seen = 0
    for where, step in _steps(kind):
        result = decode(result_type, step["metrics"], f"{where}.metrics")
        assert json.dumps(encode(result)) == json.dumps(step["metrics"]), where
        seen += 1
    assert seen >= 1


def test_a_damaged_scan_record_still_reads_with_its_defaults():
    r = decode(ScanResult, {"metrics": {"exponent": "x", "points": [1, {"value": 64, "runs": "two"}],
                                        "bisection": [], "exponent_ci": "no"}, "runs": None}, lenient=True)
    assert r.metrics.exponent is None and r.metrics.exponent_ci is None and r.metrics.bisection is None
    assert [p.value for p in r.metrics.points] == [None, 64] and r.metrics.points[1].runs is None and r.runs == []


def test_a_comm_record_reads_its_collectives_in_the_order_of_kinds():
    """The collectives measured, in the order the comm kind lists them (KINDS: the order its metrics are written
    in), a damaged one left out."""
    from validation.kinds.comm import measured, tables

    row = {"bytes": 4096, "time_s": 0.001, "algbw_gbps": 0.004, "busbw_gbps": 0.004}
    metrics = {"world_size": 2, "backend": "gloo", "source": "torch", "broadcast": {"table": [row]},
               "all_reduce": {"table": [row], "busbw_gbps": {"max": 0.004}}, "all_gather": "damaged"}
    r, kinds = measured(metrics)
    assert list(kinds) == ["all_reduce", "broadcast"] and r.all_reduce.busbw_gbps.max == 0.004
    assert tables(metrics) == {"all_reduce": [row], "broadcast": [row]} and tables(r) == tables(metrics)


def test_a_triage_step_without_a_verdict_has_no_ranked_metrics():
    from validation.kinds.triage import ranked

    assert ranked({"metrics": {}}) is None and ranked({"metrics": {"reason": "x"}}) is None and ranked([]) is None
    m = ranked({"metrics": {"culprit": None, "reason": "no ranking: too few runs", "suspects": {"a": "damaged"}}})
    assert m is not None and m.culprit is None and m.suspects["a"].effect is None


def test_a_profile_record_without_a_profile_reads_its_keys_from_the_top_and_older_operator_times():
    from validation.kinds import get

    top = {"status": "ok", "top_ops": [{"name": "aten::mm", "self_time_ms": 2.5, "calls": 3}], "trace": "t.json"}
    profile = get("profile")
    text = "\n".join(str(b) for b in profile.blocks(profile.read({"name": "p", "metrics": top})))
    assert "aten::mm" in text and "2.5" in text and "t.json" in text
    r = decode(ProfileMetrics, {"status": "ok"})  # no profile: what run() writes where no trace was written
    assert r.profile.top_ops == [] and encode(r)["profile"] == {"trace": None, "top_ops": [], "nvtx_ranges": []}


def test_a_damaged_value_leaves_the_rest_of_its_table_in_the_report():
    """A collective, a scaling mode or an attribution whose record is never null decodes field by field: one
    malformed value is read as missing, its neighbours still shown."""
    from validation.kinds import get

    row = {"bytes": 4096, "time_s": "x", "algbw_gbps": 0.004, "busbw_gbps": 0.004}
    comm = {"metrics": {"world_size": 2, "backend": "gloo", "source": "torch", "all_reduce": {"table": [row]}}}
    assert "4 KiB" in "\n".join(str(b) for b in get("comm").blocks(get("comm").read(comm)))
    strong = {"mode": "strong", "base": "one", "rows": [{"world_size": 2, "toks_per_s": 10.0, "efficiency": 0.5}],
              "efficiency": {"min": 0.5}}
    scaling = get("scaling").read({"metrics": {"strong": strong}})
    assert "strong efficiency min 0.5" in get("scaling").summary_line(scaling)
    assert "50%" in "\n".join(str(b) for b in get("scaling").blocks(scaling))


def test_profile_summary_reads_the_complete_events_of_a_trace(tmp_path):
    from validation.kinds.profile import profile_summary

    events = [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 1500},
              {"ph": "X", "name": "aten::mm", "cat": "kernel", "ts": 10, "dur": 500.5},
              {"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": 20, "dur": 3000},
              {"ph": "X", "name": "nsa.sel", "cat": "user_annotation", "ts": 0, "dur": 9000},
              {"ph": "i", "name": "nsa.marker", "cat": "cpu_op", "ts": 5}, "not an event"]
    trace = tmp_path / "trace_rank0_step2.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert profile_summary(trace) == {"top_ops": [{"name": "aten::add", "total_ms": 3.0, "calls": 1},
                                                  {"name": "aten::mm", "total_ms": 2.001, "calls": 2}],
                                      "nvtx_ranges": ["nsa.sel"]}
    trace.write_text("[not json")
    assert profile_summary(trace) == {"top_ops": [], "nvtx_ranges": []}
