"""benchmarks/bench_validation.py's figures: each stage's work runs --repeats times in its stage process and is given
as min / median / max, the tail-vs-whole-file ratio from the medians, the command that reproduces the figures printed
last; a stage that fails ends it with its error (exit code 1)."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load

bench = load("bench_validation")


def _stage(times: list[float], rss: float = 100.0, **extra) -> dict:
    return {"runs": times, "seconds": bench.spread(times), "peak_rss_mb": rss, **extra}


def test_stages_run_repeats_and_print_min_median_max(monkeypatch, capsys, tmp_path):
    asked: list[list[str]] = []
    figures = {"csv": _stage([0.5, 0.2, 0.3]), "report": _stage([1.0, 1.2, 3.0]),
               "heartbeat_tail": _stage([0.002, 0.001, 0.001]), "heartbeat_full": _stage([0.5, 0.4, 0.3])}

    def stage_process(argv, what):
        asked.append(argv)
        return figures[argv[argv.index("--stage") + 1]]

    monkeypatch.setattr(bench, "_subprocess_json", stage_process)
    monkeypatch.setattr(bench, "make_csv", lambda path, rows: path.write_text("step\n"))
    monkeypatch.setattr(bench, "make_heartbeats", lambda path, lines: path.write_text(""))
    argv = ["--rows", "10", "--repeats", "3", "--json", str(tmp_path / "f.json")]
    assert bench.main(argv) == 0
    assert all(a[a.index("--repeats") + 1] == "3" for a in asked) and len(asked) == 4
    lines = capsys.readouterr().out.splitlines()
    assert "csv             0.200 / 0.300 / 0.500 s (min / median / max of 3)" in lines[1]
    assert "report          1.000 / 1.200 / 3.000 s" in lines[2]
    assert lines[5] == "heartbeat tail read is 400x faster than reading the whole file (medians)"  # 0.4 / 0.001
    assert lines[-1] == "reproduce: python benchmarks/bench_validation.py " + " ".join(argv)
    assert json.loads((tmp_path / "f.json").read_text())["repeats"] == 3


def test_a_stage_times_its_work_each_repeat(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"steps": {"longrun": {"metrics": {}}}}))
    bench.make_heartbeats(tmp_path / "heartbeat_rank0.jsonl", 50)
    out = bench.stage("heartbeat_full", tmp_path, run, repeats=4)
    assert out["records"] == 50 and len(out["runs"]) == 4
    ordered = sorted(out["runs"])
    assert out["seconds"] == {"min": ordered[0], "median": (ordered[1] + ordered[2]) / 2, "max": ordered[3]}
    assert 0 < out["peak_rss_mb"] <= out["peak_rss_mb_all_runs"]


def test_a_failed_stage_ends_the_benchmark_with_its_error(monkeypatch):
    def fails(argv, what):
        raise SystemExit(f"{what} failed:\nTraceback ... boom")

    monkeypatch.setattr(bench, "_subprocess_json", fails)
    monkeypatch.setattr(bench, "make_csv", lambda path, rows: path.write_text("step\n"))
    monkeypatch.setattr(bench, "make_heartbeats", lambda path, lines: path.write_text(""))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--rows", "10"])
    assert "stage csv failed" in str(exc.value.code)
