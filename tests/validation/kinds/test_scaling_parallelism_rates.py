"""Tokens/s over repeats in the scaling and parallelism steps: each run's figure is its window's work over its time,
every run of a point the same work, so the repeats' figure is their work over their time (the harmonic mean of the
runs' figures, as a window's own figure is of its steps), never the plain mean of the rates. Hand-computed figures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from validation import kinds
from validation.results.codec import encode

REPO = Path(__file__).resolve().parents[3]
RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5, batch_size: 4}, nproc_per_node: 1}
phases:
  - name: p
    steps:
      - {name: sc, kind: scaling, world_sizes: [1, 2], modes: [weak], repeats: 2}
"""


def _weak(tmp_path, monkeypatch, toks: dict, mfu: dict) -> dict:
    """The weak-scaling table of runs whose tokens/s and MFU are toks[(label, repeat)], mfu[(label, repeat)]."""
    from validation.kinds import scaling
    from validation.kinds.trainer import Runs
    from validation.runbook.loader import load_runbook
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun, RunContext, Stat

    path = tmp_path / "rb.yaml"
    path.write_text(RB)
    step = load_runbook(path, cwd=str(REPO)).step("sc")
    kind = kinds.get("scaling")
    specs = kind.launches(step, {}, tmp_path / "run")
    runs = [LaunchRun(label=s.label, params=dict(s.params), status="passed", reason=None, dir=s.dir,
                      command=["torchrun"], repeat=s.repeat,
                      metrics=LaunchMetrics(toks_per_s=Stat(mean=toks[(s.label, s.repeat)]),
                                            mfu=Stat(mean=mfu[(s.label, s.repeat)]),
                                            context=RunContext(device="NVIDIA H200")))
            for s in specs]
    monkeypatch.setattr(scaling, "run_all", lambda ctx: Runs(runs))
    ctx = SimpleNamespace(step=step, launches=specs, run_dir=tmp_path / "run", save=lambda partial=None: None)
    return encode(kind.run(step.options, ctx))["metrics"]["weak"]


def test_weak_scaling_over_repeats_is_work_over_time(tmp_path, monkeypatch):
    """1 rank at [100, 100] tok/s, 2 ranks at [190, 90] over equal windows: 2 windows of W tokens take W/190 + W/90
    seconds, 2 / (1/190 + 1/90) = 122.142857 tok/s, efficiency 122.142857 / 100 / 2 = 0.610714 (the plain mean,
    140 tok/s, said 0.70). The MFU, proportional to the tokens/s, averages the same way: 0.122142857."""
    toks = {("weak_n1", 0): 100.0, ("weak_n1", 1): 100.0, ("weak_n2", 0): 190.0, ("weak_n2", 1): 90.0}
    mfu = {k: v / 1000.0 for k, v in toks.items()}
    t = _weak(tmp_path, monkeypatch, toks, mfu)
    rows = {r["world_size"]: r for r in t["rows"]}
    assert rows[1]["toks_per_s"] == pytest.approx(100.0)
    assert rows[2]["toks_per_s"] == pytest.approx(34200.0 / 280.0)
    assert rows[2]["efficiency"] == pytest.approx(34200.0 / 280.0 / 200.0)
    assert t["efficiency"]["min"] == pytest.approx(0.6107142857)
    assert rows[2]["mfu"] == pytest.approx(0.1221428571)


def test_parallelism_tokens_per_s_agrees_with_its_step_time():
    """Two runs of 20 tokens a step at 0.1 s and 0.2 s a step (200 and 100 tok/s): the mean step time 0.15 s is
    20 / 0.15 = 133.33 tok/s, and so is their work over their time, 2 / (1/200 + 1/100); the plain mean said 150."""
    from validation.kinds.parallelism import Strategy
    from validation.kinds.parallelism.analysis import strategy_figures

    runs = [{"label": "ddp", "status": "passed",
             "metrics": {"toks_per_s": {"mean": 20.0 / t}, "step_time_s": {"mean": t}}} for t in (0.1, 0.2)]
    infos = [{"summary": {"schema": 1, "world_size": 2, "steps": 10}, "trace": None}] * 2
    s = strategy_figures("ddp", Strategy(strategy="ddp"), runs, infos, None, "n/a")
    assert s["step_time_s"] == pytest.approx(0.15)
    assert s["toks_per_s"] == pytest.approx(20.0 / 0.15)
    assert s["toks_per_s_runs"] == [pytest.approx(200.0), pytest.approx(100.0)]
