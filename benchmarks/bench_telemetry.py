"""The cost of the device telemetry sampler (validation.launch.telemetry) on this machine: its CPU time per sample
(thread CPU time, what the ``sampler_cpu_ms`` column records) and as a share of one core at the default 1 s
interval, while it samples a process tree of `--procs` busy processes; and the work those processes got done with
and without the sampler (a loop count over the same wall time, each measured `--repeats` times, interleaved).

    python benchmarks/bench_telemetry.py [--seconds 5] [--procs 2] [--interval 1.0] [--repeats 3] [--json OUT.json]

Without pynvml (or a GPU) only the /proc part is measured; with it, the NVML queries are included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORKER = ("import sys, time\nend = time.time() + float(sys.argv[1])\nn = 0\n"
          "while time.time() < end:\n    n += 1\nprint(n)\n")


def busy_tree(seconds: float, procs: int) -> subprocess.Popen:
    """A root process running `procs` busy workers; prints their loop counts, one per line."""
    code = ("import subprocess, sys\n"
            f"ps = [subprocess.Popen([sys.executable, '-c', {WORKER!r}, '{seconds}'], stdout=subprocess.PIPE, "
            f"text=True) for _ in range({procs})]\n"
            "print(sum(int(p.communicate()[0]) for p in ps))\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def one(seconds: float, procs: int, interval: float | None) -> dict:
    from validation.launch.telemetry import Sampler

    root = busy_tree(seconds, procs)
    sampler = None
    with tempfile.TemporaryDirectory() as tmp:
        if interval is not None:
            sampler = Sampler(Path(tmp) / "telemetry.csv", root.pid, interval).start()
        work = int(root.communicate()[0])
        if sampler is not None:
            sampler.stop()
    out = {"work": work}
    if sampler is not None:
        out.update(samples=sampler.samples, cpu_s=sampler.cpu_s, gpu=bool(sampler.gpu and sampler.gpu.available))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = {"with": [], "without": []}
    for _ in range(args.repeats):  # interleaved: the machine's drift hits both alike
        runs["without"].append(one(args.seconds, args.procs, None))
        runs["with"].append(one(args.seconds, args.procs, args.interval))
    samples = sum(r["samples"] for r in runs["with"])
    cpu_s = sum(r["cpu_s"] for r in runs["with"])
    per_sample_ms = 1000 * cpu_s / max(samples, 1)
    work_with = statistics.median(r["work"] for r in runs["with"])
    work_without = statistics.median(r["work"] for r in runs["without"])
    result = {"samples": samples, "cpu_ms_per_sample": round(per_sample_ms, 3),
              "core_share_at_interval": round(per_sample_ms / 1000 / args.interval, 6),
              "gpu_sampled": any(r["gpu"] for r in runs["with"]),
              "work_ratio_with_over_without": round(work_with / work_without, 4),
              "work_with": [r["work"] for r in runs["with"]], "work_without": [r["work"] for r in runs["without"]],
              "settings": vars(args) | {"json": str(args.json) if args.json else None}}
    print(f"sampler: {samples} samples, {per_sample_ms:.2f} ms CPU per sample = "
          f"{100 * result['core_share_at_interval']:.3f}% of one core at {args.interval:g} s "
          f"(GPU sampled: {result['gpu_sampled']})")
    print(f"work of {args.procs} busy processes over {args.seconds:g} s, median of {args.repeats}: with the sampler "
          f"{work_with:,.0f}, without {work_without:,.0f} (ratio {result['work_ratio_with_over_without']:.4f}; "
          "run-to-run spread: " + ", ".join(f"{r['work']:,}" for r in runs["without"]) + ")")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
