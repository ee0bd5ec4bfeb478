"""A scaling efficiency is a ratio of two points' throughputs, each one launch or a few: its 95% interval from the
run-to-run noise (the repeats' own spread, else the runbook's declared launch noise, else the noise measured earlier
in the run, else unknown), against intervals computed here by hand from the log throughputs and against the
coverage of a seeded simulation; and the smallest world size missing leaves min and last None, as a larger one
does."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from validation import kinds
from validation.analysis.parallelism import scaling_table
from validation.results.codec import encode

REPO = Path(__file__).resolve().parents[3]
# Student t quantiles t(0.975, df) from a printed table
T975 = {2: 4.302653, 3: 3.182446, 4: 2.776445, 69: 1.994945}


def _runbook(tmp_path, world_sizes=(1, 2), modes=("weak",), repeats=1, compare=""):
    text = (f"name: t\n{compare}requirements: {{gpus: 0, backend: gloo}}\n"
            "defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5, batch_size: 4}, nproc_per_node: 1}\n"
            "phases:\n  - name: p\n    steps:\n"
            f"      - {{name: sc, kind: scaling, world_sizes: {list(world_sizes)}, modes: [{', '.join(modes)}], "
            f"repeats: {repeats}}}\n")
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    from validation.runbook.loader import load_runbook
    return load_runbook(path, cwd=str(REPO)).step("sc")


def _run(tmp_path, monkeypatch, step, toks, results=None):
    """The step's result from runs whose tokens/s are toks[(label, repeat)] (all passed, on a GPU)."""
    from validation.kinds import scaling
    from validation.kinds.trainer import Runs
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun, RunContext, Stat

    kind = kinds.get("scaling")
    specs = kind.launches(step, {}, tmp_path / "run")
    runs = [LaunchRun(label=s.label, params=dict(s.params), status="passed", reason=None, dir=s.dir,
                      command=["torchrun"], repeat=s.repeat,
                      metrics=LaunchMetrics(toks_per_s=Stat(mean=toks[(s.label, s.repeat)]),
                                            context=RunContext(device="NVIDIA H200")))
            for s in specs]
    monkeypatch.setattr(scaling, "run_all", lambda ctx: Runs(runs))
    ctx = SimpleNamespace(step=step, launches=specs, run_dir=tmp_path / "run", save=lambda partial=None: None,
                          results=results)
    return kind.run(step.options, ctx)


def _md(result) -> str:
    from validation.report.renderer import blocks_markdown

    kind = kinds.get("scaling")
    return blocks_markdown(kind.blocks(kind.read(encode(result))))


def test_repeats_give_a_t_interval_from_their_own_spread(tmp_path, monkeypatch):
    """Weak scaling, 1 and 2 ranks, 3 repeats each: the pooled sd of log tokens/s over the two points (4 df), and
    log E(2) +- t(0.975, 4) s sqrt(1/3 + 1/3) around the efficiency of the repeats' work over their time."""
    one, two = [1000.0, 1060.0, 980.0], [1500.0, 1700.0, 1610.0]
    toks = {**{("weak_n1", r): v for r, v in enumerate(one)}, **{("weak_n2", r): v for r, v in enumerate(two)}}
    m = _run(tmp_path, monkeypatch, _runbook(tmp_path, repeats=3), toks).metrics
    logs = [np.log(one), np.log(two)]
    s = math.sqrt(sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / 4)
    e = (3 / sum(1 / v for v in two)) / (3 / sum(1 / v for v in one)) / 2
    half = T975[4] * s * math.sqrt(2 / 3)
    assert (m.noise.source, m.noise.df) == ("repeats", 4) and m.noise.sd == pytest.approx(s)
    row = m.weak.rows[1]
    assert row.efficiency == pytest.approx(e)
    assert (row.efficiency_low, row.efficiency_high) == (pytest.approx(e * math.exp(-half), rel=1e-5),
                                                         pytest.approx(e * math.exp(half), rel=1e-5))
    eff = m.weak.efficiency
    assert (eff.min_low, eff.min_high, eff.last_low, eff.last_high) == (row.efficiency_low, row.efficiency_high,
                                                                       row.efficiency_low, row.efficiency_high)
    text = _md(_run(tmp_path, monkeypatch, _runbook(tmp_path, repeats=3), toks))
    # X(2) = 3 / (1/1500 + 1/1700 + 1/1610) = 1,599.1; e = 0.7899, s = 0.05291, interval 0.7006 .. 0.8906
    assert "| 2 | 4 | 1,599.1 | 1.58x | 79% | 70% .. 89%: below 1.0 |" in text
    assert "the repeats' own spread" in text and "4 df" in text


