"""A scan with one run a point: block means of its window see only the noise within that run, never how far the next
launch's level lies. Simulated scans (synthetic step-time series, no training) with a known truth: at a true cost
exponent equal to the expected one, with 3% run-to-run noise (each run's level times exp(N(0, 0.03))) and AR(1)
noise within each run, a declared launch noise (`compare.launch_sd` = 0.03 * sqrt 2, one launch's share 3%) keeps
false cliffs near alpha; without it a cliff on block noise alone is inconclusive, never claimed; a true cliff (a 40%
throughput drop at one point) is still found; with two runs a point their spread measures the noise as before."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from validation.analysis.significance import PairNoise, block_units
from validation.analysis.triage import find_cliffs, point_noise
from validation.kinds import scan as scan_mod
from validation.kinds.blocks import Paragraph
from validation.kinds.trainer import Runs
from validation.results.codec import decode, encode
from validation.results.trainer_launch import LaunchMetrics, LaunchRun
from validation.runbook.expressions import compile_expression
from validation.runbook.loader import load_runbook
from validation.runbook.plan import step_launches

REPO = Path(__file__).resolve().parents[2]
RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 30}, nproc_per_node: 1, window: 20, warmup_steps: 5}
phases:
  - name: p
    steps:
      - {name: sc, kind: scan, values: {args.seq_len: %s}, repeats: %d%s}
"""
RUN_SD = 0.03  # run-to-run noise of a run's level
DECLARED = {"launch_sd": RUN_SD * math.sqrt(2.0), "pairs": 30}  # one launch's share: 3%


def ar1(rng, n: int, cv: float, phi: float) -> np.ndarray:
    """Relative AR(1) noise: lag-1 correlation phi, marginal sd cv."""
    x = np.empty(n)
    x[0] = rng.standard_normal() * cv
    e = rng.standard_normal(n) * cv * math.sqrt(1.0 - phi * phi)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + e[t]
    return x


class Scanner:
    """Scan.run over fake launches: each run's window is `law(value)` times its level's run-to-run draw times AR(1)
    noise within the run (cv 1%, lag-1 0.5, 20 steps); `declared`: the runbook's compare mapping in results.json."""

    def __init__(self, monkeypatch, tmp_path, values, repeats, extra=""):
        path = tmp_path / "rb.yaml"
        path.write_text(RB % (values, repeats, extra))
        self.step = load_runbook(path, cwd=str(REPO)).steps()[0]
        self.launches = step_launches(self.step, {}, tmp_path)
        self.tmp_path, self.mod, self.seed, self.law = tmp_path, scan_mod, 0, None

        def fake_run_all(ctx, retry_disturbed=False, launches=None, on_progress=None):
            return Runs([LaunchRun(label=s.label, params=dict(s.params), status="passed", dir=s.dir,
                                   command=list(s.argv), repeat=s.repeat,
                                   metrics=decode(LaunchMetrics, {"toks_per_s": {"mean": 1000.0}}))
                         for s in (ctx.launches if launches is None else launches)])

        def fake_values(run_dir, step, run, metric):
            v = float(next(iter(run["params"].values())))
            # each run's own stream (the scan's seed, its value and repeat): whatever order the runs are read in
            rng = np.random.default_rng([self.seed, int(v), int(run.get("repeat") or 0)])
            level = self.law(v) * math.exp(rng.normal(0.0, RUN_SD))
            return list(level * (1.0 + ar1(rng, 20, 0.01, 0.5)))

        monkeypatch.setattr(scan_mod, "run_all", fake_run_all)
        monkeypatch.setattr(scan_mod, "run_values", fake_values)

    def run(self, law, seed, declared=None):
        """The scan step's Result (its typed record: metrics as validation.kinds.scan.result.Metrics)."""
        self.seed, self.law = seed, law
        results = {"runbook": {"compare": declared}} if declared is not None else {}
        ctx = SimpleNamespace(run_dir=self.tmp_path, step=self.step, launches=self.launches, winners=dict,
                              save=lambda partial=None: None, results=results)
        return self.mod.Scan().run(self.step.options, ctx)


def expected_law(v: float) -> float:
    """Step time growing as value^1.5: exactly the default expected_exponent."""
    return 1e-3 * (v / 2048.0) ** 1.5


def test_one_run_a_point_at_the_expected_exponent_calls_no_false_cliff_with_a_declared_launch_noise(
        monkeypatch, tmp_path):
    """runbooks/h100_single.yaml's seq_scan (2,048 / 8,192 / 32,768, one run a point, a 20-step window), 80 seeded
    scans held to the declared launch noise: false cliffs at most 10% (alpha 5% one-sided, Holm; on block noise
    alone, the within-run 1% a third of the run-to-run 3%, they were about half)."""
    scanner = Scanner(monkeypatch, tmp_path, "[2048, 8192, 32768]", 1)
    n = 80
    held = [scanner.run(expected_law, seed, DECLARED).metrics for seed in range(n)]
    assert sum(m.cliff is True for m in held) / n <= 0.10
    assert {m.run_to_run for m in held} == {"declared"} and {m.launch_sd for m in held} == {DECLARED["launch_sd"]}
    assert all(m.cliff is False for m in held if m.cliff is not True)  # decided either way, never inconclusive


