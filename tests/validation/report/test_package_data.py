"""A report renders from the installed package alone: the wheel carries the report templates and every step kind's
partials as package data, so `nsa-validate report` works from a non-editable install, far from any checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from validation.report import render

REPO = Path(__file__).resolve().parents[3]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "results_example.json"


@pytest.mark.slow
def test_wheel_renders_an_html_report_outside_the_checkout(tmp_path):
    # build the wheel from a copy of the sources (a build in the checkout would leave build/ and *.egg-info there)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for package in ("nsa", "validation"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(dist), str(src)], check=True, env=env, cwd=tmp_path, timeout=600,
                   capture_output=True)
    (wheel,) = dist.glob("nsa_validate-*.whl")

    # a fresh venv that sees this environment's packages (jinja2, typer, ...), with the wheel alone installed
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)], check=True, env=env,
                   cwd=tmp_path, timeout=300, capture_output=True)

    # a run directory and a working directory that are nowhere near the checkout
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy2(FIXTURE, run_dir / "results.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import validation; print(validation.__file__)"], env=env,
                           cwd=elsewhere, capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv), f"validation imported from {where}, not from the installed wheel"
    proc = subprocess.run([str(venv / "bin" / "nsa-validate"), "report", str(run_dir), "--format", "html"], env=env,
                          cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = proc.stdout
    assert html.startswith("<!DOCTYPE html>") and "Status: NO-GO" in html
    assert "<th>Tokens/s, window mean (all ranks)</th>" in html  # the sweep kind's partial
    assert "<th>Baseline</th><th>Variant</th>" in html  # the ab kind's partial
    assert html == render(json.loads(FIXTURE.read_text()), "html", run_dir=run_dir)  # the same as from the checkout
