"""The A/B's comparisons against their documented contract, on synthetic launches (tests/validation/decision_support.py:
no process is started):

- block means of one run each with no run-to-run noise measured or declared never see how far the next launch's
  level lies, so such a comparison is neither significant nor "same": "inconclusive" whatever its interval, its
  text saying why (an interval inside the noise floor gave "same");
- the means a comparison shows follow the rule for a rate of equal work (toks_per_s, mfu): the runs' work over their
  time, the harmonic mean of the run figures (repeats' run means of toks_per_s 100 and 300 show 150, not 200), while
  the test, on the log-ratios or the run means, is unchanged; other metrics keep the plain mean.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decision_support import run_ab_step  # noqa: E402

from validation.analysis.significance.comparison import RunNoise, compare_paired, compare_units  # noqa: E402
from validation.analysis.significance.units import run_units  # noqa: E402
from validation.kinds import ab as ab_mod  # noqa: E402
from validation.kinds import get  # noqa: E402
from validation.kinds.blocks import Table  # noqa: E402

RB = """\
name: t
requirements: {{gpus: 0, backend: gloo}}
defaults: {{config: configs/tiny_cpu.yaml, args: {{steps: 60}}, window: 50, warmup_steps: 5, nproc_per_node: 1}}
phases:
  - name: p
    steps:
      - name: fa
        kind: ab
        baseline: {{env: {{NSA_OPT_FUSED: "0"}}}}
        variants: {{fused: {{env: {{NSA_OPT_FUSED: "1"}}}}}}
        repeats: {repeats}
