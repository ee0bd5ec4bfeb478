"""The bars of a sweep's and an A/B's chart (validation.kinds._plot_helpers.bar_points) against the figures their
tables show, hand-computed: repeats pooled as their work over their time (the harmonic mean of their tokens/s, as
metrics.window_mean pools a rate), from the runs that passed, of those the ones measured undisturbed where any was;
the error bar the population stdev of the pooled runs' means."""

from __future__ import annotations

import math

import pytest

from validation.kinds import get
from validation.kinds._plot_helpers import bar_points
from validation.kinds.ab import pooled_summary

QUIET = {"disturbed": False, "share": 0.0, "text": "no interference"}
BUSY = {"disturbed": True, "share": 0.75, "text": "one busy neighbour"}


def _run(label, repeat, mean, status="passed", interference=QUIET, params=None):
    return {"label": label, "repeat": repeat, "status": status, "params": params or {},
            "metrics": {"toks_per_s": {"mean": mean, "stdev": 5.0, "n": 20}, "throughput_stable": True,
                        "interference": interference}}


def test_repeats_are_pooled_as_work_over_time_from_the_runs_the_tables_count():
    """baseline: 100 and 300 tokens/s (equal work each): 2 units of work in 1/100 + 1/300 = 4/300 time units, 150
    tokens/s (the plain mean says 200), error bar 100 (the population stdev of 100 and 300). variant: 400 and 200
    passed, a failed run's 10 and a disturbed repeat's 50 left out: 2 / (1/400 + 1/200) = 266.67 tokens/s."""
    runs = [_run("baseline", 0, 100.0), _run("variant", 0, 400.0), _run("variant", 1, 10.0, status="failed"),
            _run("baseline", 1, 300.0), _run("variant", 2, 200.0), _run("variant", 3, 50.0, interference=BUSY)]
    points = {p[3]: p for p in bar_points(runs)}
    assert points["baseline"][:2] == ("baseline (x2)", pytest.approx(150.0, rel=1e-12))
    assert points["baseline"][2] == pytest.approx(100.0, rel=1e-12)
    assert points["variant"][:2] == ("variant (x2)", pytest.approx(800.0 / 3.0, rel=1e-12))
    assert points["variant"][2] == pytest.approx(100.0, rel=1e-12)
    # the A/B's pooled summary (its metrics' figure of each side) is the bar
    for label in ("baseline", "variant"):
        assert points[label][1] == pytest.approx(pooled_summary(runs, label)["toks_per_s"]["mean"], rel=1e-12)


def test_a_label_measured_only_under_interference_keeps_its_runs_and_a_failed_label_has_no_bar():
    runs = [_run("a", 0, 100.0, interference=BUSY), _run("a", 1, 300.0, interference=BUSY),
            _run("b", 0, 80.0, status="failed")]
    ((tick, mean, err, label),) = bar_points(runs)
    assert (tick, label) == ("a (x2)", "a") and math.isclose(mean, 150.0) and math.isclose(err, 100.0)


class _Plotter:
    def __init__(self):
        self.bars_drawn = []

    def bars(self, points, **kwargs):
        self.bars_drawn.append(points)
        self.colors = {p[3]: kwargs["colors"](i, p[3]) for i, p in enumerate(points)}


def test_the_sweep_chart_shows_its_key_figure_and_the_ab_chart_its_pooled_summary():
    """A sweep of two repeats: 50 MB ran at 1,000 and 3,000 tokens/s: its key figure says 1,500 tokens/s (the work
    over the time), and so does its bar. An A/B's bars are its pooled summaries (a failed run left out)."""
    sweep = get("sweep")
    params = {"env.NSA_DDP_BUCKET_MB": "50"}
    choice = {"label": "NSA_DDP_BUCKET_MB=50", "params": params, "significant": False, "kept_default": True,
              "explanation": "kept"}
    step = {"name": "sw", "kind": "sweep", "status": "passed", "choice": choice, "winner": None,
            "runs": [_run("NSA_DDP_BUCKET_MB=50", r, m, params=params) for r, m in ((0, 1_000.0), (1, 3_000.0))],
            "metrics": {"points": 1, "passed": 2}}
    (figure,) = sweep.key_figures([sweep.read(step)])
    assert "1,500" in figure.note
    plotter = _Plotter()
    sweep.plots("sw", sweep.read(step), plotter)
    ((bar,),) = plotter.bars_drawn
    assert bar[0] == "50 (x2)" and bar[1] == pytest.approx(1_500.0, rel=1e-12)

    ab = get("ab")
    runs = [_run("baseline", 0, 1_000.0), _run("fused", 0, 1_200.0), _run("baseline", 1, 3_000.0),
            _run("fused", 1, 600.0, status="failed"), _run("fused", 2, 2_400.0)]
    plotter = _Plotter()
    ab.plots("ab", ab.read({"name": "ab", "kind": "ab", "status": "passed", "runs": runs}), plotter)
    ((first, second),) = plotter.bars_drawn
    heights = {first[3]: first[1], second[3]: second[1]}
    assert heights == {"baseline": pytest.approx(1_500.0, rel=1e-12), "fused": pytest.approx(1_600.0, rel=1e-12)}


def test_the_ab_chart_colours_the_baseline_whatever_ran_first():
    """Each repeat runs the sides in a random order, so the variant's run may come first (its bar first): the
    baseline's bar is the baseline's colour all the same."""
    ab = get("ab")
    runs = [_run("fused", 0, 1_200.0), _run("baseline", 0, 1_000.0)]
    plotter = _Plotter()
    ab.plots("ab", ab.read({"name": "ab", "kind": "ab", "status": "passed", "runs": runs}), plotter)
    assert [p[3] for p in plotter.bars_drawn[0]] == ["fused", "baseline"]
    assert plotter.colors == {"baseline": "tab:blue", "fused": "tab:orange"}
