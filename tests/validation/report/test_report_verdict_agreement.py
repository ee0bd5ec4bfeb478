"""The reports say what the verdict says (validation.execution.acceptance.verdict, computed here on the same
results as the independent reference): JUnit fails or errs only on what the verdict stands on (a warning criterion
that could not be evaluated, an optional step that failed: skipped test cases with their reason), and a step the
runbook no longer has (kept from an earlier attempt of a resumed run) is shown as removed with what it last
recorded, never as pending, in the JUnit file, the Markdown and HTML reports and their counts."""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from validation.execution.acceptance import verdict
from validation.report import render
from validation.report.view import console_summary

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"
OUTCOMES = ("failure", "error", "skipped")


KEPT_PHASES = ("preflight", "single")  # three steps: rendering stays quick


@pytest.fixture(scope="module")
def example() -> dict:
    """The example run, its phases cut to KEPT_PHASES (its acceptance rows as they were recorded)."""
    results = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    results["phases"] = [p for p in results["phases"] if p["name"] in KEPT_PHASES]
    kept = {n for p in results["phases"] for n in p["steps"]}
    results["steps"] = {n: s for n, s in results["steps"].items() if n in kept}
    results["plots"] = [p for p in results["plots"] if p.get("step") in kept]
    results.pop("performance_analysis", None)
    return results


@pytest.fixture()
def results(example) -> dict:
    return copy.deepcopy(example)


def _judged(results: dict) -> dict:
    """results with the verdict the verdict code gives them (the reference every report must agree with)."""
    results["verdict"], results["verdict_reason"] = verdict(results, False)
    return results


def _junit(results: dict) -> ET.Element:
    """The JUnit XML parsed, after checking that every count attribute agrees with the test cases it holds."""
    root = ET.fromstring(render(results, "junit"))
    totals = dict.fromkeys(("tests", *OUTCOMES), 0)
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        counted = {"tests": len(cases)}
        for outcome in OUTCOMES:
            counted[outcome] = sum(case.find(outcome) is not None for case in cases)
        assert all(sum(case.find(o) is not None for o in OUTCOMES) <= 1 for case in cases)
        attrs = {"tests": int(suite.get("tests")), "failure": int(suite.get("failures")),
                 "error": int(suite.get("errors")), "skipped": int(suite.get("skipped"))}
        assert attrs == counted, suite.get("name")
        for key in totals:
            totals[key] += counted[key]
    assert {"tests": int(root.get("tests")), "failure": int(root.get("failures")), "error": int(root.get("errors")),
            "skipped": int(root.get("skipped"))} == totals
    return root


def _case(root: ET.Element, suite: str, name: str) -> ET.Element:
    return next(c for s in root.findall("testsuite") if s.get("name") == suite for c in s.findall("testcase")
                if c.get("name") == name)


def _bad_cases(root: ET.Element) -> list[str]:
    """The test cases a CI counts against the run: a failure or an error."""
    return [c.get("name") for c in root.iter("testcase")
            if c.find("failure") is not None or c.find("error") is not None]


def _warn_criterion(results: dict) -> dict:
    return next(c for c in results["acceptance"] if c["severity"] == "warn")


def _remove_step(results: dict, name: str = "old_probe", **record) -> None:
    """What a resume with a runbook that lost step `name` leaves in results.json: the step's earlier record kept
    (validation.execution.runner.Runner._continue; tests/validation/test_verdict_cells.py runs such a resume), the
    phases the runbook's as it runs now (none lists it)."""
    old = copy.deepcopy(results["steps"]["single"])
    old.update(name=name, phase="gone", status="pending", reason=None, started=None, duration_s=None, metrics={},
               runs=[], dir=name, excerpt=None, stack_dumps=[])
    old.update(record)
    results["steps"][name] = old
    results["resumes"] = [{"at": "2026-11-30T15:00:00+0000", "previous_end": "2026-11-30T14:00:00+0000",
                           "previous_state": "interrupted by SIGINT", "steps": [], "rerun": [], "replaced": {},
                           "runbook_changed": True}]
    assert all(name not in p["steps"] for p in results["phases"])


def test_a_warning_criterion_that_cannot_be_evaluated_is_a_skipped_case_on_a_go_run(results):
    crit = _warn_criterion(results)
    crit.update(status="error", actual="n/a", detail="name 'longrun.throughput_drift' is not defined")
    assert _judged(results)["verdict"] == "GO"
    root = _junit(results)
    assert _bad_cases(root) == []  # a CI reading the file passes what the suite called GO
    skipped = _case(root, "acceptance", crit["name"]).find("skipped")
    assert skipped is not None and "throughput_drift' is not defined" in skipped.get("message")
    suite = next(s for s in root.findall("testsuite") if s.get("name") == "acceptance")
    assert (suite.get("errors"), suite.get("skipped")) == ("0", "1")


