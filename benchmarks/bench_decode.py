"""Decoding tokens/s: NSAModel's cached decode steps (one prefill, then decode_step per token) against full
recomputation (the training forward over the whole sequence so far for every new token), at a few prompt lengths,
for NSA and its dense twin.

    python benchmarks/bench_decode.py                                   # configs/tiny_cpu.yaml's model, fp32, CPU
    python benchmarks/bench_decode.py --lengths 256,1024,4096 --new-tokens 32 --repeats 7
    python benchmarks/bench_decode.py --config configs/m7c_125m_1xh100.yaml --device cuda --lengths 2048
    python benchmarks/bench_decode.py --attention nsa --batch 8 --selected-ab   # the selected branch's A/B
    python benchmarks/bench_decode.py ... --dry-run     # check the options and print the cases, run nothing

For each attention and prompt length L: --new-tokens N greedy tokens after an L-token prompt (batch --batch). The
cached path's time is the N - 1 decode steps after the prefill (the prefill is timed on its own); the recomputation's
is N - 1 forwards over L + 1 .. L + N - 1 tokens, each keeping the last position's logits, on the same tokens. Before
anything is timed the two are checked to give the same logits at every step (the largest difference is printed; more
than 1e-3 relative to the logits' scale in fp32 exits 1). Timed alternately, the order reversed every round, after
--warmup rounds; printed and written (--json): min / median / max tokens/s of each (new tokens of the whole batch
per second), the per-round speed-up cached / recomputation (median, min-max) and the prefill's median ms.
The command that reproduces the figures is printed at the end. A timing is only evidence on a quiet machine.

--selected-ab (NSA only) times the cached decode steps instead with the two forms of the decode step's selected
branch (nsa.attention.layer.DECODE_SELECTED): "loop", the per-token oracle (ranges read on the host, one gather per
sequence and group), and "gather", the vectorized default, alternated in this process the same way, after checking
that both give the same tokens and logits (the recomputation check above applies to each). It prints tokens/s of
each and the per-round speed-up gather / loop.
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

import torch  # noqa: E402
import yaml  # noqa: E402

from nsa.attention import layer as nsa_layer  # noqa: E402
from nsa.config import ATTENTION_CHOICES, ModelConfig  # noqa: E402
from nsa.model import NSAModel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 1e-3, "fp64": 1e-9, "bf16": 5e-2}  # max |logit difference| / max |logit| of the two paths


def _ints(text: str, name: str, ap) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        ap.error(f"--{name} {text!r}: expected comma-separated integers >= 1")
    return values


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny_cpu.yaml",
                    help="a YAML config whose `model` section is the model (default: configs/tiny_cpu.yaml)")
    ap.add_argument("--attention", default=",".join(ATTENTION_CHOICES),
                    help=f"comma-separated, of {', '.join(ATTENTION_CHOICES)}")
    ap.add_argument("--lengths", default="128,512,2048", help="prompt lengths, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens generated after each prompt (>= 2)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    ap.add_argument("--repeats", type=int, default=5, help="alternated rounds")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--selected-ab", action="store_true",
                    help="NSA only: time the decode step's selected branch as the per-token loop vs the vectorized "
                         "gather (DECODE_SELECTED), alternated, instead of cached vs recomputed")
    ap.add_argument("--dry-run", action="store_true", help="check the options and print the cases, run nothing")
    args = ap.parse_args(argv)
    args.attention = list(dict.fromkeys(x.strip() for x in args.attention.split(",") if x.strip()))
    if not args.attention or set(args.attention) - set(ATTENTION_CHOICES):
        ap.error(f"--attention: expected comma-separated names of {', '.join(ATTENTION_CHOICES)}")
    if args.selected_ab and args.attention != ["nsa"]:
        ap.error(f"--selected-ab times NSA's selected branch: give --attention nsa, got {','.join(args.attention)}")
    args.lengths = _ints(args.lengths, "lengths", ap)
    if args.new_tokens < 2:
        ap.error(f"--new-tokens must be >= 2 (one prefill token, then decode steps), got {args.new_tokens}")
    for name in ("batch", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    try:
        args.model = ModelConfig.from_flat(yaml.safe_load(args.config.read_text())["model"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        ap.error(f"--config {args.config}: no valid `model` section ({exc})")
    return args


def _load() -> float | None:
    """The 1-minute load average (None where the system does not report it): other work on the machine."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _cached(model: NSAModel, prompt: torch.Tensor, n: int):
    """Prefill, then n - 1 greedy decode steps: (tokens [B, n], logits of each step [n, B, V], prefill s, decode s)."""
    _sync(prompt.device.type)
    start = time.perf_counter()
    logits, caches = model.prefill(prompt)
    _sync(prompt.device.type)
    mid = time.perf_counter()
    tokens, steps = [logits.argmax(-1)], [logits]
    for _ in range(n - 1):
        steps.append(model.decode_step(tokens[-1].unsqueeze(1), caches))
        tokens.append(steps[-1].argmax(-1))
    _sync(prompt.device.type)
    return torch.stack(tokens, 1), torch.stack(steps), mid - start, time.perf_counter() - mid