def test_one_run_a_point_without_a_declared_launch_noise_claims_no_cliff_its_noise_cannot_support(
        monkeypatch, tmp_path):
    """The same 80 scans without a declared launch noise: block noise alone would call a cliff in a third or more
    of them; none is claimed, each such scan is inconclusive (cliff null) and says what would settle it; the report
    and the key figure say so, and a criterion on the cliff cannot pass either way."""
    scanner = Scanner(monkeypatch, tmp_path, "[2048, 8192, 32768]", 1)
    n = 80
    results = [scanner.run(expected_law, seed) for seed in range(n)]
    bare = [r.metrics for r in results]
    assert not any(m.cliff is True for m in bare)
    assert {m.run_to_run for m in bare} == {"unknown"}
    unsure = [r for r in results if r.metrics.cliff is None]
    assert len(unsure) / n >= 0.3
    for r in unsure:
        m = r.metrics
        assert m.cliff_localised is None and m.cliff_interval is None and m.bisection is None
        assert m.cliff_reason.startswith("inconclusive") and "repeats >= 2" in m.cliff_reason
        assert "launch_sd" in m.cliff_reason and any(p.inconclusive for p in m.pairs)
    kind, first = scanner.mod.Scan(), unsure[0]
    assert "cliff inconclusive" in kind.summary_line(first)
    (figure,) = kind.key_figures([first])
    assert figure.value.endswith(", cliff inconclusive")
    texts = [b.text for b in kind.blocks(first) if isinstance(b, Paragraph)]
    assert any(t.startswith("**Cliff**: inconclusive") for t in texts)
    assert any(t.startswith("Run-to-run noise: unknown") for t in texts)
    metrics = encode(first)["metrics"]
    for expr in ("sc.cliff", "not sc.cliff", "sc.cliff_localised", "not sc.cliff_localised"):
        assert compile_expression(expr).evaluate({"sc": metrics}).status != "pass", expr


def test_a_true_cliff_is_still_found_with_one_run_a_point_and_the_declared_floor(monkeypatch, tmp_path):
    """A 40% throughput drop at 256 (its step time / 0.6): the pair 128 -> 256 has a local exponent of
    1.5 + log2(1 / 0.6) = 2.24, about 12 of its standard errors (3% a point) above 1.5: found in every seeded scan;
    the bisection's midpoint 192 follows the law and is classified from the same floor, the interval then
    [192, 256]."""
    scanner = Scanner(monkeypatch, tmp_path, "[64, 128, 256, 512]", 1,
                      ", bisect: {steps: 1, resolution: 32, multiple_of: 32}")

    def law(v):
        return 1e-3 * (v / 64.0) ** 1.5 / (0.6 if v == 256 else 1.0)

    first = good = 0
    for seed in range(30):
        step = scanner.run(law, seed, DECLARED)
        m = step.metrics
        assert step.status == "passed" and m.cliff is True and m.run_to_run == "declared", seed
        drop = m.pairs[1]
        assert (drop.a, drop.b) == (128, 256) and drop.cliff is True, seed
        assert drop.exponent == pytest.approx(1.5 + math.log2(1 / 0.6), abs=0.25)  # 4 standard errors
        if (m.cliff_pair.a, m.cliff_pair.b) == (128, 256):  # else a pair below it was, by chance, called first
            first += 1
            assert [p[0] for p in m.bisection.points] == [192] and m.bisection.points[0][1] in ("good", "bad")
            good += m.cliff_interval == [192, 256]
    # tests at 5%: a pair at the expected exponent below the drop, or 192, now and then called a cliff by chance
    assert first >= 25 and good >= first - 4


def test_two_runs_a_point_measure_the_noise_between_runs_as_before(monkeypatch, tmp_path):
    """Repeats 2 and no declared launch noise: the pooled spread of the run medians (numpy here) is each point's
    noise, cliffs are called or not, never inconclusive; at the expected exponent with 3% run-to-run noise false
    cliffs stay near alpha, and a 3x jump at the last point is a cliff."""
    scanner = Scanner(monkeypatch, tmp_path, "[2048, 8192, 32768]", 2)
    n = 60
    metrics = [scanner.run(expected_law, seed).metrics for seed in range(n)]
    assert {m.run_to_run for m in metrics} == {"repeats"} and {m.noise_source for m in metrics} == {"repeats"}
    assert all(m.cliff in (True, False) for m in metrics) and sum(m.cliff for m in metrics) / n <= 0.10
    m = metrics[0]
    logs = [np.log(p.run_step_times_s) for p in m.points]
    s = math.sqrt(sum(float(((g - g.mean()) ** 2).sum()) for g in logs) / 3)
    first = m.pairs[0]
    se = math.sqrt(2.0) * (s / math.sqrt(2.0)) / math.log(4.0)  # two points of 2 runs each, log(8192 / 2048)
    assert first.ci_high - first.exponent == pytest.approx(se * 3.182446305284263, rel=1e-6)  # t(0.975, 3)
    jump = scanner.run(lambda v: expected_law(v) * (3.0 if v == 32768 else 1.0), 0).metrics
    assert jump.cliff is True and jump.cliff_pair.a == 8192


