"""A figure a step derived from its runs is evidence like the runs' own (validation.execution.evidence): a weak-scaling
table whose middle row is 14.9 (N ranks doing 14.9 times the work of one each) is no result, even where the
criterion reads the table's minimum, 0.9, which is in range. Before, the criterion passed, the run ended GO and
results.json's evidence named nothing implausible."""

from __future__ import annotations

from pathlib import Path

from decision_support import judge

from validation.analysis.parallelism import scaling_table
from validation.runbook.loader import load_runbook

RUNBOOK = """\
name: ev
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {batch_size: 4}}
phases:
  - name: p
    steps:
      - {name: sc, kind: scaling, world_sizes: [1, 2, 4], modes: [weak]}
acceptance:
  - {name: "Weak", expr: "sc.weak.efficiency.min >= 0.8", target: ">= 0.8"}
"""
REPO = Path(__file__).resolve().parents[2]
QUIET = {"disturbed": False, "text": "no interference in 8 samples", "share": 0.0}


def _results(tmp_path, points: dict[int, float]) -> tuple:
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    rb = load_runbook(path, cwd=str(REPO))
    runs = [{"label": f"weak_n{n}", "status": "passed", "repeat": 0, "params": {"mode": "weak", "world_size": n},
             "metrics": {"toks_per_s": {"mean": toks, "cv": 0.02, "n": 20}, "interference": QUIET, "world_size": n,
                         "context": {"device": "cpu"}}} for n, toks in points.items()]
    step = {"name": "sc", "kind": "scaling", "status": "passed", "runs": runs,
            "metrics": {"world_sizes": list(points), "weak": scaling_table(points, "weak")}}
    results = {"runbook": {"name": "ev", "path": "rb.yaml"}, "run_dir": str(tmp_path), "steps": {"sc": step},
               "acceptance": []}
    return rb, results


def test_a_derived_row_outside_its_range_makes_the_criterion_an_error_and_is_named(tmp_path):
    rb, results = _results(tmp_path, {1: 100.0, 2: 2980.0, 4: 360.0})
    assert [r["efficiency"] for r in results["steps"]["sc"]["metrics"]["weak"]["rows"]] == [1.0, 14.9, 0.9]
    criteria, verdict = judge(rb, results)
    assert criteria["Weak"]["status"] == "error", criteria["Weak"]
    assert "weak.rows.1.efficiency = 14.9" in criteria["Weak"]["detail"]
    assert verdict[0] != "GO"
    assert [(b["step"], b["metric"], b["value"]) for b in results["evidence"]["implausible"]] == [
        ("sc", "weak.rows.1.efficiency", 14.9)]


def test_a_table_in_range_passes(tmp_path):
    rb, results = _results(tmp_path, {1: 100.0, 2: 190.0, 4: 360.0})
    criteria, verdict = judge(rb, results)
    assert criteria["Weak"]["status"] == "pass" and verdict[0] == "GO", (criteria, verdict)
    assert results["evidence"]["implausible"] == []
