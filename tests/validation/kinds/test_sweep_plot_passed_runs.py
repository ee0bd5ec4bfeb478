"""A sweep's bar chart (validation.kinds.sweep) against the report's own rule for a point's throughput: a failed
run's partial window is no measurement of its point, so it is neither a bar of its own nor pooled into its point's
bar (which would show the point kept, or a point that crashed, as a loser)."""

from __future__ import annotations

import pytest

from validation.kinds import get


def _run(label: str, repeat: int, toks: float, status: str = "passed") -> dict:
    return {"label": label, "repeat": repeat, "status": status, "params": {"env.NSA_DDP_BUCKET_MB": label[-2:]},
            "metrics": {"toks_per_s": {"mean": toks, "stdev": 1.0, "n": 20}}}


class Bars:
    """A plotter that keeps the bars it is asked to draw."""

    def __init__(self):
        self.points = None

    def bars(self, points, **kw):
        self.points = points


def test_failed_runs_are_no_bars_of_the_sweep_chart():
    kept, other, crashed = "NSA_DDP_BUCKET_MB=50", "NSA_DDP_BUCKET_MB=25", "NSA_DDP_BUCKET_MB=99"
    # 50: 1,000 tokens/s in its passed repeat, 100 in the partial window of the repeat that crashed early;
    # 99: its only two runs crashed
    step = {"name": "sw", "kind": "sweep", "status": "failed",
            "runs": [_run(kept, 0, 1000.0), _run(other, 0, 990.0), _run(kept, 1, 100.0, "failed"),
                     _run(other, 1, 1010.0), _run(crashed, 0, 50.0, "failed"), _run(crashed, 1, 60.0, "failed")],
            "choice": {"label": kept, "params": {"env.NSA_DDP_BUCKET_MB": "50"}, "significant": False,
                       "kept_default": True, "explanation": "no significant difference"},
            "metrics": {"points": 3}}
    sweep = get("sweep")
    plotter = Bars()
    sweep.plots("sw", sweep.read(step), plotter)
    bars = {label: (tick, mean) for tick, mean, _, label in plotter.points}
    assert set(bars) == {kept, other}  # the point whose runs all failed has no bar
    assert bars[kept] == ("50", pytest.approx(1000.0))  # its passed run alone, not (1,000 + 100) / 2 = 550
    # both passed, pooled as the key figure pools them (their work over their time): 2 / (1/990 + 1/1,010) = 999.9
    assert bars[other] == ("25 (x2)", pytest.approx(999.9, rel=1e-12))
