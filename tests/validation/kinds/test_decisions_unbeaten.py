"""How the deciding kinds word and record what they pick, on synthetic trainer launches with a known truth
(tests/validation/decision_support.py: no process is started): a significant difference the step does not act on
is never called "no significant difference", a choice among points the data cannot order is never called the
winner or the best, and a bisection point that measured a step time outside its physical range stops the
bisection with a note (the figure flagged by the evidence) instead of ending the run with a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decision_support import FakeTrainer, ab_runbook, run_ab_step, run_runbook  # noqa: E402

from validation.kinds import get  # noqa: E402
from validation.kinds._decision_view import decision_blocks  # noqa: E402

AB_RB = ab_runbook(1)


def _measured_noise(monkeypatch, total=0.01):
    """A run-to-run variation of `total` measured in the run's earlier repeats: one run each is held to it (without
    one, block means alone decide nothing and the stability rule is never reached)."""
    from validation.analysis.significance.comparison import RunNoise
    from validation.kinds import ab as ab_mod

    noise = RunNoise(between=total, total=total, within=0.0, df=4.0, runs=6, groups=2, source="earlier (2 x 3 runs)")
    monkeypatch.setattr(ab_mod, "measured_run_noise", lambda *args, **kwargs: noise)


def test_an_ab_winner_left_out_as_unstable_is_not_called_no_significant_difference(monkeypatch, tmp_path):
    """One run each: batched 10x the baseline's tokens/s (40 steps of 1% noise against the baseline's 1%), but its
    throughput is marked unstable, so the A/B keeps the baseline (its documented stability rule). The difference
    itself is significant (its 95% interval far from 0): the decision's headline and the step's summary line say the
    baseline is kept with no winner and name the significant difference, never "no significant difference"."""
    rng = np.random.default_rng(3)

    def collect(spec):
        return {"toks_per_s": {"mean": 10000.0 if spec.label == "batched" else 1000.0},
                "throughput_stable": spec.label != "batched",
                "interference": {"disturbed": False, "share": 0.0, "text": "no interference"}}

    def values(run):
        return list((10000.0 if run["label"] == "batched" else 1000.0) * (1 + 0.01 * rng.standard_normal(40)))

    _measured_noise(monkeypatch)  # one run each held to a run-to-run noise: the stability rule decides
    result = run_ab_step(monkeypatch, tmp_path, AB_RB, collect, values)
    d = result["decision"]
    assert result["choice"]["label"] == "baseline" and result["choice"]["significant"] is False
    assert d["comparison"]["significant"] is True and d["comparison"]["ci_low"] > 5.0  # at least 6x: a real effect
    impl = get("ab")
    step = impl.read(result)
    line = impl.summary_line(step)
    headline = str(decision_blocks(step.decision, step.choice)[0])
    for text in (line, headline):
        assert "no significant difference" not in text, text
        assert "kept, no winner" in text and "batched +" in text and "against baseline is significant" in text


SWEEP_RB = """\
name: decide
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 30}
  window: 25
  warmup_steps: 5
phases:
  - name: sweep
    steps:
      - name: sw
        kind: sweep
        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50, 100]}
        repeats: 3
        prefer: {env.NSA_DDP_BUCKET_MB: 50}
"""


def test_a_tie_that_beats_the_default_is_chosen_but_never_called_the_winner_or_the_best(monkeypatch, tmp_path):
    """25 and 100 MB both 30% faster than the preferred 50 (2% step noise, 0.5% run to run, 3 repeats): 50 is
    beaten, but nothing separates 25 from 100, so there is no winner (the decision's own `winner` is null) and the
    choice between the two is the higher mean. The step's summary line, the decision's headline and the key figure
    say the default was beaten with no single winner; none names a winner or a best bucket."""
    trainer = FakeTrainer(lambda spec: 10_000.0 if spec.env.get("NSA_DDP_BUCKET_MB") == "50" else 13_000.0,
                          cv=0.02, run_cv=0.005)
    results = run_runbook(monkeypatch, tmp_path, SWEEP_RB, trainer)
    sw = results["steps"]["sw"]
    d = sw["decision"]
    assert d["winner"] is None and d["significant"] is True
    assert sw["choice"]["label"] in ("NSA_DDP_BUCKET_MB=25", "NSA_DDP_BUCKET_MB=100")
    impl = get("sweep")
    step = impl.read(sw)
    line = impl.summary_line(step)
    headline = str(decision_blocks(step.decision, step.choice)[0])
    assert "winner:" not in line and "no single winner" in line and "NSA_DDP_BUCKET_MB=50" in line, line
    assert "no single winner" in headline and "(significant)" not in headline, headline
    figure = impl.key_figures([step])[0]
    assert figure.label == "Bucket" and "no single winner" in figure.value, figure


SCAN_RB = """\
name: s
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 12}
  window: 8
  warmup_steps: 2
phases:
  - name: p
    steps:
      - name: sc
        kind: scan
        values: {args.seq_len: [64, 128, 256, 512]}
        repeats: 2
        bisect: {steps: 2, resolution: 64, multiple_of: 32}
