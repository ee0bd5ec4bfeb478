"""Records a run holds rarely (an interrupted or resumed run, a resume that kept steps measured under other settings
or ran another source, a phase reused from an earlier run, every step skipped, no criteria, no steps or a hundred,
reasons holding Markdown, HTML and control characters) render in every format: each shown in its section with its
words, no Python value ("None", "{}", a list's repr) in the text, the HTML balanced and escaped, the JUnit counts
those of the records, and the conclusion's "Open:" naming everything that neither passed nor failed."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/validation: the record builders
from results_records import run_record  # noqa: E402

from validation.report import render  # noqa: E402
from validation.report.compare import environment_differences, setting_differences  # noqa: E402
from validation.report.findings import conclusion  # noqa: E402
from validation.report.problems import open_problems  # noqa: E402
from validation.report.renderer import html_text  # noqa: E402
from validation.report.view import console_summary  # noqa: E402
from validation.results.model import check_results  # noqa: E402

STATUSES = ("passed", "failed", "skipped", "interrupted", "pending", "timeout", "hang", "error")
CRITERIA = ("pass", "fail", "warn", "error", "skipped", "inconclusive")
REASON = ("line one\nline two <script>alert(1)</script> | a pipe **bold** [x](http://e.invalid) `code` "
          "\x1b[31mred\x1b[0m \x07 & \"quoted\" </td></table>" + " long" * 400)
# a value as Python prints it, never a report's words ("None: every step ran ..." is the report's own sentence)
LEAK = re.compile(r"\bNone\b(?!: every step)|\bnan\b|\{\}|\[\]|\['|\{'|\bTrue\b|\bFalse\b")
VOID = {"br", "img", "meta", "hr", "input", "link", "col", "area", "base", "wbr", "source"}


class _Balance(HTMLParser):
    """Every element closed, in the order opened."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else ''}>")
        if tag in self.stack:
            while self.stack.pop() != tag:
                pass


def _balanced(html: str) -> list[str]:
    parser = _Balance()
    parser.feed(html)
    parser.close()
    return parser.errors + [f"<{t}> not closed" for t in parser.stack]


def _text(html: str) -> str:
    return re.sub(r'data:image/png;base64,[^"]+', "", html)


def _criterion(name: str, status: str, severity: str = "fail", detail: str | None = None) -> dict:
    return {"name": name, "expr": f"{name}.x > 1", "target": "> 1", "actual": "" if status == "skipped" else "2",
            "status": status, "severity": severity, "description": "", "detail": detail}


def _check_formats(results: dict) -> dict[str, str]:
    check_results(results, "results.json")  # a record a run could have written: `report RUN` reads it
    out = {fmt: render(results, fmt) for fmt in ("md", "html", "json", "junit")}
    for fmt in ("md", "html"):
        leaks = [m.group(0) for m in LEAK.finditer(_text(out[fmt]))]
        assert not leaks, f"{fmt}: {leaks[:5]}"
    assert not _balanced(out["html"])
    assert "<script>" not in out["html"] and "\x1b" not in out["html"] and "\x07" not in out["html"]
    return out


def _junit_counts(xml: str) -> dict[str, int]:
    root = ET.fromstring(xml.encode("utf-8"))
    return {k: int(root.get(k)) for k in ("tests", "failures", "errors", "skipped")}


# ------------------------------------------------------------------------------------------- inline HTML markup

@pytest.mark.parametrize("text", ["`loss ** 2` is nan; `grad ** 2` too", "**a `b** c`", "`a **b` c**",
                                  "*a **b* c**", "**a *b** c*", "*x `y* z`"])
def test_inline_markup_never_crosses_a_code_span(text):
    results = run_record({"steps": {"s": {"status": "passed", "reason": text, "notes": [text]}}})
    assert not _balanced(str(html_text(text)))
    assert not _balanced(render(results, "html"))


def test_bold_and_code_still_become_tags():
    assert str(html_text("**a** `b` **c**")) == "<strong>a</strong> <code>b</code> <strong>c</strong>"
    assert str(html_text("`x ** 2` and **y**")) == "<code>x ** 2</code> and <strong>y</strong>"


# ------------------------------------------------------------------------------------------------ the conclusion

