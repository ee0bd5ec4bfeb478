"""Predicted against measured time of the DDP gradient collectives (issue 16): validation.analysis.collectives.predict_seconds
over the trainer's counted message sizes and the comm benchmark's table, against the collectives' own time in the
torch profiler traces of both ranks, on gloo at 2 ranks. The target: measured / predicted within 0.7 .. 1.3.

Measured: the collective calls' own time, from the torch profiler traces of BOTH ranks (--profile-steps): for every
gradient bucket's all-reduce (a c10d::allreduce_ issued off the main thread, i.e. by DDP's comm hook in backward,
and the gloo:all_reduce that ran it), from the moment the LAST rank started it until it had finished on every
rank. The traces of processes on one host share a clock. Not summary.json's comm_time_s: rank 0's in-flight time
also holds its wait for the slower rank to finish its backward (on this 2-core machine often several times the
collective itself; printed beside).

Predicted: the benchmark measured at the trainer's own bucket sizes, in the conditions the trainer issues them:
each timed call after a training step's worth of computation and a barrier (comm_bench --compute-ms).
Back-to-back calls (nccl-tests' protocol) leave the CPU collective's threads hot and measure it 2-10x faster than
the same call right after a backward on a shared CPU.

A timing, so a benchmark (repeats, min / median / max), not a test: tests/validation/kinds/test_comm_prediction.py
runs one attempt and checks what does not depend on the machine's speed.

    python benchmarks/bench_comm_prediction.py --repeats 5 [--check]
"""


from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from validation.analysis.collectives import bandwidth_row, predict_seconds
from validation.launch.torchrun import free_port

REPO = Path(__file__).resolve().parents[1]
PROFILED = 30  # profiled steps, and timed calls per size in the benchmark: single calls vary 10x on a shared CPU


def _torchrun(args: list[str], log: Path, timeout: float = 240) -> None:
    env = {**os.environ, "NSA_TB_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={free_port()}", *args]
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    assert proc.returncode == 0, log.read_text()[-3000:]


