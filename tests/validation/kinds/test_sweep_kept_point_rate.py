"""The sweep's key figure for the point it keeps, against a hand figure: the point's tokens/s over its repeats is
their work over their time (each repeat one window of the same work), as a window's own figure is, not the plain
mean of the repeats' figures."""

from __future__ import annotations

import re

import pytest

from validation.kinds import get


def _run(label: str, repeat: int, toks: float) -> dict:
    return {"label": label, "repeat": repeat, "status": "passed", "params": {"env.NSA_DDP_BUCKET_MB": label[-2:]},
            "metrics": {"toks_per_s": {"mean": toks, "n": 20},
                        "interference": {"disturbed": False, "share": 0.0}}}


def test_the_kept_points_tokens_per_s_is_its_repeats_work_over_their_time():
    kept = "NSA_DDP_BUCKET_MB=50"
    step = {"name": "sw", "kind": "sweep", "status": "passed",
            "runs": [_run(kept, 0, 190.0), _run("NSA_DDP_BUCKET_MB=25", 0, 150.0), _run(kept, 1, 90.0),
                     _run("NSA_DDP_BUCKET_MB=25", 1, 120.0)],
            "choice": {"label": kept, "params": {"env.NSA_DDP_BUCKET_MB": "50"}, "significant": False,
                       "kept_default": True, "explanation": "no significant difference"},
            "metrics": {"points": 2}}
    # 40,960 tokens a window at 190 and at 90 tokens/s: 215.58 s + 455.11 s for 81,920 tokens = 122.1 tokens/s
    tokens = 40_960.0
    by_hand = 2 * tokens / (tokens / 190.0 + tokens / 90.0)
    assert by_hand == pytest.approx(122.142857, rel=1e-6)
    sweep = get("sweep")
    (figure,) = sweep.key_figures([sweep.read(step)])
    shown = re.search(r"step `sw`, ([\d,.]+) tokens/s", figure.note)
    assert shown is not None, figure.note
    assert float(shown.group(1).replace(",", "")) == pytest.approx(by_hand, abs=0.051)  # shown to one decimal