def test_open_names_inconclusive_and_unevaluated_criteria():
    results = run_record({"steps": {"a": {}}, "verdict": "INCOMPLETE", "verdict_reason": "a criterion was disturbed",
                          "acceptance": [_criterion("held", "pass"), _criterion("shaken", "inconclusive"),
                                         _criterion("unread", "skipped"), _criterion("soft", "warn", "warn")]})
    text = conclusion(results, open_problems(results), None)["open"]
    assert "1 criterion inconclusive (shaken)" in text
    assert "1 criterion not evaluated (unread)" in text
    assert "1 criterion only warned (soft)" in text
    md = render(results, "md")
    assert "Open: " in md and "inconclusive (shaken)" in md.split("## Conclusion")[1]


def test_open_names_a_step_with_no_result():
    results = run_record({"steps": {"a": {}}, "verdict": "INCOMPLETE", "verdict_reason": "a step has no result"})
    results["phases"][0]["steps"].append("ghost")
    results["steps"]["odd"] = {**results["steps"]["a"], "name": "odd", "status": "weird"}
    results["phases"][0]["steps"].append("odd")
    text = conclusion(results, open_problems(results), None)["open"]
    assert "2 steps with no result recorded (ghost, odd)" in text


def test_next_starts_with_the_first_failure_in_run_order():
    results = run_record({"steps": {"zeta": {"status": "failed", "reason": "first"},
                                    "alpha": {"status": "failed", "reason": "its consequence"}},
                          "verdict": "NO-GO", "verdict_reason": "two steps failed"})
    nxt = conclusion(results, open_problems(results), None)["next"]
    assert "starting with `zeta/`" in nxt


def test_every_step_skipped():
    steps = {f"s{i}": {"status": "skipped", "reason": "left out by --skip"} for i in range(3)}
    results = run_record({"steps": steps, "verdict": "INCOMPLETE", "verdict_reason": "nothing ran",
                          "acceptance": [_criterion("c", "skipped")]})
    out = _check_formats(results)
    assert _junit_counts(out["junit"]) == {"tests": 4, "failures": 0, "errors": 0, "skipped": 4}
    end = out["md"].split("## Conclusion")[1]
    assert "no step passed" in end and "3 steps skipped (s0, s1, s2)" in end and "not evaluated (c)" in end
    assert "### Phase 1: Main — SKIPPED" in out["md"]


# ------------------------------------------------------------------------------------------ every rare record

def test_no_steps_and_no_criteria():
    out = _check_formats(run_record({"steps": {}}))
    assert "- **Steps**: 0 (none)" in out["md"] and "- **Acceptance criteria**: 0 (none)" in out["md"]
    assert "No acceptance criteria were evaluated." in out["md"]
    assert _junit_counts(out["junit"]) == {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}


def test_a_hundred_steps_of_every_status():
    steps = {f"s{i}": {"status": STATUSES[i % 8], "reason": None if i % 8 == 0 else f"why {i}"} for i in range(100)}
    crits = [_criterion(f"c{i}", CRITERIA[i % 6], "fail" if i % 2 else "warn") for i in range(30)]
    results = run_record({"steps": steps, "acceptance": crits, "verdict": "NO-GO", "verdict_reason": "failures"})
    out = _check_formats(results)
    step_fail = sum(STATUSES[i % 8] in ("failed", "timeout", "hang", "error") for i in range(100))
    step_skip = sum(STATUSES[i % 8] in ("skipped", "interrupted", "pending") for i in range(100))
    crit = [CRITERIA[i % 6] for i in range(30)]
    assert _junit_counts(out["junit"]) == {
        "tests": 130, "failures": step_fail + crit.count("fail"), "errors": crit.count("error"),
        "skipped": step_skip + crit.count("skipped") + crit.count("inconclusive")}
    assert "- **Steps**: 100 (" in out["md"] and f"- **Open problems**: {len(open_problems(results))}" in out["md"]
    rows, lines = console_summary(results, Path("run"), [])
    assert len(rows) == 30 and ("NO-GO: failures", "bold red") in lines


def test_an_interrupted_run():
    steps = {"a": {}, "b": {"status": "interrupted", "reason": "interrupted by SIGINT"}, "c": {"status": "pending"}}
    results = run_record({"steps": steps, "verdict": "INCOMPLETE", "verdict_reason": "interrupted by SIGINT",
                          "interrupted_by": "SIGINT", "finished": None, "duration_s": None})
    out = _check_formats(results)
    assert _junit_counts(out["junit"]) == {"tests": 3, "failures": 0, "errors": 0, "skipped": 2}
    end = out["md"].split("## Conclusion")[1]
    assert "Open: 2 steps did not finish (b, c)" in end and "--resume run" in end
    assert "(not finished)" in out["md"]


