"""benchmarks/bench_comm_prediction.py's figures from known inputs, without launching anything: the launches
(_torchrun) replaced by one that writes the files the trainer and the comm benchmark would write, with hand-set
timings. Measured: per bucket, from the later rank's start to the later rank's end, summed per step; predicted:
predict_seconds over the step's bucket sizes on the mean of the benchmark before and after; bad options refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark_scripts import load

bench = load("bench_comm_prediction")

SIZES = [4000, 1000]  # bytes of the two gradient buckets of every step, in issue order
BENCH_S = {"bench_before": {1000: 0.001, 4000: 0.003}, "bench_after": {1000: 0.003, 4000: 0.005}}
STEPS = 3
# per bucket: (call, rank 0's gloo run start, end, rank 1's start, end), microseconds into the step
BUCKETS = [(1000, 1100, 1600, 1300, 1700),   # own time: 1700 - 1300 = 400 us
           (2000, 2100, 3100, 2050, 2900)]   # own time: 3100 - 2100 = 1000 us


def _trace(rank: int) -> dict:
    events = []
    for s in range(STEPS):
        t0 = 100_000 * s
        events.append({"ph": "X", "name": f"ProfilerStep#{s}", "ts": t0, "dur": 90_000})
        for call, a0, a1, b0, b1 in BUCKETS:
            start, end = (a0, a1) if rank == 0 else (b0, b1)
            events.append({"ph": "X", "name": "c10d::allreduce_", "ts": t0 + call, "dur": 5})
            events.append({"ph": "X", "name": "gloo:all_reduce", "ts": t0 + start, "dur": end - start})
        # the trainer's own loss sync after the optimizer step: not a gradient bucket
        events.append({"ph": "X", "name": "c10d::allreduce_", "ts": t0 + 80_000, "dur": 5})
        events.append({"ph": "X", "name": "gloo:all_reduce", "ts": t0 + 80_010, "dur": 30_000})
    events.reverse()  # the trace's order is not the clock's
    return {"traceEvents": [*events, {"ph": "M", "name": "process_name"}]}


def _fake_torchrun(calls: list):
    def run(args: list[str], log: Path, timeout: float = 240) -> None:
        calls.append(args)
        if "validation.analysis.comm_bench" in args:
            out = Path(args[args.index("--out") + 1])
            out.mkdir(parents=True)
            rows = [{"bytes": b, "time_s": t} for b, t in BENCH_S[out.name].items()]
            (out / "comm.json").write_text(json.dumps({"kinds": {"all_reduce": rows}}))
            return
        out = Path(args[args.index("--out-dir") + 1])
        out.mkdir(parents=True)
        steps = int(args[args.index("--steps") + 1])
        per_step = [{"kind": "all_reduce", "sizes": SIZES}]
        (out / "summary.json").write_text(json.dumps({
            "comm": {"per_step": per_step, "constant": True}, "comm_model_matches": True,
            "avg_step_time_excl_first_s": 0.0504, "comm_time_s": 0.012 * steps, "steps": steps}))
        if "--profile-steps" in args:
            (out / "profile").mkdir()
            for rank in (0, 1):
                (out / "profile" / f"trace_rank{rank}_step{steps}.json").write_text(json.dumps(_trace(rank)))
    return run


def test_attempt_measures_each_bucket_across_both_ranks_and_predicts_from_the_benchmark(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setattr(bench, "_torchrun", _fake_torchrun(calls))
    monkeypatch.setattr(bench, "PROFILED", STEPS)
    ratio, report = bench.attempt(tmp_path / "a")
    # measured (400 + 1000) us per step; predicted (0.001 + 0.003) / 2 + (0.003 + 0.005) / 2 = 6 ms per step
    assert ratio == pytest.approx(1.4 / 6.0)
    assert "measured 1.40 ms/step" in report and "predicted 6.00 ms/step" in report
    assert "ratio 0.23" in report and "(comm_time_s) 12.00 ms/step" in report
    benches = [c for c in calls if "validation.analysis.comm_bench" in c]
    assert len(benches) == 2
    for c in benches:  # the buckets' own sizes, after the probe run's step time (50.4 ms -> 50)
        assert c[c.index("--sizes") + 1] == "1000,4000" and c[c.index("--compute-ms") + 1] == "50"
        assert c[c.index("--iters") + 1] == str(STEPS)


def test_main_reports_min_median_max_of_the_attempts(monkeypatch, capsys):
    ratios = iter([1.6, 0.5])
    monkeypatch.setattr(bench, "attempt", lambda path: (next(ratios), "figures"))
    assert bench.main(["--repeats", "2", "--check"]) == 0  # median (0.5 + 1.6) / 2 = 1.05, inside 0.7 .. 1.3
    out = capsys.readouterr().out
    assert "over 2 attempts: min 0.50, median 1.05, max 1.60" in out
    assert "reproduce: python benchmarks/bench_comm_prediction.py --repeats 2" in out


@pytest.mark.parametrize("repeats", ["0", "-2"])
def test_repeats_below_one_are_refused(monkeypatch, repeats, capsys):
    monkeypatch.setattr(bench, "attempt", lambda path: pytest.fail("an attempt ran"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--repeats", repeats])
    assert exc.value.code == 2 and "--repeats must be >= 1" in capsys.readouterr().err
