"""Percentages are printed one way everywhere (validation.formatting.fmt_pct): thousands separators, never
'+1422.8%' - in the report (Markdown and HTML), in a comparison's stored text, and in `compare`'s table."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from validation.report.compare import table_lines
from validation.report import render
from validation.formatting import fmt_pct
from validation.analysis.significance import compare_paired

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results_example.json"
UNSEPARATED = re.compile(r"\d{4}(?:\.\d+)?%")  # four digits before the point: a missing thousands separator


def test_fmt_pct_separates_thousands_and_keeps_its_sign_and_decimals():
    assert fmt_pct(14.228, signed=True) == "+1,422.8%"
    assert fmt_pct(14.228) == "1,422.8%"
    assert fmt_pct(-0.05, signed=True) == "-5.0%"
    assert fmt_pct(0.05, signed=True) == "+5.0%"
    assert fmt_pct(123456.789) == "12,345,678.9%"
    assert fmt_pct(0.95, digits=0) == "95%"
    assert fmt_pct(0.0) == "0.0%"
    for bad in (None, float("nan"), float("inf"), "12", True):
        assert fmt_pct(bad) == "n/a"


def test_a_comparison_states_a_large_effect_with_separators():
    """15x faster: the stored one-line text (results.json, the console, the report) reads +1,4xx.x%."""
    comp = compare_paired([1000.0, 1010.0, 990.0, 1005.0], [15000.0, 15100.0, 14900.0, 15050.0])
    text = comp.describe()
    assert re.match(r"\+1,\d{3}\.\d% \(95% CI \+1,\d{3}\.\d% \.\. \+1,\d{3}\.\d%\)", text), text
    assert not UNSEPARATED.search(text), text


def test_compare_table_prints_large_changes_with_separators():
    row = {"step": "prefill", "metric": "toks_per_s", "mean_a": 1158.5, "mean_b": 17640.8, "rel_delta": 14.228,
           "ci_low": 12.98, "ci_high": 14.586, "p_value": 1e-8, "p_adjusted": 1e-8, "noise_floor": 0.09,
           "tested": True, "significant": True, "verdict": "better"}
    out = {"rows": [row], "run_a": "A", "run_b": "B", "family": {"statement": "Holm over 1 row."},
           "gate": "no significant regression", "exit_code": 0}
    line = next(x for x in table_lines(out) if x.startswith("prefill"))
    assert "+1,422.8%" in line and "+1,298.0% .. +1,458.6%" in line and "9.0%" in line, line
    assert not UNSEPARATED.search(line), line


def test_report_prints_large_changes_with_separators():
    results = json.loads(FIXTURE.read_text(encoding="utf-8"))
    big = copy.deepcopy(results)
    big["steps"]["fused_adamw"]["comparison"][0].update(rel_delta=14.228, mean_b=5795.9 * 15.228)
    for fmt in ("md", "html"):
        text = render(big, fmt)
        assert "+1,422.8%" in text, fmt
        assert not UNSEPARATED.search(text), (fmt, UNSEPARATED.findall(text))


def test_first_of_lists_a_few_and_counts_the_rest():
    from validation.formatting import first_of

    assert first_of(["a", "b"], 4) == "a; b"
    assert first_of(iter("abcdef"), 4) == "a; b; c; d; and 2 more"
    assert first_of([1, 2, 3], 2, sep=", ") == "1, 2, and 1 more" and first_of([], 3) == ""


def test_fmt_num_keeps_a_figure_past_any_of_ours_short():
    # an impossible figure the open problems quote (1e308 tokens/s) is '1e+308', not a 400-character number
    from validation.formatting import fmt_num
    assert fmt_num(1e308) == "1e+308" and fmt_num(-2.5e20) == "-2.5e+20"
    assert fmt_num(123_456_789_012.5) == "123,456,789,012.5" and fmt_num(5843.2) == "5,843.2"
    from validation.formatting import fmt_rate  # the key figures' and train tables' tokens/s: the same
    assert fmt_rate(4.096e18) == "4.096e+18" and fmt_rate(30946.94) == "30,946.9"
