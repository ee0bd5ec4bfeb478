"""Forward+backward throughput and peak memory of NSA attention (batched, sequential) vs dense SDPA attention.

    python benchmarks/bench_attention.py                 # S = 512 ... 16384 on CPU, fp32
    python benchmarks/bench_attention.py --quick         # S = 512, 1024, 2048
    python benchmarks/bench_attention.py --device cuda --dtype bf16

Every (path, S) case runs in a fresh subprocess so that its peak memory is its own (CPU: peak resident set size
of the process; CUDA: torch.cuda.max_memory_allocated). Times are medians of repeated forward+backward passes
after a warm-up pass. Ratios compare paths measured in the same run; the targets are checked against them.
This is a benchmark, not a test: it reports, and `--check` turns a missed target into exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
PATHS = ("batched", "sequential", "dense")
# The shape the issue names: B=1, dim=256, 8 heads, 2 KV groups, d_k=d_v=32, default NSA blocks.
SHAPE = dict(dim=256, n_heads=8, n_kv_groups=2, d_k=32, d_v=32)
TARGET_TOKS_2048 = 7000.0
TARGET_SCALING = 6.0  # time(S=16384) / time(S=4096), batched
TARGET_PEAK_GB = 8.0  # S=16384, batched


def build(path: str, device: str, dtype):
    import torch.nn as nn
    import torch.nn.functional as F

    from nsa import NSAAttention, NSAConfig

    if path == "dense":
        class DenseAttention(nn.Module):
            """Causal GQA attention of the same shape through PyTorch SDPA (the baseline)."""

            def __init__(self, dim, n_heads, n_kv_groups, d_k, d_v):
                super().__init__()
                self.h, self.g = n_heads, n_kv_groups
                self.q = nn.Linear(dim, n_heads * d_k, bias=False)
                self.k = nn.Linear(dim, n_kv_groups * d_k, bias=False)
                self.v = nn.Linear(dim, n_kv_groups * d_v, bias=False)
                self.o = nn.Linear(n_heads * d_v, dim, bias=False)

            def forward(self, x):
                b, s, _ = x.shape
                q = self.q(x).view(b, s, self.h, -1).transpose(1, 2)
                k = self.k(x).view(b, s, self.g, -1).transpose(1, 2)
                v = self.v(x).view(b, s, self.g, -1).transpose(1, 2)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return self.o(o.transpose(1, 2).flatten(2))

        module = DenseAttention(**SHAPE)
    else:
        module = NSAAttention(NSAConfig(**SHAPE, prefill=path))
    return module.to(device=device, dtype=dtype)


def run_case(path: str, seq_len: int, device: str, dtype_name: str, repeats: int) -> dict:
    """Measure one case in this process; returns a JSON-able dict."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    torch.manual_seed(0)
    module = build(path, device, dtype)
    x = torch.randn(1, seq_len, SHAPE["dim"], device=device, dtype=dtype, requires_grad=True)

    def step():
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        module(x).float().square().mean().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    warm = step()
    n = 1 if warm > 10 else repeats
    times = [step() for _ in range(n)]
    if device == "cuda":
        peak_gb = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    median = statistics.median(times)
    return {"path": path, "seq_len": seq_len, "time_s": median, "toks_per_s": seq_len / median,
            "peak_gb": peak_gb, "repeats": n, "device": device, "dtype": dtype_name,
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def spawn(path: str, seq_len: int, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", path, "--seq-lens", str(seq_len),
           "--device", args.device, "--dtype", args.dtype, "--repeats", str(args.repeats)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"path": path, "seq_len": seq_len, "error": f"exit {proc.returncode}: {tail[0]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt(value, spec):
    """format(value, spec), or a dash padded to the same width when there is no value."""
    width = int("".join(ch for ch in spec.split(",")[0].split(".")[0] if ch.isdigit()) or 0)
    return format("-", f">{width}") if value is None else format(value, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)), help="comma-separated sequence lengths")
    ap.add_argument("--quick", action="store_true", help="S = 512, 1024, 2048 only")
    ap.add_argument("--sequential-max", type=int, default=2048,
                    help="largest S for the sequential oracle (a per-token Python loop; slow by design)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write all results to this file")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--case", choices=PATHS, help=argparse.SUPPRESS)  # internal: measure one case
    args = ap.parse_args(argv)
    try:
        seq_lens = [int(s) for s in args.seq_lens.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seq-lens must be comma-separated integers, got {args.seq_lens!r}")
    if any(s < 1 for s in seq_lens):
        ap.error("--seq-lens values must be >= 1")
    if args.case:
        print(json.dumps(run_case(args.case, seq_lens[0], args.device, args.dtype, args.repeats)))
        return 0
    if args.quick:
        seq_lens = [512, 1024, 2048]

    results: dict[tuple[str, int], dict] = {}
    print(f"NSA attention forward+backward, B=1 {SHAPE}, device={args.device} dtype={args.dtype}")
    header = (f"{'S':>6} | {'batched tok/s':>13} {'seq tok/s':>10} {'dense tok/s':>11} | {'b/dense':>7} "
              f"{'b/seq':>7} | {'peak GB b/s/d':>20}")
    print(header)
    print("-" * len(header))
    for s in seq_lens:
        for path in PATHS:
            if path == "sequential" and s > args.sequential_max:
                continue
            results[(path, s)] = spawn(path, s, args)
        row = {p: results.get((p, s), {}) for p in PATHS}
        tps = {p: row[p].get("toks_per_s") for p in PATHS}
        peaks = "/".join(fmt(row[p].get("peak_gb"), ".2f") for p in PATHS)
        ratio_dense = tps["batched"] / tps["dense"] if tps["batched"] and tps["dense"] else None
        ratio_seq = tps["batched"] / tps["sequential"] if tps["batched"] and tps["sequential"] else None
        print(f"{s:>6} | {fmt(tps['batched'], '13,.0f')} {fmt(tps['sequential'], '10,.0f')} "
              f"{fmt(tps['dense'], '11,.0f')} | {fmt(ratio_dense, '7.2f')} {fmt(ratio_seq, '7.1f')} | {peaks:>20}",
              flush=True)
        for p in PATHS:
            if "error" in row[p]:
                print(f"       {p} failed: {row[p]['error']}")
    if any(s > args.sequential_max for s in seq_lens):
        print(f"(sequential: the per-token oracle is measured up to S={args.sequential_max}; --sequential-max)")

    checks = []
    b2048 = results.get(("batched", 2048), {}).get("toks_per_s")
    if b2048 is not None and args.device == "cpu" and args.dtype == "fp32":
        checks.append((f"batched S=2048 >= {TARGET_TOKS_2048:,.0f} tok/s", f"{b2048:,.0f}", b2048 >= TARGET_TOKS_2048))
    t4, t16 = (results.get(("batched", s), {}).get("time_s") for s in (4096, 16384))
    if t4 and t16:
        d4, d16 = (results.get(("dense", s), {}).get("time_s") for s in (4096, 16384))
        dense = f" (dense: {d16 / d4:.1f}x)" if d4 and d16 else ""
        checks.append((f"time(16384)/time(4096) <= {TARGET_SCALING:g}", f"{t16 / t4:.2f}{dense}",
                       t16 / t4 <= TARGET_SCALING))
    p16 = results.get(("batched", 16384), {}).get("peak_gb")
    if p16 is not None:
        checks.append((f"S=16384 peak < {TARGET_PEAK_GB:g} GB", f"{p16:.2f} GB", p16 < TARGET_PEAK_GB))
    if checks:
        print("\ntargets:")
        for name, value, ok in checks:
            print(f"  {'PASS' if ok else 'MISS'}  {name}: {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"shape": SHAPE, "results": list(results.values()),
                                         "checks": [dict(name=n, value=v, ok=o) for n, v, o in checks]}, indent=2))
    return 1 if args.check and not all(ok for _, _, ok in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
