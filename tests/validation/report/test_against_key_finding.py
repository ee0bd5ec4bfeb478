"""`report RUN --against EARLIER` where every metric is compared but none can be tested (one value per run on each
side: a copy of a run without its training.csv files): the key finding says so, never that no metric could be
compared while the table below it lists the compared metrics."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from validation.report import render
from validation.report.compare import performance_analysis
from validation.report.performance import performance_view

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke"


def _against_itself() -> dict:
    results = json.loads((EXAMPLE / "results.json").read_text(encoding="utf-8"))
    earlier = copy.deepcopy(results)
    results["performance_analysis"] = performance_analysis(results, earlier, EXAMPLE, EXAMPLE)
    return results


def test_compared_but_untested_metrics_are_not_called_uncomparable():
    results = _against_itself()
    block = results["performance_analysis"]
    rows = block["rows"]
    assert rows and not any(r["tested"] for r in rows)  # what this input is: compared, none tested
    text = block["key_finding"]["text"]
    assert "could be compared" not in text and text.startswith("none: no metric could be tested")
    assert f"{len(rows)} metrics compared" in text
    md = render(results, "md")
    assert f"{len(rows)} metrics compared, 0 tested" in md and "no metric could be compared" not in md


def test_the_fallback_key_finding_agrees():
    results = _against_itself()
    del results["performance_analysis"]["key_finding"]  # a block written without it: computed when shown
    finding = performance_view(results)["key_finding"]
    assert finding.startswith("none: no metric could be tested against the earlier run"), finding
    assert "changed significantly" not in finding
