"""The report's "With and without, measured in this run" table as a reader sees it: every figure in a unit the table
states (a sweep that selected on a step time or a memory peak is not shown as tokens/s), and in HTML every cell's
text inside its cell (a wide confidence interval used to spill over the p column).

The run is the committed example reports/examples/cpu_smoke (its results.json alone); the browser checks use
headless Chromium and skip without it, as test_html_browser does.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from html import unescape
from pathlib import Path

import pytest

from validation.report import render

from test_html_browser import FLAGS, _chromium  # the same headless Chromium, found the same way (this folder)

EXAMPLE = Path(__file__).parents[3] / "reports" / "examples" / "cpu_smoke" / "results.json"
PROBE = """<script>
window.addEventListener("load", () => {
  const heading = [...document.querySelectorAll("h3")].find(h => h.textContent.startsWith("With and without"));
  let node = heading.nextElementSibling;
  while (node && !node.classList.contains("table-wrap")) node = node.nextElementSibling;
  const cells = [...node.querySelectorAll("td, th")];
  const spill = cells.filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent);
  document.body.setAttribute("data-spill", JSON.stringify({cells: cells.length, spill}));
});
</script>"""


def _results() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def _table(md: str) -> list[list[str]]:
    """The rows of the Markdown comparison table, as cells."""
    part = md.split("### With and without, measured in this run", 1)[1].split("**Key finding**", 1)[0]
    lines = [line for line in part.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]


def test_a_comparison_of_another_metric_names_it_and_the_sentence_does_not_call_it_tokens_per_s():
    results = copy.deepcopy(_results())
    for comp in results["steps"]["bucket_sweep"]["decision"]["comparisons"]:
        comp["metric"] = "step_time_s"
        comp["mean_a"], comp["mean_b"] = 0.0712, 0.0663  # seconds a step, as a step-time sweep records them
    md = render(results, "md")
    intro = md.split("### With and without, measured in this run", 1)[1].split("\n\n")[1]
    assert "(tokens/s;" not in intro, intro
    assert "step_time_s" in intro, intro
    rows = {(r[0], r[1], r[2]): r for r in _table(md)}
    sweep = rows[("bucket_sweep", "NSA_DDP_BUCKET_MB=100", "NSA_DDP_BUCKET_MB=50")]
    assert sweep[3] == "0.0663 step_time_s" and sweep[4] == "0.0712 step_time_s", sweep
    prefill = next(r for r in _table(md) if r[0] == "prefill")
    comp = results["steps"]["prefill"]["decision"]["comparison"]  # batched against the baseline, as the run wrote it
    assert (prefill[3], prefill[4]) == (f"{comp['mean_b']:,.1f}", f"{comp['mean_a']:,.1f}"), prefill  # tokens/s

    html = render(results, "html")
    assert "0.0663 step_time_s" in html
    assert "tokens/s, except the figures that name their metric (step_time_s)" in unescape(html)


@pytest.mark.parametrize("width", [1280, 900])
def test_html_comparison_cells_hold_their_text(tmp_path, width):
    """The example's intervals (e.g. +910.2% to +1,733.6%) and settings stay inside their cells at a desktop and a
    narrow window width."""
    browser = _chromium()
    page = tmp_path / "report.html"
    page.write_text(render(_results(), "html").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    out = subprocess.run([browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},3000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    found = re.search(r'data-spill="([^"]*)"', out.stdout)
    assert found, "the probe did not run"
    layout = json.loads(unescape(found.group(1)))
    assert layout["cells"] >= 9 * 5  # the header and the example's four comparisons
    assert layout["spill"] == [], layout["spill"]
