"""Values a run records that would change a report's structure, checked against independent references: the Markdown
as CommonMark reads it (markdown-it-py, the parser rich uses), the JUnit XML as xml.etree and its schema's decimal
time read it, the JSON report as json.loads reads it and UTF-8 encodes it."""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from validation.report import render
from validation.report.renderer import md_text

markdown_it = pytest.importorskip("markdown_it")

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"
KEEP = ("snapshot", "baseline", "prefill")  # a snapshot, a trainer launch (the validated command's), an A/B


@pytest.fixture()
def results() -> dict:
    """The example run cut to three steps (a report renders in well under a second)."""
    r = copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))
    r["steps"] = {k: v for k, v in r["steps"].items() if k in KEEP}
    r["phases"] = [dict(p, steps=[s for s in p["steps"] if s in KEEP]) for p in r["phases"]
                   if set(p["steps"]) & set(KEEP)]
    r["acceptance"] = r["acceptance"][:3]
    r["plots"] = [p for p in r["plots"] if p.get("step") in KEEP]
    return r


def _tokens(md: str):
    return markdown_it.MarkdownIt("commonmark").enable("table").parse(md)


def _raw_html(md: str) -> list[str]:
    """The raw HTML CommonMark finds in md (the report writes none of its own)."""
    out = []
    for t in _tokens(md):
        out += [t.content] if t.type == "html_block" else []
        out += [c.content for c in t.children or [] if c.type == "html_inline"]
    return out


def _headings(md: str) -> list[str]:
    toks = _tokens(md)
    return [toks[i + 1].content for i, t in enumerate(toks) if t.type == "heading_open"]


def _fences(md: str) -> list[str]:
    return [t.content for t in _tokens(md) if t.type == "fence"]


def test_a_lone_backtick_in_a_criterion_name_leaves_the_code_spans_after_it_closed(results):
    # the Conclusion is one paragraph: "Failed: 1 criterion failed (didn`t drop)." then the key finding's "step
    # `prefill`" and the next command's span; the name's backtick would pair with the first of them, and the next
    # one with the command's opening, leaving the command (its markup included) outside code
    crit = results["acceptance"][0]
    crit["name"], crit["status"], results["verdict"] = "throughput didn`t drop", "fail", "NO-GO"
    results["runbook"]["path"] = "runbooks/<b>x</b>.yaml"
    md = render(results, "md")
    assert _raw_html(md) == []
    codes = [c.content for t in _tokens(md) for c in t.children or [] if c.type == "code_inline"]
    assert "prefill" in codes and "nsa-validate run 'runbooks/<b>x</b>.yaml'" in codes


def test_backslash_escaped_backticks_open_no_code_span_around_markup():
    # CommonMark: \` is a literal backtick, so the <b> between two of them is raw HTML unless escaped
    for value in ("\\`<b>x</b>\\`", "a \\`<i>\\` and `<s>`"):
        html = markdown_it.MarkdownIt("commonmark").render(md_text(value))
        assert "<b>" not in html and "<i>" not in html and "<s>" not in html, (value, html)


def test_an_unclosed_fence_in_a_description_does_not_take_the_rest_of_the_report(results):
    clean = render(results, "md")
    results["steps"]["baseline"]["description"] = "Measures DDP.\n```\nthe rest"
    md = render(results, "md")
    assert _headings(md) == _headings(clean)  # "Acceptance Criteria Assessment" and the rest are still headings
    assert _fences(md) == _fences(clean)


@pytest.mark.parametrize("description", [
    "Intro.\n~~~\nthe rest",  # a tilde fence, never closed
    "Intro.\n```\na ``` b",  # a backtick fence whose only other run closes no fence
    "a `x\n\n<b>y</b>` z",  # a code span's backticks in two paragraphs: CommonMark pairs none
    "a `x\n# <b>y</b>` z",  # in a paragraph and a heading
])
def test_a_description_keeps_the_blocks_after_it_and_carries_no_raw_html(description):
    md = md_text(description, lines=True) + "\n\n## Next section\n"
    assert _headings(md)[-1:] == ["Next section"] and _raw_html(md) == [], md


def test_a_description_keeps_the_fenced_example_it_closes_itself():
    md = md_text("Run:\n```bash\nnsa-validate run <runbook>\n```\nThen `x`.", lines=True)
    assert _fences(md) == ["nsa-validate run <runbook>\n"] and _raw_html(md) == []


def test_a_recommended_value_holding_a_fence_line_stays_in_its_block(results):
    results["recommendations"]["env"] = {"NSA_X": "1\n```\n# Injected"}
    md = render(results, "md")
    assert "Injected" not in _headings(md)
    exports = next(f for f in _fences(md) if f.startswith("export "))
    assert exports == "export NSA_X='1\n```\n# Injected'\n"  # the shell line, whole


def test_an_environment_value_holding_a_fence_line_stays_in_the_run_command_block(results):
    results["steps"]["baseline"]["env"]["NSA_X"] = "2\n```\n# Injected"
    md = render(results, "md")
    assert "Injected" not in _headings(md)
    command = next(f for f in _fences(md) if "torchrun" in f)
    assert "NSA_X='2\n```\n# Injected' \\\n" in command


def test_an_excerpt_whose_colour_codes_join_backticks_stays_in_its_block(results):
    step = results["steps"]["baseline"]
    # "``" and "`" apart in the record, "```" once the colour code is removed: a closing fence
    step["status"], step["excerpt"] = "failed", "``\x1b[0m`\n# Injected\n<b>x</b>"
    results["verdict"] = "NO-GO"
    md = render(results, "md")
    assert "Injected" not in _headings(md) and _raw_html(md) == []
    assert "```\n# Injected\n<b>x</b>\n" in _fences(md)


def test_the_summary_counts_every_step_of_the_runbook(results):
    del results["steps"]["prefill"]  # listed by its phase, no record
    results["steps"]["baseline"]["status"] = None
    results["acceptance"][0]["status"] = None  # its row: UNKNOWN
    md = render(results, "md")
    listed = sum(len(p["steps"]) for p in results["phases"])
    assert listed == 3 and len(results["acceptance"]) == 3
    assert "- **Steps**: 3 (1 missing, 1 passed, 1 unknown)" in md.splitlines()
    assert "- **Acceptance criteria**: 3 (3 required, 0 warnings only; 2 pass, 1 unknown)" in md.splitlines()
    root = ET.fromstring(render(results, "junit"))
    assert sum(int(s.get("tests")) for s in root if s.get("name") != "acceptance") == listed


def test_a_suites_time_is_a_decimal_whatever_the_durations(results):
    results["phases"] = [dict(results["phases"][0], steps=list(KEEP))]  # one suite of three testcases
    for step in results["steps"].values():
        step["duration_s"] = 1e308  # finite each, past a float's range summed
    root = ET.fromstring(render(results, "junit"))
    for suite in root.iter("testsuite"):
        assert re.fullmatch(r"\d+\.\d{3}", suite.get("time")), suite.get("time")  # xs:decimal, never "inf"


def test_the_json_report_of_a_name_holding_a_lone_surrogate_encodes_and_reads_back(results):
    results["run_dir"] = "runs/caf\udce9"  # a path of bytes that are not UTF-8, as os.fsdecode gives it
    text = render(results, "json")
    assert json.loads(text.encode("utf-8")) == results
