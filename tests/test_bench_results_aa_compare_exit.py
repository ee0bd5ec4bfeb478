"""benchmarks/bench_aa_compare.py's exit status: a condition whose every pair failed (a run that did not finish, or a
compare that did not answer) measured nothing, and the benchmark must not end as a success; one compared pair per
condition is a measurement. The runs are stood in for (no nsa-validate run starts): supervise() ends each run with
exit 2 and no results.json, as a run that crashed at its start."""

from __future__ import annotations

import json

from benchmark_scripts import load

bench = load("bench_aa_compare")


def _crashed_runs(monkeypatch, fails=lambda argv: True):
    calls = []

    def supervise(argv, log_path, window=None, busy_procs=1, timeout_s=0):
        calls.append(argv)
        return (2, 0.1, None) if fails(argv) else (0, 0.1, None)

    monkeypatch.setattr(bench, "supervise", supervise)
    return calls


def test_every_pair_failing_exits_non_zero_and_says_so(tmp_path, monkeypatch, capsys):
    calls = _crashed_runs(monkeypatch)
    js = tmp_path / "out.json"
    code = bench.main(["--pairs", "2", "--slow-pairs", "1", "--out", str(tmp_path / "o"), "--json", str(js)])
    out = capsys.readouterr().out
    assert len(calls) == 6  # 3 pairs of 2 runs, all ended with exit 2
    assert code == 1
    assert "no pair of condition 'none' was compared" in out and "nothing was measured" in out
    doc = json.loads(js.read_text())
    assert doc["not_compared"] == ["none"]
    assert doc["conditions"]["none"]["pairs"] == {"aa": 2, "slow": 1, "compared_aa": 0, "compared_slow": 0,
                                                  "errors": 3}


def _finished_run(run_dir, fault=None, window=None, busy_procs=1):
    return {"dir": str(run_dir), "exit": 0, "seconds": 1.0, "load_before": None, "load_after": None, "fault": fault,
            "busy": None, "verdict": "GO", "steps": {}, "disturbed_steps": [], "ab": [], "triage": [], "error": None}


def test_a_condition_with_no_compared_pair_beside_one_with_fails_the_benchmark(tmp_path, monkeypatch, capsys):
    """--load both: the pairs of "none" are compared, every run under "busy" crashes."""
    def real_run(runbook, run_dir, fault=None, window=None, busy_procs=1):
        if "busy" in run_dir.parts:
            return {**_finished_run(run_dir, fault), "exit": 2, "verdict": None, "error": "crashed"}
        return _finished_run(run_dir, fault)

    monkeypatch.setattr(bench, "real_run", real_run)
    monkeypatch.setattr(bench, "real_compare", lambda a, b: bench.compare_summary({"rows": []}, 0))
    code = bench.main(["--pairs", "1", "--slow-pairs", "0", "--load", "both", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 1
    assert "no pair of condition 'busy' was compared" in out and "condition 'none'" not in out


def test_one_compared_pair_per_condition_exits_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "real_run", lambda runbook, run_dir, fault=None, window=None, busy_procs=1:
                        _finished_run(run_dir, fault))
    monkeypatch.setattr(bench, "real_compare", lambda a, b: bench.compare_summary({"rows": []}, 0))
    assert bench.main(["--pairs", "1", "--slow-pairs", "0", "--out", str(tmp_path / "o")]) == 0
    assert "FAILED" not in capsys.readouterr().out


def test_recompare_of_pairs_whose_every_run_failed_exits_non_zero(tmp_path, monkeypatch, capsys):
    _crashed_runs(monkeypatch)
    out = tmp_path / "o"
    assert bench.main(["--pairs", "1", "--slow-pairs", "0", "--out", str(out)]) == 1
    capsys.readouterr()
    assert bench.main(["--recompare", "--out", str(out)]) == 1
    assert "no pair of condition 'none' was compared" in capsys.readouterr().out
