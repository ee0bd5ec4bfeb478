"""benchmarks/bench_choices.py: the layer's launch choices against a baseline arm in one process, round by round
(ABBA: the baseline first in odd rounds, the arm first in even ones), each block under its own choices and every
other choice as at the start; a crash loses only the arm in progress (--resume); and benchmarks/ab_table.py reads
its JSON into the same verdicts as the other A/Bs of a GPU run.

The blocks are stubbed where a test is about the order and the choices (what the process-wide X_CHOICE holds while
each block runs); one real CPU run (the PyTorch path's top-n_sel choice, S 64) checks the JSON end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark_scripts import load

bc = load("bench_choices")
ab = load("ab_table")


def _block(ms: float) -> dict:
    t = ms / 1e3
    return {"times_s": {m: {"min": t, "median": t, "max": t} for m in ("fwd", "bwd", "fwdbwd")}, "passes": 1}


@pytest.fixture
def blocks(monkeypatch):
    """measure_block replaced: records the top-n_sel choice in effect for each block, returns a time per choice
    (sort 10 ms, topk 8 ms), or raises for an arm named in `fail`."""
    from nsa.attention import selection

    seen, fail = [], {}

    def measure(one, warmup, repeats, device):
        choice = selection.TOPK_CHOICE
        seen.append(choice)
        if choice in fail:
            raise fail[choice]
        return _block({"sort": 10.0, "topk": 8.0, "auto": 10.0}[choice])

    monkeypatch.setattr(bc, "measure_block", measure)
    monkeypatch.setattr(bc, "layer_pass", lambda args: None)
    return seen, fail


ARGS = ["--path", "nsa-torch", "--seq-len", "64", "--arm", "sort=topk-choice:sort", "--arm", "topk=topk-choice:topk"]


def test_each_round_runs_the_baseline_and_the_arm_adjacent_in_abba_order_under_their_own_choices(blocks, tmp_path):
    from nsa.attention import selection

    seen, _ = blocks
    out = tmp_path / "c.json"
    assert bc.main([*ARGS, "--rounds", "4", "--json", str(out)]) == 0
    assert seen == ["sort", "topk", "topk", "sort", "sort", "topk", "topk", "sort"]
    assert selection.TOPK_CHOICE == "auto"  # every choice back to its value at the start
    data = json.loads(out.read_text())
    arm = data["arms"]["topk"]
    assert [r["first"] for r in arm["rounds"]] == ["baseline", "arm", "baseline", "arm"]
    assert [r["ratio"]["fwdbwd"] for r in arm["rounds"]] == [pytest.approx(0.8)] * 4
    assert arm["verdict"] == "faster in every round" and arm["choices"]["topk_choice"] == "topk"
    assert data["in_progress"] is None and data["baseline"] == "sort"


def test_an_arm_with_the_baselines_choices_in_effect_is_named_an_aa_comparison(blocks, tmp_path):
    out = tmp_path / "c.json"
    # "auto" resolves to the qualified top-n_sel choice, sort: the same kernels as the baseline
    assert bc.main([*ARGS, "--arm", "shipped", "--json", str(out)]) == 0
    arms = json.loads(out.read_text())["arms"]
    assert "A/A" in arms["shipped"]["note"] and "note" not in arms["topk"]
    assert arms["shipped"]["verdict"] == "mixed"  # equal medians: a tie is neither faster nor slower


def test_a_failed_arm_is_recorded_and_the_others_still_measured(blocks, tmp_path, capsys):
    seen, fail = blocks
    fail["topk"] = RuntimeError("Triton Error [CUDA]: an illegal memory access\nmore")
    out = tmp_path / "c.json"
    assert bc.main([*ARGS, "--arm", "again=topk-choice:sort", "--json", str(out)]) == 1
    arms = json.loads(out.read_text())["arms"]
    assert arms["topk"]["error"] == "RuntimeError: Triton Error [CUDA]: an illegal memory access"
    assert "verdict" not in arms["topk"] and arms["again"]["verdict"] == "mixed"
    assert "topk: failed" in capsys.readouterr().out


def test_resume_keeps_finished_arms_marks_the_one_in_progress_crashed_and_measures_the_rest(blocks, tmp_path):
    seen, _ = blocks
    out = tmp_path / "c.json"
    args = [*ARGS, "--arm", "again=topk-choice:sort", "--json", str(out)]
    assert bc.main(args) == 0
    data = json.loads(out.read_text())
    # as a process killed while measuring "topk" leaves it: "again" not started, "topk" without rounds
    data["arms"] = {"topk": {**data["arms"]["topk"], "rounds": data["arms"]["topk"]["rounds"][:1]}}
    data["arms"]["topk"].pop("verdict")
    data["in_progress"] = "topk"
    out.write_text(json.dumps(data))
    seen.clear()
    assert bc.main([*args, "--resume", str(out)]) == 1  # the crashed arm is a failure
    assert seen == ["sort", "sort", "sort", "sort"]  # only "again" (whose choice is sort) was measured
    arms = json.loads(out.read_text())["arms"]
    assert arms["topk"]["error"].startswith("crashed") and arms["again"]["verdict"] == "mixed"
    rec = {r["choice"]: r for r in ab.choices_records(tmp_path, out)}
    assert rec["topk"]["verdict"] == "incomplete" and rec["topk"]["rounds"][-1]["failed"].startswith("crashed")


def test_resume_refuses_another_measurement(blocks, tmp_path):
    out = tmp_path / "c.json"
    assert bc.main([*ARGS, "--json", str(out)]) == 0
    with pytest.raises(SystemExit, match="seq_len differ"):
        bc.main([*ARGS[:3], "128", *ARGS[4:], "--json", str(out), "--resume", str(out)])


@pytest.mark.parametrize("arm,says", [
    ("x=topk-choice:top", "expected auto or one of sort, topk"),
    ("x=topk:sort", "is not FLAG:VALUE"),
    ("x=topk-choice", "is not FLAG:VALUE"),
    ("x=topk-choice:sort,topk-choice:topk", "topk-choice given twice"),
    ("x=", "nothing after '='"),
    ("=topk-choice:sort", "a name first"),
    ("a/b", "a name first"),
])
def test_a_malformed_arm_is_refused_naming_what_is_wrong(arm, says):
    with pytest.raises(ValueError, match=says):
        bc.parse_arm(arm)


@pytest.mark.parametrize("argv,says", [
    (["--arm", "only"], "at least two --arm"),
    (["--arm", "a", "--arm", "a=topk-choice:topk"], "a named more than once"),
    (["--path", "nsa-torch", "--arm", "a", "--arm", "b=sel-dq-choice:query"], "nsa-triton only: b (sel-dq-choice)"),
    (["--arm", "a", "--arm", "b", "--rounds", "0"], "must be >= 1"),
])
def test_the_command_line_refuses_what_would_measure_nothing_or_the_wrong_thing(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        bc.main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_dry_run_lists_the_arms_and_measures_nothing(capsys):
    assert bc.main(["--device", "cuda", "--arm", "shipped", "--arm", "dq=sel-dq-choice:query", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "shipped: every choice as shipped  (baseline)" in out and "dq: sel-dq-choice query" in out


def test_a_real_cpu_run_gives_ab_table_its_rounds_and_verdict(tmp_path, capsys):
    """End to end on the PyTorch path (its top-n_sel choice): the JSON's medians, ratios and verdicts are read back
    by ab_table, which recomputes each ratio from the two blocks' medians."""
    out = tmp_path / "choices.json"
    assert bc.main(["--path", "nsa-torch", "--seq-len", "64", "--arm", "sort=topk-choice:sort", "--arm",
                    "topk=topk-choice:topk", "--rounds", "2", "--repeats", "1", "--warmup", "0",
                    "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rounds = data["arms"]["topk"]["rounds"]
    assert len(rounds) == 2 and all(r["baseline"]["passes"] == r["arm"]["passes"] == 1 for r in rounds)
    assert all(r[side]["loss"] > 0 and r[side]["grad_norm"] > 0 for r in rounds for side in ("baseline", "arm"))
    (rec,) = ab.choices_records(tmp_path, out)
    assert rec["choice"] == "topk" and rec["baseline"] == "sort" and rec["case"] == "64b1"
    for got, r in zip(rec["rounds"], rounds):
        want = r["arm"]["times_s"]["fwdbwd"]["median"] / r["baseline"]["times_s"]["fwdbwd"]["median"]
        assert got["ratio"]["fwdbwd"] == pytest.approx(want)
    assert rec["verdict"] == ab.round_verdict([g["ratio"]["fwdbwd"] for g in rec["rounds"]])
    # the file says which arms finished: a later call that skipped its step for time leaves them figures
    (tmp_path / "log.txt").write_text("[500s] SKIPPED K4_choices: 20s left, it needs about 240s\n")
    assert [r["verdict"] for r in ab.comparisons(tmp_path, ("sort",))] == [rec["verdict"]]
    assert ab.main([str(tmp_path)]) == 0
    assert "| choices | 64b1 | topk vs sort | 2 |" in capsys.readouterr().out


def test_ab_table_reads_hand_made_rounds_into_the_verdict(tmp_path):
    """Medians written by hand: 9 against 10 ms and 11 against 10 ms in two rounds is mixed; 9 and 9.5 faster."""
    def arm(*pairs):
        return {"rounds": [{"round": i + 1, "baseline": _block(b), "arm": _block(a)} for i, (b, a) in
                           enumerate(pairs)]}
    data = {"bench": "choices", "seq_len": 2048, "batch": 8, "baseline": "shipped", "in_progress": "late",
            "arms": {"mixed": arm((10, 9), (10, 11)), "fast": arm((10, 9), (10, 9.5)),
                     "broken": {**arm((10, 9)), "error": "RuntimeError: boom"}, "late": arm((10, 5))}}
    path = tmp_path / "k4.json"
    path.write_text(json.dumps(data))
    rec = {r["choice"]: r for r in ab.choices_records(tmp_path, path)}
    assert rec["mixed"]["verdict"] == "mixed" and rec["fast"]["verdict"] == "faster in every round"
    assert [r["ratio"]["fwdbwd"] for r in rec["fast"]["rounds"]] == [pytest.approx(0.9), pytest.approx(0.95)]
    assert rec["broken"]["verdict"] == "incomplete" and rec["broken"]["rounds"][-1]["failed"] == "RuntimeError: boom"
    assert rec["late"]["verdict"] == "incomplete"  # the process ended while it was measured
    assert all(r["case"] == "2048b8" for r in rec.values())
    assert ab.choices_records(tmp_path, Path(__file__)) == []  # not a JSON of this benchmark
    # an arm the run never reached (its process ended, no resume left) is listed, not left out
    data["arm_settings"] = {"shipped": {}, **{a: {} for a in data["arms"]}, "never": {"sel-dq-choice": "query"}}
    path.write_text(json.dumps(data))
    rec = {r["choice"]: r for r in ab.choices_records(tmp_path, path)}
    assert rec["never"]["verdict"] == "incomplete" and rec["never"]["rounds"][0]["failed"] == "not measured"
    assert "shipped" not in rec  # the baseline is no comparison


def test_an_arm_whose_outputs_differ_from_the_baselines_is_failed_not_a_winner(monkeypatch, tmp_path):
    """A faster arm whose loss is 10% off (a kernel that computes something else) is no speed result."""
    from nsa.attention import selection

    def measure(one, warmup, repeats, device):
        fast = selection.TOPK_CHOICE == "topk"
        return {**_block(8.0 if fast else 10.0), "loss": 1.1 if fast else 1.0, "grad_norm": 3.0}

    monkeypatch.setattr(bc, "measure_block", measure)
    monkeypatch.setattr(bc, "layer_pass", lambda args: None)
    out = tmp_path / "c.json"
    assert bc.main([*ARGS, "--json", str(out)]) == 1
    arm = json.loads(out.read_text())["arms"]["topk"]
    assert arm["error"] == "OutputsDiffer: round 1: loss 1.1 against the baseline's 1"
    assert "verdict" not in arm
    (rec,) = ab.choices_records(tmp_path, out)
    assert rec["verdict"] == "incomplete"


def test_a_baseline_whose_outputs_change_during_the_run_invalidates_it(monkeypatch, tmp_path, capsys):
    """Memory overwritten under every later block shows as the baseline's own loss changing between its blocks."""
    from nsa.attention import selection

    calls = []

    def measure(one, warmup, repeats, device):
        calls.append(selection.TOPK_CHOICE)
        corrupted = len(calls) > 4  # from the second arm on
        return {**_block(10.0), "loss": 2.0 if corrupted else 1.0, "grad_norm": 3.0}

    monkeypatch.setattr(bc, "measure_block", measure)
    monkeypatch.setattr(bc, "layer_pass", lambda args: None)
    out = tmp_path / "c.json"
    assert bc.main([*ARGS, "--arm", "again=topk-choice:sort", "--json", str(out)]) == 1
    assert "loss 2 against the baseline's 1" in json.loads(out.read_text())["baseline_outputs_changed"]
    assert "no figure of this run is valid" in capsys.readouterr().out


def test_resume_of_a_file_not_there_yet_starts_afresh(blocks, tmp_path):
    out = tmp_path / "c.json"
    assert bc.main([*ARGS, "--json", str(out), "--resume", str(out)]) == 0
    assert json.loads(out.read_text())["arms"]["topk"]["verdict"] == "faster in every round"


def test_outputs_differ_within_and_beyond_the_tolerance():
    base = {"loss": 1.0, "grad_norm": 2.0}
    assert bc.outputs_differ(base, {"loss": 1.019, "grad_norm": 1.97}) is None
    assert bc.outputs_differ(base, {"loss": 1.0, "grad_norm": 2.1}) == "grad_norm 2.1 against the baseline's 2"
    assert bc.outputs_differ(base, {"loss": float("nan"), "grad_norm": 2.0}).startswith("loss nan")
    assert bc.outputs_differ(base, {}) is None  # a block without outputs (a stub) is not judged


def test_a_round_whose_arm_time_is_no_duration_has_no_ratio():
    """ratios() took arm / baseline for any positive baseline: a negative or NaN arm median (a broken timer, a
    block that measured nothing) became a stored ratio, negative or NaN; it is none."""
    def block(median):
        return {"times_s": {m: {"median": median} for m in bc.MODES}}

    assert bc.ratios(block(2.0), block(1.0)) == {m: 0.5 for m in bc.MODES}
    for bad in (-1.0, 0.0, float("nan"), float("inf")):
        assert bc.ratios(block(2.0), block(bad)) == {m: None for m in bc.MODES}
        assert bc.ratios(block(bad), block(1.0)) == {m: None for m in bc.MODES}
