"""benchmarks/bench_aa_compare.py's counting, on simulated and fabricated inputs (never a real run): the Wilson
interval against known values; the goals' verdicts; what a run's results.json and compare's output are reduced to;
false regressions, false winners, false culprits, the inconclusive shares and the detection of the slowdown counted
from pair records; simulated pairs through the real compare; the busy load always killed."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmark_scripts import load

REPO = Path(__file__).resolve().parents[2]
bench = load("bench_aa_compare")


def test_wilson_interval_matches_its_formula_and_known_values():
    assert bench.wilson(0, 20) == pytest.approx((0.0, 0.16113), abs=1e-4)   # the "rule of three"-like bound
    low, high = bench.wilson(1, 20)
    assert (low, high) == pytest.approx((0.00888, 0.23613), abs=1e-4)
    low, high = bench.wilson(10, 20)
    assert low == pytest.approx(1 - high) and low == pytest.approx(0.29929, abs=1e-4)
    # the score interval: the p whose z-test against k/n is at the edge, both ends
    for p in bench.wilson(3, 40):
        assert abs(3 / 40 - p) == pytest.approx(1.959963984540054 * math.sqrt(p * (1 - p) / 40), rel=1e-9)
    assert bench.wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        bench.wilson(5, 4)


def test_summary_counts_exit_1_as_flagged_and_leaves_errors_out():
    s = bench.summarize([0] * 18 + [1, 2])
    assert (s["pairs"], s["flagged"], s["errors"]) == (19, 1, 1)
    assert s["share"] == pytest.approx(1 / 19) and s["ci_high"] > bench.GOAL and not s["within_goal"]
    s = bench.summarize([0] * 100)
    assert s["share"] == 0 and s["within_goal"]  # 0 of 100: the interval's top is 3.7%
    lines = bench.report_lines(bench.summarize([0, 1] * 10), "python benchmarks/bench_aa_compare.py --pairs 20")
    assert lines[0] == "A/A pairs: 20, flagged by compare (exit 1): 10"
    assert "share flagged: 50.0% (95% Wilson CI" in lines[1] and "missed" in lines[1]
    assert lines[-1] == "command: python benchmarks/bench_aa_compare.py --pairs 20"


def test_goals_are_judged_on_the_whole_interval():
    assert bench.rate(0, 100, bench.GOAL)["result"] == "met"          # top 3.7% <= 5%
    assert bench.rate(0, 20, bench.GOAL)["result"] == "not shown"     # top 16.1%: 20 pairs cannot show 5%
    assert bench.rate(10, 20, bench.GOAL)["result"] == "missed"
    assert bench.rate(20, 20, bench.DETECT_GOAL, at_least=True)["result"] == "met"        # low 83.9%
    assert bench.rate(17, 20, bench.DETECT_GOAL, at_least=True)["result"] == "not shown"
    assert bench.rate(10, 20, bench.DETECT_GOAL, at_least=True)["result"] == "missed"     # top 70.1%
    r = bench.rate(0, 0, bench.GOAL)
    assert r["share"] is None and r["result"] is None and r["goal_kind"] == "at most"
    assert bench.rate(3, 10)["result"] is None  # a share without a goal


# ------------------------------------------------------------------------------------------ fabricated results.json
def _launch(disturbed: bool) -> dict:
    return {"csv": "x/out/training.csv",
            "interference": {"disturbed": disturbed, "text": "busy" if disturbed else "quiet"}}


def _results(verdict="GO", winner=None, recommendable=False, compared=True, culprit=None, ranked=True,
             disturbed=()) -> dict:
    """A results.json shaped like a run of runbooks/aa_cpu.yaml."""
    def runs(step, labels):
        return [{"label": lb, "repeat": r, "status": "passed", "metrics": _launch(f"{step}:{lb}:{r}" in disturbed)}
                for r in range(2) for lb in labels]

    decision = {"winner": winner, "choice": winner or "baseline", "significant": winner is not None,
                "recommendable": recommendable, "reason": "fabricated",
                "comparison": {"rel": 0.01} if compared else None, "disturbed_runs": []}
    triage = {"culprit": culprit, "reason": "fabricated", **({"statement": "Holm over 1"} if ranked else {})}
    return {"verdict": verdict,
            "steps": {"baseline": {"name": "baseline", "kind": "train", "status": "passed",
                                   "metrics": _launch("baseline" in disturbed)},
                      "batch": {"name": "batch", "kind": "sweep", "status": "passed",
                                "runs": runs("batch", ["batch_size=2", "batch_size=4"])},
                      "aa_ab": {"name": "aa_ab", "kind": "ab", "status": "passed",
                                "runs": runs("aa_ab", ["baseline", "torch"]),
                                "decision": decision, "winner": {"label": winner} if winner else None,
                                "metrics": {"decided": True}},
                      "aa_triage": {"name": "aa_triage", "kind": "triage", "status": "passed",
                                    "runs": runs("aa_triage", ["config", "kernel_torch"]), "metrics": triage}},
            "evidence": {"disturbed": [{"step": s} for s in dict.fromkeys(d.split(":")[0] for d in disturbed)]}}


def _write(tmp_path: Path, name: str, results: dict) -> Path:
    run_dir = tmp_path / name
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps(results))
    return run_dir


def test_run_summary_reads_the_verdict_interference_winner_and_culprit(tmp_path):
    s = bench.run_summary(_write(tmp_path, "r", _results(
        "INCOMPLETE", winner="torch", recommendable=True, culprit="kernel_torch",
        disturbed=("baseline", "aa_ab:torch:1"))))
    assert s["verdict"] == "INCOMPLETE" and s["error"] is None
    assert s["disturbed_steps"] == ["baseline", "aa_ab"]
    assert s["steps"]["baseline"] == {"kind": "train", "status": "passed", "disturbed": True, "text": "busy",
                                      "launches": 1, "disturbed_launches": 1}
    assert (s["steps"]["aa_ab"]["launches"], s["steps"]["aa_ab"]["disturbed_launches"]) == (4, 1)
    assert not s["steps"]["batch"]["disturbed"]
    assert s["ab"] == [{"step": "aa_ab", "decided": True, "winner": "torch", "recommendable": True,
                        "significant": True, "choice": "torch", "reason": "fabricated", "left_out": 0}]
    assert s["triage"] == [{"step": "aa_triage", "ranked": True, "culprit": "kernel_torch", "reason": "fabricated"}]
    # a decision kept by default without comparing the arms (every run disturbed) is no decision
    s = bench.run_summary(_write(tmp_path, "q", _results(compared=False, ranked=False)))
    assert s["ab"][0]["decided"] is False and s["triage"][0]["ranked"] is False
    missing = bench.run_summary(tmp_path / "nowhere")
    assert missing["verdict"] is None and "no readable results.json" in missing["error"]


def test_compare_summary_counts_throughput_rows():
    out = {"rows": [{"step": "baseline", "metric": "toks_per_s", "verdict": "inconclusive", "disturbed": True},
                    {"step": "batch[x, repeat 1]", "metric": "toks_per_s", "verdict": "inconclusive"},
                    {"step": "batch[x, repeat 2]", "metric": "toks_per_s", "verdict": "worse"},
                    {"step": "baseline", "metric": "final_loss", "verdict": "inconclusive"},  # not a throughput row
                    {"step": "all steps (common change)", "metric": "toks_per_s", "verdict": "worse", "rel": -0.2,
                     "significant": True, "p_adjusted": 0.001}],
           "regressions": [{"step": "all steps (common change)", "metric": "toks_per_s", "rel": -0.2}],
           "gate": "1 regression"}
    out["rows"][-1]["tested"] = out["rows"][2]["tested"] = True
    c = bench.compare_summary(out, 1)
    assert (c["exit"], c["rows"], c["tested"], c["inconclusive"], c["disturbed"]) == (1, 4, 2, 2, 1)
    assert c["flagged"] == ["all steps (common change)"] and c["common"]["rel"] == -0.2
    assert bench.compare_summary(None, 2, "boom") == {"exit": 2, "flagged": [], "rows": 0, "tested": 0,
                                                      "inconclusive": 0, "disturbed": 0, "common": None, "gate": None,
                                                      "error": "boom"}


def _run(verdict="GO", winner=None, recommendable=False, compared=True, culprit=None, ranked=True, exit=None,
         disturbed=()):
    return {"exit": {"GO": 0, "NO-GO": 1, "INCOMPLETE": 3}.get(verdict, 2) if exit is None else exit,
            "verdict": verdict, "seconds": 100.0, "load_before": [2.0, 2.0, 2.0], "load_after": [3.0, 2.0, 2.0],
            "steps": {"baseline": {"launches": 1, "disturbed_launches": int(bool(disturbed))}},
            "disturbed_steps": list(disturbed),
            "ab": [{"decided": compared, "winner": winner, "recommendable": recommendable}],
            "triage": [{"ranked": ranked, "culprit": culprit}], "fault": None, "busy": None}


def _pair(kind, exit_code, a=None, b=None, rows=10, inconclusive=0, disturbed_rows=0, flagged=None, index=0,
          tested=None):
    flagged = (["all steps (common change)"] if exit_code == 1 else []) if flagged is None else flagged
    return {"condition": "none", "kind": kind, "index": index, "order": ["a", "b"], "seconds": 200.0,
            "runs": {"a": a or _run(), "b": b or _run()},
            "compare": {"exit": exit_code, "flagged": flagged, "rows": rows,
                        "tested": rows - disturbed_rows if tested is None else tested, "inconclusive": inconclusive,
                        "disturbed": disturbed_rows, "common": None, "gate": None, "error": None}}


def test_condition_figures_count_every_figure():
    pairs = [
        _pair("aa", 0, inconclusive=3),
        _pair("aa", 1, a=_run(winner="torch", recommendable=True)),  # a false regression, a false winner
        _pair("aa", 0, b=_run("INCOMPLETE", winner="baseline", culprit="kernel_torch", disturbed=("batch",)),
              inconclusive=5, disturbed_rows=4),
        _pair("aa", 2),                                                              # compare failed: not counted
        _pair("aa", -1, b=_run("NO-GO", exit=2)),                                    # a run failed: not counted
        _pair("aa", 0, a=_run(compared=False, ranked=False)),                        # nothing compared: not counted
        _pair("slow", 1),                                                            # detected
        _pair("slow", 0),                                                            # missed
        _pair("slow", 0, tested=0, inconclusive=10, disturbed_rows=10),              # all disturbed: untestable
        _pair("slow", 1, flagged=[]),                                                # exit 1 without a regression row?
    ]
    f = bench.condition_figures(pairs)
    assert f["pairs"] == {"aa": 6, "slow": 4, "compared_aa": 4, "compared_slow": 4, "errors": 2}
    assert (f["false_regression"]["k"], f["false_regression"]["n"]) == (1, 4)
    runs_done = 2 * 10 - 1  # the NO-GO run exited 2 (an error): not a finished run
    assert (f["false_winner"]["k"], f["false_winner"]["n"]) == (2, runs_done - 1)
    assert (f["false_recommendable"]["k"], f["false_recommendable"]["n"]) == (1, runs_done - 1)
    assert f["ab_undecided"] == 1 and f["triage_unranked"] == 1
    assert (f["false_culprit"]["k"], f["false_culprit"]["n"]) == (1, runs_done - 1)
    assert (f["incomplete_runs"]["k"], f["incomplete_runs"]["n"]) == (1, runs_done)
    assert f["verdicts"] == {"GO": runs_done - 1, "INCOMPLETE": 1}
    assert (f["inconclusive_rows"]["k"], f["inconclusive_rows"]["n"]) == (18, 80)  # 8 compared pairs x 10 rows
    assert (f["disturbed_rows"]["k"], f["disturbed_rows"]["n"]) == (14, 80)
    assert (f["detected"]["k"], f["detected"]["n"]) == (1, 4) and f["detected"]["goal_kind"] == "at least"
    assert (f["detected_when_tested"]["k"], f["detected_when_tested"]["n"]) == (1, 3)
    assert (f["disturbed_runs"]["k"], f["disturbed_runs"]["n"]) == (1, runs_done)
    assert (f["disturbed_launches"]["k"], f["disturbed_launches"]["n"]) == (1, runs_done)
    assert f["run_seconds_median"] == 100.0 and f["pair_seconds_median"] == 200.0 and f["load_before_mean"] == 2.0
    lines = bench.table_lines("none", f)
    assert lines[0].startswith("as found (none): 6 A/A and 4 slowdown pair(s), 20 run(s), 1 failed")
    assert any(ln.strip().startswith("false regression") and "1 / 4" in ln for ln in lines)
    assert any(ln.strip().startswith("slowdown detected") and "1 / 4" in ln and ">= 80%" in ln for ln in lines)
    line = bench.pair_line(pairs[1], 6)
    assert line.startswith("[as found] A/A 1/6: A GO 100 s") and "compare exit 1, flagged: all steps" in line
    assert "ab winner torch/none" in line


# ------------------------------------------------------------------------------------------ simulated pairs
def test_simulated_pairs_go_through_compare_and_the_slowdown_is_detected(tmp_path):
    pair = bench.SimulatedPairs(tmp_path, np.random.default_rng(0))
    plan = bench.schedule(["none", "busy"], 2, 2)
    assert plan == [("none", "aa", 0), ("none", "slow", 0), ("busy", "aa", 0), ("busy", "slow", 0),
                    ("none", "aa", 1), ("none", "slow", 1), ("busy", "aa", 1), ("busy", "slow", 1)]
    lines = []
    records = bench.run_all(plan[:4], pair, {"aa": 2, "slow": 2}, log=lines.append)  # one pair of each
    assert len(records) == len(lines) == 4
    for p in records:
        assert p["compare"]["exit"] in (0, 1) and p["compare"]["rows"] == 14  # 13 launches + the common change
        assert all(r["verdict"] in ("GO", "INCOMPLETE") and len(r["ab"]) == len(r["triage"]) == 1
                   for r in p["runs"].values())
        if p["kind"] == "slow":  # 20% slower everywhere: the common change finds it
            assert p["compare"]["exit"] == 1 and p["compare"]["common"]["rel"] == pytest.approx(-0.2, abs=0.05)
    none = bench.condition_figures([p for p in records if p["condition"] == "none"])
    assert none["incomplete_runs"]["k"] == 0 and none["disturbed_launches"]["k"] == 0
    assert none["detected"]["k"] == 1
    busy = bench.condition_figures([p for p in records if p["condition"] == "busy"])
    assert busy["disturbed_launches"]["k"] > 0 and busy["disturbed_rows"]["k"] > 0


def test_main_simulate_writes_every_figure_and_the_command(tmp_path, capsys):
    out = tmp_path / "json" / "aa.json"
    argv = ["--simulate", "--pairs", "1", "--slow-pairs", "0", "--load", "both", "--out", str(tmp_path / "sim"),
            "--json", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] == "python benchmarks/bench_aa_compare.py " + " ".join(argv)
    assert set(doc["conditions"]) == {"none", "busy"} and len(doc["pairs"]) == 2
    for fig in doc["conditions"].values():
        for key in ("false_regression", "false_winner", "false_culprit", "detected", "incomplete_runs",
                    "inconclusive_rows"):
            assert {"k", "n", "share", "ci_low", "ci_high"} <= set(fig[key])
    text = capsys.readouterr().out
    assert "as found (none)" in text and "added load (busy)" in text and f"command: {doc['command']}" in text


# ------------------------------------------------------------------------------------------ the added load
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_busy_window_is_a_random_half_of_the_run():
    import random

    rng = random.Random(0)
    for _ in range(50):
        start, stop = bench.busy_window(rng, 100.0)
        assert 0 <= start <= 50 and stop == pytest.approx(start + 50)


def test_supervise_starts_the_busy_load_in_the_window_and_kills_it(tmp_path):
    code, seconds, busy = bench.supervise([sys.executable, "-c", "import time; time.sleep(0.8)"], tmp_path / "log",
                                          window=(0.1, 0.4))
    assert code == 0 and seconds >= 0.8
    assert 0.1 <= busy["started_s"] < busy["stopped_s"] and busy["stopped_s"] >= 0.4 and busy["procs"] == 1


def test_the_busy_load_and_the_run_end_on_ctrl_c(tmp_path, monkeypatch):
    """A KeyboardInterrupt while the busy process runs: it is killed (its group) and the command ended."""
    started: list = []
    real_start = bench.BusyLoad.start

    def start(self):
        real_start(self)
        started.extend(self.procs)
        return self

    calls = {"n": 0}
    real_wait = bench._wait

    def wait(proc, until):
        calls["n"] += 1
        if calls["n"] == 2:  # the wait over the busy window
            raise KeyboardInterrupt
        return real_wait(proc, until)

    monkeypatch.setattr(bench.BusyLoad, "start", start)
    monkeypatch.setattr(bench, "_wait", wait)
    procs: list = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        p = real_popen(*args, **kwargs)
        procs.append(p)
        return p

    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    with pytest.raises(KeyboardInterrupt):
        bench.supervise([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log", window=(0.0, 30.0))
    assert len(started) == 1 and started[0].returncode is not None and not _alive(started[0].pid)
    # the command itself was ended by the SIGINT and reaped, not by the SIGKILL 60 s later: whatever SIGINT's
    # disposition here (ignored under a shell's background job), the child takes it as Python's KeyboardInterrupt
    # (exit 1), or as the default action while it is still starting (-2)
    assert procs[0].returncode in (1, -signal.SIGINT)


def test_recompare_compares_the_stored_pairs_again_with_the_runbooks_current_declaration(tmp_path, capsys):
    """--recompare runs nothing: each finished pair under --out (its pair.json) is compared again by the current
    compare, with the runbook's `compare` declaration given to runs that predate it, in memory only. A 20% slowdown
    is a regression without a declaration, and not under one that says two runs differ by far more."""
    out = tmp_path / "pairs"
    rec = bench.SimulatedPairs(out, np.random.default_rng(3))("none", "slow", 0)
    assert rec["compare"]["exit"] == 1
    (Path(rec["dir"]) / "pair.json").write_text(json.dumps(rec))
    stored = {p: p.read_bytes() for p in Path(rec["dir"]).rglob("*.json")}
    text = (REPO / "runbooks" / "aa_cpu.yaml").read_text()
    assert "compare: {run_sd: 0.073, launch_sd: 0.12, pairs: 70}" in text
    plain = tmp_path / "plain.yaml"
    plain.write_text(text.replace("compare: {run_sd: 0.073, launch_sd: 0.12, pairs: 70}\n", ""))
    wide = tmp_path / "wide.yaml"
    wide.write_text(text.replace("run_sd: 0.073, launch_sd: 0.12", "run_sd: 0.5, launch_sd: 0.9"))
    again = bench.recompare(out, plain, ["none"])
    assert len(again) == 1 and again[0]["compare"]["exit"] == 1
    wider = bench.recompare(out, wide, ["none"])
    assert wider[0]["compare"]["exit"] == 0 and wider[0]["compare"]["common"]["rel"] < -0.1
    # the A/B and the triage decided again by today's functions, under the declared launch noise: nothing decides
    for run in wider[0]["runs"].values():
        assert [d["step"] for d in run["ab"]] == ["aa_ab"] and run["ab"][0]["winner"] is None
        assert "no significant difference" in run["ab"][0]["reason"]
        assert [t["step"] for t in run["triage"]] == ["aa_triage"] and run["triage"][0]["culprit"] is None
    assert {p: p.read_bytes() for p in Path(rec["dir"]).rglob("*.json")} == stored  # nothing rewritten
    js = tmp_path / "re.json"
    assert bench.main(["--recompare", "--out", str(out), "--runbook", str(wide), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert doc["recompared"] and doc["conditions"]["none"]["detected"]["k"] == 0
    assert "slowdown 1/1" in capsys.readouterr().out
    assert bench.main(["--recompare", "--out", str(tmp_path / "empty")]) == 2
