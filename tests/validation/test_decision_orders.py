"""The random run orders behind a paired decision (validation.analysis.significance.decision, rule 7): the sign-flip
test over the orders the repeats could have had, and the false winners it keeps at alpha where the drift between a
repeat's runs is about as large in every repeat as the runs' own noise (benchmarks/bench_significance.py --only ab
has the full table, 20,000 simulated A/Bs a cell)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from validation.analysis.significance import StatsError, decide, recommended_repeats
from validation.analysis.significance import simulate as sim
from validation.analysis.significance.decision import (_sign_patterns, _signed_sums, order_randomization_p,
                                                      order_test_reaches, replicated_blocks)


def _runs(log_ratios, level: float = 1000.0) -> dict[str, list[float]]:
    return {"a": [level] * len(log_ratios), "b": [level * math.exp(x) for x in log_ratios]}


def test_the_order_p_counts_the_sign_patterns_the_repeats_could_have_had():
    # 3 repeats |d| = 1, 2, 3: the 8 signed sums are +-6, +-4, +-2, +-0 (0 twice)
    assert order_randomization_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)      # 6: only itself and its mirror
    assert order_randomization_p([1.0, -2.0, 3.0]) == pytest.approx(6 / 8)     # 2: all but the two zeros
    assert order_randomization_p([-1.0, -2.0, -3.0]) == pytest.approx(2 / 8)   # two-sided
    assert order_randomization_p([0.05] * 6) == pytest.approx(2 / 64)
    # five repeats +5% and one -0.1%: the observed sum and the all-positive one, each with its mirror
    assert order_randomization_p([0.05] * 5 + [-0.001]) == pytest.approx(4 / 64)
    # beyond 16 repeats a seeded sample of the patterns: the same d, the same p; 20 repeats the same way is rare
    many = [0.05] * 20
    assert order_randomization_p(many) == order_randomization_p(many) < 1e-4
    assert 0.9 < order_randomization_p([0.05, -0.05] * 10) <= 1.0
    with pytest.raises(StatsError, match="finite"):
        order_randomization_p([0.1, math.nan])
    with pytest.raises(StatsError, match="finite"):
        order_randomization_p([])


@pytest.mark.parametrize("repeats", [1, 3, 8, 9, 16, 17, 50, 100])
def test_the_signed_sums_by_byte_are_those_of_every_sign_pattern(repeats):
    """The order test sums each pattern a byte of repeats at a time; the sums are the patterns' own matmul (to
    rounding) and the p counts them as that matmul's sums would, exact or sampled."""
    rng = np.random.default_rng(repeats)
    d = rng.normal(0.01, 0.05, repeats)
    patterns = _sign_patterns(repeats)
    assert patterns.shape == ((1 << repeats) if repeats <= 16 else 1 << 16, repeats)
    reference = patterns @ np.abs(d)
    np.testing.assert_allclose(_signed_sums(np.abs(d)), reference, rtol=0, atol=1e-12)
    hits = int(np.sum(np.abs(reference) >= abs(d.sum()) - 1e-9))
    p = order_randomization_p(d)
    assert p == pytest.approx(hits / len(patterns) if repeats <= 16 else (hits + 1) / (len(patterns) + 1))


def test_the_order_test_reaches_alpha_from_6_repeats():
    assert [r for r in range(1, 10) if order_test_reaches(r, 0.05)] == [6, 7, 8, 9]
    assert order_test_reaches(2, 0.6) and not order_test_reaches(5, 0.0625)


def test_a_difference_the_random_orders_alone_could_give_is_no_winner():
    """Six repeats, five of them +5% and one -0.1%: the paired t says p = 0.0045 and every replication block is
    ahead, but 4 of the 64 orders the repeats could have had give a sum as large: no winner, the default kept, nothing
    recommended. Seven repeats all ahead, or five (where no order test reaches p < 0.05), still decide."""
    d = decide(_runs([0.05] * 5 + [-0.001]), default="a")
    assert d.comparison.p_value < 0.01 and d.comparison.significant
    assert d.winner is None and d.choice == "a" and d.kept_default and not d.significant
    assert not d.recommendable and d.replicated is None
    assert "sign-flip p = 0.062" in d.reason and "64 orders its 6 repeats" in d.reason
    seven = decide(_runs([0.05, 0.051, 0.049, 0.05, 0.052, 0.048, 0.05]), default="a")
    assert seven.winner == "b" and seven.recommendable
    five = decide(_runs([0.05, 0.051, 0.049, 0.05, 0.02]), default="a")
    assert five.winner == "b"


def test_the_order_test_also_holds_the_default_leaving_and_a_preference():
    """Three arms, 6 repeats: c is far ahead of b in every repeat, and ahead of the default a in five of six; the
    order test keeps c from beating a, so a is kept (without it, a would be left for c)."""
    a = [1000.0] * 6
    c = [1000.0 * math.exp(x) for x in [0.05] * 5 + [-0.001]]
    b = [900.0] * 6
    d = decide({"a": a, "b": b, "c": c}, default="a")
    assert d.winner is None and d.choice == "a" and d.kept_default and not d.significant


def test_the_repeats_advice_adds_the_one_the_order_test_needs_at_6():
    """Where the t alone would find a 5% difference with 80% power in 6 repeats, the advice is 7: in 6 the order
    test needs every repeat the same way."""
    z = np.array([-1.5, -0.9, -0.3, 0.3, 0.9, 1.5, -1.2, 1.2])
    cv = 0.02
    d_ratios = (z / z.std(ddof=1)) * cv * math.sqrt(2.0)  # sd of the log-ratios = cv * sqrt 2
    d = decide(_runs(list(d_ratios)), default="a")
    assert d.cv == pytest.approx(cv)
    assert recommended_repeats(cv, 0.05, n_variants=2) == 6 and d.recommended_repeats == 7


def test_two_identical_arms_give_at_most_alpha_false_winners_under_a_drift_between_their_runs():
    """Two identical arms on a machine whose runs are quiet (1% step noise) but whose level drifts by 5% over a few
    hundred steps, 6 interleaved repeats in random orders: the paired t and replication alone name a false winner in
    6.5% of such A/Bs (6.1-6.8% over 20,000 in the benchmark); with the order test at most 5% (3.1% there)."""
    model = sim.NoiseModel(cv=0.01, drift_amp=0.05)
    reps = 2000
    y = sim.sweep(np.random.default_rng(6), reps, [0.0, 0.0], 6, model, "random").mean(-1)
    winners = t_winners = 0
    for i in range(reps):
        d = decide({"a": [float(v) for v in y[i, :, 0]], "b": [float(v) for v in y[i, :, 1]]}, default="a")
        winners += d.winner is not None
        c = d.comparisons[0]
        lo, hi = (y[i, :, 0], y[i, :, 1]) if d.ranking[0][0] == "b" else (y[i, :, 1], y[i, :, 0])
        t_winners += bool(c.significant and c.verdict == "better" and replicated_blocks(np.log(hi / lo)))
    print(f"\n{reps} A/Bs of identical arms, 6 repeats, quiet runs under a drift: false winners {winners / reps:.1%}; "
          f"the paired t and replication alone {t_winners / reps:.1%}")
    assert t_winners / reps > 0.05  # the drift does make the t alone exceed alpha here
    assert winners / reps <= 0.05
