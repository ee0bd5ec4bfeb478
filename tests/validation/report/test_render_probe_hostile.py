"""Reports of a run whose text is hostile (markup, `]]>`, quotes, control characters, lone surrogates, very long
lines, brackets and backticks) keep their structure, checked against independent references: the JUnit XML parses
as strict UTF-8 XML with the element layout Jenkins reads and counts that match its testcases; a Markdown image
resolves to its file from the report and its table rows keep their columns; a plot shows every finite point it
was given, a series of one point included."""

from __future__ import annotations

import copy
import json
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from matplotlib.colors import to_rgb

from validation.report import render
from validation.report.plots import Plotter
from validation.results.run import Step

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"
HOSTILE = "x<y & z]]> \"q' \x00\x01\x08\x0b\x1f\x7f \ud800 \udfff end " + "L" * 3000


@pytest.fixture()
def results() -> dict:
    return copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))


# --------------------------------------------------------------------------------------------------------------
# JUnit XML

_CASE_CHILDREN = {"skipped", "error", "failure", "system-out", "system-err"}  # Jenkins' junit schema


def _check_jenkins_layout(root: ET.Element) -> None:
    """testsuites/testsuite/(properties?, testcase*) with numeric counts that match the testcases' children."""
    assert root.tag == "testsuites"
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in root:
        assert suite.tag == "testsuite" and suite.get("name") is not None
        children = list(suite)
        if children and children[0].tag == "properties":
            children = children[1:]
        assert all(c.tag == "testcase" for c in children)
        counts = {"tests": len(children), "failures": 0, "errors": 0, "skipped": 0}
        for case in children:
            assert case.get("name") is not None and float(case.get("time")) >= 0
            tags = [c.tag for c in case]
            assert set(tags) <= _CASE_CHILDREN, tags
            outcome = [t for t in tags if t in ("failure", "error", "skipped")]
            assert len(outcome) <= 1, tags
            key = {"failure": "failures", "error": "errors", "skipped": "skipped"}.get(outcome[0]) if outcome else None
            if key:
                counts[key] += 1
        for key, n in counts.items():
            assert int(suite.get(key)) == n, (suite.get("name")[:40], key)
            totals[key] += n
        assert float(suite.get("time")) >= 0
    for key, n in totals.items():
        assert int(root.get(key)) == n, key
    float(root.get("time"))


def test_junit_with_hostile_text_in_every_field_is_well_formed_and_counts_match(results):
    results["runbook"]["name"] = results["runbook"]["path"] = HOSTILE
    results["verdict_reason"] = results["environment"]["host"] = HOSTILE
    for phase in results["phases"]:
        phase["name"] = phase["title"] = phase["name"] + HOSTILE
    statuses = ["failed", "passed", "skipped", "pending", "interrupted", "timeout", "hang", "error", "running"]
    for (name, step), status in zip(results["steps"].items(), statuses * 2):
        step.update(status=status, reason=HOSTILE, excerpt=HOSTILE, dir=HOSTILE, command=[HOSTILE, "a b"])
    crit_statuses = ["pass", "fail", "warn", "error", "skipped", "inconclusive"]
    for crit, status in zip(results["acceptance"], crit_statuses * 3):
        crit.update(name=HOSTILE, detail=HOSTILE, expr=HOSTILE, target=HOSTILE, actual=HOSTILE, status=status,
                    severity=HOSTILE)  # a record built in memory: any string (validation.results.run.Criterion)
    results["verdict"] = "NO-GO"
    xml = render(results, "junit")
    root = ET.fromstring(xml.encode("utf-8"))  # strict UTF-8 (no lone surrogate) and XML 1.0 (no control character)
    _check_jenkins_layout(root)
    assert int(root.get("tests")) == len(results["steps"]) + len(results["acceptance"])
    acceptance = next(s for s in root if s.get("name") == "acceptance")
    failure = next(c.find("failure") for c in acceptance if c.find("failure") is not None)
    assert failure.get("type").startswith("x<y & z]]> \"q' \ufffd")  # the severity's text, shown, not dropped


