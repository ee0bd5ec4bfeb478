"""A sweep's ranking shows each variant's level as its comparison does: for a rate (tokens/s of runs of equal work)
the runs' work over their time, so the ranking and the comparison never name different figures or a different best."""

from __future__ import annotations

import pytest

from validation.analysis.significance import decide


def _work_over_time(run_rates):
    # each run does the same work W: total time = sum(W / rate), so the level is n W / total time
    return len(run_rates) / sum(1.0 / r for r in run_rates)


def test_rate_ranking_is_work_over_time_not_the_plain_mean():
    # "steady" is faster in total: 2 runs of W take 2 W / 400, "erratic" 1 W / 100 + 1 W / 1000 = 11 W / 1000;
    # the plain mean of its run rates (550) would rank it first although it took longer
    runs = {"erratic": [100.0, 1000.0], "steady": [400.0, 400.0]}
    d = decide(runs, default="erratic", metric="toks_per_s")
    levels = dict(d.ranking)
    assert levels["erratic"] == pytest.approx(_work_over_time([100.0, 1000.0]))
    assert levels["steady"] == pytest.approx(400.0)
    assert d.ranking[0][0] == "steady"


def test_ranking_level_matches_the_comparison_mean():
    runs = {"a": [900.0, 1100.0, 1000.0], "b": [950.0, 1000.0, 1200.0]}
    d = decide(runs, default="a", metric="toks_per_s")
    best, other = d.ranking[0][0], d.ranking[1][0]
    c = next(c for c in d.comparisons if c.variant == best and c.baseline == other)
    assert dict(d.ranking)[best] == pytest.approx(c.mean_b)
    assert dict(d.ranking)[other] == pytest.approx(c.mean_a)


def test_a_metric_that_is_not_a_rate_keeps_the_plain_mean():
    runs = {"a": [1.0, 3.0], "b": [2.5, 2.5]}
    d = decide(runs, default="a", metric="loss", higher_is_better=False)
    assert dict(d.ranking)["a"] == pytest.approx(2.0)
    assert d.ranking[0][0] == "a"


@pytest.mark.parametrize("metric", ["toks_per_s_per_gpu", "toks_per_s_per_node"])
def test_tokens_per_gpu_and_per_node_are_rates_too(metric):
    # a fixed world size (or node count) divides tokens/s: its runs' figure is their work over their time as well
    runs = {"erratic": [100.0, 1000.0], "steady": [400.0, 400.0]}
    d = decide(runs, default="erratic", metric=metric)
    assert dict(d.ranking)["erratic"] == pytest.approx(_work_over_time([100.0, 1000.0]))
    assert d.ranking[0][0] == "steady"