def bucket_all_reduces(trace: Path, per_step: int) -> list[tuple[float, float]]:
    """(start, end) in microseconds of the gloo all-reduce of every DDP gradient bucket in one rank's trace, in
    order: in every profiled step (a ProfilerStep range), its first `per_step` c10d::allreduce_ calls (DDP's comm
    hook issues the buckets during backward; the trainer's own loss/stop sync comes after the optimizer step), each
    matched to the first gloo:all_reduce that started after it."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep")), key=lambda e: e["ts"])
    calls = sorted((e for e in events if e["name"] == "c10d::allreduce_"), key=lambda e: e["ts"])
    runs = sorted((e for e in events if e["name"] == "gloo:all_reduce"), key=lambda e: e["ts"])
    out, used = [], set()
    for step in steps:
        inside = [c for c in calls if step["ts"] <= c["ts"] <= step["ts"] + step["dur"]]
        for call in inside[:per_step]:
            i = next(i for i, r in enumerate(runs) if r["ts"] >= call["ts"] and i not in used)
            used.add(i)
            out.append((runs[i]["ts"], runs[i]["ts"] + runs[i]["dur"]))
    return out


def bench(tmp_path: Path, name: str, sizes: list[int], compute_ms: int) -> dict[int, float]:
    out = tmp_path / name
    _torchrun(["-m", "validation.analysis.comm_bench", "--out", str(out), "--kinds", "all_reduce", "--sizes",
               ",".join(map(str, sizes)), "--iters", str(PROFILED), "--warmup", "3", "--compute-ms", str(compute_ms)],
              tmp_path / f"{name}.log")
    return {r["bytes"]: r["time_s"] for r in json.loads((out / "comm.json").read_text())["kinds"]["all_reduce"]}


def attempt(tmp_path: Path) -> tuple[float, str]:
    """One measurement: (measured / predicted, the figures behind it)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    # the buckets' sizes and the step time, from the byte model's twin run (same config, no profiler): the
    # benchmark runs just before and just after the profiled run, so that a change of the machine's load in
    # between weighs on both sides alike
    out = tmp_path / "train"
    args = ["-m", "nsa.training", "--config", "configs/tiny_cpu.yaml", "--ddp", "1", "--dataset", "synthetic"]
    _torchrun([*args, "--steps", "6", "--out-dir", str(tmp_path / "probe")], tmp_path / "probe.log")
    probe = json.loads((tmp_path / "probe" / "summary.json").read_text())
    per_step = {r["kind"]: r["sizes"] for r in probe["comm"]["per_step"]}
    assert set(per_step) == {"all_reduce"}
    sizes = sorted(set(per_step["all_reduce"]))  # the buckets' own sizes: no interpolation in the prediction
    compute_ms = round(probe["avg_step_time_excl_first_s"] * 1e3)

    before = bench(tmp_path, "bench_before", sizes, compute_ms)
    _torchrun([*args, "--steps", str(PROFILED + 4), "--profile-steps", str(PROFILED), "--out-dir", str(out)],
              tmp_path / "train.log")
    after = bench(tmp_path, "bench_after", sizes, compute_ms)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["comm_model_matches"] is True and summary["comm"]["constant"] is True
    assert {r["kind"]: r["sizes"] for r in summary["comm"]["per_step"]} == per_step

    traces = [sorted((out / "profile").glob(f"trace_rank{r}_step*.json"))[-1] for r in (0, 1)]
    rank0, rank1 = (bucket_all_reduces(t, len(per_step["all_reduce"])) for t in traces)
    n_steps = len(rank0) // len(per_step["all_reduce"])  # the profiled steps whose range closed in the trace
    assert len(rank0) == len(rank1) and n_steps >= PROFILED - 2
    own = [(max(a[1], b[1]) - max(a[0], b[0])) / 1e6 for a, b in zip(rank0, rank1)]
    measured = sum(own) / n_steps  # seconds per step

    table = {"all_reduce": [bandwidth_row("all_reduce", 2, b, (before[b] + after[b]) / 2) for b in sorted(before)]}
    predicted = predict_seconds(per_step, table, 2)
    assert predicted.missing == []
    ratio = measured / predicted.total_s
    report = (f"measured {measured * 1e3:.2f} ms/step (own time per bucket, ms: "
              f"{[round(x * 1e3, 2) for x in own]}), predicted {predicted.total_s * 1e3:.2f} ms/step (benchmark "
              f"before {[round(t * 1e3, 2) for t in before.values()]} ms, after "
              f"{[round(t * 1e3, 2) for t in after.values()]} ms per call at {sizes} B after {compute_ms} ms of "
              f"computation); ratio {ratio:.2f}; rank 0's in-flight time (comm_time_s) "
              f"{summary['comm_time_s'] / summary['steps'] * 1e3:.2f} ms/step; median own "
              f"{statistics.median(own) * 1e3:.2f} ms")
    return ratio, report



BAND = (0.7, 1.3)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="independent attempts (each ~20 s on 2 cores)")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when the median ratio is outside {BAND}")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="comm_prediction-") as tmp:
        for i in range(args.repeats):
            ratio, report = attempt(Path(tmp) / f"attempt{i + 1}")
            ratios.append(ratio)
            print(f"attempt {i + 1}: {report}", flush=True)
    med = statistics.median(ratios)
    print(f"measured / predicted over {len(ratios)} attempts: min {min(ratios):.2f}, median {med:.2f}, "
          f"max {max(ratios):.2f} (target {BAND[0]} .. {BAND[1]})")
    print(f"reproduce: python benchmarks/bench_comm_prediction.py --repeats {args.repeats}")
    return 1 if args.check and not BAND[0] <= med <= BAND[1] else 0


if __name__ == "__main__":
    raise SystemExit(main())
