"""A sweep of one run a point (validation.kinds.sweep) against its documented contract: block means of one run's
window see only the noise within it, never how far the next launch's level lies, so each run's noise is held to the
run-to-run variation measured earlier in the same validation run (as an A/B's), and with neither a measured nor a
declared launch noise no point is significant: the point to keep is kept and the reason names the fix. The
launches are synthetic (decision_support.FakeTrainer): each launch's level is set by hand, its steps carry 1% AR(1)
noise around it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decision_support import FakeTrainer, run_runbook  # noqa: E402

RB = """\
name: noise
requirements: {{gpus: 0, backend: gloo}}
{compare}defaults:
  config: configs/tiny_cpu.yaml
  args: {{steps: 30}}
  window: 25
  warmup_steps: 5
phases:
  - name: p
    steps:
{earlier}      - name: sw
        kind: sweep
        matrix: {{env.NSA_DDP_BUCKET_MB: [25, 50, 100]}}
        select: {{metric: toks_per_s, goal: {goal}}}
        prefer: {{env.NSA_DDP_BUCKET_MB: 50}}
  - name: later
    steps:
      - {{name: after, kind: train, env: {{NSA_DDP_BUCKET_MB: "${{sw.winner.env.NSA_DDP_BUCKET_MB}}"}}}}
acceptance:
  - {{name: decided, expr: "sw.decided", target: "a significant winner, or 50 kept"}}
"""

# a point of one setting launched three times before the sweep: its run-to-run variation is measured there
REPEATED = """\
      - name: repeated
        kind: sweep
        matrix: {env.NSA_DDP_BUCKET_MB: [50]}
        repeats: 3
