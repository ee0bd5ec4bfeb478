"""The language model's cross entropy alone, forward + backward: model.loss "reference" (the whole batch's logits,
an fp32 copy, F.cross_entropy), "chunked" (nsa.loss.linear_cross_entropy, PyTorch) and "fused" (the same with its
Triton kernel), side by side in one process.

    python benchmarks/bench_loss.py --device cuda                      # the m7c trainer's head: 16,384 tokens
                                                                       # (B 8 x 2,048), vocab 50,304, dim 768, bf16
    python benchmarks/bench_loss.py --device cuda --tokens 32768 --chunk 16384 --repeats 20
    python benchmarks/bench_loss.py --device cuda --fused-configs 8192x16,16384x32   # the kernel's tile, too
    TRITON_INTERPRET=1 python benchmarks/bench_loss.py --tokens 256 --vocab 1000 --dim 64   # CPU: a smoke run
    python benchmarks/bench_loss.py ... --dry-run     # check the options and print the cases, run nothing

As the trainer runs it: fp32 hidden states and head weight under bf16 autocast (--dtype fp32: no autocast), every
--ignore-every'th target ignored. Before anything is timed, each implementation's loss is checked against the
reference's (relative difference at most 1e-2 in bf16, 1e-4 in fp32) and its gradients w.r.t. the hidden states and
the head weight against the reference's (norm of the difference over the reference's norm at most 2e-2 in bf16,
1e-4 in fp32: GRAD_TOLERANCE); a larger difference exits 1 naming the implementation and the gradient. The largest
element-wise gradient difference is printed too. Timed alternately, the order reversed every round, after
--warmup calls each; each round's ratio against the reference is that round's time over the reference's in the
same round. Printed and written (--json): min / median / max milliseconds per implementation, the median and the
range of its per-round ratios, and on CUDA its peak memory above what the inputs hold (one call after the timing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from nsa.attention.kernels import triton_modules, triton_status  # noqa: E402
from nsa.loss import CHUNK_TOKENS, IGNORE_INDEX, LOSS_IMPLS, linear_cross_entropy  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
LOSS_TOLERANCE = {"bf16": 1e-2, "fp32": 1e-4}  # relative difference of a loss from the reference's
# ||grad - reference's grad|| / ||reference's grad|| (Frobenius norms: element-wise ratios mean nothing at the entries
# near 0, and a row of logit gradients sums to 0, so single entries cancel). Under bf16 autocast each gradient is a
# bf16 matmul's output over bf16-rounded logit gradients: two correct implementations round differently, a few of
# bf16's unit roundoffs (2^-8 = 3.9e-3) apart; 2e-2 is 5 of them (measured up to 5.8e-3, chunked and interpreted
# fused, 40-200 tokens, vocab 70-1,000, on CPU). In fp32, 1e-4 as for the loss (measured up to 3.7e-7).
GRAD_TOLERANCE = {"bf16": 2e-2, "fp32": 1e-4}
GRADIENTS = ("hidden states", "head weight")  # the order _step returns them in, after the loss


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--tokens", type=int, default=16384, help="tokens of the batch (default: B 8 x 2,048)")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                    help="bf16: bf16 autocast over fp32 inputs (the default on cuda); fp32: none (the default on cpu)")
    ap.add_argument("--impls", default=",".join(LOSS_IMPLS), help=f"comma-separated, of {', '.join(LOSS_IMPLS)} "
                                                                  "(the reference is always timed)")
    ap.add_argument("--chunk", type=int, default=CHUNK_TOKENS, help="tokens per chunk of chunked and fused")
    ap.add_argument("--fused-configs", default="", help="comma-separated BLOCK_VxWARPS launch configurations of the "
                                                        "fused kernel timed beside its shipped one, e.g. 8192x16 "
                                                        "(each a case 'fused@8192x16')")
    ap.add_argument("--ignore-every", type=int, default=64, help="every n-th target is ignored (0: none)")
    ap.add_argument("--repeats", type=int, default=10, help="alternated rounds")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="check the options and print the cases, run nothing "
                                                            "(no device is needed)")
    args = ap.parse_args(argv)
    impls = [x.strip() for x in args.impls.split(",") if x.strip()]
    unknown = sorted(set(impls) - set(LOSS_IMPLS))
    if unknown or not impls:
        ap.error(f"--impls {args.impls!r}: expected comma-separated names of {', '.join(LOSS_IMPLS)}")
    args.impls = ["reference"] + [x for x in dict.fromkeys(impls) if x != "reference"]
    args.configs = {}
    for text in (x.strip() for x in args.fused_configs.split(",") if x.strip()):
        block, _, warps = text.partition("x")
        if not (block.isdigit() and warps.isdigit()) or int(block) < 16 or int(block) & (int(block) - 1) \
                or int(warps) not in (1, 2, 4, 8, 16, 32):
            ap.error(f"--fused-configs {text!r}: expected BLOCK_VxWARPS, BLOCK_V a power of two >= 16 and WARPS one of "
                     "1, 2, 4, 8, 16, 32 (e.g. 8192x16)")
        args.configs[f"fused@{text}"] = (int(block), int(warps))
    args.impls += [name for name in args.configs if name not in args.impls]
    for name in ("tokens", "vocab", "dim", "chunk", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.ignore_every < 0:
        ap.error("--warmup and --ignore-every must be >= 0")
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    return args


def _inputs(args):
    gen = torch.Generator().manual_seed(0)
    dev = torch.device(args.device)
    hidden = torch.randn(args.tokens, args.dim, generator=gen).to(dev).requires_grad_()
    weight = (torch.randn(args.vocab, args.dim, generator=gen) * 0.02).to(dev).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(dev)
    if args.ignore_every:
        targets[::args.ignore_every] = IGNORE_INDEX
    return hidden, weight, targets


def _step(impl: str, args, hidden, weight, targets):
    """One forward + backward of `impl`: (loss, grad hidden, grad weight)."""
    if impl in args.configs:  # the fused kernel at another launch configuration, for this call
        host = triton_modules().cross_entropy
        saved = host.BLOCK_V, host.NUM_WARPS
        host.BLOCK_V, host.NUM_WARPS = args.configs[impl]
        try:
            return _step("fused", args, hidden, weight, targets)
        finally:
            host.BLOCK_V, host.NUM_WARPS = saved
    hidden.grad = weight.grad = None
    with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
        if impl == "reference":  # nsa.model.lm_loss on the head's logits, as NSAModel runs it
            loss = F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=IGNORE_INDEX)
        else:
            loss = linear_cross_entropy(hidden, weight, targets, chunk=args.chunk, fused=impl == "fused")
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def _sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def _norm_rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (0 when both are 0; inf when only `want` is; NaN stays NaN)."""
    diff, scale = float((got.double() - want.double()).norm()), float(want.double().norm())
    if scale == 0:
        return 0.0 if diff == 0 else float("inf")
    return diff / scale


