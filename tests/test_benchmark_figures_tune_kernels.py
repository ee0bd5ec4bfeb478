"""benchmarks/tune_kernels.py's figures from known timings: the shipped configuration and the candidate alternated
(shipped, candidate, shipped, ...), the warm-up passes left out, min / median / max of each, the ratio of the
fwd + bwd medians (candidate over shipped); and its correctness flag: a candidate whose outputs hold a NaN is WRONG,
whatever finite values sit beside it."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from benchmark_scripts import load

tune = load("tune_kernels")


def test_a_nan_in_the_candidates_outputs_is_wrong():
    shipped = [torch.tensor([1.0, -4.0]), torch.tensor([2.0, 2.0])]
    close = [torch.tensor([1.0, -3.96]), torch.tensor([2.0, 2.01])]
    assert tune.max_rel_diff(close, shipped) == pytest.approx(max(0.04 / 4.0, 0.01 / 2.0))
    for nan_at in (0, 1):  # before or after a finite difference: max() must not drop it
        got = [t.clone() for t in close]
        got[nan_at][0] = float("nan")
        diff = tune.max_rel_diff(got, shipped)
        assert math.isnan(diff)
        assert not diff <= tune.WRONG  # the row's "wrong" rule
    got = [t.clone() for t in close]
    got[1][1] = float("inf")
    assert math.isnan(tune.max_rel_diff(got, shipped))


@pytest.mark.parametrize("nan", [False, True])
def test_the_arms_alternate_after_the_warm_up_and_the_ratio_is_of_the_medians(nan, monkeypatch):
    """nan: the candidate's window output is NaN (a configuration that reads what it never wrote): WRONG."""
    from nsa.attention.kernels.range_attn import host as tr

    # the branches as cheap functions of every input (the gradients reach each leaf), the patch recorded
    state = {"candidate": False}
    monkeypatch.setattr(tr, "window_attention", lambda q, k, v, w: q * (math.nan if nan and state["candidate"] else 1)
                        + 0 * (k.sum() + v.sum()))
    monkeypatch.setattr(tr, "compressed_attention", lambda q, kc, vc, l, d: q + 0 * (kc.sum() + vc.sum()))
    arms = []

    def patch(family, cand):
        state["candidate"] = True
        return lambda: state.update(candidate=False)

    monkeypatch.setattr(tune, "_patch", patch)
    # (fwd, bwd) seconds of each pass in order: the two compiling passes, then warm-up 1 and repeats 3, each round
    # shipped then candidate
    passes = [(9.0, 9.0), (8.0, 8.0),
              (5.0, 5.0), (6.0, 6.0),  # warm-up: never timed
              (0.010, 0.030), (0.004, 0.010),
              (0.012, 0.020), (0.005, 0.011),
              (0.011, 0.040), (0.030, 0.001)]
    stamps = []
    for f, b in passes:
        stamps += [f, b]
    clock = {"now": 0.0, "calls": 0}

    def perf_counter():
        # one() reads the clock three times: start, after the forward, after the backward
        i = clock["calls"]
        clock["calls"] += 1
        if i % 3 == 0:
            arms.append("candidate" if state["candidate"] else "shipped")
        else:
            clock["now"] += stamps[(i // 3) * 2 + (i % 3) - 1]
        return clock["now"]

    monkeypatch.setattr(tune, "time", SimpleNamespace(perf_counter=perf_counter))
    row = tune.run_case("range_q", 1, 64, 1, device="cpu", dtype_name="fp32", repeats=3, warmup=1)
    assert arms == ["shipped", "candidate"] * 5
    assert row["shipped"]["fwd"] == pytest.approx({"min": 0.010, "median": 0.011, "max": 0.012})
    assert row["candidate"]["bwd"] == pytest.approx({"min": 0.001, "median": 0.010, "max": 0.011})
    # fwd + bwd: shipped 0.040, 0.032, 0.051 (median 0.040); candidate 0.014, 0.016, 0.031 (median 0.016)
    assert row["ratio_fwdbwd"] == pytest.approx(0.016 / 0.040)
    assert row["repeats"] == 3 and row["candidate_index"] == 1 and row["config"] == "[64, 64, 4, 2]"
    if nan:
        assert math.isnan(row["max_rel_diff"]) and row["wrong"] is True
    else:
        assert row["max_rel_diff"] == 0.0 and row["wrong"] is False


def test_a_case_that_failed_is_recorded_and_the_run_exits_1(monkeypatch, tmp_path, capsys):
    rows = {1: {"family": "range_q", "candidate": 1, "candidate_index": 1, "seq_len": 64, "batch": 1,
                "error": "timeout 300 s"}}

    def spawn(family, cand, s, b, args):  # a measured row as run_case writes it: "candidate" holds its times
        times = {m: {"min": 0.001, "median": 0.002, "max": 0.003} for m in ("fwd", "bwd")}
        return rows.get(cand) or {"family": family, "candidate_index": cand, "config": "bn32", "seq_len": s,
                                  "batch": b, "max_rel_diff": 0.0, "wrong": False, "ratio_fwdbwd": 0.5,
                                  "shipped": times, "candidate": times}

    monkeypatch.setattr(tune, "_spawn", spawn)
    out = tmp_path / "t" / "tiles.json"
    argv = ["--device", "cpu", "--families", "range_q", "--candidates", "1,bn32", "--seq-lens", "64", "--batch", "1",
            "--json", str(out)]
    assert tune.main(argv) == 1
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "reproduce: python benchmarks/tune_kernels.py " + " ".join(argv)
    assert "#1 [64, 64, 4, 2]: timeout 300 s" in text and "fwd+bwd ratio 0.500" in text
    data = json.loads(out.read_text())
    assert [("error" in r, r["candidate_index"]) for r in data] == [(True, 1),
                                                                     (False, tune.FAMILIES["range_q"].index("bn32"))]
    rows.clear()
    assert tune.main(argv) == 0  # every case measured
