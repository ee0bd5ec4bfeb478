"""validation.execution.acceptance: a criterion whose and / or a known part decides is decided whatever the disturbed
figures it also reads hold (three-valued logic), and a step the runbook no longer lists counts for nothing in the
verdict, a failure of it in an earlier attempt included."""

from __future__ import annotations

import pytest

from validation.analysis.interference import step_interference
from validation.execution.acceptance import evaluate, verdict
from validation.runbook.loader import load_runbook

RUNBOOK = """\
name: kl
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - {name: busy, kind: train}
      - {name: quiet, kind: train, nproc_per_node: 1}
acceptance:
  - {name: c, expr: "EXPR", target: "-"}
"""

QUIET = {"disturbed": False, "text": "no interference in 8 samples", "share": 0.0}
BUSY = {"disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 5 of 8 samples (62%)",
        "share": 0.625}


def _metrics(toks: float, interference: dict) -> dict:
    return {"toks_per_s": {"mean": toks, "cv": 0.05, "n": 20}, "loss_drop": 2.5, "throughput_stable": True,
            "world_size": 1, "toks_per_s_per_gpu": toks, "interference": interference, "context": {"device": "cpu"}}


def _judge(tmp_path, expr: str, busy_toks: float, quiet_toks: float) -> tuple[dict, tuple[str, str]]:
    path = tmp_path / "kl.yaml"
    path.write_text(RUNBOOK.replace("EXPR", expr))
    rb = load_runbook(path)
    steps = {"busy": {"name": "busy", "kind": "train", "status": "passed", "runs": [],
                      "metrics": _metrics(busy_toks, BUSY)},
             "quiet": {"name": "quiet", "kind": "train", "status": "passed", "runs": [],
                       "metrics": _metrics(quiet_toks, QUIET)}}
    for s in steps.values():
        s["interference"] = step_interference(s)
    results = {"runbook": {"name": "kl", "path": "runbooks/kl.yaml"}, "run_dir": "artifacts/validate/kl-1",
               "steps": steps, "acceptance": []}
    results["acceptance"] = evaluate(rb, results, tmp_path)
    return results["acceptance"][0], verdict(results, False)


# (expression, busy's figure, quiet's figure) -> (status, verdict): busy's figure is disturbed, quiet's is not
@pytest.mark.parametrize("expr, busy, quiet, status, word", [
    # a known part that is false decides `and`, whatever the disturbed figure holds
    ("busy.toks_per_s.mean > 100 and quiet.toks_per_s.mean > 5000", 500.0, 4000.0, "fail", "NO-GO"),
    ("busy.toks_per_s.mean > 100 and quiet.toks_per_s.mean > 5000", 50.0, 4000.0, "fail", "NO-GO"),
    ("quiet.toks_per_s.mean > 5000 and busy.toks_per_s.mean > 100", 500.0, 4000.0, "fail", "NO-GO"),
    # a known part that is true decides `or`
    ("busy.toks_per_s.mean > 100 or quiet.toks_per_s.mean > 3000", 50.0, 4000.0, "pass", "GO"),
    ("busy.toks_per_s.mean > 100 or quiet.toks_per_s.mean > 3000", 500.0, 4000.0, "pass", "GO"),
    # `not` of an `and` a known part decided false
    ("not (busy.toks_per_s.mean > 100 and quiet.toks_per_s.mean > 5000)", 500.0, 4000.0, "pass", "GO"),
    # nothing known decides: inconclusive, whichever way the disturbed figure went
    ("busy.toks_per_s.mean > 100 and quiet.toks_per_s.mean > 3000", 500.0, 4000.0, "inconclusive", "INCOMPLETE"),
    ("busy.toks_per_s.mean > 100 and quiet.toks_per_s.mean > 3000", 50.0, 4000.0, "inconclusive", "INCOMPLETE"),
    ("busy.toks_per_s.mean > 100 or quiet.toks_per_s.mean > 5000", 500.0, 4000.0, "inconclusive", "INCOMPLETE"),
    ("busy.toks_per_s.mean > 100 or quiet.toks_per_s.mean > 5000", 50.0, 4000.0, "inconclusive", "INCOMPLETE"),
    # undisturbed figures decide as before
    ("quiet.toks_per_s.mean > 3000 and quiet.loss_drop > 1", 500.0, 4000.0, "pass", "GO"),
])
def test_a_known_part_decides_a_criterion_that_also_reads_a_disturbed_figure(tmp_path, expr, busy, quiet, status,
                                                                           word):
    row, (got_word, reason) = _judge(tmp_path, expr, busy, quiet)
    assert (row["status"], got_word) == (status, word), (row, reason)
    if status == "inconclusive":
        assert "step busy was disturbed" in row["detail"]


def _results(steps: dict[str, str], listed: list[str], criteria: list[tuple[str, str, str]] = ()) -> dict:
    """steps: name -> status; listed: the steps the run's phases hold (the runbook it last ran with)."""
    return {"steps": {n: {"name": n, "status": st, "reason": "boom" if st == "failed" else ""}
                      for n, st in steps.items()},
            "phases": [{"name": "p", "title": "P", "description": "", "steps": listed}],
            "acceptance": [{"name": n, "severity": sev, "status": st, "expr": "a.x > 1"} for n, sev, st in criteria]}


def test_a_removed_step_that_failed_before_is_no_no_go():
    res = _results({"a": "passed", "gone": "failed"}, ["a"], [("fast", "fail", "pass")])
    assert verdict(res, False) == ("GO", "1 step(s) passed and every required criterion holds")


def test_a_removed_step_that_passed_before_is_not_counted_as_passed():
    res = _results({"a": "passed", "gone": "passed"}, ["a"])
    assert verdict(res, False) == ("GO", "1 step(s) passed and every required criterion holds")


def test_a_listed_step_that_failed_is_still_no_go():
    res = _results({"a": "failed", "gone": "failed"}, ["a"])
    assert verdict(res, False) == ("NO-GO", "step(s) a failed")