def run(args) -> dict:
    hidden, weight, targets = _inputs(args)
    ref = [t.clone() for t in _step("reference", args, hidden, weight, targets)]
    checks = {}
    for impl in args.impls[1:]:
        loss, gh, gw = _step(impl, args, hidden, weight, targets)
        rel = abs(float(loss) - float(ref[0])) / max(abs(float(ref[0])), 1e-12)
        grad_rel = [_norm_rel_diff(got, want) for got, want in zip((gh, gw), ref[1:])]
        checks[impl] = {"loss": float(loss), "loss_rel_diff": rel,
                        "grad_hidden_max_diff": float((gh - ref[1]).abs().max()),
                        "grad_weight_max_diff": float((gw - ref[2]).abs().max()),
                        "grad_hidden_rel_diff": grad_rel[0], "grad_weight_rel_diff": grad_rel[1]}
        if not rel <= LOSS_TOLERANCE[args.dtype]:
            raise SystemExit(f"{impl}: loss {float(loss):.6g} differs from the reference's {float(ref[0]):.6g} "
                             f"by {rel:.3g} (relative), more than {LOSS_TOLERANCE[args.dtype]:g}")
        for name, diff in zip(GRADIENTS, grad_rel):
            if not diff <= GRAD_TOLERANCE[args.dtype]:
                raise SystemExit(f"{impl}: the gradient w.r.t. the {name} differs from the reference's by {diff:.3g} "
                                 f"(norm of the difference over the reference's norm), more than "
                                 f"{GRAD_TOLERANCE[args.dtype]:g} in {args.dtype}")
    del ref
    for impl in args.impls:
        for _ in range(args.warmup):
            _step(impl, args, hidden, weight, targets)
    times = {impl: [] for impl in args.impls}
    for r in range(args.repeats):
        for impl in (args.impls if r % 2 == 0 else args.impls[::-1]):
            _sync(args)
            start = time.perf_counter()
            _step(impl, args, hidden, weight, targets)
            _sync(args)
            times[impl].append(time.perf_counter() - start)
    peak = {}
    if args.device == "cuda":
        for impl in args.impls:
            hidden.grad = weight.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            _step(impl, args, hidden, weight, targets)
            torch.cuda.synchronize()
            peak[impl] = (torch.cuda.max_memory_allocated() - base) / 2**30
    rows = {}
    for impl in args.impls:
        ms = [t * 1e3 for t in times[impl]]
        ratios = [t / r for t, r in zip(times[impl], times["reference"])]
        rows[impl] = {"ms_min": min(ms), "ms_median": statistics.median(ms), "ms_max": max(ms),
                      "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                      "peak_gib": peak.get(impl), **checks.get(impl, {})}
    return rows


def main(argv=None) -> int:
    args = parse(argv)
    shape = (f"{args.tokens} tokens, vocab {args.vocab}, dim {args.dim}, {args.dtype}, chunk {args.chunk}, every "
             f"{args.ignore_every or 'no'}th target ignored")
    print(f"cross entropy forward + backward: {', '.join(args.impls)}; {shape}; device {args.device}; "
          f"{args.repeats} alternated rounds after {args.warmup} warm-up calls each")
    if args.dry_run:
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    problem = triton_status(torch.device(args.device)) if "fused" in args.impls or args.configs else None
    if problem:
        print(f"bench_loss: the fused loss cannot run: {problem}", file=sys.stderr)
        return 2
    rows = run(args)
    print(f"{'impl':<16} {'min ms':>8} {'median':>8} {'max ms':>8} {'x ref (median, range)':>24} {'peak GiB':>9} "
          f"{'max |d grad w|':>14} {'rel d grad h, w':>18}")
    for impl, row in rows.items():
        peak = f"{row['peak_gib']:.2f}" if row["peak_gib"] is not None else "-"
        dgw = f"{row['grad_weight_max_diff']:.2e}" if "grad_weight_max_diff" in row else "-"
        rel = f"{row['grad_hidden_rel_diff']:.1e}, {row['grad_weight_rel_diff']:.1e}" \
            if "grad_hidden_rel_diff" in row else "-"
        print(f"{impl:<16} {row['ms_min']:8.2f} {row['ms_median']:8.2f} {row['ms_max']:8.2f} "
              f"{row['ratio_median']:9.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f}) {peak:>9} {dgw:>14} "
              f"{rel:>18}")
    print("reproduce: python benchmarks/bench_loss.py " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        args.json.write_text(json.dumps({"device": args.device, "device_name": name, "torch": torch.__version__,
                                         "tokens": args.tokens, "vocab": args.vocab, "dim": args.dim,
                                         "dtype": args.dtype, "chunk": args.chunk, "repeats": args.repeats,
                                         "by_impl": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
