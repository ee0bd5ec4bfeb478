"""Selection-range builders v1 (loop) vs v2 (vectorized): time per call and the whole layer's forward with each.

    python benchmarks/bench_selection.py [--seq-lens 1024,2048,4096] [--device cuda]

The range builders belong to the PyTorch kernels (the Triton path reads block indices), so the layer runs
kernel="torch". Both builders are checked to give identical ranges before anything is timed. Ratios are v1 time /
v2 time, measured in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench_attention import SHAPES  # noqa: E402  (same directory: one shape for both benchmarks)

SHAPE = SHAPES["small"]
from nsa import NSAAttention, NSAConfig  # noqa: E402
from nsa.attention.selection import RANGE_BUILDERS  # noqa: E402


def timed(fn, device: str, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="1024,2048,4096")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the results here: per S and the minimum speed-ups "
                                              "(ranges_speedup_min, forward_speedup_min)")
    args = ap.parse_args(argv)
    rows = []
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    torch.manual_seed(0)
    base = NSAAttention(NSAConfig(**SHAPE, kernel="torch")).to(args.device)
    print(f"selection ranges v1 vs v2, B=1 {SHAPE}, device={args.device}")
    print(f"{'S':>6} | {'v1 ranges ms':>12} {'v2 ranges ms':>12} {'v1/v2':>8} | {'fwd v1 ms':>9} {'fwd v2 ms':>9} "
          f"{'v1/v2':>6}")
    for s in seq_lens:
        x = torch.randn(1, s, SHAPE["dim"], device=args.device)
        blocks = base.selected_blocks(x)
        pos = torch.arange(s, device=args.device)
        v1, v2 = RANGE_BUILDERS["v1"](blocks, pos, base.cfg.l_sel), RANGE_BUILDERS["v2"](blocks, pos, base.cfg.l_sel)
        if not torch.equal(v1, v2):
            print(f"S={s}: v1 and v2 ranges differ", file=sys.stderr)
            return 1
        t1 = timed(lambda: RANGE_BUILDERS["v1"](blocks, pos, base.cfg.l_sel), args.device, args.repeats)
        t2 = timed(lambda: RANGE_BUILDERS["v2"](blocks, pos, base.cfg.l_sel), args.device, args.repeats)
        fwd = {}
        for sel in ("v1", "v2"):
            layer = NSAAttention(NSAConfig(**SHAPE, selection=sel, kernel="torch")).to(args.device)
            layer.load_state_dict(base.state_dict())
            with torch.no_grad():
                fwd[sel] = timed(lambda: layer(x), args.device, args.repeats)
        print(f"{s:>6} | {t1 * 1e3:12.2f} {t2 * 1e3:12.2f} {t1 / t2:8.1f} | {fwd['v1'] * 1e3:9.1f} "
              f"{fwd['v2'] * 1e3:9.1f} {fwd['v1'] / fwd['v2']:6.2f}")
        rows.append({"seq_len": s, "ranges_v1_ms": t1 * 1e3, "ranges_v2_ms": t2 * 1e3, "ranges_speedup": t1 / t2,
                     "forward_v1_ms": fwd["v1"] * 1e3, "forward_v2_ms": fwd["v2"] * 1e3,
                     "forward_speedup": fwd["v1"] / fwd["v2"]})
    if args.json:
        import json

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "device": args.device, "parity": True, "by_seq_len": rows,
            "ranges_speedup_min": min(r["ranges_speedup"] for r in rows),
            "forward_speedup_min": min(r["forward_speedup"] for r in rows)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
