"""The sanitizer kind's Result (validation.kinds.sanitizer): every committed sanitizer step record decodes strictly
into it and encodes back unchanged (the whole step entry: its frame, metrics and artifacts, the step's and the
metrics' keys in the same order, numbers of the same JSON type; a case's record in the order CaseResult writes it,
its flags after its own keys, which the committed runs, written before the metrics were typed, do not share); its
metrics are typed (a CaseResult per case, the flags' values in its `extra`)."""

from __future__ import annotations

import json

from validation.kinds import get
from validation.kinds.sanitizer import CaseResult, Metrics, Result, totals
from validation.results.codec import decode, encode
from results_records import committed_steps


def test_every_committed_sanitizer_step_decodes_strictly_and_encodes_back_unchanged():
    seen = 0
    for where, step in committed_steps("sanitizer"):
        result = decode(Result, step, where)
        out = encode(result)
        assert json.dumps(out, sort_keys=True) == json.dumps(step, sort_keys=True), where
        assert list(out) == list(step) and list(out["metrics"]) == list(step["metrics"]), where
        m = result.metrics
        assert isinstance(m, Metrics) and m.cases == len(m.by_case) and m.by_case, where
        assert all(isinstance(c, CaseResult) and c.extra for c in m.by_case), where  # the flags' values
        assert get("sanitizer").read(step) == result
        seen += 1
    assert seen >= 2


def test_the_metrics_encode_as_the_dict_writer_wrote_them():
    case = CaseResult(case="dtype=bf16", status="errors", errors=2, returncode=1, first_error="Invalid read",
                      reason="exited 1", duration_s=1.5, extra={"dtype": "bf16"})
    m = totals(Metrics(tool="memcheck", grid="default", sanitizer="/bin/compute-sanitizer"), [case])
    assert encode(m) == {"tool": "memcheck", "grid": "default", "sanitizer": "/bin/compute-sanitizer", "cases": 1,
                         "cases_clean": 0, "errors": 2, "by_case": [encode(case)]}
    assert list(encode(case)) == ["case", "status", "errors", "returncode", "first_error", "reason", "duration_s",
                                  "dtype"]
    assert encode(Result())["metrics"] == {} and decode(Result, {"metrics": {}}).metrics is None


def test_the_hooks_read_the_result_and_a_damaged_step_leniently():
    kind = get("sanitizer")
    clean = CaseResult(case="a=1", status="clean", errors=0, returncode=0, extra={"a": "1"})
    bad = CaseResult(case="a=2", status="errors", errors=3, returncode=1, first_error="Invalid read",
                     extra={"a": "2"})
    step = Result(name="check", kind="sanitizer", status="failed",
                  metrics=totals(Metrics(tool="memcheck", grid="default"), [clean, bad]))
    assert kind.summary_line(step) == " (1 of 2 cases clean, 3 memcheck errors)"
    figures = kind.key_figures([step, kind.read({"kind": "sanitizer", "name": "never", "metrics": {}}),
                                get("snapshot").read({"kind": "snapshot", "name": "snap", "metrics": {"cases": 2}})])
    assert [(f.id, f.value, f.steps) for f in figures] == [("sanitizer_cases_clean", "1 of 2 cases clean",
                                                           ("check",))]
    assert "first not clean: a=2" in figures[0].note
    assert len(kind.blocks(step)) == 2 and kind.blocks(kind.read({"metrics": {}})) == []
    assert kind.blocks(kind.read({"metrics": [1]})) == [] and kind.summary_line(kind.read(None)) == ""
    damaged = kind.read({"metrics": {"tool": 5, "cases": 1, "by_case": [{"case": "x", "status": "clean",
                                                                       "errors": "n"}]}})
    assert damaged.metrics.tool is None and damaged.metrics.by_case[0].errors is None
