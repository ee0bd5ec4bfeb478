"""What the report concludes against the evidence it reads: a disturbed step's comparison, a decision that recommends
nothing (one run a side), a reused phase, the next action when only non-warning problems are open, a run stopped by
a failure, a step skipped for what the machine lacks, and the "Against an earlier run" section's notes and warnings
(A and B, which the section defines). Built from the committed cpu_smoke run's results.json and
the fixtures, edited in memory."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from validation.report import findings, render
from validation.report.performance import performance_view
from validation.report.problems import open_problems
from validation.results.run import read_run

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parents[1] / "fixtures"
_SMOKE = json.loads((REPO / "reports/examples/cpu_smoke/results.json").read_text(encoding="utf-8"))


@pytest.fixture
def smoke() -> dict:
    """The committed cpu_smoke run with every window marked steady and every warning criterion passed (its open
    WARNs for unsteady windows, which a busy machine gives, are not what these tests edit in): each test's open
    problems are those it makes."""
    results = copy.deepcopy(_SMOKE)
    for step in results["steps"].values():
        for record in [step, *(step.get("runs") or [])]:
            if "throughput_stable" in (record.get("metrics") or {}):
                record["metrics"]["throughput_stable"] = True
    for crit in results["acceptance"]:
        if crit["status"] == "warn":
            crit["status"] = "pass"
    return results


def _conclusions(results: dict) -> dict:
    """The report's conclusions as the report view gives them (validation.report.view), without the rest of the page."""
    run = read_run(results)
    comps = findings.comparisons(results, run)
    finding = findings.key_finding(comps)
    problems = open_problems(run)
    return {"key_finding": finding["text"] if finding else None, "comparisons": findings.comparison_rows(comps),
            "recommended": findings.recommendation_rows(run, comps), "problems": problems,
            "conclusion": findings.conclusion(run, problems, finding)}


def _disturb_prefill(results: dict) -> None:
    """prefill (the run's only significant comparison) measured while other work used the machine, its decision not
    standing without the disturbed run: the step's interference record says disturbed, as the evidence does."""
    step = results["steps"]["prefill"]
    text = "1 of 6 runs disturbed (batched, repeat 2); batched, repeat 2: other processes used 1.5 cores"
    step["interference"].update(disturbed=True, text=text)
    step["interference"]["launches"][3]["disturbed"] = True
    results["evidence"]["disturbed"] = [{"step": "prefill", "text": text,
                                         "launches": [step["interference"]["launches"][3]]}]


def test_a_disturbed_comparison_is_no_finding_no_measured_recommendation_and_no_setting_that_mattered(smoke):
    _disturb_prefill(smoke)
    view = _conclusions(smoke)
    assert view["key_finding"].startswith("none: no significant effect in 4 with/without comparisons")
    assert "prefill: measured while other work used the machine, not a result" in view["key_finding"]
    prefill = next(row for row in view["comparisons"] if row["step"] == "prefill")
    assert not prefill["significant"] and "NOT A RESULT, measured while other work used the machine" in \
        prefill["verdict"]
    rows = {r["name"]: r for r in view["recommended"]}
    assert rows["NSA_PREFILL_BATCHED"]["source"] == "always"
    assert "setting that mattered most" not in view["conclusion"]["next"]
    # the open DISTURBED row is named by the next action of a run that ended GO
    assert view["conclusion"]["next"] == ("use the settings under Recommendations; read the 1 open problem "
                                          "(1 DISTURBED) under Open Problems before relying on the figures")