@torch.no_grad()
def _recomputed(model: NSAModel, prompt: torch.Tensor, tokens: torch.Tensor):
    """The forward over prompt + tokens[:, :k] for k = 1 .. n - 1, last position: (logits [n - 1, B, V], s)."""
    _sync(prompt.device.type)
    start = time.perf_counter()
    out = [model(torch.cat([prompt, tokens[:, :k]], dim=1))[:, -1] for k in range(1, tokens.shape[1])]
    _sync(prompt.device.type)
    return torch.stack(out), time.perf_counter() - start


def _prompt(model: NSAModel, length: int, args) -> torch.Tensor:
    gen = torch.Generator().manual_seed(args.seed + length)
    return torch.randint(0, model.cfg.vocab_size, (args.batch, length), generator=gen).to(args.device)


def _check(logits: torch.Tensor, ref: torch.Tensor, length: int, what: str, args) -> tuple[float, float]:
    """(max |difference|, max |ref|); exits 1 when the difference is beyond TOLERANCE relative to the scale."""
    diff = float((logits - ref).abs().max().float())
    scale = float(ref.abs().max().float())
    if not diff <= TOLERANCE[args.dtype] * max(scale, 1e-12):
        raise SystemExit(f"bench_decode: L={length}: {what} by {diff:.3g} (logits up to {scale:.3g}), more than "
                         f"{TOLERANCE[args.dtype]:g} relative")
    return diff, scale


def _selected(choice: str, fn, *fn_args):
    """fn(*fn_args) with the NSA decode step's selected branch `choice` (DECODE_SELECTED), restored after."""
    before = nsa_layer.DECODE_SELECTED
    nsa_layer.DECODE_SELECTED = choice
    try:
        return fn(*fn_args)
    finally:
        nsa_layer.DECODE_SELECTED = before


def measure(model: NSAModel, length: int, args) -> dict:
    prompt = _prompt(model, length, args)
    tokens, logits, _, _ = _cached(model, prompt, args.new_tokens)
    ref, _ = _recomputed(model, prompt, tokens)
    diff, scale = _check(logits[1:], ref, length, "cached decode's logits differ from the recomputation's", args)
    for _ in range(args.warmup):
        _cached(model, prompt, args.new_tokens)
        _recomputed(model, prompt, tokens)
    cached, recomputed, prefill = [], [], []
    for r in range(args.repeats):
        for name in (("cached", "recomputed") if r % 2 == 0 else ("recomputed", "cached")):
            if name == "cached":
                _, _, p_s, d_s = _cached(model, prompt, args.new_tokens)
                cached.append(d_s)
                prefill.append(p_s)
            else:
                recomputed.append(_recomputed(model, prompt, tokens)[1])
    new = args.batch * (args.new_tokens - 1)
    tps = lambda xs: sorted(new / x for x in xs)  # noqa: E731
    ratios = sorted(r / c for c, r in zip(cached, recomputed))
    c, f = tps(cached), tps(recomputed)
    return {"length": length, "cached_tok_s": [c[0], statistics.median(c), c[-1]],
            "recomputed_tok_s": [f[0], statistics.median(f), f[-1]],
            "speedup": [ratios[0], statistics.median(ratios), ratios[-1]],
            "prefill_ms_median": statistics.median(prefill) * 1e3, "max_logit_diff": diff, "logit_scale": scale}


def measure_selected(model: NSAModel, length: int, args) -> dict:
    """--selected-ab: the cached decode steps with DECODE_SELECTED "loop" (A) and "gather" (B), alternated."""
    prompt = _prompt(model, length, args)
    tokens, logits, _, _ = _selected("gather", _cached, model, prompt, args.new_tokens)
    loop_tokens, loop_logits, _, _ = _selected("loop", _cached, model, prompt, args.new_tokens)
    if not torch.equal(tokens, loop_tokens):
        raise SystemExit(f"bench_decode: L={length}: the loop and gather decode steps chose different tokens")
    ref, _ = _recomputed(model, prompt, tokens)
    diff, scale = _check(logits[1:], ref, length, "the gather decode's logits differ from the recomputation's", args)
    _check(loop_logits[1:], ref, length, "the loop decode's logits differ from the recomputation's", args)
    ab = float((logits - loop_logits).abs().max().float())
    for _ in range(args.warmup):
        for choice in ("loop", "gather"):
            _selected(choice, _cached, model, prompt, args.new_tokens)
    times = {"loop": [], "gather": []}
    for r in range(args.repeats):
        for choice in (("loop", "gather") if r % 2 == 0 else ("gather", "loop")):
            times[choice].append(_selected(choice, _cached, model, prompt, args.new_tokens)[3])
    new = args.batch * (args.new_tokens - 1)
    tps = lambda xs: sorted(new / x for x in xs)  # noqa: E731
    lp, ga = tps(times["loop"]), tps(times["gather"])
    ratios = sorted(a / b for a, b in zip(times["loop"], times["gather"]))
    return {"length": length, "loop_tok_s": [lp[0], statistics.median(lp), lp[-1]],
            "gather_tok_s": [ga[0], statistics.median(ga), ga[-1]],
            "speedup": [ratios[0], statistics.median(ratios), ratios[-1]],
            "max_logit_diff_loop_gather": ab, "max_logit_diff": diff, "logit_scale": scale}


