"""benchmarks/bench_telemetry.py's figures from known measurements (each run's sampler CPU, samples and work given):
min / median / max over the runs, the work ratio taken per run (each pair ran back to back) before its median, the
command that reproduces them; a sampler that failed or sampled nothing, or busy processes that reported no work,
exit 1 instead of printing figures."""

from __future__ import annotations

import json
import sys

from benchmark_scripts import load

bench = load("bench_telemetry")

ARGV = ["--seconds", "0.1", "--repeats", "3", "--procs", "1"]


def _scripted(monkeypatch, with_runs: list[dict], without_work: list[int | None]) -> list[tuple]:
    calls: list[tuple] = []
    queues = {"with": list(with_runs), "without": [{"work": w} for w in without_work]}

    def one(seconds, procs, interval):
        calls.append((seconds, procs, interval))
        return queues["without" if interval is None else "with"].pop(0)

    monkeypatch.setattr(bench, "one", one)
    monkeypatch.setattr(sys, "argv", ["bench_telemetry.py", *ARGV])
    return calls


def _run(work: int, samples: int, cpu_s: float, error: str | None = None) -> dict:
    return {"work": work, "samples": samples, "cpu_s": cpu_s, "gpu": False, "error": error}


def test_figures_are_min_median_max_of_the_runs_with_per_run_ratios(monkeypatch, capsys, tmp_path):
    calls = _scripted(monkeypatch, [_run(90, 10, 0.010), _run(30, 4, 0.012), _run(100, 5, 0.010)], [100, 40, 200])
    assert bench.main() == 0
    assert [c[2] for c in calls] == [None, 1.0] * 3  # interleaved: without, then with, each repeat
    out = capsys.readouterr().out
    # CPU per sample: 1.0, 3.0 and 2.0 ms; work ratios per run 0.9, 0.75, 0.5 (the ratio of the medians is 0.9)
    assert "(min / median / max of the runs) 1.00 / 2.00 / 3.00 ms = 0.200% of one core at 1 s" in out
    assert "with the sampler 30 / 90 / 100, without 40 / 100 / 200" in out
    assert "ratio with / without per run 0.5000 / 0.7500 / 0.9000" in out
    assert out.splitlines()[-1] == "reproduce: python benchmarks/bench_telemetry.py " + " ".join(ARGV)
    _scripted(monkeypatch, [_run(90, 10, 0.010), _run(30, 4, 0.012), _run(100, 5, 0.010)], [100, 40, 200])
    assert bench.main([*ARGV, "--json", str(tmp_path / "t.json")]) == 0
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["work_ratio_with_over_without"] == {"min": 0.5, "median": 0.75, "max": 0.9}
    assert saved["samples"] == 19 and saved["cpu_ms_per_sample"]["median"] == 2.0


def test_a_failed_sampler_or_busy_tree_exits_1_without_figures(monkeypatch, capsys):
    _scripted(monkeypatch, [_run(90, 3, 0.01), _run(80, 0, 0.0, "OSError: [Errno 28] No space left on device"),
                            _run(85, 3, 0.01)], [100, 100, 100])
    assert bench.main() == 1
    captured = capsys.readouterr()
    assert "bench_telemetry: the sampler failed: OSError: [Errno 28] No space left on device" in captured.err
    assert "samples" not in captured.out
    _scripted(monkeypatch, [_run(90, 3, 0.01)] * 3, [100, None, 100])
    assert bench.main() == 1
    assert "the busy processes did not report their work (without the sampler)" in capsys.readouterr().err
