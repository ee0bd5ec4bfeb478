"""The long run's throughput drift with its 95% interval (validation.analysis.significance.drift.throughput_drift_interval) and
the runbooks' "Long run throughput holds" criterion that reads both.

The drift alone, median(last third) / median(first third) - 1, judges no noise: autocorrelated steps (AR(1), phi
0.9, 10% CV, no true drift) give a drift below -10% in about one run of eight at cpu_smoke's size (115 rows after the
warmup), and "drift >= -0.1" warned on each of them. The criterion now warns where the drift is below -10% and its
interval shows a decline (its upper bound below 0). References: hand-computed figures, Python's statistics.median,
the large-sample variance of a median (pi/2 sigma^2 / n for independent steps) and a Monte Carlo of the variance
ratio, seeded simulations with a known truth."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # decision_support: the fake launcher

from decision_support import run_runbook, write_csv  # noqa: E402
from validation import kinds as step_kinds  # noqa: E402
from validation.analysis.interference import step_interference  # noqa: E402
from validation.analysis.metrics import Window, read_training_csv, summarize  # noqa: E402
from validation.analysis.significance.drift import (DRIFT_CI_MIN_ROWS, median_variance_ratio,  # noqa: E402
                                                    throughput_drift_interval)
from validation.execution.acceptance import evaluate  # noqa: E402
from validation.execution.evidence import assess, is_performance  # noqa: E402
from validation.launch.spec import LaunchResult  # noqa: E402
from validation.runbook.loader import load_runbook  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
LONG_RUNBOOKS = ("cpu_smoke", "ddp_2xa100", "h100_single", "load_cpu", "slurm_2x8_h100")
HOLDS = "Long run throughput holds"


def _holds(name: str = "cpu_smoke"):
    """The runbook's "Long run throughput holds" criterion."""
    rb = load_runbook(REPO / "runbooks" / f"{name}.yaml")
    return next(c for c in rb.acceptance if c.name == HOLDS)


def _ar1(rng: np.random.Generator, runs: int, n: int, phi: float) -> np.ndarray:
    """`runs` AR(1) series of n steps with unit marginal variance (one per row)."""
    z = np.empty((runs, n))
    z[:, 0] = rng.standard_normal(runs)
    e = rng.standard_normal((runs, n)) * math.sqrt(1.0 - phi * phi)
    for t in range(1, n):
        z[:, t] = phi * z[:, t - 1] + e[:, t]
    return z


def _frame(values) -> pd.DataFrame:
    return pd.DataFrame({"toks_per_s": np.asarray(values, dtype="float64")})


def _median_drift(values, warmup: int) -> float:
    """The drift by hand: Python's medians of the first and last third of the rows after the warmup."""
    rest = list(values)[warmup:]
    third = len(rest) // 3
    return statistics.median(rest[-third:]) / statistics.median(rest[:third]) - 1.0


# ------------------------------------------------------------------------------------------- the interval itself
def test_thirds_without_noise_give_the_hand_computed_drift_as_their_whole_interval(tmp_path):
    # 6 warmup rows, then thirds of 8 at 1,000, 950 and 880 tokens/s: drift 880 / 1,000 - 1 = -12%, no noise at all
    values = [1200.0] * 6 + [1000.0] * 8 + [950.0] * 8 + [880.0] * 8
    low, high = throughput_drift_interval(_frame(values), 6)
    assert low == pytest.approx(-0.12) and high == pytest.approx(-0.12)
    # 23 rows after the warmup (thirds of 7): a drift, but too few rows for block means of each third
    assert DRIFT_CI_MIN_ROWS == 24
    assert throughput_drift_interval(_frame(values[:-1]), 6) is None
    write_csv(tmp_path / "training.csv", values[:-1])
    read = read_training_csv(tmp_path / "training.csv")
    assert summarize(read, Window(last=20, warmup=6))["throughput_drift"] == pytest.approx(-0.12)


def test_independent_steps_give_the_large_sample_interval_of_a_difference_of_medians():
    # 3,000 independent steps, log-normal with sd 5%, no drift: each third's median has variance (pi/2) 0.05^2 / 1000
    # (the median of n normal values), the log-ratio twice that, so the 95% interval's half-width on the log scale is
    # 1.96 sqrt(2 (pi/2) 0.0025 / 1000) = 0.00549, centred on the log of the ratio of medians
    rng = np.random.default_rng(11)
    values = 1000.0 * np.exp(0.05 * rng.standard_normal(3000))
    low, high = throughput_drift_interval(_frame(values), 0)
    centre = math.log(1.0 + _median_drift(values, 0))
    half = 1.959964 * math.sqrt(2.0 * (math.pi / 2.0) * 0.05 ** 2 / 1000)
    assert (math.log1p(low) + math.log1p(high)) / 2.0 == pytest.approx(centre, abs=1e-9)
    assert (math.log1p(high) - math.log1p(low)) / 2.0 == pytest.approx(half, rel=0.1)


