"""The run record (validation.results.run): every committed results.json decodes strictly into Run and encodes back to
the same JSON; a damaged one decodes leniently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation.results.codec import decode, encode
from validation.results.run import Run, Step, read_run

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(REPO.glob("reports/**/results.json"))


def _same(a, b) -> str:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_committed_run_decodes_strictly_and_encodes_back_unchanged(path):
    data = json.loads(path.read_text())
    run = decode(Run, data, str(path))
    assert _same(encode(run), data)
    assert read_run(data) == run  # lenient reading of a sound record: the same record
    assert all(isinstance(s, Step) for s in run.steps.values())


def test_the_committed_runs_are_there():
    assert len(COMMITTED) >= 6


def test_a_damaged_run_reads_leniently():
    run = read_run({"verdict": 3, "steps": {"a": None, "b": {"status": "odd", "runs": [None], "metrics": [1]}},
                    "acceptance": [{}], "recommendations": {"env": None}, "environment": {"gpus": [{"name": "H"}]}})
    assert run.verdict is None and run.steps["a"] is None
    assert run.steps["b"].status == "odd" and run.steps["b"].metrics == {} and len(run.steps["b"].runs) == 1
    assert run.recommendations.env == {} and run.environment.gpus[0].name == "H"
    assert read_run(None) == Run() and read_run(run) is run
    assert read_run({}).environment.gpus is None


def test_a_performance_analysis_and_an_evidence_record_round_trip():
    """The blocks a committed run lacks: a comparison with an earlier run (as compare.performance_analysis writes it)
    and the evidence record (evidence.assess's keys)."""
    block = json.loads((REPO / "tests/validation/fixtures/performance_analysis.json").read_text("utf-8"))
    evidence = {"disturbed": [{"step": "baseline", "text": "another process used 40% CPU",
                               "launches": [{"label": "", "repeat": None, "disturbed": True, "share": 0.4,
                                             "text": "another process used 40% CPU"}]}],
                "implausible": [{"metric": "toks_per_s.cv", "value": 3.5, "range": "[0, 1]", "reason": "a CV",
                                 "step": "baseline", "disturbed": True}],
                "measured": ["baseline"], "rules": "disturbed when ...", "rerun": "nsa-validate run r.yaml --resume d"}
    data = {"performance_analysis": block, "evidence": evidence}
    run = decode(Run, data, "results")
    assert _same(encode(run), {**encode(Run()), **data})
    assert run.performance_analysis.rows and run.performance_analysis.family.statement
    assert run.evidence.disturbed[0].launches[0]["share"] == 0.4 and run.evidence.implausible[0].disturbed
    assert "performance_analysis" not in encode(Run()) and "evidence" not in encode(Run())


@pytest.mark.parametrize("data", [json.loads(p.read_text()) for p in COMMITTED] + [
    {}, {"phases": [{"name": "p", "steps": ["ghost", 3]}], "steps": {"orphan": {"kind": "train"}, "bad": None}},
    {"phases": [None, {"steps": "x"}], "steps": {"b": {}, "a": {}}}])
def test_the_steps_in_runbook_order_are_formatting_s(data):
    """Run.phases_in_order and steps_in_order walk the steps as validation.formatting.ordered_steps does (the
    phases' step names, then the steps no phase lists, sorted), a step that is not an object as None."""
    from validation.formatting import ordered_steps, steps_in_order

    run = read_run(data)
    assert [names for _, names in run.phases_in_order()] == [names for _, names in ordered_steps(data)]
    assert [(n, s is None) for n, s in run.steps_in_order()] == [(n, not isinstance(s, dict))
                                                                 for n, s in steps_in_order(data)]
