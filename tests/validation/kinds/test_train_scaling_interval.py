"""A train step's scaling_efficiency against its `scaling_baseline` is a ratio of two launches' throughputs: it
carries its 95% interval (scaling_efficiency_low / _high) from the runbook's declared launch noise, else the
run-to-run noise measured earlier in the run, else none (unknown, said), against intervals computed here by hand and
against the coverage of a seeded simulation; the bounds are performance figures, and the report shows them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from validation import kinds
from validation.results.codec import encode
from validation.results.trainer_launch import LaunchMetrics, Stat

# Student t quantiles t(0.975, df) from a printed table
T975 = {3: 3.182446, 69: 1.994945}


def _baseline(world: int, toks: float) -> dict:
    return {"name": "one_node", "kind": "train", "status": "passed",
            "metrics": {"world_size": world, "toks_per_s": {"mean": toks, "stdev": 1.0, "n": 20}}}


def _run(monkeypatch, tmp_path, world: int, toks: float, base_world: int, base_toks: float, compare=None):
    """The `two_nodes` step's Result: one launch of `toks` tokens/s on `world` ranks against the passed baseline
    step `one_node` (`base_toks` on `base_world`), in a run whose runbook declares `compare` (None: nothing)."""
    from validation.kinds import train

    kind = kinds.get("train")
    launched = SimpleNamespace(status="passed", reason=None,
                               metrics=LaunchMetrics(world_size=world, toks_per_s=Stat(mean=toks, stdev=1.0, n=20)))
    monkeypatch.setattr(train, "launch_one", lambda ctx: launched)
    results = {"steps": {"one_node": _baseline(base_world, base_toks)}}
    if compare is not None:
        results["runbook"] = {"compare": compare}
    ctx = SimpleNamespace(results=results, run_dir=tmp_path / "run")
    return kind.run(train.Options(scaling_baseline="one_node"), ctx)


def _steps(result) -> list:
    step = {**encode(result), "name": "two_nodes", "kind": "train"}
    return kinds.read_steps([_baseline(8, 100_000.0), step])


def test_the_declared_launch_noise_gives_the_hand_computed_interval(monkeypatch, tmp_path):
    """16 GPUs at 170,000 tokens/s against 8 at 100,000: E = 170,000 / (2 x 100,000) = 0.85; launch_sd 0.12 from 70
    A/A pairs (the sd of the log-ratio of two launches): 0.85 exp(-/+ t(0.975, 69) x 0.12) = 0.669 .. 1.080."""
    res = _run(monkeypatch, tmp_path, 16, 170_000.0, 8, 100_000.0, {"run_sd": 0.073, "launch_sd": 0.12, "pairs": 70})
    m = encode(res.metrics)
    assert m["scaling_efficiency"] == pytest.approx(0.85)
    low, high = 0.85 * math.exp(-T975[69] * 0.12), 0.85 * math.exp(T975[69] * 0.12)
    assert (low, high) == (pytest.approx(0.66903, abs=5e-5), pytest.approx(1.07992, abs=5e-5))
    assert m["scaling_efficiency_low"] == pytest.approx(low, rel=1e-5)
    assert m["scaling_efficiency_high"] == pytest.approx(high, rel=1e-5)
    noise = m["scaling_noise"]
    assert (noise["source"], noise["df"]) == ("declared", 69)
    assert noise["sd"] == pytest.approx(0.12 / math.sqrt(2))
    assert "launch_sd 12.0%" in noise["detail"]


def test_without_a_declared_noise_the_noise_measured_earlier_is_used(monkeypatch, tmp_path):
    """Nothing declared; repeats earlier in the run measured sd 0.05 of one run's log tokens/s (3 df): E 0.9 has
    0.9 exp(-/+ t(0.975, 3) x 0.05 sqrt 2) = 0.7187 .. 1.1271; and a declared noise smaller than the measured one
    (launch_sd 0.02: one launch's share 0.014) gives way to it."""
    from validation.analysis.significance import RunNoise
    from validation.kinds import trainer

    noise = RunNoise(between=0.05, total=0.05, within=0.0, df=3.0, runs=6, groups=3, source="sweep (3 x 2 runs)")
    monkeypatch.setattr(trainer, "measured_run_noise", lambda results, run_dir, metric: noise)
    half = T975[3] * 0.05 * math.sqrt(2)
    for compare in (None, {"launch_sd": 0.02, "pairs": 30}):
        m = encode(_run(monkeypatch, tmp_path, 2, 1_800.0, 1, 1_000.0, compare).metrics)
        assert m["scaling_efficiency"] == pytest.approx(0.9)
        assert m["scaling_efficiency_low"] == pytest.approx(0.9 * math.exp(-half), rel=1e-5)
        assert m["scaling_efficiency_high"] == pytest.approx(0.9 * math.exp(half), rel=1e-5)
        assert m["scaling_efficiency_low"] == pytest.approx(0.71869, abs=5e-5)
        assert (m["scaling_noise"]["source"], m["scaling_noise"]["df"]) == ("measured", 3)


def test_no_noise_known_leaves_the_bounds_absent_and_a_claim_on_them_an_error(monkeypatch, tmp_path):
    from validation.runbook.expressions import compile_expression

    res = _run(monkeypatch, tmp_path, 2, 1_800.0, 1, 1_000.0)
    m = encode(res.metrics)
    assert m["scaling_efficiency"] == pytest.approx(0.9)
    assert "scaling_efficiency_low" not in m and "scaling_efficiency_high" not in m
    assert m["scaling_noise"]["source"] == "unknown" and "compare: {launch_sd, pairs}" in m["scaling_noise"]["detail"]
    claim = compile_expression("two_nodes.scaling_efficiency_low >= 0.85").evaluate({"two_nodes": m})
    assert claim.status == "error"  # never a pass
    assert compile_expression("two_nodes.scaling_efficiency >= 0.85").evaluate({"two_nodes": m}).status == "pass"
    figure = next(f for f in kinds.get("train").key_figures(_steps(res)) if f.id == "scaling_efficiency")
    assert "95% interval unknown" in figure.value and "noise (unknown)" in figure.note


def test_no_efficiency_no_interval(monkeypatch, tmp_path):
    """A baseline without a throughput: no efficiency, so no bounds and no noise are written."""
    res = _run(monkeypatch, tmp_path, 2, 1_800.0, 1, 0.0, {"launch_sd": 0.12, "pairs": 70})
    m = encode(res.metrics)
    assert m["scaling_efficiency"] is None
    assert not {"scaling_efficiency_low", "scaling_efficiency_high", "scaling_noise"} & set(m)


def test_the_bounds_are_declared_performance_figures():
    """A criterion may read them, and a launch another process disturbed decides nothing on them."""
    from validation.execution.evidence import is_performance
    from validation.kinds.base import metric_declared

    kind = kinds.get("train")
    for name in ("scaling_efficiency_low", "scaling_efficiency_high"):
        assert metric_declared((name,), kind.metrics)
        assert is_performance(kind, (name,))
    assert metric_declared(("scaling_noise", "source"), kind.metrics)


def test_the_report_shows_the_interval_where_it_shows_the_efficiency(monkeypatch, tmp_path):
    from validation.report.renderer import blocks_markdown

    res = _run(monkeypatch, tmp_path, 16, 170_000.0, 8, 100_000.0, {"launch_sd": 0.12, "pairs": 70})
    figure = next(f for f in kinds.get("train").key_figures(_steps(res)) if f.id == "scaling_efficiency")
    assert figure.value == "0.85 (85% of linear; 95% interval 0.67 .. 1.08, not resolved from 1.0)"
    assert figure.note.startswith("step `two_nodes`; noise (declared): one launch's share of the runbook's launch_sd")
    kind = kinds.get("train")
    text = blocks_markdown(kind.blocks(kind.read({**encode(res), "name": "two_nodes", "kind": "train"})))
    assert "Scaling efficiency against `one_node`: 0.85; 95% interval 0.67 .. 1.08, not resolved from 1.0" in text
    assert "Scaling efficiency: 0.85" not in text


def test_the_interval_covers_the_true_efficiency_95_percent_of_the_time():
    """Seeded simulation: true efficiency 0.8 (1,000 and 1,600 tokens/s on 1 and 2 ranks), each launch's log
    tokens/s off by N(0, 0.05); the declared launch noise matching the machine's (launch_sd 0.05 sqrt 2, 70 pairs):
    the interval covers 0.8 in about 95% of 4000 pairs of launches."""
    from validation.kinds import train

    rng = np.random.default_rng(20261201)
    noise = train.ScalingNoise(source="declared", sd=0.05, df=69.0)
    hits = 0
    for _ in range(4000):
        e = 1600.0 * math.exp(rng.normal(0.0, 0.05)) / (2 * 1000.0 * math.exp(rng.normal(0.0, 0.05)))
        low, high = train.efficiency_interval(e, noise)
        hits += low <= 0.8 <= high
    assert 0.935 <= hits / 4000 <= 0.965


def test_a_run_records_the_interval_and_a_disturbed_launch_decides_nothing_on_it(monkeypatch, tmp_path):
    """In-process runs (the runner, a fake trainer): the two_nodes step's bounds are E exp(-/+ t(0.975, 69) x 0.12)
    around its recorded efficiency, and a criterion of severity fail reading the lower bound passes; where other
    work disturbed two_nodes, that criterion is inconclusive, not passed."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from decision_support import FakeTrainer, run_runbook

    text = ("name: t\ncompare: {launch_sd: 0.12, pairs: 70}\ndefaults: {nproc_per_node: 1, window: 5}\n"
            "phases:\n  - name: p\n    steps:\n"
            "      - {name: one_node, kind: train, args: {steps: 10}}\n"
            "      - {name: two_nodes, kind: train, scaling_baseline: one_node, args: {steps: 10}}\n"
            "acceptance:\n  - {name: c, expr: \"two_nodes.scaling_efficiency_low >= 0.5\", target: x}\n")
    level = lambda spec: 1000.0 if spec.step == "one_node" else 900.0  # noqa: E731
    for busy, status in ((None, "pass"), (lambda spec: spec.step == "two_nodes", "inconclusive")):
        results = run_runbook(monkeypatch, tmp_path, text, FakeTrainer(level, busy=busy), run_name=f"run_{status}")
        m = results["steps"]["two_nodes"]["metrics"]
        e = m["toks_per_s"]["mean"] / results["steps"]["one_node"]["metrics"]["toks_per_s"]["mean"]
        assert m["scaling_efficiency"] == pytest.approx(e)
        assert m["scaling_efficiency_low"] == pytest.approx(e * math.exp(-T975[69] * 0.12), rel=1e-5)
        assert m["scaling_efficiency_high"] == pytest.approx(e * math.exp(T975[69] * 0.12), rel=1e-5)
        assert m["scaling_noise"]["source"] == "declared"
        assert results["acceptance"][0]["status"] == status


def test_no_runbook_gates_on_a_bound_no_noise_can_give():
    """A criterion of severity fail that reads a train step's scaling_efficiency_low is an error, a NO-GO, where no
    noise is known when that step runs: every runbook that has one declares its launch noise (`compare: {launch_sd,
    pairs}`) or runs repeats before the step; the Slurm runbooks' gating scaling checks read the point figure."""
    import re
    from pathlib import Path

    from validation.runbook.loader import load_runbook

    repo = Path(__file__).resolve().parents[3]
    for path in sorted((repo / "runbooks").glob("*.yaml")):
        rb = load_runbook(path, cwd=str(repo))
        order = rb.steps()
        for c in rb.acceptance:
            for name in re.findall(r"(\w+)\.scaling_efficiency_low\b", c.expr.text):
                if c.severity != "fail":
                    continue
                before = order[:[s.name for s in order].index(name)]
                declared = bool((rb.compare_noise or {}).get("launch_sd"))
                assert declared or any((getattr(s, "repeats", 1) or 1) > 1 for s in before), (path.name, c.name)
    for runbook, step in (("slurm_2x8_h100.yaml", "two_nodes"), ("slurm_cpu.yaml", "two_nodes")):
        rb = load_runbook(repo / "runbooks" / runbook, cwd=str(repo))
        reads = [c.expr.text for c in rb.acceptance if f"{step}.scaling_efficiency" in c.expr.text]
        assert reads and all(f"{step}.scaling_efficiency_low" not in t for t in reads), runbook


def test_a_lower_bound_above_the_efficiencys_range_is_implausible():
    from validation.analysis.plausibility import implausible

    flagged = {f["metric"] for f in implausible({"scaling_efficiency": 2.5, "scaling_efficiency_low": 2.0,
                                                 "scaling_efficiency_high": 3.1})}
    assert {"scaling_efficiency", "scaling_efficiency_low"} <= flagged and "scaling_efficiency_high" not in flagged
