"""Where one attention layer's forward and backward spend their time on a GPU, against their roofline.

    python benchmarks/profile_layer.py --seq-lens 2048,65536 --batch 8,1          # NSA (Triton) and dense, bf16
    python benchmarks/profile_layer.py --select fused --json out.json             # the fused top-k selection

For each (path, S, B) case, in a fresh subprocess: build the layer (m7c shape: H = 12, G = 2, d = 64, dim = 768),
run warm-up passes, then profile N passes with torch.profiler (CPU and CUDA activities), the N forwards in one
profile and their N backwards in another (each synchronised at its end), and report per pass:
- kernel launches: the CUDA kernels the GPU ran (memcpy / memset counted apart), the number issue 21 caps at 80
  per NSA layer forward + backward (bench_ops.py counts the ops that launch them on CPU);
- host time: the wall time of a pass with the device synchronised only at its end (the host issues, the GPU runs
  behind it: when host time > GPU time, the host sets the pace); the forward's and the backward's wall time, each
  synchronised at its end;
- GPU time: the sum of the kernels' durations, in all and per direction;
- the top kernels by GPU time;
- the roofline (nsa.attention.cost_model, the device's peaks from nsa.training.metrics.roofline_peaks): per kernel
  its measured time, share of the layer's fwd + bwd kernel time, cost family, the model's FLOPs, exps and minimal
  HBM bytes at the shape, its floor (the slowest resource at peak) and efficiency (floor / time); the layer's
  efficiency per direction and in all (sum of the floors over the time of the kernels that take at least 1% of
  the layer's time, aten glue and GEMMs included: they have no floor); the model's layer floor against the dense
  twin's floor, printed beside the measured ratio (dense's GPU time over NSA's at the same S and B). A device
  without listed peaks says "peak unknown" and gets the counts only.
JSON (--json): {"results": one record per case (the fields above; fwd_*, bwd_*, efficiency*, floor_*,
dense_floor_*, floor_ratio*, measured_ratio*), "kernels": every case's kernels of at least 1% of the layer's time,
one row each, plus a row per case and pass summing the rest}. A case that failed is a record with its "error" (no
figures), and the script then exits 1; so is a profile that recorded no GPU kernel (CUPTI unavailable: 0 launches
and 0 ms would read as figures).
This is a profile, not a timing benchmark: the profiler adds host overhead. Speeds come from bench_attention.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from nsa.attention import cost_model as cm  # noqa: E402 - after the path set-up above; torch-free
from nsa.attention.cost_model import BWD, FWD  # noqa: E402
from nsa.config import NSAConfig  # noqa: E402

MIN_SHARE = cm.MIN_SHARE  # kernels under 1% of the layer's time: summed into one row of the JSON's kernel table


COPY_MARKERS = ("Memcpy", "Memset", "[memcpy", "[memset")


def _kernels(prof, torch) -> tuple[dict[str, list[float]], int]:
    """{kernel name: [durations in us]} of the CUDA kernels a profile saw, and the number of copies / sets.
    A profile without any GPU kernel (the CUDA activity was not recorded: a CPU-only profile, or CUPTI unavailable)
    raises: its 0 launches and 0 ms GPU time would read as figures (a layer within the launch cap, in no time)."""
    kernels: dict[str, list[float]] = {}
    copies = 0
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = evt.name
        if name.startswith(COPY_MARKERS) or "memcpy" in name.lower() or "memset" in name.lower():
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
    if not kernels:
        raise RuntimeError(f"the profiler recorded no GPU kernel ({copies} copies / sets): the CUDA activity was not "
                           "traced (a CPU-only profile, or CUPTI unavailable); no launch count or GPU time")
    return kernels, copies


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

    def forward():
        return module(x).float().square().mean()

    def clear():
        x.grad = None
        for p in module.parameters():
            p.grad = None

    for _ in range(warmup):
        forward().backward()
        clear()
    torch.cuda.synchronize()
    host, fwd_wall, bwd_wall = [], [], []
    for _ in range(3):
        t0 = time.perf_counter()
        forward().backward()
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t2 - t0, time.perf_counter() - t0))
        clear()
        t0 = time.perf_counter()  # forward and backward apart, each synchronised at its end
        loss = forward()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        fwd_wall.append(t1 - t0)
        bwd_wall.append(time.perf_counter() - t1)
        clear()
    # forward and backward profiled apart: the N forwards in one profile (their graphs kept), then their N backwards
    # in another (gradients cleared between them, so no accumulation kernels); each synchronised at its end
    by_pass: dict[str, dict[str, list[float]]] = {}
    copies = 0
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        losses = [forward() for _ in range(passes)]
        torch.cuda.synchronize()
    by_pass[FWD], n = _kernels(prof, torch)
    copies += n
    with profile(activities=activities) as prof:
        for loss in losses:
            loss.backward()
            clear()
        torch.cuda.synchronize()
    by_pass[BWD], n = _kernels(prof, torch)
    copies += n
    del losses
    kernels: dict[str, list[float]] = {}
    for found in by_pass.values():
        for name, us in found.items():
            kernels.setdefault(name, []).extend(us)
    launches = sum(len(v) for v in kernels.values()) / passes
    gpu_us = sum(sum(v) for v in kernels.values()) / passes
    top = sorted(((sum(v) / passes, len(v) / passes, k) for k, v in kernels.items()), reverse=True)[:15]
    name = torch.cuda.get_device_name()
    record = {"path": path, "seq_len": seq_len, "batch": batch, "select": select, "index_build": index_build,
              "passes": passes,
              "kernel_launches": launches, "copies_per_pass": copies / passes,
              "gpu_ms": gpu_us / 1e3, "host_issue_ms": min(h for h, _ in host) * 1e3,
              "wall_ms": min(w for _, w in host) * 1e3,
              "fwd_wall_ms": min(fwd_wall) * 1e3, "bwd_wall_ms": min(bwd_wall) * 1e3,
              "top_kernels": [{"name": k[:120], "ms": us / 1e3, "per_pass": n} for us, n, k in top],
              "device_name": name, "torch": torch.__version__}
    record.update(roofline({p: {k: [sum(v) / passes / 1e3, len(v) / passes] for k, v in found.items()}
                            for p, found in by_pass.items()}, path, seq_len, batch, name, shape))
    return record


def _duration(ms) -> bool:
    """Whether a kernel's measured time is a duration: a finite number of ms, not negative."""
    return isinstance(ms, (int, float)) and math.isfinite(ms) and ms >= 0


