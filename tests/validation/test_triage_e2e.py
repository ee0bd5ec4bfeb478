"""runbooks/triage_cpu.yaml end to end, as a user runs it (tiny model, single-process launches, about 2 minutes on a
2-core machine): with the injected cliff (NSA_FAULT=sel_v1_quadratic@256, selection v1) the scan finds and bisects
the cliff and the triage names sel_v2 (GO); on a clean configuration (no fault, selection v2, so that the sel_v2
suspect changes nothing) its triage phase names no culprit (NO-GO). In CI the faulted runbook's triage phase runs
alone (9 launches, under a minute): the real injected slowdown is named from real launches. The whole runbook (the
scan's cliff and bisection from real launches too) and the clean configuration run under `-m slow`: the scan's
decisions are tested in CI on simulated launches (test_scan_triage_steps.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verdicts import assert_go_or_disturbed

from validation.analysis.triage import CULPRIT_MIN_EFFECT

REPO = Path(__file__).resolve().parents[2]


def step(results, name):
    steps = results["steps"]
    return next(s for s in steps if s["name"] == name) if isinstance(steps, list) else steps[name]


@pytest.fixture(scope="module")
def faulted(cli, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("triage") / "run"
    proc = cli("run", REPO / "runbooks" / "triage_cpu.yaml", "--out", run_dir)
    return run_dir, proc, json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def faulted_triage(cli, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("triage_phase") / "run"
    # retry_disturbed 0: beside the other xdist worker a repeat run again is disturbed again (as test_e2e.py's)
    proc = cli("run", REPO / "runbooks" / "triage_cpu.yaml", "--out", run_dir, "--only", "triage",
               "--set", "defaults.retry_disturbed=0")
    return run_dir, proc, json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def clean(cli, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("triage_clean") / "run"
    # the triage phase only: a scan without a cliff is tested on simulated runs (test_scan_triage_steps.py)
    proc = cli("run", REPO / "runbooks" / "triage_cpu.yaml", "--out", run_dir, "--set", 'defaults.env.NSA_FAULT=""',
               "--set", 'defaults.env.NSA_SEL_RANGES_V2="1"', "--only", "triage")
    return run_dir, proc, json.loads((run_dir / "results.json").read_text())


def test_the_triage_phase_names_the_injected_culprit(faulted_triage):
    """Selection v1 made quadratic above 256 tokens, triaged at 320: sel_v2 is the culprit (about 4-5x), the suspect
    that changes nothing is not, and the runbook's criterion on it passes; where a launch of the triage was disturbed
    (a machine busy beyond the core each launch uses), the criterion is inconclusive and names the disturbance."""
    run_dir, proc, results = faulted_triage
    assert proc.returncode in (0, 1, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    named = next(c for c in results["acceptance"] if c["name"] == "Culprit named")
    t = step(results, "triage")["metrics"]
    if "triage" in {d["step"] for d in (results.get("evidence") or {}).get("disturbed") or []} and \
            named["status"] != "pass":
        assert named["status"] == "inconclusive" and "was disturbed: " in named["detail"], named
        assert t.get("culprit") is None  # none named; absent where nothing was left to compare
        return
    assert named["status"] == "pass", (named, t.get("reason"))
    assert t["culprit"] == "sel_v2" and t["ranking"][0] == "sel_v2" and t["runs"] == t["passed"] == 9
    # its interval excludes no change and it explains at least what a culprit must (how far above that the
    # injected slowdown measures is the machine's, a figure, not a test: 2x or more in most runs, a CI run on a
    # quiet machine gave a lower bound of +54%)
    assert t["suspects"]["sel_v2"]["significant"] and t["suspects"]["sel_v2"]["ci"][0] > 0
    assert t["suspects"]["sel_v2"]["effect"] >= CULPRIT_MIN_EFFECT
    assert not t["suspects"]["aux_stats_off"]["significant"] or \
        abs(t["suspects"]["aux_stats_off"]["effect"]) < CULPRIT_MIN_EFFECT
    assert "**sel_v2 CULPRIT**" in (run_dir / "report.md").read_text()


@pytest.mark.slow  # in CI: the triage phase above, and the scan's decisions on simulated launches
def test_injected_cliff_is_localised_and_its_cause_named(faulted):
    """GO; on a machine busy beyond the one core each single-thread launch leaves free, INCOMPLETE with every
    inconclusive criterion naming the disturbance (verdicts.py), and then only what undisturbed runs showed is
    asserted."""
    run_dir, proc, results = faulted
    word = assert_go_or_disturbed(proc, results)
    disturbed = {d["step"] for d in results["evidence"]["disturbed"]}
    if "seq_scan" in disturbed or "triage" in disturbed:
        assert word == "INCOMPLETE"
        return
    m = step(results, "seq_scan")["metrics"]
    good, bad = m["cliff_interval"]
    assert m["cliff"] and m["cliff_localised"] and 256 <= good < bad <= 512 and bad - good <= 64
    assert m["cliff_pair"]["a"] == 256 and m["cliff_pair"]["b"] == 512  # the fault starts above 256 tokens
    assert m["bisection"]["points"] and all(verdict in ("good", "bad") for _, verdict in m["bisection"]["points"])
    assert all(v % 32 == 0 for v, _ in m["bisection"]["points"])
    assert m["exponent_ci"][0] <= m["exponent"] <= m["exponent_ci"][1]
    bisect_runs = [r for r in step(results, "seq_scan")["runs"] if r.get("source") == "bisect"]
    assert bisect_runs and all((run_dir / r["dir"] / "out" / "training.csv").is_file() for r in bisect_runs)
    t = step(results, "triage")["metrics"]
    assert t["culprit"] == "sel_v2" and t["ranking"][0] == "sel_v2"
    assert t["suspects"]["sel_v2"]["significant"] and t["suspects"]["sel_v2"]["ci"][0] > 0
    report = (run_dir / "report.md").read_text()
    assert "**sel_v2 CULPRIT**" in report and "CLIFF" in report and "Bisection:" in report
    assert (run_dir / "plots" / "scan_seq_scan.png").is_file()


@pytest.mark.slow
def test_clean_configuration_names_no_culprit(clean):
    """NO-GO (no culprit); never a culprit, disturbed or not: a suspect that changes nothing is named only when
    significant, at least 10% and ahead in every repeat, from undisturbed runs. Under `-m slow` (about a minute): in
    CI the faulted runbook's triage phase covers the same decision, its aux_stats_off suspect changing nothing that matters
    and never named, and benchmarks/bench_aa_compare.py measures the false-culprit rate on real runs."""
    run_dir, _, results = clean
    assert results["verdict"] in ("NO-GO", "INCOMPLETE"), results["verdict_reason"]
    if results["verdict"] == "INCOMPLETE":  # only where the triage was disturbed
        assert "triage" in {d["step"] for d in results["evidence"]["disturbed"]}
    t = step(results, "triage")["metrics"]
    # the sel_v2 suspect changes nothing here: never named; a paired test over 3 repeats may still call a few
    # percent significant now and then (its 5% error rate), never the 10% a culprit must explain in every repeat
    sel = t["suspects"]["sel_v2"]
    assert t["culprit"] is None and (sel["significant"] is False or abs(sel["effect"]) < CULPRIT_MIN_EFFECT), sel
    assert "Culprit**: none" in (run_dir / "report.md").read_text()