def _print_selected(rows: list[dict]) -> None:
    print(f"{'L':>6} {'loop tok/s min/median/max':>30} {'gather tok/s min/median/max':>30} "
          f"{'gather/loop median (range)':>27} {'|loop-gather|':>13} {'max |dlogit|':>12}")
    for row in rows:
        a, b, s = row["loop_tok_s"], row["gather_tok_s"], row["speedup"]
        print(f"{row['length']:>6} {a[0]:>9.1f} {a[1]:>9.1f} {a[2]:>9.1f}  {b[0]:>9.1f} {b[1]:>9.1f} {b[2]:>9.1f}  "
              f"{s[1]:>12.2f} ({s[0]:.2f}-{s[2]:.2f})  {row['max_logit_diff_loop_gather']:>13.2e} "
              f"{row['max_logit_diff']:>12.2e}")


def main(argv=None) -> int:
    args = parse(argv)
    m = args.model
    what = "NSA decode steps, selected branch loop (A) vs gather (B)" if args.selected_ab else \
        f"cached vs full recomputation: {', '.join(args.attention)}"
    print(f"decoding tokens/s, {what}; model {args.config.name} "
          f"(dim {m.nsa.dim}, {m.n_layers} layers, vocab {m.vocab_size}, l {m.nsa.l}, d {m.nsa.d}, "
          f"l_sel {m.nsa.l_sel}, n_sel {m.nsa.n_sel}, w {m.nsa.w}); prompts {', '.join(map(str, args.lengths))} "
          f"+ {args.new_tokens} new tokens, batch {args.batch}; {args.dtype} on {args.device}, "
          f"{torch.get_num_threads()} threads; {args.repeats} alternated rounds after {args.warmup} warm-up")
    if args.dry_run:
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    load_before = _load()
    rows = []
    for attention in args.attention:
        torch.manual_seed(args.seed)
        model = NSAModel(m.replace(attention=attention)).to(device=args.device, dtype=DTYPES[args.dtype]).eval()
        for length in args.lengths:
            rows.append({"attention": attention,
                         **(measure_selected if args.selected_ab else measure)(model, length, args)})
    if args.selected_ab:
        _print_selected(rows)
    else:
        _print_rows(rows)
    load_after = _load()
    print(f"machine load (1-minute average, {os.cpu_count()} CPUs): {load_before} before, {load_after} after")
    given = sys.argv[1:] if argv is None else [str(a) for a in argv]
    command = "python benchmarks/bench_decode.py " + shlex.join(given)
    print(f"reproduce: {command}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        args.json.write_text(json.dumps({"device": args.device, "device_name": name, "torch": torch.__version__,
                                         "threads": torch.get_num_threads(), "config": str(args.config),
                                         "dtype": args.dtype, "batch": args.batch, "new_tokens": args.new_tokens,
                                         "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
                                         "lengths": args.lengths, "attention": args.attention,
                                         "selected_ab": args.selected_ab, "command": command,
                                         "load_before": load_before, "load_after": load_after,
                                         "rows": rows}, indent=2) + "\n")
    return 0


def _print_rows(rows: list[dict]) -> None:
    print(f"{'attention':<9} {'L':>6} {'cached tok/s min/median/max':>30} {'recompute tok/s min/median/max':>32} "
          f"{'speed-up median (range)':>24} {'prefill ms':>10} {'max |dlogit|':>12}")
    for row in rows:
        c, f, s = row["cached_tok_s"], row["recomputed_tok_s"], row["speedup"]
        print(f"{row['attention']:<9} {row['length']:>6} {c[0]:>9.1f} {c[1]:>9.1f} {c[2]:>9.1f}  "
              f"{f[0]:>9.1f} {f[1]:>9.1f} {f[2]:>9.1f}  {s[1]:>9.2f} ({s[0]:.2f}-{s[2]:.2f})  "
              f"{row['prefill_ms_median']:>10.1f} {row['max_logit_diff']:>12.2e}")


if __name__ == "__main__":
    sys.exit(main())
