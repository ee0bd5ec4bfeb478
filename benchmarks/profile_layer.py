"""Where one attention layer's forward + backward spends its time on a GPU: kernel launches, host time, GPU time.

    python benchmarks/profile_layer.py --seq-lens 2048,65536 --batch 8,1          # NSA (Triton) and dense, bf16
    python benchmarks/profile_layer.py --select fused --json out.json             # the fused top-k selection

For each (path, S, B) case, in a fresh subprocess: build the layer (m7c shape: H = 12, G = 2, d = 64, dim = 768),
run warm-up passes, then profile N forward + backward passes with torch.profiler (CPU and CUDA activities) and
report per pass:
- kernel launches: the CUDA kernels the GPU ran (memcpy / memset counted apart), the number issue 21 caps at 80
  per NSA layer forward + backward (bench_ops.py counts the ops that launch them on CPU);
- host time: the wall time of a pass with the device synchronised only at its end (the host issues, the GPU runs
  behind it: when host time > GPU time, the host sets the pace);
- GPU time: the sum of the kernels' durations;
- the top kernels by GPU time.
This is a profile, not a timing benchmark: the profiler adds host overhead. Speeds come from bench_attention.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def run_case(path: str, seq_len: int, batch: int, select: str, passes: int, warmup: int,
             index_build: str = "auto") -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_attention import SHAPES, build

    if select != "default":
        from nsa.attention.kernels.selection import host as triton_selection
        triton_selection.select_method = lambda n_sel: select
    torch.manual_seed(0)
    shape = SHAPES["m7c"]
    module = build(path, shape, "cuda", torch.bfloat16, index_build)
    x = torch.randn(batch, seq_len, shape["dim"], device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def one():
        module(x).float().square().mean().backward()
        x.grad = None
        for p in module.parameters():
            p.grad = None

    for _ in range(warmup):
        one()
    torch.cuda.synchronize()
    host = []
    for _ in range(3):
        t0 = time.perf_counter()
        one()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0, time.perf_counter() - t0))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            one()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    copies = 0
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = evt.name
        if name.startswith(("Memcpy", "Memset", "[memcpy", "[memset")) or "memcpy" in name.lower() \
                or "memset" in name.lower():
            copies += 1
            continue
        kernels.setdefault(name, []).append(evt.time_range.elapsed_us())
    if not kernels:  # profilers that attach the kernels to their CPU events instead
        for evt in prof.events():
            for k in getattr(evt, "kernels", []):
                if "memcpy" in k.name.lower() or "memset" in k.name.lower():
                    copies += 1
                else:
                    kernels.setdefault(k.name, []).append(k.duration)
    launches = sum(len(v) for v in kernels.values()) / passes
    gpu_us = sum(sum(v) for v in kernels.values()) / passes
    top = sorted(((sum(v) / passes, len(v) / passes, k) for k, v in kernels.items()), reverse=True)[:15]
    return {"path": path, "seq_len": seq_len, "batch": batch, "select": select, "index_build": index_build,
            "passes": passes,
            "kernel_launches": launches, "copies_per_pass": copies / passes,
            "gpu_ms": gpu_us / 1e3, "host_issue_ms": min(h for h, _ in host) * 1e3,
            "wall_ms": min(w for _, w in host) * 1e3,
            "top_kernels": [{"name": k[:120], "ms": us / 1e3, "per_pass": n} for us, n, k in top],
            "device_name": torch.cuda.get_device_name(), "torch": torch.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="2048,65536")
    ap.add_argument("--batch", default="8,1", help="B per length (one value: every length)")
    ap.add_argument("--paths", default="nsa-triton,dense")
    ap.add_argument("--select", default="default", choices=("default", "tiled", "fused"),
                    help="the NSA layer's block selection (default: select_method's choice)")
    ap.add_argument("--index-build", default="auto", choices=("auto", "torch", "triton"),
                    help="the NSA layer's inverted index of the selected blocks (NSAConfig.index_build; auto: triton "
                         "on a GPU)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    if len(batches) == 1:
        batches *= len(seq_lens)
    if len(batches) != len(seq_lens):
        ap.error(f"--batch has {len(batches)} values for {len(seq_lens)} lengths")
    if args.case:
        print(json.dumps(run_case(args.case, seq_lens[0], batches[0], args.select, args.passes, args.warmup,
                                  args.index_build)))
        return 0
    print("command:", " ".join([sys.executable, *sys.argv]), flush=True)
    results = []
    for s, b in zip(seq_lens, batches):
        for path in args.paths.split(","):
            cmd = [sys.executable, __file__, "--case", path, "--seq-lens", str(s), "--batch", str(b),
                   "--select", args.select, "--index-build", args.index_build, "--passes", str(args.passes),
                   "--warmup", str(args.warmup)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()
                r = {"path": path, "seq_len": s, "batch": b, "error": f"exit {proc.returncode}: "
                                                                      f"{(tail or ['no output'])[-1]}"}
            else:
                r = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(r)
            if "error" in r:
                print(f"{path:<11} S={s:<6} B={b}: {r['error']}", flush=True)
                continue
            print(f"{path:<11} S={s:<6} B={b}: {r['kernel_launches']:.0f} kernel launches/pass "
                  f"(+{r['copies_per_pass']:.0f} copies), host issue {r['host_issue_ms']:.2f} ms, "
                  f"wall {r['wall_ms']:.2f} ms, GPU {r['gpu_ms']:.2f} ms", flush=True)
            for k in r["top_kernels"][:8]:
                print(f"    {k['ms']:8.3f} ms  x{k['per_pass']:<5.1f} {k['name']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