# --------------------------------------------------------------------------------------------------------------
# Markdown

def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)(?:\\\\)*\|", line))


def _table_rows_after(md: str, header: str) -> list[str]:
    lines = md.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_a_criterion_of_an_unknown_status_keeps_the_tables_columns(results):
    crit = results["acceptance"][0]
    crit["status"] = "odd|status"  # a record built in memory: any string, shown upper-cased
    md = render(results, "md")
    header = "| Criterion | Target | Actual | Status | If it fails | Detail |"
    rows = _table_rows_after(md, header)
    assert rows and all(_unescaped_pipes(r) == _unescaped_pipes(header) for r in rows), rows[0]
    assert "ODD\\|STATUS" in rows[0]
    header = "| Status | Where | What |"
    rows = _table_rows_after(md, header)
    assert rows and all(_unescaped_pipes(r) == _unescaped_pipes(header) for r in rows), rows


def _images(md: str) -> list[tuple[str, str]]:
    """(text, destination) of every one-line Markdown image, read by CommonMark's rules: the text up to the first
    `]` that is neither escaped by a backslash nor closes a `[` of the text, then `(destination)` without spaces."""
    out = []
    for line in (line for line in md.splitlines() if line.startswith("![")):
        i, depth = 2, 0
        while i < len(line):
            ch = line[i]
            if ch == "\\":
                i += 2
                continue
            if ch == "]" and depth == 0:
                break
            depth += {"[": 1, "]": -1}.get(ch, 0)
            i += 1
        match = re.fullmatch(r"\(([^\s()<>]+)\)", line[i + 1:])
        assert match, f"not an image: {line!r}"
        out.append((line[2:i], match.group(1)))
    return out


def test_a_plot_image_resolves_to_its_file_from_the_report(results):
    paths = ["plots/a b.png", "plots/a#b.png", "plots/a?b.png", "plots/é (1).png", "plots/50%.png"]
    plots = [{"title": f"Tokens/s {i}: a] b [c", "path": path, "step": None} for i, path in enumerate(paths)]
    plots.append({"title": "Beside its step", "path": "plots/s (1)#.png", "step": "baseline"})
    md = render(results, "md", plots=plots)
    shown = {}
    for text, dest in _images(md):
        resolved = urlsplit(urljoin("file:///run/report.md", dest))
        assert not resolved.query and not resolved.fragment, dest
        shown[unquote(resolved.path, encoding="utf-8")] = re.sub(r"\\(.)", r"\1", text)
    # the whole caption, brackets included, is the image's text
    assert shown == {"/run/" + p["path"]: p["title"] for p in plots}


def test_a_recommended_setting_is_one_code_span_whatever_its_value(results):
    results["recommendations"]["env"] = {"NCCL_IB_HCA": "=mlx5_0`1<x>"}
    md = render(results, "md")
    line = next(line for line in md.splitlines() if line.startswith("- ") and "NCCL_IB_HCA" in line)
    assert line.startswith("- `") and _code_spans(line)[0] == "NCCL_IB_HCA==mlx5_0`1<x>", line


def test_the_next_command_is_one_code_span_when_the_run_directory_holds_a_backtick(results):
    results["run_dir"] = "runs/it`s here"
    step = results["steps"]["baseline"]
    step["status"], step["reason"] = "failed", "crashed"
    results["verdict"] = "NO-GO"
    md = render(results, "md")
    line = next(line for line in md.splitlines() if line.startswith("Next: "))
    expected = shlex.join(["nsa-validate", "run", results["runbook"]["path"], "--resume", "runs/it`s here",
                           "--rerun", "baseline"])
    assert expected in _code_spans(line), line


def _code_spans(text: str) -> list[str]:
    """The contents of text's code spans by CommonMark's rule: a run of n backticks to the next run of exactly n
    (an unmatched run is literal), one space stripped from each side of a padded content."""
    out, pos = [], 0
    while (opening := re.compile(r"`+").search(text, pos)) is not None:
        n = len(opening.group(0))
        closing = next((m for m in re.finditer(r"`+", text[opening.end():]) if len(m.group(0)) == n), None)
        if closing is None:
            pos = opening.end()
            continue
        content = text[opening.end():opening.end() + closing.start()]
        if len(content) > 2 and content.startswith(" ") and content.endswith(" "):
            content = content[1:-1]
        out.append(content)
        pos = opening.end() + closing.end()
    return out