def test_the_variance_of_a_median_over_that_of_a_mean_matches_a_monte_carlo():
    assert median_variance_ratio(1.0) == pytest.approx(math.pi / 2.0)  # independent steps
    assert median_variance_ratio(1e12) == pytest.approx(math.pi / 2.0 * math.log(2.0), rel=1e-3)  # phi -> 1
    # AR(1) phi 0.5 (g = 3): 8,000 series of 401 steps, their medians' variance over their means'
    z = _ar1(np.random.default_rng(5), 8000, 401, 0.5)
    ratio = float(np.median(z, axis=1).var() / z.mean(axis=1).var())
    assert median_variance_ratio(3.0) == pytest.approx(ratio, rel=0.06)
    assert median_variance_ratio(3.0) < math.pi / 2.0 - 0.3  # far from the independent steps' figure


def test_a_run_with_no_drift_rarely_warns_and_one_that_declines_20_percent_does():
    """cpu_smoke's size: 120 steps, 5 of warmup. 200 seeded runs with no drift (AR(1) phi 0.9, 10% CV: the drift's
    sd is about 9%) and 200 that lose 20% half way (phi 0.5, 5% CV), judged by cpu_smoke's criterion."""
    holds = _holds().expr
    rng = np.random.default_rng(2026)
    quiet = 1000.0 * np.exp(0.10 * _ar1(rng, 200, 120, 0.9))
    level = np.where(np.arange(120) >= 60, 0.8, 1.0)
    slowing = 1000.0 * level * np.exp(0.05 * _ar1(rng, 200, 120, 0.5))
    outcome = {}
    for name, runs in (("quiet", quiet), ("slowing", slowing)):
        warned = old = covered = 0
        for values in runs:
            drift = _median_drift(values, 5)
            low, high = throughput_drift_interval(_frame(values), 5)
            assert low <= drift <= high
            status = holds.evaluate({"longrun": {"throughput_drift": drift, "throughput_drift_ci_low": low,
                                                 "throughput_drift_ci_high": high}}).status
            warned += status == "fail"
            old += drift < -0.1  # the drift alone
            covered += low <= (-0.2 if name == "slowing" else 0.0) <= high
        outcome[name] = (warned / len(runs), old / len(runs), covered / len(runs))
    # no drift: the drift alone warned in about one run of eight; with its interval at most ~5% do
    assert outcome["quiet"][1] >= 0.08 and outcome["quiet"][0] <= 0.05
    # a true 20% decline: warned nearly always, then and now
    assert outcome["slowing"][1] >= 0.95 and outcome["slowing"][0] >= 0.9
    # the interval covers the true drift (0 and -20%) at about its 95%
    assert outcome["quiet"][2] >= 0.9 and outcome["slowing"][2] >= 0.9


# ------------------------------------------------------------------------------------- the runbooks' criterion
@pytest.mark.parametrize("name", LONG_RUNBOOKS)
def test_each_long_run_criterion_reads_the_drift_and_its_interval(name):
    holds = _holds(name)
    assert holds.severity == "warn"
    reads = {path for _, path in holds.expr.paths}
    assert reads == {("throughput_drift",), ("throughput_drift_ci_high",)}
    judge = holds.expr.evaluate
    # a decline beyond 10% that the interval shows: warns; one the interval does not show, or a drift within 10%:
    # holds; a drift that could not be computed (too few rows): never holds
    assert judge({"longrun": {"throughput_drift": -0.15, "throughput_drift_ci_high": -0.02}}).status == "fail"
    assert judge({"longrun": {"throughput_drift": -0.15, "throughput_drift_ci_high": 0.04}}).status == "pass"
    assert judge({"longrun": {"throughput_drift": -0.05, "throughput_drift_ci_high": None}}).status == "pass"
    assert judge({"longrun": {"throughput_drift": None, "throughput_drift_ci_high": None}}).status == "error"
    assert judge({"longrun": {"throughput_drift": -0.15, "throughput_drift_ci_high": None}}).status == "error"


# ------------------------------------------------------------------------------------ the longrun kind records it
RUNBOOK = """\
name: long
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 120}
  window: 50
  warmup_steps: 5
phases:
  - name: stability
    steps:
      - {name: longrun, kind: longrun}
acceptance:
  - {name: holds, expr: "EXPR", target: "-", severity: warn}
"""