def test_a_required_criterion_that_cannot_be_evaluated_stays_an_error(results):
    crit = next(c for c in results["acceptance"] if c["severity"] == "fail")
    crit.update(status="error", actual="n/a", detail="division by zero")
    assert _judged(results)["verdict"] == "NO-GO"
    root = _junit(results)
    assert _bad_cases(root) == [crit["name"]]
    assert _case(root, "acceptance", crit["name"]).find("error") is not None


def test_an_optional_step_that_failed_does_not_fail_a_go_run(results):
    step = results["steps"]["single"]
    step.update(status="failed", optional=True, reason="exit code 1", excerpt="Traceback: boom")
    for crit in results["acceptance"]:  # the warning reading its figure did not hold
        if "single." in crit["expr"]:
            assert crit["severity"] == "warn"
            crit["status"] = "warn"
    assert _judged(results)["verdict"] == "GO"
    root = _junit(results)
    assert _bad_cases(root) == []
    case = _case(root, "single", "single")
    assert "optional" in case.find("skipped").get("message") and "exit code 1" in case.find("skipped").get("message")
    assert "Traceback: boom" in case.find("system-out").text  # the evidence is still there


def test_a_step_the_runbook_lost_is_removed_not_pending(results):
    _remove_step(results)
    assert _judged(results)["verdict"] == "GO"  # the verdict does not wait for it
    runbook_steps = sum(len(p["steps"]) for p in results["phases"])  # 3, all passed
    root = _junit(results)
    assert _bad_cases(root) == []
    message = _case(root, "other", "old_probe").find("skipped").get("message")
    assert "not part of this runbook" in message and "last recorded: PENDING" in message
    md = render(results, "md")
    assert f"- **Steps**: {runbook_steps} ({runbook_steps} passed)\n" in md
    assert "pending" not in md.split("- **Steps**:")[1].split("\n")[0]
    assert "old_probe (last recorded: PENDING)" in md
    section = md.split("Other steps: no longer in the runbook — REMOVED")[1].split("\n## ")[0]
    assert re.search(r"^#### \S+ One process, same config — REMOVED$", section, re.M), section
    assert "PENDING |" not in section  # no kind table of a launch that never ran
    assert "last recorded: PENDING" in section
    problems = md.split("## Open Problems")[1].split("\n## ")[0]
    assert "old_probe" not in problems
    conclusion = md.split("## Conclusion")[1].split("\n## ")[0]
    assert "did not finish" not in conclusion and "old_probe" not in conclusion
    html = render(results, "html")
    assert "REMOVED</span>" in html and "last recorded: PENDING" in html
    _, lines = console_summary(results, Path("run"), [])
    assert not any("pending" in text.lower() or "old_probe" in text for text, _ in lines)


def test_a_lost_step_that_failed_counts_for_nothing_in_the_verdict_nor_in_the_report(results):
    _remove_step(results, status="failed", reason="exit code 1", duration_s=3.0)
    assert _judged(results)["verdict"] == "GO"  # a step the runbook no longer has counts for nothing in the verdict
    root = _junit(results)
    assert _bad_cases(root) == []  # nor in the JUnit cases: skipped, saying what it last recorded
    message = _case(root, "other", "old_probe").find("skipped").get("message")
    assert "not part of this runbook" in message and "last recorded: FAILED (exit code 1)" in message
    md = render(results, "md")
    assert "REMOVED" in md and "last recorded: FAILED (exit code 1)" in md
    assert "--rerun old_probe" not in md  # a resume refuses a step its runbook lacks
    assert "Other steps: no longer in the runbook — REMOVED" in md  # the phase is REMOVED, not FAILED
    problems = md.split("## Open Problems")[1].split("\n## ")[0]
    assert "old_probe" not in problems
    conclusion = md.split("## Conclusion")[1].split("\n## ")[0]
    assert "old_probe" not in conclusion
    runbook_steps = sum(len(p["steps"]) for p in results["phases"])
    assert f"- **Steps**: {runbook_steps} ({runbook_steps} passed)\n" in md


def test_a_warning_that_cannot_be_evaluated_is_listed_with_the_warnings_not_the_failures(results):
    from validation.report.problems import open_problems

    crit = _warn_criterion(results)
    crit.update(status="error", actual="n/a", detail="division by zero")
    results["steps"]["sanity_tests"].update(status="skipped", reason="not selected")
    assert _judged(results)["verdict"] == "GO"  # nothing the verdict stands on failed
    # the documented order: failures, then what is incomplete, then what was not run, then warnings
    where = [p["where"] for p in open_problems(results)]
    assert where.index("step sanity_tests") < where.index(f"criterion {crit['name']}")
