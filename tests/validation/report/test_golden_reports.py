"""The committed runs' reports, rendered again from their results.json, against golden copies.

Every step kind appears in at least one committed run (reports/examples/* and a GPU run of gpu_kernels.yaml), so a
change to any kind's view, to the report's blocks or to the renderer shows here as a diff of the rendered Markdown,
HTML (inline plots left out: their bytes depend on matplotlib; one tag a line) and JUnit. A change that alters a report on purpose
updates the golden copies and shows the difference in its commit:

    python tests/validation/report/test_golden_reports.py --update
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import pytest

from validation import kinds
from validation.report.renderer import render
from validation.results.store import read_results

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "golden"
RUNS = {
    "cpu_smoke": REPO / "reports/examples/cpu_smoke",
    "parallelism_cpu": REPO / "reports/examples/parallelism_cpu",
    "triage_cpu": REPO / "reports/examples/triage_cpu",
    "gpu_kernels_h100": REPO / "reports/gpu/2026-11-26-h100/run6/gpu_kernels_run",
}
FORMATS = {"md": "md", "html": "html", "junit": "xml"}
_DATA_URI = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")
_MD_RULE = re.compile(r"^\|(?:\s*:?-+:?\s*\|)+$", re.M)


def rendered(name: str, fmt: str) -> str:
    """The report as rendered today, normalised where only the layout of the source differs: an HTML tag starts a
    line (whitespace between tags is not shown), a Markdown table's rule has three dashes a column."""
    run_dir = RUNS[name]
    text = _DATA_URI.sub("data:image/png;base64,...", render(read_results(run_dir), fmt, run_dir=run_dir))
    if fmt == "html":
        return re.sub(r">\s*<", ">\n<", text)
    if fmt == "md":
        return _MD_RULE.sub(lambda m: "|" + "---|" * (m.group(0).count("|") - 1), text)
    return text


def golden_path(name: str, fmt: str) -> Path:
    return GOLDEN / f"{name}.{FORMATS[fmt]}"


def test_the_committed_runs_hold_every_kind():
    seen = {step["kind"] for run_dir in RUNS.values() for step in read_results(run_dir)["steps"].values()}
    assert set(kinds.names()) <= seen, f"no committed run has a step of kind {sorted(set(kinds.names()) - seen)}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", RUNS)
def test_report_matches_its_golden_copy(name, fmt):
    want = golden_path(name, fmt).read_text(encoding="utf-8")
    got = rendered(name, fmt)
    if got != want:
        diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"golden/{name}",
                                                 f"rendered/{name}", n=1))[:80])
        pytest.fail(f"the {fmt} report of {name} changed (if on purpose: python {Path(__file__).relative_to(REPO)}"
                    f" --update):\n{diff}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: python {sys.argv[0]} --update   (rewrites the golden copies from today's renderer)")
    GOLDEN.mkdir(exist_ok=True)
    for run in RUNS:
        for f in FORMATS:
            golden_path(run, f).write_text(rendered(run, f), encoding="utf-8")
            print("wrote", golden_path(run, f).relative_to(REPO))
