"""The A/B's pooled summary of a side against hand figures: a repeat measured while other work used the machine is
left out of the side's tokens/s, as the comparison and the decision leave it out (a side measured only disturbed
keeps its runs: nothing else measured it); the repeats' tokens/s is their work over their time, as a window's is."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decision_support import ab_runbook, run_ab_step  # noqa: E402
from validation.kinds.ab import pooled_summary  # noqa: E402


def _run(label: str, repeat: int, mean: float, disturbed: bool, stable: bool = True) -> dict:
    return {"label": label, "repeat": repeat, "status": "passed",
            "metrics": {"toks_per_s": {"mean": mean}, "throughput_stable": stable,
                        "interference": {"disturbed": disturbed, "share": 0.6 if disturbed else 0.0}}}


def test_the_pooled_summary_leaves_a_disturbed_repeat_out():
    runs = [_run("fused", 0, 300.0, True, stable=False), _run("fused", 1, 1000.0, False),
            _run("fused", 2, 1040.0, False)]
    summary = pooled_summary(runs, "fused")
    # by hand: the two undisturbed repeats' work over their time, 2 / (1 / 1,000 + 1 / 1,040) = 1,019.61; the
    # disturbed one pooled in as well gave (300 + 1,000 + 1,040) / 3 = 780
    assert summary["toks_per_s"] == {"mean": pytest.approx(2 / (1 / 1000 + 1 / 1040), rel=1e-12), "n": 2}
    assert summary["repeats"] == 2 and summary["throughput_stable"] is True
    # one undisturbed run left: that run's own summary, as written
    assert pooled_summary(runs[:2], "fused")["toks_per_s"]["mean"] == 1000.0
    # every run disturbed: they are all there is
    only = [_run("fused", 0, 300.0, True), _run("fused", 1, 600.0, True)]
    assert pooled_summary(only, "fused")["toks_per_s"] == {"mean": pytest.approx(400.0, rel=1e-12), "n": 2}


def test_the_pooled_tokens_per_s_is_the_repeats_work_over_their_time():
    """Two repeats of one window of the same work (say 20 steps of 2,048 tokens, 40,960 tokens each) at 190 and
    90 tokens/s take 215.6 s and 455.1 s: 81,920 tokens in 670.7 s are 122.1 tokens/s, not the plain mean 140."""
    runs = [_run("baseline", 0, 190.0, False), _run("baseline", 1, 90.0, False)]
    tokens = 40_960.0
    by_hand = 2 * tokens / (tokens / 190.0 + tokens / 90.0)
    assert by_hand == pytest.approx(122.142857, rel=1e-6)
    assert pooled_summary(runs, "baseline")["toks_per_s"] == {"mean": pytest.approx(by_hand, rel=1e-12), "n": 2}


RB = ab_runbook(3)


def test_an_ab_step_reports_a_variant_without_its_disturbed_repeat(monkeypatch, tmp_path):
    """Both sides at 1,000 tokens/s; batched's first repeat ran (twice: its retry too) beside other work at 300."""
    def shaken(label, repeat):
        return label == "batched" and repeat == 0

    def collect(spec):
        disturbed = shaken(spec.label, spec.repeat)
        return {"toks_per_s": {"mean": 300.0 if disturbed else 1000.0}, "throughput_stable": True,
                "interference": {"disturbed": disturbed, "share": 0.5 if disturbed else 0.0, "text": "t"}}

    rng = np.random.default_rng(0)

    def values(run):
        return list((300.0 if shaken(run["label"], run["repeat"]) else 1000.0)
                    * (1 + 0.01 * rng.standard_normal(40)))

    result = run_ab_step(monkeypatch, tmp_path, RB, collect, values)
    (comp,) = result["comparison"]
    assert comp["n_b"] == 2  # the comparison pairs the two undisturbed repeats
    assert result["metrics"]["batched"]["toks_per_s"] == {"mean": pytest.approx(1000.0), "n": 2}  # not 766.7
    assert result["metrics"]["baseline"]["toks_per_s"] == {"mean": pytest.approx(1000.0), "n": 3}
