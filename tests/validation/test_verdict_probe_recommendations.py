"""validation.execution.acceptance: the recommended settings come only from a recommendable decision of a step that
passed; two decisions that chose different values of one setting recommend neither; a baseline that won is
recommended with the settings it ran with; a note says where a value that stays comes from; and a criterion naming a
step without a record (a resumed run whose runbook gained steps, cut off before them) is not evaluated instead of
ending the run in a KeyError."""

from __future__ import annotations

from validation.execution.acceptance import evaluate, recommendations, verdict
from validation.runbook.loader import load_runbook

RUNBOOK = """\
name: r
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
recommend: {env: {NSA_DDP_BUCKET_MB: "25", NSA_PREFILL_BATCHED: "1"}}
phases:
  - name: p
    steps:
      - {name: base, kind: train}
      - {name: later, kind: train}
acceptance:
  - {name: "Later loss falls", expr: "later.loss_drop > 0", target: "> 0"}
"""

REPLICATED = {"significant": True, "recommendable": True,
              "recommendation": "recommended: significant and ahead in every one of 3 interleaved blocks"}
NOT_REPLICATED = {"significant": True, "recommendable": False,
                  "recommendation": "no recommendation: not in every interleaved block"}


def _rb(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RUNBOOK)
    return load_runbook(path)


def _decided(kind: str, label: str, params: dict, decision: dict, status: str = "passed", reason=None,
             runs: list | None = None) -> dict:
    choice = {"label": label, "params": params, "explanation": "faster", "significant": decision["significant"],
              "kept_default": False}
    return {"kind": kind, "status": status, "reason": reason, "decision": decision, "choice": choice,
            "winner": choice if decision["significant"] else None,
            "runs": runs if runs is not None else [{"label": label, "params": params}]}


def _steps(**decided) -> dict:
    return {"steps": {"base": {"kind": "train", "status": "passed"}, **decided}}


def test_a_failed_step_recommends_nothing_even_from_a_replicated_decision(tmp_path):
    """An optional A/B whose compressed variant crashed in its fourth repeat: the step failed, the run may still be
    GO, and the decision over the three repeats left is replicated (validation.kinds.ab records it so); a setting
    whose launch crashed is no setting to export (the old code exported NSA_DDP_COMPRESS=bf16)."""
    ab = _decided("ab", "compressed", {"env.NSA_DDP_COMPRESS": "bf16"}, REPLICATED, status="failed",
                  reason="compressed: rank 0 exited 1")
    rec = recommendations(_rb(tmp_path), _steps(compress=ab))
    assert rec["env"] == {"NSA_DDP_BUCKET_MB": "25", "NSA_PREFILL_BATCHED": "1"}
    assert rec["notes"] == ["compress: no recommendation: the step did not pass (failed: compressed: rank 0 exited 1); "
                            "compressed kept, NSA_DDP_COMPRESS not recommended from this step"]


def test_two_decisions_that_chose_different_values_recommend_neither(tmp_path):
    """Two sweeps, each replicated, chose 100 and 50 MB: the old code exported the later one's 50 while the earlier
    one's note still read as its recommendation of 100. Neither is the setting to use: the runbook's 25 stays."""
    a = _decided("sweep", "NSA_DDP_BUCKET_MB=100", {"env.NSA_DDP_BUCKET_MB": "100"}, REPLICATED)
    b = _decided("sweep", "NSA_DDP_BUCKET_MB=50", {"env.NSA_DDP_BUCKET_MB": "50"}, REPLICATED)
    rec = recommendations(_rb(tmp_path), _steps(sw1=a, sw2=b))
    assert rec["env"] == {"NSA_DDP_BUCKET_MB": "25", "NSA_PREFILL_BATCHED": "1"}
    disagree = ("NSA_DDP_BUCKET_MB not recommended: the decisions disagree (sw1: NSA_DDP_BUCKET_MB=100, sw2: "
                "NSA_DDP_BUCKET_MB=50); NSA_DDP_BUCKET_MB=25 (the runbook's recommendation) stays")
    assert rec["notes"] == [f"sw1: NSA_DDP_BUCKET_MB=100 (faster); {disagree}",
                            f"sw2: NSA_DDP_BUCKET_MB=50 (faster); {disagree}"]