def test_point_noise_is_held_to_one_launch_share_of_the_declared_launch_noise():
    """Hand figures: one launch's share of launch_sd 0.06 is 0.06 / sqrt 2; a one-run point whose block noise is
    below it takes it with the declared df (pairs - 1), one above it keeps its own; with repeats the pooled
    spread is held to it over sqrt(runs), the repeats' df kept."""
    floor = PairNoise(sd=0.06, pairs=11)
    share = 0.06 / math.sqrt(2.0)
    quiet = [1.0 + 0.001 * ((-1) ** i) for i in range(20)]
    loud = list(np.exp(0.4 * np.random.default_rng(1).standard_normal(40)))
    noise = point_noise({1: [1.0], 2: [1.0]}, {1: quiet, 2: loud}, floor)
    assert noise[1].se == pytest.approx(share) and noise[1].df == 10 and noise[1].source == "declared"
    own = block_units(loud)
    assert own.rel_se > share and noise[2].se == pytest.approx(own.rel_se) and noise[2].source == "blocks"
    assert noise[1].run_noise and noise[2].run_noise
    runs = {1: [1.0, 1.001], 2: [2.0, 2.001], 4: [4.0, 4.002]}
    held = point_noise(runs, floor=floor)
    assert all(p.se == pytest.approx(share / math.sqrt(2.0)) and p.df == 3 and p.source == "repeats"
               for p in held.values())


def test_a_cliff_on_block_noise_alone_is_inconclusive():
    """One run a point, no declared launch noise: an 8x step time between 256 and 512 is significant on the block
    means of each window, but the run-to-run noise is unknown: no cliff, the pair marked inconclusive."""
    rng = np.random.default_rng(4)
    runs = {v: [v * (8.0 if v == 512 else 1.0)] for v in (128, 256, 512)}
    series = {v: list(t[0] * (1.0 + ar1(rng, 20, 0.01, 0.3))) for v, t in runs.items()}
    c = find_cliffs(point_noise(runs, series))
    assert c.cliff is None and c.inconclusive is not None and (c.inconclusive.a, c.inconclusive.b) == (256, 512)
    assert [p.inconclusive for p in c.pairs] == [False, True] and not any(p.cliff for p in c.pairs)
    assert c.reason.startswith("inconclusive") and c.pairs[1].as_dict()["inconclusive"] is True
    assert "inconclusive" not in c.pairs[0].as_dict()


def test_one_run_a_point_is_held_to_the_run_to_run_noise_measured_earlier_in_the_run(monkeypatch, tmp_path):
    """No declared launch noise, but an earlier step's repeats measured the run-to-run noise (3% of a run's mean,
    30 df): the same 80 scans decide, each point held to it (a launch pair's sd 3% x sqrt 2), false cliffs near
    alpha, none inconclusive; a true 3x jump is still a cliff."""
    from validation.analysis.significance import RunNoise
    from validation.kinds import trainer

    measured = RunNoise(between=RUN_SD, total=RUN_SD, within=0.0, df=30.0, runs=62, groups=31, source="ab")
    monkeypatch.setattr(trainer, "measured_run_noise", lambda results, run_dir, metric="toks_per_s": measured)
    scanner = Scanner(monkeypatch, tmp_path, "[2048, 8192, 32768]", 1)
    n = 80
    held = [scanner.run(expected_law, seed).metrics for seed in range(n)]
    assert {m.run_to_run for m in held} == {"measured"}
    assert all(m.launch_sd == pytest.approx(RUN_SD * math.sqrt(2.0)) for m in held)
    assert all(m.cliff in (True, False) for m in held) and sum(m.cliff for m in held) / n <= 0.10
    jump = scanner.run(lambda v: expected_law(v) * (3.0 if v == 32768 else 1.0), 0)
    assert jump.metrics.cliff is True and jump.metrics.cliff_pair.a == 8192
    texts = [b.text for b in scanner.mod.Scan().blocks(jump) if isinstance(b, Paragraph)]
    assert any(t.startswith("Run-to-run noise: one run a point, each point's noise held to at least the run-to-run "
                            "noise this run measured") for t in texts)
    # a declared launch noise larger than the measured one is the floor, as before
    larger = scanner.run(expected_law, 0, {"launch_sd": 0.1, "pairs": 30}).metrics
    assert larger.run_to_run == "declared" and larger.launch_sd == 0.1