def test_one_launch_a_point_reads_the_declared_launch_noise(tmp_path, monkeypatch):
    """cpu_smoke's declared launch_sd 0.12 (the sd of the log-ratio of two launches, from 70 A/A pairs): one launch a
    world size, E 0.85 has the interval 0.85 exp(-/+ t(0.975, 69) x 0.12) = 0.669 .. 1.080, not resolved from 1.0;
    `efficiency.min >= 0.8` passes on the point figure while the lower bound is 0.67."""
    step = _runbook(tmp_path)
    results = {"runbook": {"compare": {"run_sd": 0.073, "launch_sd": 0.12, "pairs": 70.0}}, "steps": {}}
    res = _run(tmp_path, monkeypatch, step, {("weak_n1", 0): 1000.0, ("weak_n2", 0): 1700.0}, results)
    m = res.metrics
    assert (m.noise.source, m.noise.df) == ("declared", 69) and m.noise.sd == pytest.approx(0.12 / math.sqrt(2))
    low, high = 0.85 * math.exp(-T975[69] * 0.12), 0.85 * math.exp(T975[69] * 0.12)
    assert m.weak.efficiency.min == pytest.approx(0.85)
    assert m.weak.efficiency.min_low == pytest.approx(low, rel=1e-5) and low == pytest.approx(0.669, abs=5e-4)
    assert m.weak.efficiency.min_high == pytest.approx(high, rel=1e-5) and high == pytest.approx(1.080, abs=5e-4)
    assert "| 2 | 4 | 1,700.0 | 1.70x | 85% | 67% .. 108%: not resolved from 1.0 |" in _md(res)


def test_one_launch_a_point_falls_back_to_the_noise_measured_earlier(tmp_path, monkeypatch):
    """No declared noise, one run a point: the run-to-run noise of repeats measured earlier in the run (sd 0.05 of a
    run, 3 df): E 0.9 exp(-/+ t(0.975, 3) x 0.05 sqrt 2)."""
    from validation.analysis.significance import RunNoise
    from validation.kinds import trainer

    noise = RunNoise(between=0.05, total=0.05, within=0.0, df=3.0, runs=6, groups=3, source="parallelism")
    monkeypatch.setattr(trainer, "measured_run_noise", lambda results, run_dir, metric: noise)
    res = _run(tmp_path, monkeypatch, _runbook(tmp_path), {("weak_n1", 0): 1000.0, ("weak_n2", 0): 1800.0},
               {"steps": {}})
    half = T975[3] * 0.05 * math.sqrt(2)
    assert res.metrics.noise.source == "measured"
    assert res.metrics.weak.rows[1].efficiency_low == pytest.approx(0.9 * math.exp(-half), rel=1e-5)
    assert res.metrics.weak.rows[1].efficiency_high == pytest.approx(0.9 * math.exp(half), rel=1e-5)


def test_no_noise_known_gives_no_interval_and_says_the_fix(tmp_path, monkeypatch):
    res = _run(tmp_path, monkeypatch, _runbook(tmp_path), {("weak_n1", 0): 1000.0, ("weak_n2", 0): 1800.0},
               {"steps": {}})
    m = res.metrics
    assert m.noise.source == "unknown" and m.weak.rows[1].efficiency_low is None
    assert m.weak.efficiency.min == pytest.approx(0.9) and m.weak.efficiency.min_low is None
    text = _md(res)
    assert "interval unknown" in text and "`repeats: 2`" in text and "compare: {launch_sd, pairs}" in text


