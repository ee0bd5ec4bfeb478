"""False alarms of `nsa-validate compare` as a CI gate, on real runs: N A/A pairs (two identical runs of a small
runbook, one after the other), each compared with `compare` (exit 1 = a row flagged as a significant regression),
and the share of pairs flagged with its 95% Wilson interval. The goal is at most 5%.

    python benchmarks/bench_aa_compare.py [--pairs 20] [--runbook PATH] [--out DIR] [--json out.json]
    python benchmarks/bench_aa_compare.py --simulate [--pairs 200] [--seed 0]

Without --runbook the small runbook below is used (a 1-process train step and a 2-point sweep repeated twice, so
that compare measures the run-to-run variation from the repeats, as on cpu_smoke; 5 launches, about a minute a run
on a loaded 2-core machine): 20 pairs take about 40 minutes and load the machine. --simulate replaces the runs by
synthetic run directories (AR(1) throughput with a run-level variation, validation.significance.simulate's
cpu_smoke-like model) and runs the same compare in-process: a check of the counting and of the gate's rate
without the machine.

Prints one line per pair (exit code, rows flagged), then the share flagged, its Wilson interval and the command
that reproduces the figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL = 0.05  # the gate's false-alarm rate it should stay under

SMALL_RUNBOOK = """\
# A/A pairs of bench_aa_compare.py: small, but like cpu_smoke in what compare sees (single runs and repeats).
name: aa_small
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  # one thread: on a shared machine two threads per process wait for cores and the runs slow down erratically
  env: {NSA_TB_DISABLE: "1", NSA_PREFILL_BATCHED: "1", NSA_SEL_RANGES_V2: "1", OMP_NUM_THREADS: "1"}
  args: {dataset: synthetic, ddp: 0, steps: 24, save_every: 100000}
  nproc_per_node: 1
  timeout_s: 300
  stall_timeout_s: 60
  window: 16
  warmup_steps: 4
phases:
  - name: measure
    steps:
      - {name: baseline, kind: train}
      - name: batch
        kind: sweep
        matrix: {args.batch_size: [2, 4]}
        repeats: 2
