"""The parallelism step's comparisons of strategies held to the noise the ab kind holds a variant to, and a run
measured under interference left out of them; checked against hand-computed figures (the t of a 12% difference held
to a declared launch noise of 12%, the log-ratios of two repeats)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from validation.kinds.parallelism import analysis
from validation.kinds.parallelism.records import Compared, NotCompared
from validation.results.codec import decode
from validation.results.trainer_launch import LaunchRun

DECLARED = {"runbook": {"compare": {"launch_sd": 0.12, "pairs": 70}}}  # cpu_smoke's declared launch noise


def _steady(level: float, n: int = 40) -> list[float]:
    """A steady window: level +-0.5% alternating (its block means agree to well under 1%)."""
    return [level * (1.005 if i % 2 else 0.995) for i in range(n)]


def _compare(monkeypatch, tmp_path, values: dict, results: dict, disturbed: set = frozenset()):
    """compare_strategies over ddp and fsdp, each run's tokens/s `values[(label, repeat)]` (a window or a run mean),
    the runs in `disturbed` measured under interference."""
    repeats = 1 + max(r for _, r in values)
    runs = [decode(LaunchRun, {"label": label, "status": "passed", "repeat": r, "dir": f"par/{label}_{r}",
                               "metrics": {"interference": {"disturbed": (label, r) in disturbed, "share": 0.5,
                                                            "text": "other work"}}}, "run", lenient=True)
            for (label, r) in values]
    monkeypatch.setattr(analysis, "run_values", lambda run_dir, step, raw, metric: values[(raw["label"],
                                                                                          raw["repeat"])])
    step = SimpleNamespace(strategies={"ddp": None, "fsdp": None}, repeats=repeats)
    ctx = SimpleNamespace(run_dir=tmp_path, results=results)
    return analysis.compare_strategies(step, runs, ctx)


def test_one_run_a_side_without_any_run_to_run_noise_is_not_established(monkeypatch, tmp_path):
    """Two single launches 12% apart, each steady within itself: their block means alone make it p < 1e-20, yet
    nothing measured how far two launches of one strategy differ (no declared launch noise, no repeats anywhere).
    The figures are shown, never as significant: inconclusive, and the text says why and what would measure it."""
    out = _compare(monkeypatch, tmp_path, {("ddp", 0): _steady(100.0), ("fsdp", 0): _steady(112.0)}, {})
    c = out["fsdp:ddp"]
    assert isinstance(c, Compared) and c.method == "blocks"
    assert c.rel == pytest.approx(0.12, rel=1e-6) and c.p_value < 1e-6  # the within-run test alone
    assert c.significant is False and c.verdict == "inconclusive"
    assert c.text.startswith("inconclusive: one run a side") and "launch_sd" in c.text and "repeats >= 2" in c.text


def test_one_run_a_side_is_held_to_the_declared_launch_noise(monkeypatch, tmp_path):
    """The runbook declares a launch noise of 12% (70 A/A pairs): each run's noise is one launch's share of it,
    12% / sqrt 2 = 8.49% with 69 df, the difference's standard error 12%: t = log(1.12) / 0.12 = 0.944, p = 0.35,
    not significant (as the ab kind's table of one run each)."""
    out = _compare(monkeypatch, tmp_path, {("ddp", 0): _steady(100.0), ("fsdp", 0): _steady(112.0)}, DECLARED)
    c = out["fsdp:ddp"]
    assert c.method == "blocks" and c.run_to_run == pytest.approx(0.12 / math.sqrt(2)) and c.df == 69
    assert c.t == pytest.approx(math.log(1.12) / 0.12, rel=1e-6)
    assert 0.3 < c.p_value < 0.4 and c.significant is False


def test_two_repeats_are_held_to_the_declared_launch_noise(monkeypatch, tmp_path):
    """Run means ddp [100, 101], fsdp [108, 110]: log-ratios 0.07696 and 0.08536 (sd 0.00594), alone t = 19.3 with
    1 df, p = 0.033: significant. Held to the declared 12% a repeat: t = 0.0812 / (0.12 / sqrt 2) = 0.956, p = 0.51."""
    values = {("ddp", 0): 100.0, ("fsdp", 0): 108.0, ("ddp", 1): 101.0, ("fsdp", 1): 110.0}
    d = [math.log(108 / 100), math.log(110 / 101)]
    alone = _compare(monkeypatch, tmp_path, values, {})["fsdp:ddp"]
    assert alone.method == "paired" and alone.significant is True  # no declared noise: the repeats alone
    held = _compare(monkeypatch, tmp_path, values, DECLARED)["fsdp:ddp"]
    assert held.method == "paired" and held.df == 1
    assert held.t == pytest.approx((d[0] + d[1]) / 2 / (0.12 / math.sqrt(2)), rel=1e-6)
    assert held.significant is False and 0.45 < held.p_value < 0.55


def test_a_run_measured_under_interference_is_left_out(monkeypatch, tmp_path):
    """ddp's first repeat ran while other work used the machine (80 tokens/s against its 100): with it the two
    repeats agree exactly (fsdp 10% ahead in both, a zero spread: p = 0, "better"); left out, one repeat remains and
    nothing is compared, and the note says why."""
    values = {("ddp", 0): 80.0, ("fsdp", 0): 88.0, ("ddp", 1): 100.0, ("fsdp", 1): 110.0}
    quiet = _compare(monkeypatch, tmp_path, values, {})["fsdp:ddp"]
    assert quiet.significant is True  # every run taken as measured
    out = _compare(monkeypatch, tmp_path, values, {}, disturbed={("ddp", 0)})["fsdp:ddp"]
    assert isinstance(out, NotCompared) and out.significant is False
    assert "disturbed runs were left out" in out.text
