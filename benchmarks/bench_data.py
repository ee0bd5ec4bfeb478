"""Building one synthetic sample (nsa.training.synthetic.SyntheticSource.sample) on the CPU: the vectorized builder
("vectorized") against the earlier per-segment builder ("per-segment": a few torch ops for every Markov and copy
segment, kept here as the baseline), side by side in one process.

    python benchmarks/bench_data.py                                   # seq_len 2,048 and 32,768, vocab 32,000
    python benchmarks/bench_data.py --seq-lens 32768,131072 --rounds 8 --samples 20
    python benchmarks/bench_data.py --threads 1 --json artifacts/bench_data.json

Before anything is timed, both builders' samples are checked equal for a few indices (a difference exits 1). Timed
in alternating rounds (A B A B ...), --samples samples per builder per round, distinct sample indices, after one
warm-up sample each. Printed (and written with --json): min / median / max milliseconds per sample over the rounds
for each builder, the median of the per-round ratios per-segment / vectorized, and the command that reproduces it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from nsa.training.synthetic import SyntheticSource, sample_generator  # noqa: E402


def per_segment_sample(src: SyntheticSource, index: int) -> torch.Tensor:
    """The earlier builder: the same draws, then one cumsum/cummax per Markov segment and a copy per copy segment."""
    v, n = src.vocab_size, src.seq_len + 1
    g = sample_generator(src.seed, src.sample_tag, src.rank, index)
    cum = torch.tensor(src.PROBS, dtype=torch.float64).cumsum(0)
    choice = torch.searchsorted(cum, torch.from_numpy(g.random(n)), right=True)
    inc = src.offsets[choice.clamp_max(src.K - 1)]
    reset = torch.from_numpy(g.random(n, dtype=np.float32)) < src.NOISE
    reset[0] = True
    noise_tok = torch.from_numpy(g.integers(0, v, n))
    n_seg = n // src.MARKOV_LEN[0] + 1
    m_lens = g.integers(src.MARKOV_LEN[0], src.MARKOV_LEN[1] + 1, n_seg).tolist()
    c_lens = g.integers(src.COPY_LEN[0], src.COPY_LEN[1] + 1, n_seg).tolist()
    src_u = g.random(n_seg).tolist()
    z = torch.empty(n, dtype=torch.int64)
    pos, s = 0, 0
    while pos < n:
        end = min(pos + m_lens[s], n)
        z_prev = int(z[pos - 1]) if pos else 0
        seg_inc, seg_reset, seg_noise = inc[pos:end], reset[pos:end], noise_tok[pos:end]
        csum = seg_inc.cumsum(0)
        idx = torch.arange(seg_inc.numel())
        last = torch.where(seg_reset, idx, torch.full_like(idx, -1)).cummax(0).values
        base = torch.where(last >= 0, (seg_noise - csum)[last.clamp_min(0)], torch.full_like(idx, z_prev))
        z[pos:end] = (base + csum) % v
        pos = end
        if pos >= n:
            break
        length = min(c_lens[s], n - pos, pos)
        start = int(src_u[s] * (pos - length + 1))
        z[pos:pos + length] = z[start:start + length]
        pos += length
        s += 1
    return src.perm[z]


BUILDERS = {"per-segment": per_segment_sample, "vectorized": SyntheticSource.sample}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="2048,32768", help="comma-separated sequence lengths")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=6, help="alternated rounds (A B A B ...)")
    ap.add_argument("--samples", type=int, default=10, help="samples per builder per round")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        args.seq_lens = [int(x) for x in args.seq_lens.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seq-lens must be comma-separated integers, got {args.seq_lens!r}")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    for name in ("vocab", "rounds", "samples"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if not args.seq_lens or min(args.seq_lens) < 1:
        ap.error("--seq-lens must hold integers >= 1")
    if args.vocab < SyntheticSource.MIN_VOCAB:
        ap.error(f"--vocab must be >= {SyntheticSource.MIN_VOCAB}")
    return args


def stats(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def bench(seq_len: int, args) -> dict:
    src = SyntheticSource(vocab_size=args.vocab, seq_len=seq_len, batch_size=1, rank=0, world_size=1, seed=0)
    for index in range(3):
        a, b = (f(src, index) for f in BUILDERS.values())
        if not torch.equal(a, b):
            sys.exit(f"seq_len {seq_len}: the builders' sample {index} differs; nothing timed")
    ms = {name: [] for name in BUILDERS}
    index = 1000
    for f in BUILDERS.values():
        f(src, index)  # warm-up
    for r in range(args.rounds):
        for name, f in BUILDERS.items():  # A B, A B, ...
            t0 = time.perf_counter()
            for _ in range(args.samples):
                index += 1
                f(src, index)
            ms[name].append((time.perf_counter() - t0) * 1e3 / args.samples)
    ratios = [old / new for old, new in zip(ms["per-segment"], ms["vectorized"])]
    return {"seq_len": seq_len, "ms_per_sample": {k: stats(v) for k, v in ms.items()},
            "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}


def main(argv=None) -> int:
    args = parse(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    command = "python benchmarks/bench_data.py " + shlex.join(sys.argv[1:] if argv is None else map(str, argv))
    print(f"# {command}")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}; vocab {args.vocab}, {args.rounds} rounds x {args.samples} samples")
    print(f"{'seq_len':>8}  {'builder':<12} {'min ms':>9} {'median ms':>10} {'max ms':>9}  per-segment / vectorized")
    results = []
    for seq_len in args.seq_lens:
        res = bench(seq_len, args)
        results.append(res)
        for name, st in res["ms_per_sample"].items():
            ratio = (f"{res['ratio_median']:.1f}x (rounds {res['ratio_range'][0]:.1f}-{res['ratio_range'][1]:.1f})"
                     if name == "vectorized" else "")
            print(f"{seq_len:>8}  {name:<12} {st['min']:>9.3f} {st['median']:>10.3f} {st['max']:>9.3f}  {ratio}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": command, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
