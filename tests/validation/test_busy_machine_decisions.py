"""Decisions on a busy machine: the runs left out as disturbed must not turn a difference inside the declared launch
noise into a winner. Hand-made run means, checked against hand-computed figures."""

import math

from validation.analysis.significance.comparison import PairNoise, RunNoise, pair_noise_from
from validation.analysis.significance.decision import decide

# cpu_smoke's declared launch noise (runbooks/cpu_smoke.yaml: compare.launch_sd)
LAUNCH_SD = PairNoise(sd=0.12, source="launch_sd 12%")

A = [100.0, 101.0, 102.0]
B = [108.0, 110.0, 111.0]


def test_all_repeats_paired_a_ten_percent_difference_is_inside_the_launch_noise():
    d = decide({"a": A, "b": B}, default="a", pair_noise=LAUNCH_SD)
    assert d.method == "paired" and d.winner is None and d.choice == "a" and not d.significant


def test_disturbed_runs_left_out_of_different_repeats_do_not_make_a_winner_of_the_same_difference():
    # repeat 3 of a and repeat 1 of b disturbed: the repeats no longer pair (one complete pair), so the run means are
    # compared unpaired, 2 runs a side: a [100, 101], b [110, 111]. Their own spread (sd 0.7%) would give +10.0%,
    # p ~0.005; held to the declared launch noise each side's relative se is 0.12 / sqrt(2 * 2) = 6%, the log
    # difference's se 6% * sqrt 2 = 8.5%, t = log(110.5 / 100.5) / 0.0849 = 1.12: no winner, the default kept
    d = decide({"a": A, "b": B}, default="a", pair_noise=LAUNCH_SD,
               disturbed={"a": [False, False, True], "b": [True, False, False]})
    assert d.method == "runs"
    assert d.disturbed_runs == (("a", 2), ("b", 0))
    assert d.winner is None and d.choice == "a" and d.kept_default and not d.significant and not d.recommendable
    c = d.comparison
    assert math.isclose(c.rel, 110.5 / 100.5 - 1, rel_tol=1e-9)
    se = math.sqrt(2) * 0.12 / math.sqrt(4)
    assert math.isclose(c.t, math.log(110.5 / 100.5) / se, rel_tol=1e-6)
    assert c.p_value > 0.05
    # the repeats advice rests on the declared noise too (one run mean's cv at least 0.12 / sqrt 2)
    assert d.cv >= 0.12 / math.sqrt(2) - 1e-12


def test_disturbed_runs_left_out_a_tenfold_effect_still_wins_unpaired():
    d = decide({"a": A, "b": [10 * x for x in B]}, default="a", pair_noise=LAUNCH_SD,
               disturbed={"a": [False, False, True], "b": [True, False, False]})
    assert d.method == "runs" and d.winner == "b" and d.significant
    assert not d.recommendable  # not paired: chosen, never exported


def test_unpaired_runs_without_a_declared_noise_keep_their_own_spread():
    d = decide({"a": A, "b": B}, default="a", disturbed={"a": [False, False, True], "b": [True, False, False]})
    assert d.method == "runs" and d.winner == "b"  # no declared noise: the runs' own spread (sd 0.7%) decides


def _steady(level: float, n: int = 40) -> list[float]:
    """A steady window: level +-0.5% alternating (its block means agree to well under 1%)."""
    return [level * (1.005 if i % 2 else 0.995) for i in range(n)]


DECLARED = pair_noise_from({"launch_sd": 0.12, "pairs": 70})


def test_one_run_each_a_difference_inside_the_declared_launch_noise_is_no_winner():
    # two single launches 12% apart, each steady within itself: its own blocks would make it p < 1e-20. The declared
    # launch noise (12% per launch pair, 70 pairs) holds each run's noise to 12% / sqrt 2 = 8.49% with 69 df, the
    # difference's se to 12%: t = log(1.12) / 0.12 = 0.94, p = 0.35, no winner, the default kept
    d = decide({"baseline": [_steady(100.0)], "fused": [_steady(112.0)]}, default="baseline", pair_noise=DECLARED)
    assert d.method == "blocks" and d.winner is None and d.choice == "baseline" and not d.significant
    c = d.comparison
    assert math.isclose(c.rel, 0.12, rel_tol=1e-6)
    assert math.isclose(c.t, math.log(1.12) / 0.12, rel_tol=1e-6) and c.df == 69
    assert 0.3 < c.p_value < 0.4


def test_one_run_each_a_measured_run_noise_larger_than_the_declared_one_is_kept():
    larger = RunNoise(between=0.2, total=0.2, within=0.0, df=4.0, runs=8, groups=4)
    d = decide({"baseline": [_steady(100.0)], "fused": [_steady(112.0)]}, default="baseline", pair_noise=DECLARED,
               run_noise=larger)
    assert d.comparison.run_to_run == 0.2 and d.comparison.df == 4


def test_one_run_each_a_large_effect_still_wins_beside_the_declared_noise():
    d = decide({"baseline": [_steady(100.0)], "fused": [_steady(200.0)]}, default="baseline", pair_noise=DECLARED)
    assert d.winner == "fused" and d.significant and not d.recommendable  # one run each: never exported


def test_ab_table_of_one_run_each_holds_the_declared_launch_noise():
    from validation.kinds.ab import _compare
    c = _compare([_steady(100.0)], [_steady(112.0)], "fused", "toks_per_s", True, None, DECLARED)
    assert not c.significant and c.verdict == "inconclusive"
    assert math.isclose(c.t, math.log(1.12) / 0.12, rel_tol=1e-6)
