"""Text a run records (a GPU name, a hostname, a git branch, a step's title and reason, a traceback excerpt) never
breaks a report's structure: the Markdown keeps each heading on its line and carries no raw HTML, autolink or link
from a value (a C++ kernel name such as `CUDAFunctor_add<c10::BFloat16>` is an autolink to CommonMark), the HTML and
the JUnit XML hold no control characters, and a coloured traceback reads as its text."""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from validation.report import render
from validation.report.renderer import blocks_markdown, md_text
from validation.kinds.blocks import Bullets, Paragraph, Table, code

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"
NASTY = "a|b <script>alert(1)</script> & <c10::BFloat16> [x](http://e.invalid/p.png)\nsecond line"
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@pytest.fixture()
def results() -> dict:
    return copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))


def _outside_code(md: str) -> str:
    """The Markdown without its fenced blocks and code spans (where `<` is text anyway)."""
    md = re.sub(r"^(`{3,})[^\n]*\n.*?^\1$", "", md, flags=re.S | re.M)
    return re.sub(r"(`+).+?\1", "", md)


def test_a_title_with_a_line_break_stays_one_heading_line(results):
    rules = len(re.findall(r"^---$", render(results, "md"), re.M))  # the footer's own rule
    results["steps"]["baseline"]["title"] = "Baseline\n# not a heading"
    results["phases"][1]["title"] = "Phase 2.1: Baseline\n---"
    md = render(results, "md")
    assert "#### Baseline # not a heading — PASSED" in md
    assert "### Phase 2.1: Baseline --- — PASSED" in md
    assert not re.search(r"^# not a heading", md, re.M) and len(re.findall(r"^---$", md, re.M)) == rules


def test_values_carry_no_raw_html_autolink_or_link_into_the_markdown(results):
    env = results["environment"]
    env["host"] = env["git_branch"] = NASTY
    env["gpus"], env["gpu_count"] = [{"index": 0, "name": NASTY, "memory_gb": 80.0, "capability": [9, 0]}], 1
    results["steps"]["baseline"]["reason"] = NASTY
    results["acceptance"][0]["detail"] = NASTY
    md = render(results, "md")
    text = _outside_code(md)
    assert "<script" not in text.replace("\\<script", "") and "<c10" not in text.replace("\\<c10", "")
    assert "](http" not in text
    assert "\\<script>alert(1)\\</script>" in md and "\\<c10::BFloat16>" in md
    for line in md.splitlines():  # every table row keeps its columns: pipes escaped, one line
        if line.startswith("| Host ") or line.startswith("| Git branch "):
            assert len(re.findall(r"(?<!\\)\|", line)) == 3, line


def test_md_text_keeps_code_spans_and_is_idempotent():
    value = "run " + code("x <y> ](z)") + " then <b>bold</b>"
    once = md_text(value)
    assert once == "run `x <y> ](z)` then \\<b>bold\\</b>"
    assert md_text(once) == once
    assert md_text(r"already \<b>") == r"already \<b>"  # an escaped `<` is not escaped twice


def test_a_kinds_blocks_keep_their_structure():
    md = blocks_markdown([Paragraph("one\ntwo <b>"), Bullets(["x\n# y"]), Table(("a",), [("<i>\nz",)])])
    assert md == "\none two \\<b>\n\n- x # y\n\n| a |\n|---|\n| \\<i> z |\n"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_control_characters_and_terminal_colours_in_every_format(results):
    excerpt = "Traceback (most recent call last):\n\x1b[31mRuntimeError\x1b[0m: bad\x01value\x0b"
    step = results["steps"]["baseline"]
    step["status"], step["reason"], step["excerpt"] = "failed", "crashed\x07 <b>", excerpt
    results["environment"]["host"] = "node\x1b[1m7\x1b[0m"
    results["verdict"] = "NO-GO"
    html, md, junit = (render(results, f) for f in ("html", "md", "junit"))
    for text in (html, md, junit):
        assert not CONTROL.search(text), repr(CONTROL.search(text))
        assert "[31m" not in text and "[0m" not in text
    parser = _Tags()
    parser.feed(html)
    assert "script" not in parser.tags and "b" not in parser.tags
    shown = "".join(parser.text)
    assert "RuntimeError: bad\ufffdvalue" in shown and "node7" in shown and "crashed\ufffd <b>" in shown
    root = ET.fromstring(junit)  # well-formed
    failure = next(c for c in root.iter("testcase") if c.get("name") == "baseline").find("failure")
    assert "RuntimeError: bad\ufffdvalue" in failure.text
    assert "RuntimeError: bad\ufffdvalue" in md  # the excerpt's fence shows it as it is, less the colours


def test_a_fenced_excerpt_is_shown_as_it_is(results):
    step = results["steps"]["baseline"]
    step["status"], step["excerpt"] = "failed", "File \"x.py\", line 3\n  a = b<c> ](y)\nError"
    results["verdict"] = "NO-GO"
    md = render(results, "md")
    assert "```text\nFile \"x.py\", line 3\n  a = b<c> ](y)\nError\n```" in md