"""
QUIET = {"disturbed": False, "share": 0.0, "text": "no interference"}


def _ab(monkeypatch, tmp_path, series: dict[tuple[str, int], list[float]], repeats: int) -> dict:
    """One A/B step whose launch (label, repeat) measured the per-step tokens/s `series[(label, repeat)]`."""
    def collect(spec):
        return {"toks_per_s": {"mean": float(np.mean(series[(spec.label, spec.repeat or 0)]))},
                "throughput_stable": True, "interference": QUIET}

    tmp_path.mkdir(parents=True, exist_ok=True)
    return run_ab_step(monkeypatch, tmp_path, RB.format(repeats=repeats), collect,
                       lambda run: list(series[(run["label"], run.get("repeat") or 0)]))


def _steady(level: float, seed: int, sd: float = 0.002, n: int = 50) -> list[float]:
    """n steps of independent noise of relative sd `sd` around `level`."""
    rng = np.random.default_rng(seed)
    return list(level * (1.0 + sd * rng.standard_normal(n)))


def test_one_run_each_on_block_means_alone_is_inconclusive_even_inside_the_noise_floor(monkeypatch, tmp_path):
    """Two equal settings, one run each, 0.2% step noise: the interval lies well inside the 1% noise floor (the case
    that read "same"), yet block means of one window each never saw the launch-to-launch spread, so the comparison
    is inconclusive, not significant, and says why; the A/B's effect (the findings) is inconclusive too. With a
    run-to-run noise measured earlier (0.1%) the same data may say "same"."""
    series = {("baseline", 0): _steady(10_000.0, 1), ("fused", 0): _steady(10_000.0, 2)}
    result = _ab(monkeypatch, tmp_path / "alone", series, repeats=1)
    (comp,) = result["comparison"]
    assert comp["method"] == "blocks" and comp["run_to_run"] is None
    floor = comp["noise_floor"]
    assert -floor <= comp["ci_low"] and comp["ci_high"] <= floor  # the interval inside the floor
    assert comp["significant"] is False and comp["verdict"] == "inconclusive", comp["text"]
    assert result["metrics"]["variants"]["fused"]["verdict"] == "inconclusive"
    assert "no run-to-run noise measured or declared" in comp["text"]
    assert "nor an interval inside the noise floor show the two the same" in comp["text"]
    impl = get("ab")
    (effect,) = impl.comparisons(impl.read(result))
    assert effect.significant is False and effect.verdict == "inconclusive"

    rn = RunNoise(between=0.001, total=0.001, within=0.0, df=6.0, runs=9, groups=3, source="earlier repeats")
    monkeypatch.setattr(ab_mod, "measured_run_noise", lambda *args, **kwargs: rn)
    held = _ab(monkeypatch, tmp_path / "held", series, repeats=1)
    (comp,) = held["comparison"]
    assert comp["run_to_run"] == 0.001 and comp["verdict"] == "same"
    assert "nor an interval inside" not in comp["text"]


def _harmonic(values: list[float]) -> float:
    return len(values) / sum(1.0 / v for v in values)


def test_paired_means_shown_are_the_runs_work_over_their_time_and_the_test_is_unchanged():
    """Run means of toks_per_s 100 and 300 (A) and 110 and 360 (B): shown 150 and 2 / (1/110 + 1/360) = 168.51,
    not 200 and 235; rel stays the mean log-ratio's exp(mean(log 1.1, log 1.2)) - 1 = sqrt(1.32) - 1, and t the
    one-sample t of the log-ratios. A metric that is no rate (step_time_s) keeps the plain mean."""
    c = compare_paired([100.0, 300.0], [110.0, 360.0], metric="toks_per_s")
    assert math.isclose(c.mean_a, 150.0, rel_tol=1e-12)
    assert math.isclose(c.mean_b, 2.0 / (1.0 / 110.0 + 1.0 / 360.0), rel_tol=1e-12)
    assert math.isclose(c.mean_b, 168.5106382978723, rel_tol=1e-12)
    d = [math.log(1.1), math.log(1.2)]
    mean_d = sum(d) / 2.0
    sd = math.sqrt(sum((x - mean_d) ** 2 for x in d))  # ddof 1 over two values
    assert math.isclose(c.rel, math.sqrt(1.32) - 1.0, rel_tol=1e-12)
    assert math.isclose(c.t, mean_d / (sd / math.sqrt(2.0)), rel_tol=1e-12)
    mfu = compare_paired([0.1, 0.3], [0.11, 0.36], metric="mfu")
    assert math.isclose(mfu.mean_a, 0.15, rel_tol=1e-12)
    plain = compare_paired([1.0, 3.0], [1.1, 3.6], metric="step_time_s", higher_is_better=False)
    assert math.isclose(plain.mean_a, 2.0, rel_tol=1e-12) and math.isclose(plain.mean_b, 2.35, rel_tol=1e-12)
    assert math.isclose(plain.rel, math.sqrt(1.32) - 1.0, rel_tol=1e-12)


def test_unpaired_run_means_shown_by_the_rate_rule_the_welch_test_on_the_plain_means():
    """Welch on run means (kind "runs", the decision's fallback when repeats do not pair): shown 150 and 168.51
    (harmonic), while rel stays the plain means' 235 / 200 - 1 = 17.5% and t the delta-method Welch t of them."""
    c = compare_units(run_units([100.0, 300.0]), run_units([110.0, 360.0]), metric="toks_per_s")
    assert c.method == "runs"
    assert math.isclose(c.mean_a, 150.0, rel_tol=1e-12)
    assert math.isclose(c.mean_b, _harmonic([110.0, 360.0]), rel_tol=1e-12)
    assert math.isclose(c.rel, 235.0 / 200.0 - 1.0, rel_tol=1e-12)
    se_a, se_b = 100.0 * math.sqrt(2.0) / math.sqrt(2.0), 125.0 * math.sqrt(2.0) / math.sqrt(2.0)  # sd / sqrt(n)
    se = math.sqrt((se_a / 200.0) ** 2 + (se_b / 235.0) ** 2)
    assert math.isclose(c.t, math.log(235.0 / 200.0) / se, rel_tol=1e-12)


def test_ab_with_repeats_shows_the_repeats_work_over_their_time(monkeypatch, tmp_path):
    """An A/B of 2 repeats whose runs measured steady 100 and 300 tokens/s (baseline) and 110 and 360 (fused): its
    comparison, table and effect show Mean A 150.0 and Mean B 168.5 (not 200.0 and 235.0), delta 18.51; Delta % stays
    the paired estimate, +14.9% (sqrt(1.32) - 1), and the table says it is not Mean B / Mean A - 1."""
    series = {("baseline", 0): [100.0] * 50, ("baseline", 1): [300.0] * 50,
              ("fused", 0): [110.0] * 50, ("fused", 1): [360.0] * 50}
    result = _ab(monkeypatch, tmp_path, series, repeats=2)
    (comp,) = result["comparison"]
    want_b = _harmonic([110.0, 360.0])
    assert comp["method"] == "paired"
    assert math.isclose(comp["mean_a"], 150.0, rel_tol=1e-12) and math.isclose(comp["mean_b"], want_b, rel_tol=1e-12)
    assert math.isclose(comp["delta"], want_b - 150.0, rel_tol=1e-12)
    assert math.isclose(comp["rel_delta"], math.sqrt(1.32) - 1.0, rel_tol=1e-12)
    assert "not Mean B / Mean A" in comp["test"]
    impl = get("ab")
    step = impl.read(result)
    (effect,) = impl.comparisons(step)
    assert math.isclose(effect.mean_without, 150.0, rel_tol=1e-12)
    assert math.isclose(effect.mean_with, want_b, rel_tol=1e-12)
    table = next(b for b in impl.blocks(step) if isinstance(b, Table) and b.columns[0].label == "Baseline")
    (row,) = table.rows
    assert row[3:6] == ("150.0", "168.5", "+14.9%")