"""


def test_a_bisection_point_measuring_a_negative_step_time_stops_the_search_and_is_flagged(monkeypatch, tmp_path):
    """Step time linear in seq_len up to 256 and 8x beyond (a cliff between 256 and 512: local exponent 4); the
    bisection's first midpoint, 384, measures negative tokens/s and step times (a broken measurement). The run ends
    (no StatsError traceback), the cliff stands, the bisection stops at 384 unclassified with a note naming it, and
    the evidence lists the point's negative step time as outside its physical range."""
    def level(spec):
        seq = int(next(iter(spec.params.values())))
        tokens_per_s = 4096 / (seq / 64 * 0.01 * (8 if seq > 256 else 1))
        return tokens_per_s if seq in (64, 128, 256, 512) else -tokens_per_s

    results = run_runbook(monkeypatch, tmp_path, SCAN_RB, FakeTrainer(level, cv=0.02))
    sc = results["steps"]["sc"]
    m = sc["metrics"]
    assert m["cliff"] is True and m["cliff_pair"]["a"] == 256 and m["cliff_pair"]["b"] == 512
    assert m["bisection"]["points"] == [[384, None]] and m["cliff_interval"] == [256, 512]
    assert m["cliff_localised"] is False
    assert any(n.startswith("bisection point 384 not classified") for n in sc["notes"])
    flagged = {x["metric"] for x in results["evidence"]["implausible"] if x["step"] == "sc"}
    row = next(i for i, p in enumerate(m["points"]) if p["value"] == 384)
    assert f"points.{row}.step_time_s" in flagged


AB_TWO_RB = ab_runbook(3, '{fast: {env: {NSA_PREFILL_BATCHED: "1"}}, other: {env: {NSA_SEL_RANGES_V2: "1"}}}')


def test_an_ab_whose_baseline_was_never_measured_undisturbed_keeps_the_baseline(monkeypatch, tmp_path):
    """Three interleaved repeats; another process used the machine during every baseline launch (each is left out
    as disturbed), while `fast` runs 30% above `other` (1% noise). `fast` clearly beats `other`, but an A/B keeps a
    variant only when it beats the baseline, which was not measured: the baseline is kept, nothing is recommended,
    and the step's evidence stays disturbed (its decision is not conclusive without the baseline)."""
    rng = np.random.default_rng(5)
    level = {"baseline": 1000.0, "fast": 1300.0, "other": 1000.0}

    def collect(spec):
        busy = spec.label == "baseline"
        return {"toks_per_s": {"mean": level[spec.label]}, "throughput_stable": True,
                "interference": {"disturbed": busy, "share": 0.6 if busy else 0.0,
                                 "text": "another process used the cores" if busy else "no interference"}}

    def values(run):
        return list(level[run["label"]] * (1 + 0.01 * rng.standard_normal()) * (1 + 0.01 * rng.standard_normal(40)))

    result = run_ab_step(monkeypatch, tmp_path, AB_TWO_RB, collect, values)
    d = result["decision"]
    assert {x["label"] for x in d["disturbed_runs"]} == {"baseline"} and len(d["disturbed_runs"]) == 3
    assert d["comparison"]["baseline"] == "other" and d["comparison"]["variant"] == "fast"
    assert d["comparison"]["significant"] is True  # the variants' own difference is real
    assert result["choice"]["label"] == "baseline" and result["choice"]["significant"] is False
    assert result["winner"] is None
    assert d["choice"] == "baseline" and d["winner"] is None and d["recommendable"] is False
    assert "the baseline was not measured" in d["reason"]
    assert result["metrics"]["significant"] is False and result["metrics"]["kept_default"] is True
    assert result["interference"]["disturbed"] is True


def test_a_sweep_whose_preferred_point_was_only_measured_disturbed_names_no_winner(monkeypatch, tmp_path):
    """100 MB is 30% faster than 25 MB; every run of the preferred 50 MB (and its run again) was measured while
    another process used the machine, so 50 was never measured: 100 beat 25, not 50. The sweep keeps 50 with no
    winner, recommends no bucket size, and its criterion is inconclusive (the run INCOMPLETE with the command that
    runs the sweep again), never GO on a winner that beat only part of the matrix."""
    trainer = FakeTrainer(lambda spec: 13_000.0 if spec.env.get("NSA_DDP_BUCKET_MB") == "100" else 10_000.0,
                          cv=0.02, run_cv=0.005, busy=lambda spec: spec.env.get("NSA_DDP_BUCKET_MB") == "50")
    text = SWEEP_RB + 'acceptance:\n  - {name: decided, expr: "sw.decided", target: "a decision"}\n'
    results = run_runbook(monkeypatch, tmp_path, text, trainer)
    sw = results["steps"]["sw"]
    d = sw["decision"]
    assert {x["label"] for x in d["disturbed_runs"]} == {"NSA_DDP_BUCKET_MB=50"}
    assert [r["label"] for r in d["ranking"]] == ["NSA_DDP_BUCKET_MB=100", "NSA_DDP_BUCKET_MB=25"]
    assert d["comparison"]["significant"] is True  # 100 against 25: real
    assert sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=50" and sw["winner"] is None
    assert d["winner"] is None and d["significant"] is False and d["recommendable"] is False
    assert "NSA_DDP_BUCKET_MB" not in results["recommendations"]["env"]
    assert results["acceptance"][0]["status"] == "inconclusive" and results["verdict"] == "INCOMPLETE"