def test_two_decisions_that_agree_recommend_their_value_whatever_its_type(tmp_path):
    """"0" (a value as the launch's environment held it) and 0 (a hand-written record) are one value: they agree."""
    path = tmp_path / "plain.yaml"
    path.write_text("name: r\nphases:\n  - name: p\n    steps:\n      - {name: base, kind: train}\n")
    rb = load_runbook(path)
    a = _decided("sweep", "NSA_DDP_BUCKET_MB=0", {"env.NSA_DDP_BUCKET_MB": "0"}, REPLICATED)
    b = _decided("ab", "zero", {"env.NSA_DDP_BUCKET_MB": 0}, REPLICATED)
    rec = recommendations(rb, _steps(sw=a, ab=b))
    assert rec["env"] == {"NSA_DDP_BUCKET_MB": "0"}
    assert rec["notes"] == ["sw: NSA_DDP_BUCKET_MB=0 (faster)", "ab: zero (faster)"]


def test_a_value_that_stays_is_said_to_come_from_where_it_came_from(tmp_path):
    """sw1 recommends 100; sw2 swept the same setting without a replicated effect: what stays is sw1's 100, which the
    old note called "the runbook's recommendation" (the runbook says 25)."""
    a = _decided("sweep", "NSA_DDP_BUCKET_MB=100", {"env.NSA_DDP_BUCKET_MB": "100"}, REPLICATED)
    b = _decided("sweep", "NSA_DDP_BUCKET_MB=50", {"env.NSA_DDP_BUCKET_MB": "50"}, NOT_REPLICATED)
    rec = recommendations(_rb(tmp_path), _steps(sw1=a, sw2=b))
    assert rec["env"]["NSA_DDP_BUCKET_MB"] == "100"
    assert rec["notes"][1] == ("sw2: no recommendation: not in every interleaved block; NSA_DDP_BUCKET_MB=50 kept, "
                               "NSA_DDP_BUCKET_MB not recommended from this step; NSA_DDP_BUCKET_MB=100 (measured in "
                               "sw1) stays")


def test_a_baseline_that_won_is_recommended_with_the_settings_it_ran_with(tmp_path):
    """A choice without params (an A/B baseline's in older records) is read from what its runs ran with. Sequential
    prefill (NSA_PREFILL_BATCHED=0) beat batched in every repeat: the old code left the runbook's 1, the setting just
    measured to be slower, in the exports. A baseline that pins nothing changes nothing."""
    runs = [{"label": "baseline", "params": {"env.NSA_PREFILL_BATCHED": "0"}},
            {"label": "batched", "params": {"env.NSA_PREFILL_BATCHED": "1"}}]
    ab = _decided("ab", "baseline", {}, REPLICATED, runs=runs)
    rec = recommendations(_rb(tmp_path), _steps(prefill=ab))
    assert rec["env"] == {"NSA_DDP_BUCKET_MB": "25", "NSA_PREFILL_BATCHED": "0"}
    assert rec["notes"] == ["prefill: baseline (faster)"]
    runs[0]["params"] = {}
    assert recommendations(_rb(tmp_path), _steps(prefill=ab))["env"] == {"NSA_DDP_BUCKET_MB": "25",
                                                                         "NSA_PREFILL_BATCHED": "1"}


def test_a_criterion_on_a_step_without_a_record_is_not_evaluated(tmp_path):
    """A resume whose runbook gained the step `later` (and a criterion on it), cut off before `later` started: the
    step has no record yet. Evaluating the criteria at the interrupt raised KeyError: 'later', so the run ended in a
    traceback instead of INCOMPLETE."""
    rb = _rb(tmp_path)
    results = {"runbook": {"name": "r", "path": "r.yaml"}, "run_dir": str(tmp_path), "acceptance": [],
               "steps": {"base": {"name": "base", "kind": "train", "status": "passed", "metrics": {}, "runs": []}}}
    rows = evaluate(rb, results, tmp_path)
    assert [(c["name"], c["status"], c["detail"]) for c in rows] == [
        ("Later loss falls", "skipped", "not evaluated: later: pending")]
    results["acceptance"] = rows
    assert verdict(results, "SIGINT")[0] == "INCOMPLETE"

