"""validation.execution.acceptance: the GO / NO-GO / INCOMPLETE verdict and its reason, from steps and criteria alone."""

from __future__ import annotations

import pytest

from validation.execution.acceptance import recommendations, verdict
from validation.runbook.loader import load_runbook


def results(steps: dict[str, str | tuple[str, bool]], criteria: list[tuple[str, str, str]] = ()) -> dict:
    """steps: name -> status or (status, optional); criteria: (name, severity, status)."""
    out = {"steps": {}, "acceptance": []}
    for name, value in steps.items():
        status, optional = value if isinstance(value, tuple) else (value, False)
        out["steps"][name] = {"name": name, "status": status, "optional": optional}
    out["acceptance"] = [{"name": n, "severity": sev, "status": st} for n, sev, st in criteria]
    return out


def test_all_passed_and_every_required_criterion_holds_is_go():
    got = verdict(results({"a": "passed", "b": "passed"}, [("fast", "fail", "pass"), ("tidy", "warn", "pass")]),
                  interrupted=False)
    assert got == ("GO", "2 step(s) passed and every required criterion holds")


def test_a_warning_keeps_go_and_is_named():
    got = verdict(results({"a": "passed"}, [("fast", "fail", "pass"), ("steady", "warn", "warn")]), False)
    assert got == ("GO", "1 step(s) passed and every required criterion holds; warnings: steady")


def test_skipped_steps_do_not_count_as_passed_but_do_not_fail_the_run():
    assert verdict(results({"a": "passed", "gpu_only": "skipped"}), False) == \
        ("GO", "1 step(s) passed and every required criterion holds")


@pytest.mark.parametrize("status", ["failed", "hang", "timeout", "error"])
def test_a_required_step_that_did_not_pass_is_no_go(status):
    got = verdict(results({"a": "passed", "b": status}), False)
    assert got == ("NO-GO", f"step(s) b {status}")


def test_an_optional_step_may_fail():
    assert verdict(results({"a": "passed", "b": ("failed", True)}), False)[0] == "GO"


@pytest.mark.parametrize("status", ["fail", "error"])
def test_a_failed_or_unevaluable_fail_criterion_is_no_go(status):
    assert verdict(results({"a": "passed"}, [("fast", "fail", status)]), False) == \
        ("NO-GO", "criteria failed: fast")


def test_a_warn_criterion_that_fails_is_only_a_warning():
    # evaluate() turns a failed warn-severity criterion into status "warn"; an error stays an error but only
    # fail-severity criteria decide the verdict
    assert verdict(results({"a": "passed"}, [("steady", "warn", "warn"), ("x", "warn", "error")]), False)[0] == "GO"


def test_a_fail_criterion_whose_step_was_skipped_makes_the_run_incomplete_not_no_go():
    res = results({"a": "skipped", "b": "passed"}, [("fast", "fail", "skipped"), ("ok", "fail", "pass")])
    res["steps"]["a"]["reason"] = "phase p not selected (--only q)"
    res["acceptance"][0]["expr"] = "a.toks_per_s.mean >= 1"
    assert verdict(res, False) == (
        "INCOMPLETE", "1 required criterion not evaluated: fast; their steps did not run "
                      "(a: phase p not selected (--only q)); nothing evaluated failed")


def test_a_skipped_warn_criterion_keeps_go():
    assert verdict(results({"a": "skipped"}, [("steady", "warn", "skipped")]), False)[0] == "GO"


@pytest.mark.parametrize("other", [{"b": "failed"}, {}])
def test_a_failure_elsewhere_still_makes_it_no_go_and_names_the_unevaluated_too(other):
    criteria = [("fast", "fail", "skipped")] + ([] if other else [("big", "fail", "fail")])
    got = verdict(results({"a": "skipped", **other}, criteria), False)
    assert got[0] == "NO-GO"
    assert got[1].endswith("criteria not evaluated (steps skipped): fast")


def test_every_reason_is_named_together():
    got = verdict(results({"a": "failed", "b": "timeout"}, [("fast", "fail", "fail"), ("big", "fail", "skipped")]),
                  False)
    assert got == ("NO-GO", "step(s) a failed, b timeout; criteria failed: fast; "
                            "criteria not evaluated (steps skipped): big")


@pytest.mark.parametrize("status", ["pending", "running", "interrupted"])
def test_steps_not_run_to_their_end_make_the_run_incomplete(status):
    assert verdict(results({"a": "failed", "b": status}, [("fast", "fail", "fail")]), False) == \
        ("INCOMPLETE", "step(s) not run yet: b")