# --------------------------------------------------------------------------------------------------------------
# Plots

LINE_RGB = (31, 119, 180)  # matplotlib's C0, the first series' colour
HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"


def _drawn(plotter: Plotter) -> list:
    """Keep each figure the plotter saves (fig, axes), drawn."""
    figures = []
    original = plotter.save

    def keep(fig, filename, title):
        original(fig, filename, title)
        fig.canvas.draw()
        figures.append(fig)

    plotter.save = keep
    return figures


def _pixel(fig, ax, x: float, y: float, dx: int = 0, dy: int = 0) -> tuple[int, int, int]:
    import numpy as np

    image = np.asarray(fig.canvas.buffer_rgba())
    px, py = ax.transData.transform((x, y))
    return tuple(int(v) for v in image[image.shape[0] - int(round(py)) + dy, int(round(px)) + dx, :3])


def _near_line_colour(fig, ax, x: float, y: float) -> bool:
    """A pixel within 2 px of (x, y) is the line's colour (it may be drawn over a faint window shade)."""
    for dx in (-2, -1, 0, 1, 2):
        for dy in (-2, -1, 0, 1, 2):
            r, g, b = _pixel(fig, ax, x, y, dx, dy)
            if abs(r - LINE_RGB[0]) < 40 and abs(g - LINE_RGB[1]) < 40 and abs(b - LINE_RGB[2]) < 40:
                return True
    return False


def test_a_tokens_per_step_plot_of_one_row_shows_its_point(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s/training.csv").write_text(HEADER + "7,2.0,0.1,1234.5,0.1,1,1,1\n")
    plotter = Plotter(tmp_path)
    figures = _drawn(plotter)
    plotter.for_step("s")
    plotter.tokens_per_step("s", {"metrics": {"csv": "s/training.csv"}})
    (fig,) = figures
    assert _near_line_colour(fig, fig.axes[0], 7, 1234.5)


def test_an_infinite_tokens_per_s_leaves_the_line_through_the_finite_rows(tmp_path):
    (tmp_path / "s").mkdir()
    rows = "1,2,0.1,100,0.1,1,1,1\n2,2,0.1,inf,0.1,1,1,1\n3,2,0.1,120,0.1,1,1,1\n4,2,0.1,-inf,0.1,1,1,1\n"
    (tmp_path / "s/training.csv").write_text(HEADER + rows)
    plotter = Plotter(tmp_path)
    figures = _drawn(plotter)
    plotter.for_step("s")
    plotter.tokens_per_step("s", {"metrics": {"csv": "s/training.csv"}})
    (fig,) = figures
    ax = fig.axes[0]
    ((xs, ys),) = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
    assert (xs, ys) == ([1, 3], [100.0, 120.0])  # the finite rows only, none outside the data
    assert _near_line_colour(fig, ax, 2, 110.0)  # the segment between them is drawn


def test_a_telemetry_plot_of_one_sample_shows_its_point(tmp_path):
    step_dir = tmp_path / "s"
    step_dir.mkdir()
    (step_dir / "telemetry.csv").write_text("time,node,sample,gpu,cpu_util_pct\n1000.0,n1,0,,150.0\n")
    plotter = Plotter(tmp_path)
    figures = _drawn(plotter)
    plotter.for_step("s")
    plotter.telemetry("s", Step(dir="s", metrics={"telemetry": {"samples": 1, "files": ["telemetry.csv"]}}))
    (fig,) = figures
    ax = fig.axes[0]
    orange = tuple(round(c * 255) for c in to_rgb("tab:orange"))  # the processes' CPU line
    r, g, b = _pixel(fig, ax, 0.0, 150.0)
    assert abs(r - orange[0]) < 40 and abs(g - orange[1]) < 40 and abs(b - orange[2]) < 40, (r, g, b)
