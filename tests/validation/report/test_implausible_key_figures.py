"""A key figure of the executive summary whose step measured a figure outside its physical range (a negative
tokens/s, a CV above 50%, in the step's own launch or one of its runs) is marked NOT A RESULT, as the scaling
efficiency already is, in the Markdown, the HTML and the console lines alike; an intact run's figures are not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from validation.report import render
from validation.report.view import key_figure_lines

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"
FLAG = "NOT A RESULT, outside its physical range"


@pytest.fixture()
def results() -> dict:
    return copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))


def _line(lines: list[str], label: str) -> str:
    return next(line for line in lines if line.startswith(label))


def test_a_negative_baseline_throughput_is_not_shown_as_a_result(results):
    stats = results["steps"]["baseline"]["metrics"]["toks_per_s"]
    stats["mean"] = -5000.0
    sd = f"{stats['stdev']:,.1f}"  # the example's own spread, as the figure shows it
    line = _line(key_figure_lines(results), "Baseline throughput:")
    assert line.startswith(f"Baseline throughput: -5,000.0 ± {sd} tokens/s (window mean ± stdev, all ranks): {FLAG}")
    assert "toks_per_s.mean = -5,000.0 outside [0, inf)" in line
    md = render(results, "md")
    assert f"- **Baseline throughput**: -5,000.0 ± {sd} tokens/s (window mean ± stdev, all ranks): {FLAG}" in md
    assert f"(window mean ± stdev, all ranks): {FLAG}" in render(results, "html")


def test_a_decision_over_an_implausible_run_is_marked(results):
    run = results["steps"]["bucket_sweep"]["runs"][0]
    run["metrics"]["toks_per_s"]["cv"] = 0.8
    line = _line(key_figure_lines(results), "Bucket:")
    assert FLAG in line and f"run {run['label']}: toks_per_s.cv = 0.8 outside [0, 0.5]" in line


def test_an_intact_run_has_no_flag(results):
    assert not any(FLAG in line for line in key_figure_lines(results))
