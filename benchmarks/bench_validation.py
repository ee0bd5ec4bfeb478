"""Load figures of the validation pipeline: a 1,000,000-row training.csv and a 1,000,000-line heartbeat file.

    python benchmarks/bench_validation.py [--rows 1000000] [--json out.json]

Each stage runs in its own subprocess so its peak memory (peak RSS, torch/pandas imports included) is its own:
- csv: read_training_csv + summarize (last-50 window) of an N-row training.csv;
- report: make_plots + render (md, html, junit) of a results.json whose long-run step points at that csv;
- heartbeat: latest_heartbeats (tail read) vs read_heartbeats (whole file) on an N-line heartbeat file.
Times are wall seconds on this machine; compare them with each other, not with another machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_csv(path: Path, rows: int) -> None:
    import numpy as np
    import pandas as pd

    steps = np.arange(1, rows + 1)
    rng = np.random.default_rng(0)
    pd.DataFrame({"step": steps, "loss": 5 - np.log1p(steps) / 20, "lr": 1e-3,
                  "toks_per_s": 30000 + rng.standard_normal(rows) * 100, "step_time_s": 0.03, "grad_norm": 1.0,
                  "mem_alloc_gb": 0.3, "mem_reserved_gb": 0.35}).to_csv(path, index=False)


def make_heartbeats(path: Path, lines: int) -> None:
    with open(path, "w") as f:
        for i in range(lines):
            f.write(json.dumps({"ts": 1.7e9 + i, "rank": 0, "pid": 1, "host": "h", "step": i, "msg": "step",
                                "loss": 2.0, "toks_per_s": 30000.0}) + "\n")


def stage(name: str, work: Path) -> dict:
    """One stage, timed without its imports (torch, pandas, matplotlib load once per process)."""
    from nsa.heartbeat import latest_heartbeats, read_heartbeats
    from validation import metrics
    from validation.report import make_plots, render

    t0 = time.perf_counter()
    if name == "csv":
        read = metrics.read_training_csv(work / "run" / "longrun" / "training.csv")
        summary = metrics.summarize(read, metrics.Window(50, 5))
        out = {"rows_used": summary["window"]["n"], "status": summary["status"]}
    elif name == "report":
        results = json.loads((work / "run" / "results.json").read_text())
        plots = make_plots(results, work / "run")
        sizes = {fmt: len(render(results, fmt, plots=plots)) for fmt in ("md", "html", "junit")}
        out = {"plots": len(plots), "chars": sizes}
    elif name == "heartbeat_tail":
        out = {"last_step": latest_heartbeats(work)[0]["step"]}
    elif name == "heartbeat_full":
        out = {"records": len(read_heartbeats(work)[0])}
    else:
        raise SystemExit(f"unknown stage {name}")
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.stage:
        print(json.dumps(stage(args.stage, args.work)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "run" / "longrun").mkdir(parents=True)
        t0 = time.perf_counter()
        make_csv(work / "run" / "longrun" / "training.csv", args.rows)
        make_heartbeats(work / "heartbeat_rank0.jsonl", args.rows)
        results = {"schema_version": 1, "runbook": {"name": "load"}, "verdict": "GO", "verdict_reason": "load",
                   "environment": {}, "phases": [{"name": "p", "title": "p", "steps": ["longrun"]}],
                   "steps": {"longrun": {"name": "longrun", "phase": "p", "kind": "longrun", "status": "passed",
                                         "metrics": {"csv": "longrun/training.csv",
                                                     "window": {"last": 50, "warmup": 5}}, "runs": []}},
                   "acceptance": [], "recommendations": {"env": {}, "notes": []}, "plots": []}
        (work / "run" / "results.json").write_text(json.dumps(results))
        print(f"inputs: {args.rows:,} csv rows and heartbeat lines ({time.perf_counter() - t0:.1f} s to write)")
        figures = {}
        for name in ("csv", "report", "heartbeat_tail", "heartbeat_full"):
            proc = subprocess.run([sys.executable, __file__, "--stage", name, "--work", str(work)], cwd=ROOT,
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if proc.returncode:
                raise SystemExit(f"stage {name} failed:\n{proc.stderr[-3000:]}")
            figures[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{name:15s} {figures[name]['seconds']:7.3f} s   peak RSS {figures[name]['peak_rss_mb']:7.0f} MB")
        tail, full = figures["heartbeat_tail"]["seconds"], figures["heartbeat_full"]["seconds"]
        print(f"heartbeat tail read is {full / max(tail, 1e-9):.0f}x faster than reading the whole file")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "figures": figures}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