def roofline(by_pass: dict, path: str, seq_len: int, batch: int, device: str, shape: dict, elem: int = 2,
             precision: str = "bf16") -> dict:
    """The roofline of one profiled case, from {pass: {kernel name: [ms per pass, launches per pass]}}.

    Returns the record's fields: per pass its GPU time and launches ("fwd_gpu_ms", ...), "kernels" (every kernel:
    pass, name, family, ms, per_pass, share of the layer's fwd + bwd kernel time, the model's flops / exps / bytes,
    floor_ms, bound, efficiency; a family seen under several names shares its cost by measured time), the
    layer's efficiency per pass and in all ("efficiency_fwd", "efficiency_bwd", "efficiency": sum of the floors
    over the measured time of the kernels that take at least 1% of the layer's time, glue included), the model's
    layer floor and dense's ("floor_*_ms", "dense_floor_*_ms") and their ratio ("floor_ratio_fwd",
    "floor_ratio"). A kernel measured under its floor (the model's counts or the device's peaks are wrong) gets no
    efficiency ("under_floor": True), nor does a sum over it; "under_floor" lists them. A kernel time that is
    negative or not finite (no duration a kernel can take) is no figure either: "bad_time" lists them, and its
    pass's GPU time and every efficiency over it are None. Unknown device: "peak": "unknown", the counts without
    floors."""
    from nsa.training.metrics import roofline_peaks  # imports torch: the parent process never loads it

    cfg = NSAConfig(**shape)
    peaks = roofline_peaks(device, precision)
    costs = cm.all_costs(cfg, seq_len, batch, elem)
    total_ms = sum(ms for found in by_pass.values() for ms, _ in found.values() if _duration(ms))
    fams = cm.families(name for found in by_pass.values() for name in found)
    rows = []
    for p, found in by_pass.items():
        fam_ms: dict[str, float] = {}
        for name, (ms, _) in found.items():
            fam_ms[fams[name]] = fam_ms.get(fams[name], 0.0) + (ms if _duration(ms) else 0.0)
        for name, (ms, n) in sorted(found.items(), key=lambda kv: -kv[1][0] if _duration(kv[1][0]) else 0.0):
            fam = fams[name]
            row = {"pass": p, "name": name[:120], "family": fam, "ms": ms, "per_pass": n,
                   "share": ms / total_ms if total_ms > 0 and _duration(ms) else None,
                   "flops": None, "exps": None, "bytes": None, "floor_ms": None, "bound": None, "efficiency": None}
            cost = costs.get(fam)
            if not _duration(ms):  # no duration a kernel can take: no share, no floor, no efficiency
                row["bad_time"] = True
            elif cost is not None:
                part = ms / fam_ms[fam] if fam_ms[fam] > 0 else 0.0
                cost = cm.Cost(cost.flops * part, cost.exps * part, cost.bytes * part)
                row.update(flops=cost.flops, exps=cost.exps, bytes=cost.bytes)
                if peaks is not None:
                    floor = cost.floor_s(peaks) * 1e3
                    row.update(floor_ms=floor, bound=cost.bound(peaks), efficiency=floor / ms if ms > 0 else None)
                    if ms < floor:  # faster than its floor: the model's counts or the device's peaks are wrong
                        row.update(efficiency=None, under_floor=True)
            rows.append(row)
    out: dict = {"peak": "unknown" if peaks is None else device, "kernels": rows}
    if peaks is not None:
        out["peaks"] = {"tflops": peaks.flops / 1e12, "texp_per_s": peaks.exps / 1e12, "tb_per_s": peaks.bytes / 1e12}
    bad = [r for r in rows if r.get("bad_time")]
    if bad:
        out["bad_time"] = [f"{r['pass']} {r['name']}: {r['ms']:.4g} ms" for r in bad]
    for p in (FWD, BWD):
        found = by_pass.get(p, {})
        out[f"{p}_gpu_ms"] = None if any(r["pass"] == p for r in bad) else sum(ms for ms, _ in found.values())
        out[f"{p}_kernel_launches"] = sum(n for _, n in found.values())
    if peaks is None:
        return out
    # the 1% is of the layer's (fwd + bwd) kernel time, whichever pass is summed; a kernel measured under its floor
    # is outside the physical range (efficiency above 100%): a sum holding its floor is no figure either
    under = [r for r in rows if r.get("under_floor")]
    if under:
        out["under_floor"] = [f"{r['pass']} {r['name']}: {r['ms']:.4g} ms, floor {r['floor_ms']:.4g} ms" for r in under]
    for key, chosen in (("efficiency_fwd", FWD), ("efficiency_bwd", BWD), ("efficiency", None)):
        kept = [r for r in rows if r["share"] is not None and r["share"] >= MIN_SHARE and chosen in (None, r["pass"])]
        out[key] = None if any(r.get("under_floor") for r in kept) or any(chosen in (None, r["pass"]) for r in bad) \
            else cm.efficiency(kept, min_share=0.0)["efficiency"]
    families = cm.DENSE_FAMILIES if path == "dense" else cm.LAYER_FAMILIES
    floor = cm.layer_floor_s(costs, peaks, families)
    dense = cm.layer_floor_s(costs, peaks, cm.DENSE_FAMILIES)
    out.update({f"floor_{k}_ms": v * 1e3 for k, v in floor.items()})
    out.update({f"dense_floor_{k}_ms": v * 1e3 for k, v in dense.items()})
    out["floor_ratio_fwd"] = dense[FWD] / floor[FWD]
    out["floor_ratio"] = dense["total"] / floor["total"]
    return out


