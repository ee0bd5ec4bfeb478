"""Training throughput of the real trainer: tokens/s, achieved FLOP/s, MFU and peak memory, single process vs DDP.

    python benchmarks/bench_train.py                  # CPU: tiny config and m7c_125m at seq 2048, single vs DDP x2
    python benchmarks/bench_train.py --quick          # CPU: tiny config only
    python benchmarks/bench_train.py --device cuda    # GPU: m7c_125m at seq 2048, bf16, NSA beside its dense twin
    python benchmarks/bench_train.py --device cuda --repeats 3   # interleaved repeats: min / median / max of runs

Each case launches `python -m nsa.training` (or torchrun with 2 ranks) in its own out_dir under artifacts/bench_train/
and reads its training.csv: throughput is the mean (and stdev) of toks_per_s over the steps after the warm-up
steps; memory is the largest mem_reserved_gb (peak RSS on CPU, peak reserved CUDA memory on GPU, rank 0).
toks_per_s is global, so DDP / single is the speed-up from the second rank (on a 2-core CPU each rank gets one
core, so ~1.0 is the expected, honest answer there; on GPUs it should approach the number of GPUs).
MFU needs a device peak: known GPUs are looked up (nsa.training.metrics); on CPU pass --peak-tflops to get one.
On CUDA the NSA model (the Triton kernels: NSA_KERNEL=auto) runs beside its dense twin (`--attention dense`: the
same model with causal SDPA), and the NSA / dense tokens/s ratio is printed (target >= 0.55, >= 150,000 tok/s on
one H100). With --repeats N the cases run N times, interleaved (A B A B ...), and the table gives the min /
median / max of the runs' mean tokens/s: per-step values are autocorrelated, runs are the independent units.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "artifacts" / "bench_train"

CPU_CASES = [
    # name, config, trainer flags, steps, warm-up steps excluded from the mean
    ("tiny", "configs/tiny_cpu.yaml", ["--precision", "fp32"], 40, 5),
    ("m7c_125m_s2048", "configs/m7c_125m_2xa100_production.yaml",
     ["--batch-size", "1", "--accum", "1", "--precision", "fp32", "--device", "cpu"], 3, 1),
]
GPU_CASES = [
    ("m7c_125m_s2048_bf16", "configs/m7c_125m_1xh100.yaml", ["--precision", "bf16", "--device", "cuda"], 60, 10),
    ("m7c_125m_s2048_bf16_dense", "configs/m7c_125m_1xh100.yaml",
     ["--precision", "bf16", "--device", "cuda", "--attention", "dense"], 60, 10),
]


def run_case(name: str, config: str, flags: list[str], steps: int, warmup: int, nproc: int, peak: float | None,
             timeout: float) -> dict:
    out_dir = OUT / f"{name}_x{nproc}"
    argv = ["-m", "nsa.training", "--config", config, "--out-dir", str(out_dir), "--steps", str(steps),
            "--save-every", str(10 ** 9), "--log-every", str(max(1, steps // 4)), *flags]
    if nproc > 1:
        argv = ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "-m", "nsa.training", *argv[2:],
                "--ddp", "1"]
    env = {**os.environ, "NSA_TB_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    if out_dir.exists():
        for stale in out_dir.glob("*.csv"):
            stale.unlink()
    t0 = time.time()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} x{nproc} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    with open(out_dir / "training.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    steady = rows[warmup:] or rows
    tps = [float(r["toks_per_s"]) for r in steady]
    env_json = json.loads((out_dir / "env.json").read_text())
    fpt = env_json["flops_per_token"]
    mean = statistics.mean(tps)
    device_peak = env_json.get("peak_flops") or (peak * 1e12 if peak else None)
    return {
        "case": name, "ranks": nproc, "device": env_json.get("device_name"), "steps": len(rows),
        "steady_steps": len(steady), "toks_per_s": mean, "toks_per_s_stdev": statistics.pstdev(tps),
        "toks_per_s_per_rank": mean / nproc, "achieved_tflops": fpt * mean / 1e12,
        "mfu": fpt * mean / (device_peak * nproc) if device_peak else None,
        "peak_mem_gb": max(float(r["mem_reserved_gb"]) for r in rows), "params_m": env_json["n_params"] / 1e6,
        "flops_per_token_g": fpt / 1e9, "final_loss": float(rows[-1]["loss"]), "wall_s": wall,
        "csv": str((out_dir / "training.csv").relative_to(ROOT)), "attention_kernel": env_json.get("attention_kernel"),
    }


def fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def summarize(runs: list[dict]) -> dict:
    """One row from the repeats of a case: min / median / max of the runs' mean tokens/s, the median run's rest."""
    runs = sorted(runs, key=lambda r: r["toks_per_s"])
    mid = runs[len(runs) // 2]
    tps = [r["toks_per_s"] for r in runs]
    return {**mid, "runs": len(runs), "toks_per_s": statistics.median(tps), "toks_per_s_min": min(tps),
            "toks_per_s_max": max(tps)}


def table(results: list[dict]) -> str:
    lines = ["| case | kernel | ranks | runs | tokens/s (global) min / median / max | per rank | step stdev | TFLOP/s | "
             "MFU | peak mem GB | params | csv |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['case']} | {r.get('attention_kernel')} | {r['ranks']} | {r['runs']} | "
                     f"{r['toks_per_s_min']:,.0f} / {r['toks_per_s']:,.0f} / {r['toks_per_s_max']:,.0f} | "
                     f"{r['toks_per_s_per_rank']:,.0f} | {r['toks_per_s_stdev']:,.0f} | {r['achieved_tflops']:.4f} | "
                     f"{fmt(r['mfu'] and r['mfu'] * 100, '.1f')}{'%' if r['mfu'] else ''} | "
                     f"{r['peak_mem_gb']:.2f} | {r['params_m']:.1f}M | {r['csv']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--quick", action="store_true", help="CPU: the tiny config only")
    ap.add_argument("--no-ddp", action="store_true", help="single-process cases only")
    ap.add_argument("--peak-tflops", type=float, help="device peak for MFU where it is not known (e.g. a CPU)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per case")
    ap.add_argument("--repeats", type=int, default=1, help="runs per case, interleaved across cases")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    cases = GPU_CASES if args.device == "cuda" else CPU_CASES[:1] if args.quick else CPU_CASES
    ranks = (1,) if args.no_ddp or args.device == "cuda" else (1, 2)
    print("reproduce: python benchmarks/bench_train.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    runs: dict[tuple[str, int], list[dict]] = {}
    for rep in range(args.repeats):
        for name, config, flags, steps, warmup in cases:
            for nproc in ranks:
                print(f"running {name} x{nproc} ({steps} steps, run {rep + 1}/{args.repeats}) ...", file=sys.stderr,
                      flush=True)
                runs.setdefault((name, nproc), []).append(
                    run_case(name, config, flags, steps, warmup, nproc, args.peak_tflops, args.timeout))
    results = [summarize(r) for r in runs.values()]
    print(table(results))
    by_case = {r["case"]: r for r in results if r["ranks"] == 1}
    for name, r in by_case.items():
        dense = by_case.get(name + "_dense")
        if dense:
            print(f"{name}: NSA / dense twin tokens/s = {r['toks_per_s'] / dense['toks_per_s']:.3f} "
                  f"(medians of {r['runs']} and {dense['runs']} runs; NSA kernel {r.get('attention_kernel')})")
    for name, *_ in cases:
        single = next((r for r in results if r["case"] == name and r["ranks"] == 1), None)
        ddp = next((r for r in results if r["case"] == name and r["ranks"] == 2), None)
        if single and ddp:
            print(f"{name}: DDP x2 / single tokens/s = {ddp['toks_per_s'] / single['toks_per_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