"""


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95% by default); (0, 1) when n == 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"k must be in 0..n, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(exit_codes: Sequence[int]) -> dict:
    """{"pairs", "flagged" (exit 1), "errors" (any other non-zero exit: not counted as pairs), "share", "ci_low",
    "ci_high", "goal", "within_goal" (the interval's upper end at most the goal: False when unsure)}."""
    flagged = sum(1 for c in exit_codes if c == 1)
    errors = sum(1 for c in exit_codes if c not in (0, 1))
    pairs = len(exit_codes) - errors
    low, high = wilson(flagged, pairs)
    return {"pairs": pairs, "flagged": flagged, "errors": errors, "share": flagged / pairs if pairs else None,
            "ci_low": low, "ci_high": high, "goal": GOAL, "within_goal": pairs > 0 and high <= GOAL}


def report_lines(summary: dict, command: str) -> list[str]:
    share = summary["share"]
    lines = [f"A/A pairs: {summary['pairs']}, flagged by compare (exit 1): {summary['flagged']}"
             + (f", errors (not counted): {summary['errors']}" if summary["errors"] else "")]
    if share is not None:
        lines.append(f"share flagged: {share:.1%} (95% Wilson CI {summary['ci_low']:.1%} .. {summary['ci_high']:.1%}); "
                     f"goal <= {summary['goal']:.0%}: "
                     + ("met (the whole interval is below it)" if summary["within_goal"] else
                        "not shown (the interval reaches above it)" if share <= summary["goal"] else "missed"))
    lines.append(f"command: {command}")
    return lines


def _cli(args: list[str], timeout: float = 1800) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "validation.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def real_pair(runbook: Path, out: Path, index: int) -> tuple[int, int]:
    """Run the runbook twice into out/pair{i}/{a,b} and compare them: (compare's exit code, rows flagged)."""
    dirs = [out / f"pair{index:02d}" / side for side in ("a", "b")]
    for d in dirs:
        proc = _cli(["run", str(runbook), "--out", str(d)])
        if proc.returncode not in (0, 1):
            print(f"pair {index}: run {d} ended with exit {proc.returncode}: {proc.stderr.strip()[-300:]}",
                  file=sys.stderr)
            return proc.returncode, 0
    proc = _cli(["compare", str(dirs[0]), str(dirs[1]), "--json"])
    try:
        flagged = len(json.loads(proc.stdout).get("regressions") or [])
    except (json.JSONDecodeError, AttributeError):
        flagged = 0
    return proc.returncode, flagged


def simulated_pair(root: Path, rng, run_cv: float = 0.03) -> tuple[int, int]:
    """Two synthetic identical cpu_smoke-like runs (validation.significance.simulate's AR(1) model: 15 steps,
    phi 0.7, CV 9%, each run's level varying by run_cv; a 3 x 2 sweep and 4 single runs) compared in-process."""
    from validation.compare import compare_runs
    from validation.significance.simulate import ar1

    def run(run_dir: Path) -> dict:
        steps = {}

        def launch(rel: str) -> dict:
            level = 1e4 * (1 + run_cv * rng.standard_normal())
            series = level * (1 + ar1(rng, (1, 15), 0.7, 0.09)[0])
            path = run_dir / rel / "out" / "training.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            rows = ["step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"]
            rows += [f"{i + 1},4.0,0.001,{v:.3f},{4096 / v:.6f},1.0,1.0,1.5" for i, v in enumerate(series)]
            path.write_text("\n".join(rows) + "\n")
            return {"csv": f"{rel}/out/training.csv", "window": {"last": 15, "warmup": 0}}

        runs = [{"label": f"NSA_DDP_BUCKET_MB={mb}", "repeat": r, "status": "passed",
                 "params": {"env.NSA_DDP_BUCKET_MB": str(mb)}, "metrics": launch(f"sweep/{mb}_r{r + 1}")}
                for r in range(2) for mb in (25, 50, 100)]
        steps["sweep"] = {"name": "sweep", "kind": "sweep", "status": "passed", "runs": runs, "metrics": {}}
        for name in ("baseline", "single", "profiling", "longrun"):
            steps[name] = {"name": name, "kind": "train", "status": "passed", "runs": [], "metrics": launch(name)}
        results = {"schema_version": 1, "runbook": {"name": "sim"}, "verdict": "GO", "environment": {},
                   "steps": steps}
        (run_dir / "results.json").parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "results.json").write_text(json.dumps(results))
        return results

    a, b = run(root / "a"), run(root / "b")
    out = compare_runs(a, b, root / "a", root / "b")
    return out["exit_code"], len(out["regressions"])


def run_pairs(n: int, pair: Callable[[int], tuple[int, int]], log=print) -> list[int]:
    codes = []
    for i in range(n):
        t0 = time.monotonic()
        code, flagged = pair(i)
        codes.append(code)
        log(f"pair {i + 1}/{n}: exit {code}, {flagged} row(s) flagged, {time.monotonic() - t0:.0f} s")
    return codes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="A/A pairs (at least 20 for the figure)")
    ap.add_argument("--runbook", type=Path, help="the runbook each run runs (default: the small one above)")
    ap.add_argument("--out", type=Path, help="where the run directories go (default: artifacts/bench_aa_compare)")
    ap.add_argument("--simulate", action="store_true", help="synthetic run directories instead of real runs")
    ap.add_argument("--seed", type=int, default=0, help="--simulate's seed")
    ap.add_argument("--json", type=Path, help="also write the summary as JSON here")
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    command = "python benchmarks/bench_aa_compare.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    out = args.out or REPO / "artifacts" / ("bench_aa_compare_sim" if args.simulate else "bench_aa_compare")
    out.mkdir(parents=True, exist_ok=True)
    if args.simulate:
        import numpy as np

        rng = np.random.default_rng(args.seed)
        codes = run_pairs(args.pairs, lambda i: simulated_pair(out / f"pair{i:03d}", rng))
    else:
        runbook = args.runbook
        if runbook is None:
            runbook = out / "aa_small.yaml"
            runbook.write_text(SMALL_RUNBOOK)
        codes = run_pairs(args.pairs, lambda i: real_pair(runbook, out, i))
    summary = summarize(codes)
    for line in report_lines(summary, command.strip()):
        print(line)
    if args.json:
        args.json.write_text(json.dumps({**summary, "command": command.strip(), "exit_codes": codes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