def test_a_claim_on_the_lower_bound_is_a_criterion(tmp_path):
    """`efficiency.min_low` is a metric the kind declares (a runbook criterion may read it), and the GPU runbook's
    claim of 85% weak scaling reads it."""
    from validation.runbook.loader import load_runbook

    step = _runbook(tmp_path)
    text = (tmp_path / "rb.yaml").read_text() + (
        "acceptance:\n  - {name: w, expr: \"sc.weak.efficiency.min_low >= 0.85 and sc.noise.source != 'unknown'\", "
        "target: x, severity: warn}\n")
    (tmp_path / "rb.yaml").write_text(text)
    assert step is not None and load_runbook(tmp_path / "rb.yaml", cwd=str(REPO)).acceptance
    rb = load_runbook(REPO / "runbooks" / "slurm_2x8_h100.yaml", cwd=str(REPO))
    assert any("scaling_curve.weak.efficiency.min_low >= 0.85" in c.expr.text for c in rb.acceptance)


def test_a_missing_smallest_world_size_leaves_min_and_last_none():
    """{1: None, 2: 1800, 4: 3420}: 4 ranks against 2 is 0.95, but that is not the step's efficiency (against 1
    rank), as a missing larger world size leaves min and last None; the reason says so."""
    t = scaling_table({1: None, 2: 1800.0, 4: 3420.0}, "weak")
    assert t["base"] == 2 and t["rows"][2]["efficiency"] == pytest.approx(0.95)
    assert t["efficiency"]["min"] is None and t["efficiency"]["last"] is None
    assert "world size(s) 1 not measured" in t["efficiency"]["reason"]
    t = scaling_table({1: 1000.0, 2: 1800.0, 4: None}, "weak")
    assert t["efficiency"]["min"] is None and "fewer points" in t["efficiency"]["reason"]


def test_the_interval_covers_the_true_efficiency_95_percent_of_the_time(tmp_path, monkeypatch):
    """Seeded simulation: true weak efficiency 0.8 (1 rank 1000 tok/s, 2 ranks 1600), each run's log tokens/s off
    by N(0, 0.05); 2 repeats a point: the step's interval (2 df) covers 0.8 in about 95% of 1500 steps. And one run a
    point with the declared launch noise matching the machine's (launch_sd 0.05 sqrt 2): about 95% too."""
    from validation.kinds import scaling
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun, Stat

    rng = np.random.default_rng(20261201)
    kind = kinds.get("scaling")

    def coverage(step, trials, results):
        specs = kind.launches(step, {}, tmp_path / "run")
        ctx = SimpleNamespace(step=step, launches=specs, run_dir=tmp_path / "run", results=results)
        hits = 0
        for _ in range(trials):
            runs = [LaunchRun(label=s.label, params={}, status="passed", repeat=s.repeat,
                              metrics=LaunchMetrics(toks_per_s=Stat(mean=(1000.0 if s.label == "weak_n1" else 1600.0)
                                                                      * math.exp(rng.normal(0.0, 0.05)))))
                    for s in specs]
            noise = scaling.efficiency_noise(step, runs, ctx)
            t = scaling.scaling_mode(step, "weak", runs, (noise.sd, noise.df))
            hits += t.efficiency.min_low <= 0.8 <= t.efficiency.min_high
        return hits / trials

    assert 0.93 <= coverage(_runbook(tmp_path, repeats=2), 1500, None) <= 0.97  # 0.951 with this seed
    declared = {"runbook": {"compare": {"launch_sd": 0.05 * math.sqrt(2), "pairs": 70.0}}, "steps": {}}
    assert 0.93 <= coverage(_runbook(tmp_path), 1500, declared) <= 0.97  # 0.957 with this seed


def test_a_lower_bound_of_an_impossible_efficiency_is_outside_its_range():
    # E 2.5 (impossible: above 1.1) with a lower bound 2.0: a criterion reading the bound meets an implausible
    # figure (an error, never a pass); an upper bound may pass 1.1 by noise alone (E 1.0, 0.85 .. 1.18)
    from validation.analysis.plausibility import implausible

    metrics = {"weak": {"efficiency": {"min": 2.5, "min_low": 2.0, "min_high": 3.1, "last_low": 2.0},
                        "rows": [{"efficiency": 1.0}, {"efficiency": 2.5, "efficiency_low": 2.0}]},
               "strong": {"efficiency": {"min": 1.0, "min_low": 0.85, "min_high": 1.18}}}
    flagged = {f["metric"] for f in implausible(metrics)}
    assert {"weak.efficiency.min_low", "weak.efficiency.last_low", "weak.rows.1.efficiency_low"} <= flagged
    assert not {"strong.efficiency.min_low", "strong.efficiency.min_high", "weak.efficiency.min_high"} & flagged