"""


def runbook(earlier: str = "", compare: str = "", goal: str = "max") -> str:
    return RB.format(earlier=earlier, compare=compare, goal=goal)


def bucket(spec) -> str:
    return spec.env.get("NSA_DDP_BUCKET_MB", "")


def sweep_level(offsets: dict[str, float], repeated_spread: float = 0.0):
    """A launch's level: the sweep's points 10,000 tokens/s times (1 + their offset); the repeated step's three
    launches 10,000 x (1 - spread, 1, 1 + spread) by repeat (a run-to-run sd of `spread`)."""
    def level(spec) -> float:
        if str(spec.dir).startswith("repeated/"):
            return 10_000.0 * (1.0 + repeated_spread * (spec.repeat - 1))
        return 10_000.0 * (1.0 + offsets.get(bucket(spec), 0.0))
    return level


# launch levels 6% apart, as two launches of one setting can be: one run a point cannot tell that from an effect
APART = {"25": -0.03, "50": 0.0, "100": 0.06}


def test_one_run_a_point_without_a_run_to_run_noise_names_no_winner_and_keeps_the_point(monkeypatch, tmp_path):
    """Block means of each run alone called 100 (6% ahead, 1% step noise) a significant winner; without a measured
    or declared launch noise it is no winner: 50 is kept (a passed decision the later step uses), nothing is
    recommended, and the reason says why and names the fix."""
    trainer = FakeTrainer(sweep_level(APART), cv=0.01)
    results = run_runbook(monkeypatch, tmp_path, runbook(), trainer)
    sw = results["steps"]["sw"]
    d = sw["decision"]
    assert d["method"] == "blocks" and [r["label"] for r in d["ranking"]][0] == "NSA_DDP_BUCKET_MB=100"
    assert d["winner"] is None and d["significant"] is False and d["recommendable"] is False
    assert d["choice"] == "NSA_DDP_BUCKET_MB=50" and d["kept_default"] is True
    assert sw["winner"] is None and sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=50"
    assert sw["choice"]["significant"] is False and sw["choice"]["kept_default"] is True
    assert sw["metrics"]["significant"] is False and sw["metrics"]["winner"] is None
    assert sw["metrics"]["decided"] is True and sw["status"] == "passed"
    assert "no run-to-run noise measured or declared" in d["reason"]
    assert "`repeats: 2`" in d["reason"] and "`compare: {launch_sd, pairs}`" in d["reason"]
    assert d["recommendation"].startswith("nothing is recommended")
    assert results["steps"]["after"]["env"]["NSA_DDP_BUCKET_MB"] == "50"
    assert results["acceptance"][0]["status"] == "pass"


def test_goal_min_one_run_a_point_without_a_run_to_run_noise_keeps_the_point(monkeypatch, tmp_path):
    """The same with `select: {goal: min}` over tokens/s: 25 (3% behind) leads the ranking; no winner either."""
    trainer = FakeTrainer(sweep_level(APART), cv=0.01)
    sw = run_runbook(monkeypatch, tmp_path, runbook(goal="min"), trainer)["steps"]["sw"]
    d = sw["decision"]
    assert [r["label"] for r in d["ranking"]][0] == "NSA_DDP_BUCKET_MB=25"
    assert d["winner"] is None and d["significant"] is False and sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=50"


def test_one_run_a_point_is_held_to_the_run_to_run_noise_measured_earlier(monkeypatch, tmp_path):
    """Three launches of one setting earlier in the run differed by 5% (10,000 x 0.95, 1, 1.05): the sweep's single
    runs are held to that variation, so 100's 6% lead over 50 (about 0.85 sd of a difference of two such launches)
    is no winner, and the reason names the measured variation it was held to."""
    trainer = FakeTrainer(sweep_level(APART, repeated_spread=0.05), cv=0.01)
    results = run_runbook(monkeypatch, tmp_path, runbook(earlier=REPEATED), trainer)
    d = results["steps"]["sw"]["decision"]
    assert d["method"] == "blocks" and d["winner"] is None and d["significant"] is False
    assert d["choice"] == "NSA_DDP_BUCKET_MB=50"
    assert "each run's noise at least the run-to-run variation" in d["reason"] and "repeated" in d["reason"]
    # the variation the runs were held to is the measured one (about 5%: the sd of log 0.95, 1, 1.05 with the
    # runs' own noise), not none
    assert "no run-to-run noise measured or declared" not in d["reason"]
    assert d["comparison"]["run_to_run"] > 0.04


def test_one_run_a_point_with_a_small_measured_noise_still_names_a_large_winner(monkeypatch, tmp_path):
    """Earlier launches of one setting within 0.5% of each other: 100, 30% ahead, is the significant winner of the
    one-run sweep (the measured noise is what lets one run a point decide), and the later step runs with it."""
    trainer = FakeTrainer(sweep_level({"100": 0.30}, repeated_spread=0.005), cv=0.01)
    results = run_runbook(monkeypatch, tmp_path, runbook(earlier=REPEATED), trainer)
    sw = results["steps"]["sw"]
    d = sw["decision"]
    assert d["method"] == "blocks" and d["winner"] == "NSA_DDP_BUCKET_MB=100" and d["significant"] is True
    assert "each run's noise at least the run-to-run variation" in d["reason"]
    assert results["steps"]["after"]["env"]["NSA_DDP_BUCKET_MB"] == "100"


def test_one_run_a_point_without_a_run_to_run_noise_never_leaves_the_point_beaten_by_a_group(monkeypatch, tmp_path):
    """25 and 100 both launched 6% above 50: block means alone beat 50 with no single winner (a significant choice
    of the best); without a run-to-run noise that is no decision to leave 50 either: it is kept, not significant."""
    trainer = FakeTrainer(sweep_level({"25": 0.06, "100": 0.06}), cv=0.01)
    results = run_runbook(monkeypatch, tmp_path, runbook(), trainer)
    sw = results["steps"]["sw"]
    d = sw["decision"]
    assert d["method"] == "blocks" and [r["label"] for r in d["ranking"]][-1] == "NSA_DDP_BUCKET_MB=50"
    assert d["significant"] is False and d["winner"] is None and d["choice"] == "NSA_DDP_BUCKET_MB=50"
    assert sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=50" and sw["choice"]["significant"] is False
    assert "against NSA_DDP_BUCKET_MB=50" in d["reason"] or "ahead of NSA_DDP_BUCKET_MB=50" in d["reason"]
    assert "`repeats: 2`" in d["reason"]
    assert results["steps"]["after"]["env"]["NSA_DDP_BUCKET_MB"] == "50"


def test_equal_points_of_one_run_each_without_noise_are_not_shown_the_same(monkeypatch, tmp_path):
    """Three equal points, 0.1% step noise: block means of one run each put every interval inside the noise floor,
    which would read "same", but they never see how far the next launch's level lies: each effect the report shows
    is inconclusive, none significant."""
    from validation import kinds

    trainer = FakeTrainer(sweep_level({}), cv=0.001)
    results = run_runbook(monkeypatch, tmp_path, runbook(), trainer)
    sw = results["steps"]["sw"]
    assert sw["decision"]["method"] == "blocks" and sw["decision"]["significant"] is False
    sweep = kinds.get("sweep")
    effects = sweep.comparisons(sweep.read({**sw, "name": "sw", "kind": "sweep"}))
    assert effects and all(e.verdict == "inconclusive" and not e.significant for e in effects)