def measured_ratios(results: list[dict]) -> None:
    """Beside each NSA case's floor ratio, dense's measured GPU time over its own at the same (S, B):
    "measured_ratio_fwd" and "measured_ratio" (fwd + bwd)."""
    dense = {(r["seq_len"], r["batch"]): r for r in results if r.get("path") == "dense" and "error" not in r}
    for r in results:
        d = dense.get((r.get("seq_len"), r.get("batch")))
        if r.get("path") == "dense" or d is None or "error" in r or not all(
                (x.get(k) or 0) > 0 for x in (r, d) for k in ("fwd_gpu_ms", "gpu_ms")):
            continue  # a ratio needs a positive GPU time on both sides
        r["measured_ratio_fwd"] = d["fwd_gpu_ms"] / r["fwd_gpu_ms"]
        r["measured_ratio"] = d["gpu_ms"] / r["gpu_ms"]


def case_record(stdout: str, path: str, seq_len: int, batch: int) -> dict:
    """The record a --case subprocess printed as its last line of output; a case whose output ends otherwise (cut,
    or a line printed after it) is an error record, never a traceback that loses every other case."""
    lines = stdout.strip().splitlines()
    try:
        record = json.loads(lines[-1]) if lines else None
    except ValueError:
        record = None
    printed = ("kernel_launches", "copies_per_pass", "host_issue_ms", "wall_ms", "gpu_ms")  # main's line of a case
    if not isinstance(record, dict) or not ("error" in record or all(k in record for k in printed)):
        tail = lines[-1][:200] if lines else "no output"
        return {"path": path, "seq_len": seq_len, "batch": batch, "error": f"exit 0 without its record: {tail}"}
    return record


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


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
    ap.add_argument("--dry-run", action="store_true", help="check the options and print the cases, run nothing (no "
                                                            "device is needed)")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        seq_lens = [int(s) for s in args.seq_lens.split(",")]
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        ap.error(f"--seq-lens {args.seq_lens!r} and --batch {args.batch!r} must be comma-separated integers")
    if len(batches) == 1:
        batches *= len(seq_lens)
    if len(batches) != len(seq_lens):
        ap.error(f"--batch has {len(batches)} values for {len(seq_lens)} lengths")
    if min(seq_lens + batches) < 1 or args.passes < 1 or args.warmup < 0:
        ap.error("lengths, batches and --passes must be >= 1, --warmup >= 0")
    from bench_attention import PATHS  # the layers bench_attention builds (this directory; it imports torch)

    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        ap.error(f"--paths {args.paths!r}: expected some of {', '.join(PATHS)}")
    if args.dry_run:
        for s, b in zip(seq_lens, batches):
            for path in paths:
                print(f"{path} at S {s:,} x B {b}: one subprocess, {args.warmup} warm-up and {args.passes} profiled "
                      "passes")
        return 0
    if args.case:
        print(json.dumps(run_case(args.case, seq_lens[0], batches[0], args.select, args.passes, args.warmup,
                                  args.index_build)))
        return 0
    print("command:", " ".join([sys.executable, *sys.argv]), flush=True)
    results = []
    for s, b in zip(seq_lens, batches):
        for path in paths:
            cmd = [sys.executable, __file__, "--case", path, "--seq-lens", str(s), "--batch", str(b),
                   "--select", args.select, "--index-build", args.index_build, "--passes", str(args.passes),
                   "--warmup", str(args.warmup)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()
                r = {"path": path, "seq_len": s, "batch": b, "error": f"exit {proc.returncode}: "
                                                                      f"{(tail or ['no output'])[-1]}"}
            else:
                r = case_record(proc.stdout, path, s, b)
            results.append(r)
            if "error" in r:
                print(f"{path:<11} S={s:<6} B={b}: {r['error']}", flush=True)
                continue
            print(f"{path:<11} S={s:<6} B={b}: {r['kernel_launches']:.0f} kernel launches/pass "
                  f"(+{r['copies_per_pass']:.0f} copies), host issue {r['host_issue_ms']:.2f} ms, "
                  f"wall {r['wall_ms']:.2f} ms, GPU {r['gpu_ms']:.2f} ms", flush=True)
            for line in describe(r):
                print(line, flush=True)
    measured_ratios(results)
    for r in results:
        if "measured_ratio" in r:
            print(f"{r['path']} S={r['seq_len']} B={r['batch']} against dense: measured {r['measured_ratio_fwd']:.2f}x "
                  f"fwd, {r['measured_ratio']:.2f}x fwd+bwd (GPU time); floor {_num(r.get('floor_ratio_fwd'), '.2f')}x "
                  f"fwd, {_num(r.get('floor_ratio'), '.2f')}x fwd+bwd", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(as_json(results), indent=1))
    if any("error" in r for r in results):
        return 1  # a case that failed is no figure: the runbook's step and next_run.sh's log see it
    return 0


def describe(r: dict) -> list[str]:
    """The console lines of one case's roofline: its passes, the layer's efficiency and floor, the kernel table
    (kernels of at least 1% of the layer's time)."""
    lines = [f"    fwd: GPU {_num(r.get('fwd_gpu_ms'), '.2f')} ms, wall {_num(r.get('fwd_wall_ms'), '.2f')} ms; "
             f"bwd: GPU {_num(r.get('bwd_gpu_ms'), '.2f')} ms, wall {_num(r.get('bwd_wall_ms'), '.2f')} ms"]
    if r.get("peak") == "unknown":
        lines.append(f"    roofline: peak unknown for {r.get('device_name')!r}: counts only")
    elif "peaks" in r:
        pk = r["peaks"]
        lines.append(f"    roofline ({pk['tflops']:.0f} TFLOP/s, {pk['texp_per_s']:.2f} T exp/s, {pk['tb_per_s']:.2f} "
                     f"TB/s): efficiency fwd {_num(r.get('efficiency_fwd'), '.1%')}, bwd "
                     f"{_num(r.get('efficiency_bwd'), '.1%')}, layer {_num(r.get('efficiency'), '.1%')}; floor fwd "
                     f"{r['floor_fwd_ms']:.3f} ms, bwd {r['floor_bwd_ms']:.3f} ms; dense's "
                     f"{r['dense_floor_fwd_ms']:.3f} / {r['dense_floor_bwd_ms']:.3f} ms: floor ratio "
                     f"{r['floor_ratio_fwd']:.2f}x fwd, {r['floor_ratio']:.2f}x fwd+bwd")
    for under in r.get("under_floor", []):
        lines.append(f"    measured under its floor (the cost model or the device's peaks are wrong; no efficiency "
                     f"over it): {under}")
    for bad in r.get("bad_time", []):
        lines.append(f"    a kernel time that is negative or not finite (no figure; no GPU time or efficiency over "
                     f"it): {bad}")
    lines.append(f"    {'pass':<4} {'ms':>8} {'share':>6} {'floor':>8} {'eff':>6} {'bound':<5} {'GFLOP':>9} "
                 f"{'G exp':>7} {'MB':>8}  {'family':<21} kernel")
    for k in r.get("kernels", []):
        if k["share"] is None or k["share"] < MIN_SHARE:
            continue
        lines.append(f"    {k['pass']:<4} {k['ms']:8.3f} {k['share']:6.1%} {_num(k['floor_ms'], '8.3f'):>8} "
                     f"{'<floor' if k.get('under_floor') else _num(k['efficiency'], '6.1%'):>6} {k['bound'] or '':<5} "
                     f"{_num(None if k['flops'] is None else k['flops'] / 1e9, '9.2f'):>9} "
                     f"{_num(None if k['exps'] is None else k['exps'] / 1e9, '7.3f'):>7} "
                     f"{_num(None if k['bytes'] is None else k['bytes'] / 1e6, '8.1f'):>8}  {k['family']:<21} "
                     f"{k['name'][:70]}")
    return lines


def as_json(results: list[dict]) -> dict:
    """The JSON file: {"results": one record per case (its kernels moved out), "kernels": one table of every case's
    kernels of at least 1% of the layer's time, plus one row per case and pass summing the others}."""
    table, records = [], []
    for r in results:
        r = dict(r)
        kernels = r.pop("kernels", [])
        records.append(r)
        case = {"path": r.get("path"), "seq_len": r.get("seq_len"), "batch": r.get("batch")}
        for p in (FWD, BWD):
            rest = [k for k in kernels if k["pass"] == p and (k["share"] is None or k["share"] < MIN_SHARE)
                    and not k.get("bad_time")]  # a time that is no duration keeps its own, flagged row
            table += [{**case, **k} for k in kernels if k["pass"] == p and k not in rest]
            if rest:
                table.append({**case, "pass": p, "name": f"({len(rest)} kernels under 1% each)", "family": "other",
                              "ms": sum(k["ms"] for k in rest), "per_pass": sum(k["per_pass"] for k in rest),
                              "share": sum(k["share"] or 0.0 for k in rest)})
    return {"results": records, "kernels": table}

if __name__ == "__main__":
    sys.exit(main())
