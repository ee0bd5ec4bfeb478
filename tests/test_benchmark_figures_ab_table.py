"""benchmarks/ab_table.py's figures from constructed bench_attention JSON (one file per arm, round and case, as
reports/gpu/next_run.sh names them): the ratio is choice / baseline of the medians (below 1: the choice is faster),
a verdict needs two complete rounds, and a median outside its physical range is shown as missing, never as a
ratio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark_scripts import load

ab = load("ab_table")


def _write(folder: Path, name: str, ms: dict[str, float]) -> None:
    """A bench_attention --json of one timed case whose medians (ms) are `ms`; min and max around them."""
    times = {m: {"min": v / 1e3 * 0.9, "median": v / 1e3, "max": v / 1e3 * 1.1} for m, v in ms.items()}
    (folder / name).write_text(json.dumps({"results": [{"path": "nsa-triton", "seq_len": 64, "times_s": times}]}))


def _one(folder: Path) -> dict:
    (rec,) = ab.comparisons(folder, ("shipped",))
    return rec


def test_one_round_decides_nothing(tmp_path):
    """next_run.sh's rule is 'faster in both rounds'; a round skipped for time leaves no file, so one round alone
    must not read "faster in every round"."""
    _write(tmp_path, "layer_shipped_r1_65536.json", {"fwd": 4.0, "bwd": 6.0, "fwdbwd": 10.0})
    _write(tmp_path, "layer_auto_r1_65536.json", {"fwd": 3.0, "bwd": 5.0, "fwdbwd": 8.0})
    rec = _one(tmp_path)
    assert rec["rounds"][0]["ratio"] == pytest.approx({"fwd": 0.75, "bwd": 5 / 6, "fwdbwd": 0.8})
    assert rec["verdict"] == "incomplete"
    # the second round completes it: the ratios are choice / baseline of each round's medians
    _write(tmp_path, "layer_shipped_r2_65536.json", {"fwd": 4.0, "bwd": 6.0, "fwdbwd": 10.0})
    _write(tmp_path, "layer_auto_r2_65536.json", {"fwd": 5.0, "bwd": 4.0, "fwdbwd": 9.0})
    rec = _one(tmp_path)
    assert [r["ratio"]["fwdbwd"] for r in rec["rounds"]] == pytest.approx([0.8, 0.9])
    assert rec["verdict"] == "faster in every round"  # judged on fwd+bwd, though round 2's forward was slower


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_median_outside_its_range_is_no_ratio(tmp_path, bad):
    """A zero, negative or non-finite median is no time: shown as "-" and the comparison incomplete, never a ratio
    of 0 (which would read as infinitely faster)."""
    for r in (1, 2):
        _write(tmp_path, f"layer_shipped_r{r}_65536.json", {"fwd": 4.0, "bwd": 6.0, "fwdbwd": 10.0})
    _write(tmp_path, "layer_auto_r1_65536.json", {"fwd": 3.0, "bwd": 5.0, "fwdbwd": 8.0})
    _write(tmp_path, "layer_auto_r2_65536.json", {"fwd": 3.0, "bwd": bad, "fwdbwd": bad})
    rec = _one(tmp_path)
    assert "fwdbwd" not in rec["rounds"][1]["ratio"] and rec["rounds"][1]["choice_ms"].get("fwdbwd") is None
    assert rec["verdict"] == "incomplete"
    text = ab.table([rec])
    assert "| layer | 65536 | auto vs shipped | 2 | 10.000, - | - | 0.750 | **incomplete** |" in text


def test_the_verdict_uses_one_mode_in_every_round(tmp_path):
    """A comparison whose files time a backward is judged on fwd+bwd in every round: a round without it is a
    missing figure, not judged on its forward instead; a forward-only comparison is judged on the forward."""
    for r in (1, 2):
        _write(tmp_path, f"layer_shipped_r{r}_65536.json", {"fwd": 4.0, "bwd": 6.0, "fwdbwd": 10.0})
    _write(tmp_path, "layer_auto_r1_65536.json", {"fwd": 5.0, "bwd": 3.0, "fwdbwd": 8.0})
    _write(tmp_path, "layer_auto_r2_65536.json", {"fwd": 3.0})  # no backward in round 2
    assert _one(tmp_path)["verdict"] == "incomplete"
    for r, (base, choice) in enumerate(((4.0, 3.0), (4.0, 5.0)), 1):  # forward only (nsa-flex on CPU)
        _write(tmp_path, f"layer_shipped_r{r}_65536.json", {"fwd": base})
        _write(tmp_path, f"layer_auto_r{r}_65536.json", {"fwd": choice})
    rec = _one(tmp_path)
    assert [x["ratio"] for x in rec["rounds"]] == [pytest.approx({"fwd": 0.75}), pytest.approx({"fwd": 1.25})]
    assert rec["verdict"] == "mixed"
