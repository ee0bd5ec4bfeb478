"""The cost of the device telemetry sampler (validation.launch.telemetry) on this machine: its CPU time per sample
(thread CPU time, what the ``sampler_cpu_ms`` column records) and as a share of one core at the default 1 s
interval, while it samples a process tree of `--procs` busy processes; and the work those processes got done with
and without the sampler (a loop count over the same wall time, each measured `--repeats` times, interleaved).
Each figure is given as min / median / max over the repeats; the command that reproduces them is printed last.

    python benchmarks/bench_telemetry.py [--seconds 5] [--procs 2] [--interval 1.0] [--repeats 3] [--json OUT.json]

Without pynvml (or a GPU) only the /proc part is measured; with it, the NVML queries are included. Exit code 1 when
the sampler failed or recorded no sample, or a busy process did not report its work.
"""

from __future__ import annotations

import argparse
import json
import shlex
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
    """One measurement: {"work"} (None when the busy tree failed), with a sampler also {"samples", "cpu_s", "gpu",
    "error"} (the sampler's error, or None)."""
    from validation.launch.telemetry import Sampler

    root = busy_tree(seconds, procs)
    sampler = None
    with tempfile.TemporaryDirectory() as tmp:
        if interval is not None:
            sampler = Sampler(Path(tmp) / "telemetry.csv", root.pid, interval).start()
        stdout = root.communicate()[0]
        if sampler is not None:
            sampler.stop()
    work = int(stdout) if root.returncode == 0 and stdout.strip().isdigit() else None
    out = {"work": work}
    if sampler is not None:
        out.update(samples=sampler.samples, cpu_s=sampler.cpu_s, gpu=bool(sampler.gpu and sampler.gpu.available),
                   error=sampler.error)
    return out


def spread(values: list[float]) -> dict:
    """{"min", "median", "max"} of `values`."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _text(s: dict, fmt: str) -> str:
    return " / ".join(format(s[k], fmt) for k in ("min", "median", "max"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for name in ("seconds", "procs", "interval", "repeats"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    runs = {"with": [], "without": []}
    for _ in range(args.repeats):  # interleaved: the machine's drift hits both alike
        runs["without"].append(one(args.seconds, args.procs, None))
        runs["with"].append(one(args.seconds, args.procs, args.interval))
    failed = [f"the sampler failed: {r['error']}" if r["error"] else "the sampler recorded no sample"
              for r in runs["with"] if r["error"] or not r["samples"]]
    failed += [f"the busy processes did not report their work ({kind} the sampler)"
               for kind, rs in runs.items() for r in rs if r["work"] is None]
    if failed:
        for reason in dict.fromkeys(failed):
            print(f"bench_telemetry: {reason}", file=sys.stderr)
        return 1
    per_sample_ms = spread([1000 * r["cpu_s"] / r["samples"] for r in runs["with"]])
    work_with = spread([r["work"] for r in runs["with"]])
    work_without = spread([r["work"] for r in runs["without"]])
    # each repeat's pair ran back to back: its ratio, then their spread (not a ratio of medians)
    ratios = spread([w["work"] / wo["work"] for w, wo in zip(runs["with"], runs["without"])])
    command = "python benchmarks/bench_telemetry.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = {"samples": sum(r["samples"] for r in runs["with"]), "cpu_ms_per_sample": per_sample_ms,
              "core_share_at_interval": {k: v / 1000 / args.interval for k, v in per_sample_ms.items()},
              "gpu_sampled": any(r["gpu"] for r in runs["with"]),
              "work_ratio_with_over_without": ratios, "work_with": work_with, "work_without": work_without,
              "runs": runs, "command": command.strip(),
              "settings": vars(args) | {"json": str(args.json) if args.json else None}}
    print(f"sampler: {result['samples']} samples in {args.repeats} runs; CPU per sample (min / median / max of the "
          f"runs) {_text(per_sample_ms, '.2f')} ms = {100 * per_sample_ms['median'] / 1000 / args.interval:.3f}% "
          f"of one core at {args.interval:g} s (median; GPU sampled: {result['gpu_sampled']})")
    print(f"work of {args.procs} busy processes over {args.seconds:g} s (min / median / max of {args.repeats}): "
          f"with the sampler {_text(work_with, ',.0f')}, without {_text(work_without, ',.0f')}; "
          f"ratio with / without per run {_text(ratios, '.4f')}")
    print(f"reproduce: {result['command']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
