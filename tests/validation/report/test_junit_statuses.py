"""JUnit XML agrees with the Markdown report on every criterion's outcome: an inconclusive criterion (judged on
disturbed evidence; a required one makes the run INCOMPLETE) is never a passing testcase."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from validation.report import render

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"


@pytest.fixture()
def results() -> dict:
    return copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))


def _acceptance(xml: str) -> ET.Element:
    root = ET.fromstring(xml)
    return next(s for s in root.findall("testsuite") if s.get("name") == "acceptance")


def test_an_inconclusive_criterion_is_skipped_not_passed(results):
    crit = results["acceptance"][0]
    crit["status"], crit["detail"] = "inconclusive", "it held, but on disturbed evidence"
    results["verdict"] = "INCOMPLETE"
    suite = _acceptance(render(results, "junit"))
    case = next(c for c in suite.findall("testcase") if c.get("name") == crit["name"])
    skipped = case.find("skipped")
    assert skipped is not None, ET.tostring(case, encoding="unicode")
    assert skipped.get("message").startswith("inconclusive: ")
    assert case.find("failure") is None and case.find("error") is None


def test_the_junit_counts_match_the_markdown_counts_for_every_criterion_status(results):
    statuses = ["pass", "fail", "warn", "error", "skipped", "inconclusive"]
    for crit in results["acceptance"]:  # the rest pass, whatever the run itself gave them
        crit["status"] = "pass"
    for crit, status in zip(results["acceptance"], statuses):
        crit["status"] = status
    results["verdict"] = "NO-GO"
    suite = _acceptance(render(results, "junit"))
    n = len(results["acceptance"])
    passes = n - len(statuses) + 2  # the rest pass; a warning is a passing testcase with its WARN
    assert {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": n, "failures": 1, "errors": 1, "skipped": 2}
    passed_cases = [c for c in suite.findall("testcase") if not list(c.iter("failure")) + list(c.iter("error"))
                    + list(c.iter("skipped"))]
    assert len(passed_cases) == passes
    md = render(results, "md")
    assert f"; 1 error, 1 fail, 1 inconclusive, {n - 5} pass, 1 skipped, 1 warn)" in md
