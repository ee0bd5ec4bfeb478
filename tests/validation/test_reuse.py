"""`nsa-validate run --reuse PHASE[=RUN_DIR]` (validation.results.reuse): a phase taken from an earlier run of the same source
instead of being run again (h100_single's kernel qualification, where the same source's gpu_kernels run is
committed). Checked on a small runbook of two phases of benchmark steps (no torch): the reused phase launches
nothing, carries the earlier run's figures into the criteria and says whose they are; an earlier run of another
source, with a failed step, other --set for its steps or no digest at all is refused, naming why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from validation import version
from validation.results.reuse import ReuseError, parse

from reuse_support import two_phase_runbook

REPO = Path(__file__).resolve().parents[2]


def runbook(tmp_path: Path) -> Path:
    return two_phase_runbook(tmp_path)


@pytest.fixture(scope="module")
def earlier(cli, tmp_path_factory):
    """One whole run of the runbook (its results.json records the source digest)."""
    tmp = tmp_path_factory.mktemp("reuse")
    rb = runbook(tmp)
    run_dir = tmp / "first"
    proc = cli("run", rb, "--out", run_dir, "--no-report")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return rb, run_dir


def _edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    data = json.loads((dst / "results.json").read_text())
    edit(data)
    (dst / "results.json").write_text(json.dumps(data))
    return dst


def test_the_earlier_run_records_this_trees_source_digest(earlier):
    _, run_dir = earlier
    results = json.loads((run_dir / "results.json").read_text())
    assert results["environment"]["source_digest"] == version.source_digest()


def test_a_reused_phase_launches_nothing_and_its_figures_decide_with_their_origin_named(cli, earlier, tmp_path):
    rb, first = earlier
    run_dir = tmp_path / "second"
    proc = cli("run", rb, "--out", run_dir, "--reuse", f"kernels={first}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"phase kernels: its results are those of {first / 'results.json'}" in proc.stderr
    results = json.loads((run_dir / "results.json").read_text())
    step = results["steps"]["kbench"]
    assert step["status"] == "passed" and step["metrics"]["speed"] == 3.0
    assert step["reused"]["from"] == str(first / "results.json") and step["reused"]["runbook"] == "two_phases"
    assert "nothing of it ran here" in step["reason"]
    assert not (run_dir / "kbench").exists()  # nothing launched for it
    assert (run_dir / "rbench" / "bench.json").is_file()  # the other phase ran
    assert [r["phase"] for r in results["reused"]] == ["kernels"]
    crits = {c["name"]: c for c in results["acceptance"]}
    assert crits["fast_kernels"]["status"] == "pass" and results["verdict"] == "GO"
    report = (run_dir / "report.md").read_text()
    assert "**Not run here**: phase kernels: its results are those of" in report
    html = (run_dir / "report.html").read_text()
    assert "Not run here" in html


def test_a_bare_reuse_finds_the_matching_run_under_reports(earlier, tmp_path):
    rb, first = earlier
    other_source = _edited(first, tmp_path / "reports" / "a" / "old_run",
                           lambda d: d["environment"].update(source_digest="0" * 64))
    good = tmp_path / "reports" / "b" / "good_run"
    shutil.copytree(first, good)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "validation.cli", "run", str(rb), "--out", str(tmp_path / "third"),
                           "--reuse", "kernels", "--no-report"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "third" / "results.json").read_text())
    assert results["steps"]["kbench"]["reused"]["from"] == str(good / "results.json")
    assert other_source.is_dir()


@pytest.mark.parametrize("edit, why", [
    (lambda d: d["environment"].update(source_digest="f" * 64), "it ran another source (digest ffffffffffff"),
    (lambda d: d["environment"].pop("source_digest"), "it recorded no source digest"),
    (lambda d: d["steps"]["kbench"].update(status="failed"), "its step kbench ended failed"),
    (lambda d: d["options"].update(set=["steps.kbench.timeout_s=30"]), "other --set for its steps"),
    (lambda d: d["phases"][0].update(name="other"), "it has no phase kernels"),
], ids=["other-source", "no-digest", "failed-step", "other-set", "no-phase"])
def test_an_earlier_run_that_cannot_stand_for_the_phase_is_refused_before_anything_runs(cli, earlier, tmp_path,
                                                                                        edit, why):
    rb, first = earlier
    source = _edited(first, tmp_path / "earlier", edit)
    run_dir = tmp_path / "refused"
    proc = cli("run", rb, "--out", run_dir, "--reuse", f"kernels={source}")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--reuse kernels: no run of this source's phase kernels" in proc.stderr and why in proc.stderr, \
        proc.stderr[-2000:]
    assert not (run_dir / "results.json").exists()


def test_a_reuse_that_names_no_phase_or_skips_it_too_is_refused(cli, earlier, tmp_path):
    rb, first = earlier
    proc = cli("run", rb, "--out", tmp_path / "x", "--reuse", f"nosuch={first}")
    assert proc.returncode == 2 and "no phase 'nosuch'" in proc.stderr, proc.stderr[-2000:]
    proc = cli("run", rb, "--out", tmp_path / "y", "--reuse", f"kernels={first}", "--skip", "kernels")
    assert proc.returncode == 2 and "either taken from an earlier run or skipped" in proc.stderr, proc.stderr[-2000:]
    with pytest.raises(ReuseError, match="given twice"):
        parse(["kernels", "kernels=x"])


def test_the_source_digest_covers_the_code_and_not_the_reports(tmp_path):
    (tmp_path / "nsa").mkdir()
    (tmp_path / "nsa" / "layer.py").write_text("x = 1\n")
    (tmp_path / "runbooks").mkdir()
    (tmp_path / "runbooks" / "a.yaml").write_text("name: a\n")
    (tmp_path / "reports" / "gpu").mkdir(parents=True)
    first = version.source_digest(tmp_path)
    (tmp_path / "reports" / "gpu" / "results.json").write_text("{}")
    (tmp_path / "README.md").write_text("# figures\n")
    (tmp_path / "nsa" / "__pycache__").mkdir()
    (tmp_path / "nsa" / "__pycache__" / "layer.cpython-311.pyc").write_bytes(b"\0")
    assert version.source_digest(tmp_path) == first  # a committed report, docs, caches: the same source
    (tmp_path / "runbooks" / "a.yaml").write_text("name: b\n")
    assert version.source_digest(tmp_path) != first  # a runbook is part of what ran
    (tmp_path / "runbooks" / "a.yaml").write_text("name: a\n")
    assert version.source_digest(tmp_path) == first
    (tmp_path / "nsa" / "layer.py").rename(tmp_path / "nsa" / "layer2.py")
    assert version.source_digest(tmp_path) != first  # the same bytes under another name is another tree
