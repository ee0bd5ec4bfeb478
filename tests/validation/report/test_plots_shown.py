"""The plots a report shows: only PNG files inside the run directory. A results.json naming another file (an
absolute path, a `..` path, a symlink out of the run) never has that file carried into the HTML page as a data: URI,
a damaged PNG is not shown as a broken image, and the report names both; Markdown and HTML show the same plots."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from validation.report import render

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke"
SECRET = b"not a plot: a file outside the run directory\n"


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    return run


def _results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text(encoding="utf-8"))


def _shown(md: str, html: str) -> tuple[list[str], list[str]]:
    md_paths = re.findall(r"!\[[^\n]*\]\((plots/[^)\s]+)\)", md)
    html_paths = re.findall(r'<img class="plot" src="data:image/png;base64,[^"]*" alt="[^"]*">\s*<figcaption>.*?'
                            r'<span class="muted">\(([^)]+)\)</span>', html, re.S)
    return md_paths, html_paths


def test_a_plot_path_outside_the_run_is_never_inlined(run_dir, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    (run_dir / "plots" / "link.png").symlink_to(secret)
    results = _results(run_dir)
    results["plots"] += [{"title": "abs", "path": str(secret)}, {"title": "up", "path": "../secret.txt"},
                         {"title": "link", "path": "plots/link.png"}]
    html = render(results, "html", run_dir=run_dir)
    assert base64.b64encode(SECRET).decode("ascii")[:40] not in html
    md = render(results, "md", run_dir=run_dir)
    assert f"]({secret})" not in md and "](../secret.txt)" not in md and "](plots/link.png)" not in md
    for text in (md, html):
        assert "(outside the run directory)" in text


def test_a_damaged_png_is_named_not_shown_and_both_formats_agree(run_dir):
    (run_dir / "plots" / "ab_prefill.png").write_bytes(b"garbage, not a PNG")
    (run_dir / "plots" / "toks_per_s_single.png").unlink()  # not there: left out, as `report --write` does
    results = _results(run_dir)
    md, html = render(results, "md", run_dir=run_dir), render(results, "html", run_dir=run_dir)
    md_paths, html_paths = _shown(md, html)
    assert md_paths == html_paths
    recorded = [p["path"] for p in results["plots"]]
    assert sorted(md_paths) == sorted(set(recorded) - {"plots/ab_prefill.png", "plots/toks_per_s_single.png"})
    assert "`plots/ab_prefill.png` (damaged: not a PNG image)" in md
    assert "<code>plots/ab_prefill.png</code> (damaged: not a PNG image)" in html
    assert "toks_per_s_single" not in md


def test_every_plot_of_an_intact_run_is_shown_alike(run_dir):
    results = _results(run_dir)
    md, html = render(results, "md", run_dir=run_dir), render(results, "html", run_dir=run_dir)
    md_paths, html_paths = _shown(md, html)
    assert md_paths == html_paths and sorted(md_paths) == sorted(p["path"] for p in results["plots"])
    assert "Not shown" not in md and "Not shown" not in html