def test_a_resume_that_kept_changed_steps_and_ran_another_source():
    results = run_record({"steps": {"a": {}, "b": {}}, "resumes": [{
        "at": "2026-01-02T00:00:00+0000", "previous_end": "2026-01-01T00:00:00+0000",
        "previous_state": "interrupted by SIGINT", "steps": ["b"], "rerun": [], "replaced": {},
        "runbook_changed": False, "options": {"only": [], "skip": [], "set": []},
        "kept_changed": {"a": "argv: --steps 30 -> --steps <3>"},
        "source_changed": {"before": {"git_sha": "a" * 40, "git_dirty": True, "source_digest": "b" * 64},
                           "now": {"git_sha": "c" * 40, "git_dirty": False, "source_digest": "d" * 64}}}]})
    out = _check_formats(results)
    summary = out["md"].split("## Test Environment")[0]
    assert "- **Resumed**: interrupted by SIGINT at 2026-01-01T00:00:00+0000" in summary
    assert "kept as measured under other settings" in summary and "a (argv: --steps 30 -> --steps <3>)" in summary
    assert "the source had changed since the earlier attempt (git aaaaaaaaaaaa dirty" in summary
    html_summary = out["html"].split('id="environment"')[0] if 'id="environment"' in out["html"] else out["html"]
    assert "--steps &lt;3&gt;" in html_summary and "kept as measured under other settings" in html_summary


def test_a_reused_phase_with_differences():
    record = {"phase": "main", "from": "reports/gpu/earlier", "runbook": "gpu", "finished": "2026-01-01T00:00:00+0000",
              "device": "2 x H100", "source_digest": "e" * 64, "differences": ["NSA_X=1", "NSA_Y=<b>"]}
    results = run_record({"steps": {"a": {"reused": record, "reason": "not run here"}}, "reused": [record]})
    out = _check_formats(results)
    summary = out["md"].split("## Test Environment")[0]
    assert ("- **Not run here**: phase main: its results are those of reports/gpu/earlier (gpu run finished "
            "2026-01-01T00:00:00+0000 on 2 x H100; the same source, digest eeeeeeeeeeee; its steps ran without "
            "NSA_X=1, NSA_Y=\\<b>, which this runbook's defaults.env adds)") in summary
    assert "NSA_Y=&lt;b&gt;" in out["html"]


def test_a_reason_holding_markdown_html_and_control_characters():
    steps = {"f": {"status": "failed", "reason": REASON, "excerpt": REASON}, "s": {"status": "skipped", "reason": REASON},
             "p": {"reason": REASON}}
    results = run_record({"steps": steps, "verdict": "NO-GO", "verdict_reason": REASON,
                          "acceptance": [_criterion("c", "warn", "warn", REASON)]})
    out = _check_formats(results)
    md = out["md"]
    headings = [line for line in md.split("\n") if line.startswith("#")]
    assert not any("line two" in h for h in headings)  # the reason never breaks onto a heading line
    outside_fences = re.sub(r"^```text\n.*?^```$", "", md, flags=re.S | re.M)
    assert "\\<script>" in outside_fences and not re.search(r"(?<!\\)<script>", outside_fences)
    assert "\x1b" not in md and "\x07" not in md
    root = ET.fromstring(out["junit"].encode("utf-8"))
    assert {k: root.get(k) for k in ("tests", "failures", "skipped")} == {"tests": "4", "failures": "1", "skipped": "1"}


def test_a_longrun_drift_is_shown_signed():
    results = run_record({"steps": {"long": {"kind": "longrun", "metrics": {"throughput_drift": -0.153,
                                                                              "throughput_stable": True}}}})
    out = _check_formats(results)
    assert "| -15.3% |" in out["md"]


# --------------------------------------------------------------------------------------------------- compare

def test_compare_warnings_say_values_in_words():
    a = run_record({"environment": {"host": "node-a", "gpus": [], "git_dirty": None, "git_sha": "1" * 40}})
    b = run_record({"environment": {"host": None, "gpus": [{"name": "H100"}], "git_dirty": True, "git_sha": "1" * 40}})
    warnings = environment_differences(a, b) + setting_differences(a, b)
    assert "host differs: A node-a, B not recorded" in warnings
    assert "GPUs differ: A none, B H100" in warnings
    assert any(w.startswith("git_dirty differs: A not recorded, B yes") for w in warnings)
    assert not [w for w in warnings if LEAK.search(w) or "'" in w]
