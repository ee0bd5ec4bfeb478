"""A criterion that only says a benchmark ran (its status, how many checks it recorded, which cases it holds) reads
no performance figure: other work on the machine cannot make it inconclusive. A kind that names its performance
keys means them whatever the comparison (a triage's culprit is a decision on speed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from validation.execution import evidence
from validation.runbook.expressions import compile_expression
from validation.runbook.loader import load_runbook

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, structural, measured", [
    ("b.status == 'passed' and len(b.checks) >= 4", [("b", ("status",)), ("b", ("checks",))], []),
    ("'nsa' in b.best and b.best.nsa.toks_per_s > 2 * b.best.dense.toks_per_s",
     [("b", ("best",))], [("b", ("best", "nsa", "toks_per_s")), ("b", ("best", "dense", "toks_per_s"))]),
    ("t.culprit in ('a', 'b') or 'x' != t.reason", [("t", ("culprit",)), ("t", ("reason",))], []),
    ("len(s.runs) > 1 and s.winner == s.baseline", [("s", ("runs",))], [("s", ("winner",)), ("s", ("baseline",))]),
    ("b.status == b.other", [], [("b", ("status",)), ("b", ("other",))]),  # no string constant: a figure
])
def test_structural_and_measured_reads_of_an_expression(text, structural, measured):
    expr = compile_expression(text)
    assert sorted(expr.structural_paths) == sorted(structural)
    assert sorted(expr.measured_paths) == sorted(measured)
    assert sorted(expr.structural_paths + expr.measured_paths) == sorted(expr.paths)


def test_the_gpu_runbooks_ran_criteria_read_no_performance_figure():
    reads = {rb: {c.name: evidence.performance_reads(load_runbook(REPO / "runbooks" / rb), c)
                  for c in load_runbook(REPO / "runbooks" / rb).acceptance}
             for rb in ("gpu_kernels.yaml", "triage_cpu.yaml")}
    kernels = reads["gpu_kernels.yaml"]
    for name in ("Layer benchmark ran", "Trainer benchmark ran", "Layer profile ran"):
        assert kernels[name] == [], name  # bench.status == 'passed', len(...) and 'nsa' in ...: it ran
    assert kernels["Trainer: NSA vs dense twin"] == [("train_bench", ("best", "nsa", "toks_per_s")),
                                                     ("train_bench", ("best", "dense", "toks_per_s"))]
    assert reads["triage_cpu.yaml"]["Culprit named"] == [("triage", ("culprit",))]  # a decision on speed