def test_an_interrupted_run_is_incomplete_whatever_its_steps_say():
    got = verdict(results({"a": "passed"}, [("fast", "fail", "pass")]), interrupted=True)
    assert got == ("INCOMPLETE", "the run was interrupted; `nsa-validate run --resume RUN_DIR` continues it")
    got = verdict(results({"a": "passed"}, [("fast", "fail", "pass")]), interrupted="SIGTERM")
    assert got == ("INCOMPLETE", "the run was interrupted (SIGTERM); `nsa-validate run --resume RUN_DIR` continues it")


def test_recommendations_merge_the_runbook_settings_and_every_significant_decision(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text("name: r\nrecommend: {env: {NSA_PREFILL_BATCHED: '1', NSA_DDP_BUCKET_MB: '25'}}\n"
                    "phases:\n  - name: p\n    steps:\n      - {name: s, kind: bench, command: [x.py]}\n")
    rb = load_runbook(path)
    won = {"label": "NSA_DDP_BUCKET_MB=100", "explanation": "fastest", "significant": True,
           "params": {"env.NSA_DDP_BUCKET_MB": "100", "args.batch_size": 8}}
    res = {"steps": {"sweep": {"kind": "sweep", "status": "passed", "winner": won, "choice": won},
                     "ab": {"kind": "ab", "status": "passed", "winner": None}}}
    assert recommendations(rb, res) == {"env": {"NSA_DDP_BUCKET_MB": "100", "NSA_PREFILL_BATCHED": "1"},
                                        "notes": ["sweep: NSA_DDP_BUCKET_MB=100 (fastest)"]}
    kept = dict(won, significant=False, label="NSA_DDP_BUCKET_MB=50", params={"env.NSA_DDP_BUCKET_MB": "50"})
    res["steps"]["sweep"].update(winner=None, choice=kept, runs=[{"params": {"env.NSA_DDP_BUCKET_MB": "50"}}])
    rec = recommendations(rb, res)  # not significant: the runbook's own 25 stays, 50 is not recommended
    assert rec["env"] == {"NSA_DDP_BUCKET_MB": "25", "NSA_PREFILL_BATCHED": "1"}
    assert rec["notes"] == ["sweep: no recommendation: no significant difference; NSA_DDP_BUCKET_MB=50 kept, "
                            "NSA_DDP_BUCKET_MB not recommended from this step; NSA_DDP_BUCKET_MB=25 (the runbook's "
                            "recommendation) stays"]
    # significant, but the decision says it is not recommendable (one run per variant, or not replicated)
    unrep = dict(won)
    res["steps"]["sweep"].update(winner=unrep, choice=unrep, decision={
        "significant": True, "recommendable": False,
        "recommendation": "no recommendation: the difference was not the same in every interleaved block"})
    rec = recommendations(rb, res)
    assert rec["env"] == {"NSA_DDP_BUCKET_MB": "25", "NSA_PREFILL_BATCHED": "1"}
    assert rec["notes"][0].startswith("sweep: no recommendation: the difference was not the same in every")


def test_recommendations_say_whether_training_failed_or_the_runbook_has_none(tmp_path):
    """gpu_kernels.yaml (tests, sanitizer, benchmarks) trains in no step: its report said "no training step passed",
    as if one had failed."""
    path = tmp_path / "rb.yaml"
    path.write_text("name: r\nrecommend: {env: {NSA_DDP_BUCKET_MB: '25'}}\n"
                    "phases:\n  - name: p\n    steps:\n      - {name: s, kind: bench, command: [x.py]}\n")
    rb = load_runbook(path)
    no_trainer = {"steps": {"tests": {"kind": "pytest", "status": "passed"}, "b": {"kind": "bench", "status": "passed"}}}
    assert recommendations(rb, no_trainer) == {"env": {}, "notes": [
        "this runbook has no training step: it recommends no settings"]}
    failed = {"steps": {**no_trainer["steps"], "baseline": {"kind": "train", "status": "failed"}}}
    assert recommendations(rb, failed)["notes"] == [
        "nothing was measured here (no training step passed): no settings are recommended"]
    failed["steps"]["baseline"]["status"] = "passed"
    assert recommendations(rb, failed)["env"] == {"NSA_DDP_BUCKET_MB": "25"}
