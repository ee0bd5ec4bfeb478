"""The report's recommended settings say where each value came from: an A/B whose baseline won (sequential prefill,
NSA_PREFILL_BATCHED=0, faster than the batched variant in every repeat) exports the baseline's setting, measured
here, not "always recommended (the runbook's recommend.env)", which the runbook's opposite value would be."""

from __future__ import annotations

from validation.report.findings import Found, recommendation_rows


def _found(rel: float, recommendable: bool = True) -> Found:
    return Found(step="prefill", kind="ab", without="NSA_PREFILL_BATCHED=0 (baseline)",
                 with_="NSA_PREFILL_BATCHED=1 (batched)", metric="toks_per_s", mean_without=100.0,
                 mean_with=100.0 * (1 + rel), rel=rel, ci_low=rel - 0.05, ci_high=rel + 0.05, p=0.01,
                 significant=True, verdict="slower" if rel < 0 else "faster", ignored=False, implausible=[],
                 disturbed=False, recommendable=recommendable, caveat=None, reused=False,
                 text=f"batched {rel:+.0%} against baseline")


def _results(value: str) -> dict:
    return {"recommendations": {"env": {"NSA_PREFILL_BATCHED": value}, "notes": []},
            "steps": {"prefill": {"name": "prefill", "kind": "ab", "status": "passed",
                                  "env": {"NSA_PREFILL_BATCHED": "1"}}}}


def test_a_baseline_that_won_is_a_measured_recommendation():
    (row,) = recommendation_rows(_results("0"), [_found(-0.2)])
    assert (row["value"], row["source"]) == ("0", "measured")
    assert row["why"] == "measured in this run: batched -20% against baseline"


def test_the_variant_that_won_and_a_setting_nothing_chose_keep_their_sources():
    (row,) = recommendation_rows(_results("1"), [_found(+0.2)])
    assert (row["value"], row["source"]) == ("1", "measured")
    # the runbook's own value where the baseline won: not what was measured, said as the runbook's
    (row,) = recommendation_rows(_results("1"), [_found(-0.2)])
    assert row["source"] == "always"
    (row,) = recommendation_rows(_results("0"), [_found(-0.2, recommendable=False)])
    assert row["source"] == "always"
