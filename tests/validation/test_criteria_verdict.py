"""validation.execution.acceptance.verdict: its reason names the steps a criterion reads (not words inside its
strings or keys) and every warn criterion that did not hold, including one that could not be evaluated."""

from __future__ import annotations

from validation.execution.acceptance import verdict


def results(steps: dict[str, tuple[str, str]], criteria: list[tuple[str, str, str, str]]) -> dict:
    """steps: name -> (status, reason); criteria: (name, severity, status, expr)."""
    return {"steps": {n: {"name": n, "status": st, "reason": why} for n, (st, why) in steps.items()},
            "acceptance": [{"name": n, "severity": sev, "status": st, "expr": e} for n, sev, st, e in criteria]}


def test_an_incomplete_reason_names_only_the_steps_a_criterion_reads():
    # `gpu` appears in the criterion only as a log text and as a key of longrun's results: it is not read, and its
    # own reason (needs 2 GPUs) is not why this criterion went unevaluated
    res = results({"longrun": ("skipped", "phase longrun not selected (--only baseline)"),
                   "gpu": ("skipped", "needs 2 GPU(s), found 0"), "baseline": ("passed", "")},
                  [("Long run clean", "fail", "skipped",
                    "not log_contains(longrun, 'gpu') and longrun.runs['gpu'].stalls == 0")])
    assert verdict(res, False) == (
        "INCOMPLETE", "1 required criterion not evaluated: Long run clean; their steps did not run "
                      "(longrun: phase longrun not selected (--only baseline)); nothing evaluated failed")


def test_a_go_reason_names_a_warn_criterion_that_could_not_be_evaluated():
    res = results({"a": ("passed", "")}, [("fast", "fail", "pass", "a.x > 1"), ("cool", "warn", "error", "a.t < 80"),
                                          ("steady", "warn", "warn", "a.cv < 0.1")])
    assert verdict(res, False) == ("GO", "1 step(s) passed and every required criterion holds; warnings: cool, steady")