def _one_run_fused_decision(results: dict) -> None:
    """fused_adamw: one run a side, its block means significantly apart (+2.0%), its decision not recommendable;
    prefill no longer significant, so fused_adamw holds the run's largest significant effect; the runbook recommends
    NSA_OPT_FUSED=1 always."""
    fused = results["steps"]["fused_adamw"]
    for comp in [fused["decision"]["comparison"], *fused["decision"]["comparisons"], *fused["comparison"]]:
        comp.update(significant=True, verdict="better", ci_low=0.005, ci_high=0.035, p_value=0.01)
    fused["decision"].update(
        significant=True, winner="fused", choice="fused", kept_default=False, replicated=None, recommendable=False,
        recommendation="no recommendation: one run per variant: an effect is recommended only when it is replicated "
                       "in interleaved repeats (set repeats: 2 or more)")
    prefill = results["steps"]["prefill"]
    for comp in [prefill["decision"]["comparison"], *prefill["decision"]["comparisons"], *prefill["comparison"]]:
        comp.update(significant=False, verdict="same")
    prefill["decision"].update(significant=False, recommendable=False)
    results["recommendations"]["env"]["NSA_OPT_FUSED"] = "1"


def test_a_decision_that_recommends_nothing_is_no_measured_recommendation(smoke):
    _one_run_fused_decision(smoke)
    view = _conclusions(smoke)
    comp = smoke["steps"]["fused_adamw"]["decision"]["comparison"]  # fused against the baseline, as the run wrote it
    with_, without = (comp["mean_a"], comp["mean_b"]) if comp["baseline"] == "fused" else (comp["mean_b"],
                                                                                          comp["mean_a"])
    assert view["key_finding"].startswith(f"NSA_OPT_FUSED=1 (fused): {with_:,.1f} tokens/s with, {without:,.1f} "
                                          "without")
    assert view["key_finding"].endswith("step `fused_adamw`; not a setting to use (one run per variant: an effect "
                                        "is recommended only when it is replicated in interleaved repeats (set "
                                        "repeats: 2 or more))")
    rows = {r["name"]: r for r in view["recommended"]}
    assert rows["NSA_OPT_FUSED"]["source"] == "always"
    assert rows["NSA_OPT_FUSED"]["why"].startswith("always recommended (the runbook's recommend.env)")
    assert view["conclusion"]["next"] == "use the settings under Recommendations; nothing else is open"


def test_a_reused_phase_is_not_said_to_be_measured_in_this_run(smoke):
    step = smoke["steps"]["prefill"]
    step["reused"] = {"phase": "prefill", "from": "artifacts/validate/earlier", "runbook": "cpu_smoke"}
    step["reason"] = "not run here: phase prefill: its results are those of artifacts/validate/earlier"
    view = _conclusions(smoke)
    assert view["key_finding"].endswith("step `prefill` (taken from an earlier run, not measured in this one)")
    why = {r["name"]: r for r in view["recommended"]}["NSA_PREFILL_BATCHED"]["why"]
    assert why.startswith("measured in an earlier run (its phase reused here): ")
    assert view["conclusion"]["next"].endswith("(step `prefill`, taken from an earlier run)")


def test_a_skipped_step_of_a_go_run_is_open_in_the_next_action(smoke):
    step = smoke["steps"]["sdpa_audit"]
    step.update(status="skipped", reason="needs 1 GPU(s), found 0")
    smoke["acceptance"] = [c for c in smoke["acceptance"] if "sdpa_audit" not in c["expr"]]
    view = _conclusions(smoke)
    assert [(p["severity"], p["where"]) for p in view["problems"]] == [("SKIPPED", "step sdpa_audit")]
    assert view["conclusion"]["next"].startswith("use the settings under Recommendations; read the 1 open problem "
                                                 "(1 SKIPPED) under Open Problems")


def test_the_steps_a_failure_stopped_run_again_with_the_failed_one(smoke):
    smoke["steps"]["sdpa_audit"].update(status="failed", reason="exit code 1")
    for name in ("sel_parity", "sel_perf", "profiling"):
        smoke["steps"][name].update(status="skipped",
                                    reason="not run: step sdpa_audit failed and on_failure is stop")
    smoke["steps"]["longrun"].update(status="skipped", reason="phase longrun skipped (--skip)")
    smoke["verdict"] = "NO-GO"
    nxt = _conclusions(smoke)["conclusion"]["next"]
    assert nxt.endswith(f"then `nsa-validate run runbooks/cpu_smoke.yaml --resume {smoke['run_dir']} --rerun "
                        "sdpa_audit --rerun sel_parity --rerun sel_perf --rerun profiling`")