class Trainer:
    """A launcher that writes a completed run's training.csv of `toks`, status.json and env.json."""

    def __init__(self, toks):
        self.toks = [float(v) for v in toks]

    def __call__(self, spec) -> LaunchResult:
        out = Path(spec.trainer_out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(out / "training.csv", self.toks)
        (out / "status.json").write_text(json.dumps({"status": "completed", "step": len(self.toks), "reason": None}))
        (out / "env.json").write_text(json.dumps({"world_size": 1}))
        log = Path(spec.step_dir) / "stdout.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("trainer\n")
        return LaunchResult(status="ok", returncode=0, duration_s=1.0, argv=list(spec.argv), log_path=log,
                            rank_logs={}, reason="exited 0", excerpt=None, stack_dumps=[], attempts=1)


def _seeded(seed: int, phi: float, cv: float, decline: float = 0.0) -> list[float]:
    z = _ar1(np.random.default_rng(seed), 1, 120, phi)[0]
    level = np.where(np.arange(120) >= 60, 1.0 - decline, 1.0)
    return [round(float(v), 3) for v in 1000.0 * level * np.exp(cv * z)]


def _longrun(monkeypatch, tmp_path, toks) -> tuple[dict, str]:
    text = RUNBOOK.replace("EXPR", _holds().expr.text)
    results = run_runbook(monkeypatch, tmp_path, text, Trainer(toks))
    return results["steps"]["longrun"]["metrics"], results["acceptance"][0]["status"]


def test_a_long_run_whose_drift_below_10_percent_is_noise_holds(monkeypatch, tmp_path):
    toks = _seeded(6, phi=0.9, cv=0.10)  # no true drift: its thirds' medians differ by noise alone
    drift = _median_drift(toks, 5)
    assert drift < -0.1  # the drift alone warned
    m, status = _longrun(monkeypatch, tmp_path, toks)
    assert m["throughput_drift"] == pytest.approx(drift)
    assert m["throughput_drift_ci_low"] <= drift <= m["throughput_drift_ci_high"]
    assert m["throughput_drift_ci_high"] >= 0  # no decline shown
    assert status == "pass"


def test_a_long_run_that_lost_20_percent_warns(monkeypatch, tmp_path):
    toks = _seeded(2, phi=0.5, cv=0.05, decline=0.2)
    drift = _median_drift(toks, 5)
    m, status = _longrun(monkeypatch, tmp_path, toks)
    assert m["throughput_drift"] == pytest.approx(drift) and drift < -0.1
    assert m["throughput_drift_ci_low"] <= drift <= m["throughput_drift_ci_high"] < 0
    assert status == "warn"


def test_a_short_long_run_records_its_drift_without_an_interval_and_one_too_short_never_holds(monkeypatch, tmp_path):
    # 5 warmup rows then thirds of 5 at 1,000, 950 and 850: a drift of -15%, 15 rows (under 24: no interval)
    toks = [1200.0] * 5 + [1000.0] * 5 + [950.0] * 5 + [850.0] * 5
    (tmp_path / "short").mkdir()
    m, status = _longrun(monkeypatch, tmp_path / "short", toks)
    assert m["throughput_drift"] == pytest.approx(-0.15)
    assert "throughput_drift_ci_low" not in m and "throughput_drift_ci_high" not in m
    assert status == "error"  # a decline beyond 10% whose interval is unknown neither holds nor warns as shown
    # 8 rows after the warmup: no drift, and so no interval keys; the criterion cannot hold
    (tmp_path / "shorter").mkdir()
    m, status = _longrun(monkeypatch, tmp_path / "shorter", toks[:13])
    assert m.get("throughput_drift") is None and "throughput_drift_ci_high" not in m
    assert status == "error"


def test_the_report_shows_the_drift_with_its_interval():
    longrun = step_kinds.get("longrun")
    result = longrun.read({"status": "passed", "metrics": {"throughput_drift": -0.12, "throughput_drift_ci_low": -0.2,
                                                           "throughput_drift_ci_high": -0.05}})
    cells = [cell for block in longrun.blocks(result) if hasattr(block, "rows") for row in block.rows for cell in row]
    assert "-12.0% (95% CI -20.0% .. -5.0%)" in cells
    older = longrun.read({"status": "passed", "metrics": {"throughput_drift": -0.12}})  # recorded before the interval
    cells = [cell for block in longrun.blocks(older) if hasattr(block, "rows") for row in block.rows for cell in row]
    assert "-12.0%" in cells


def test_the_interval_is_performance_evidence_a_disturbed_run_decides_nothing_on(tmp_path):
    longrun = step_kinds.get("longrun")
    assert is_performance(longrun, ("throughput_drift_ci_high",))
    assert is_performance(longrun, ("throughput_drift_ci_low",))
    path = tmp_path / "long.yaml"
    path.write_text(RUNBOOK.replace("EXPR", _holds().expr.text))
    rb = load_runbook(path)
    busy = {"disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 30 of 40 samples (75%)",
            "share": 0.75}
    metrics = {"toks_per_s": {"mean": 1000.0, "cv": 0.05, "n": 50}, "throughput_drift": -0.25,
               "throughput_drift_ci_low": -0.3, "throughput_drift_ci_high": -0.2, "halted": False, "stalls": 0,
               "stack_dumps": [], "world_size": 1, "interference": busy, "context": {"device": "cpu"}}
    step = {"name": "longrun", "kind": "longrun", "status": "passed", "metrics": metrics, "runs": []}
    step["interference"] = step_interference(step)
    results = {"runbook": {"name": "long", "path": "runbooks/long.yaml"}, "run_dir": "artifacts/validate/long-1",
               "steps": {"longrun": step}, "acceptance": []}
    results["evidence"] = assess(rb, results, results["run_dir"])
    assert evaluate(rb, results, results["run_dir"])[0]["status"] == "inconclusive"
