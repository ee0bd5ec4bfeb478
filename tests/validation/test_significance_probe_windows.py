"""validation.analysis.significance.windows: the window figure of one launch from its stored summary statistic, and
never from a JSON true/false standing where results.json holds a number."""

from __future__ import annotations

import pytest

from validation.analysis.significance.windows import compare_windows, window_figure

# 2,048-token steps at these rates: 8 steps, 16,384 tokens in 2,048 (1 / 1000 + 1 / 800 + ...) seconds
RATES = [1000.0, 800.0, 1000.0, 800.0, 1000.0, 800.0, 1000.0, 800.0]
TOKENS_OVER_TIME = 8 / (4 / 1000.0 + 4 / 800.0)  # 888.88...: the harmonic mean


def test_the_stored_figure_is_used_when_it_covers_the_values():
    assert TOKENS_OVER_TIME == pytest.approx(8000.0 / 9.0, rel=1e-15)
    assert window_figure(RATES) == pytest.approx(TOKENS_OVER_TIME, rel=1e-12)
    assert window_figure(RATES, {"mean": 890.5, "n": 8}) == 890.5
    assert window_figure(RATES, {"mean": 890, "n": 8}) == 890.0
    assert window_figure(RATES, {"mean": 890.5, "n": 7}) == pytest.approx(TOKENS_OVER_TIME, rel=1e-12)


@pytest.mark.parametrize("stored", [{"mean": True, "n": 8}, {"mean": False, "n": 8}])
def test_a_boolean_mean_is_no_figure(stored):
    """A damaged summary with `"mean": true` gave the launch a figure of 1 token/s (and compare a -99.9% change)."""
    assert window_figure(RATES, stored) == pytest.approx(TOKENS_OVER_TIME, rel=1e-12)
    c = compare_windows(RATES, RATES, stored_a=stored, higher_is_better=True)
    assert c.mean_a == pytest.approx(TOKENS_OVER_TIME, rel=1e-12)
    assert c.rel == pytest.approx(0.0, abs=1e-12)


def test_a_boolean_count_covers_no_window():
    """`"n": true` equals 1 in Python: it made a one-step window take the stored mean."""
    assert window_figure([500.0], {"mean": 123.0, "n": True}) == 500.0
    assert window_figure([500.0], {"mean": 123.0, "n": 1}) == 123.0


HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"


def _csv(path, rates):
    lines = [HEADER] + [f"{i},9.0,0.001,{r!r},{2048 / r!r},1.5,2.0,3.0" for i, r in enumerate(rates, 1)]
    path.write_text("\n".join(lines) + "\n")


def test_launch_series_takes_the_recorded_window_after_its_warmup(tmp_path):
    """60 steps at 1000 + step tokens/s, summarised over the last 20 after 10 warm-up steps: steps 41..60."""
    from validation.analysis import metrics
    from validation.analysis.significance.windows import launch_series

    _csv(tmp_path / "training.csv", [1000.0 + i for i in range(1, 61)])
    m = {"csv": "training.csv", "window": {"last": 20, "warmup": 10, "n": 20}}
    assert launch_series(tmp_path, m) == [1000.0 + i for i in range(41, 61)]
    # a window longer than the steps after the warm-up: all of them (steps 11..60)
    m = {"csv": "training.csv", "window": {"last": 80, "warmup": 10}}
    assert launch_series(tmp_path, m) == [1000.0 + i for i in range(11, 61)]
    # nothing recorded: the decision's step window when given, else the last 50 steps
    assert launch_series(tmp_path, {"csv": "training.csv"}, default=metrics.Window(5, 0)) == [
        1000.0 + i for i in range(56, 61)]
    assert launch_series(tmp_path, {"csv": "training.csv"}) == [1000.0 + i for i in range(11, 61)]


@pytest.mark.parametrize("window", [{"last": True, "warmup": 10}, {"last": 20, "warmup": True}])
def test_a_boolean_window_is_unusable(tmp_path, window):
    """`"last": true` was read as int(True) = 1, a one-step window (and `"warmup": true` as one warm-up step); an
    unusable window takes the decision's step window (else nothing), as the docstring says."""
    from validation.analysis import metrics
    from validation.analysis.significance.windows import launch_series

    _csv(tmp_path / "training.csv", [1000.0 + i for i in range(1, 61)])
    m = {"csv": "training.csv", "window": window}
    assert launch_series(tmp_path, m, default=metrics.Window(20, 10)) == [1000.0 + i for i in range(41, 61)]
    assert launch_series(tmp_path, m) == []