def test_the_next_action_says_why_a_skipped_step_did_not_run(smoke):
    smoke["steps"]["sdpa_audit"].update(status="skipped", reason="needs 1 GPU(s), found 0")
    smoke["verdict"] = "INCOMPLETE"
    nxt = _conclusions(smoke)["conclusion"]["next"]
    assert nxt.startswith("run the steps that did not run or were disturbed again (sdpa_audit: needs 1 GPU(s), "
                          "found 0): `nsa-validate run runbooks/cpu_smoke.yaml --resume ")


@pytest.fixture
def against() -> dict:
    results = json.loads((FIXTURES / "results_example.json").read_text(encoding="utf-8"))
    block = json.loads((FIXTURES / "performance_analysis.json").read_text(encoding="utf-8"))
    block["warnings"] = ["host differs: A ci-runner-03, B ci-runner-07",
                         "different --set: A none; B args.steps=30",
                         "step single is a train step in A and a sweep step in B",
                         "steps with trainer launches in one run only, not compared: A only: sel_perf"]
    block["rows"][3]["note"] = ("one run of this step on each side: its run-to-run variation is unknown (the step "
                                "ran no repeats)")  # a tested row's caveat
    block["rows"].append({"step": "longrun", "metric": "toks_per_s", "tested": False, "mean_a": 10.0,
                          "mean_b": 11.0, "rel_delta": 0.1, "verdict": "inconclusive",
                          "note": "not tested: fewer than 2 blocks on a side"})
    block["rows"].append({"step": "prefill", "metric": "toks_per_s", "tested": False, "mean_a": 10.0,
                          "mean_b": 9.0, "rel_delta": -0.1, "verdict": "inconclusive",
                          "note": "measured while other work used the machine (B: steal 0.3 core): decides "
                                  "nothing, never gating"})
    results["performance_analysis"] = block
    return results


def test_the_notes_against_an_earlier_run_name_their_rows_and_say_not_tested_once(against):
    view = performance_view(against)
    assert view["notes"] == [
        "baseline final_loss: one value per run: shown, not tested, never gating",
        "longrun toks_per_s: fewer than 2 blocks on a side",
        "prefill toks_per_s: measured while other work used the machine (B: steal 0.3 core): decides "
        "nothing, never gating"]
    # the tested row's caveat is no reason it was not tested: it is said with how the rows were tested
    assert view["method"].endswith("; single toks_per_s: one run of this step on each side: its run-to-run "
                                   "variation is unknown (the step ran no repeats)")
    md = render(against, "md")
    assert "Not tested: longrun toks_per_s: fewer than 2 blocks on a side" in md
    assert "Not tested: not tested" not in md and "Not tested: single" not in md


def test_the_warnings_against_an_earlier_run_use_the_letters_the_section_defines(against):
    """compare's sentences name the runs A and B; the section says once which is which and heads its table with
    them, so that a warning reads whatever a step or label is called (a step named "A" or "B" included)."""
    view = performance_view(against)
    assert view["warnings"] == [
        "host differs: A ci-runner-03, B ci-runner-07",
        "different --set: A none; B args.steps=30",
        "step single is a train step in A and a sweep step in B",
        "steps with trainer launches in one run only, not compared: A only: sel_perf"]
    for fmt in ("md", "html"):
        text = render(against, fmt)
        assert "A is the earlier run, B this run." in text
        assert "host differs: A ci-runner-03, B ci-runner-07" in text
    md = render(against, "md")
    assert "| A (earlier run) | B (this run) |" in md
