"""Selection-range builders v1 (loop) vs v2 (vectorized): time per call and the whole layer's forward with each;
with --topk-ab, the two top-n_sel choices of the block selection side by side instead.

    python benchmarks/bench_selection.py [--seq-lens 1024,2048,4096] [--device cuda] [--topk-choice topk]
    python benchmarks/bench_selection.py --topk-ab --device cuda --seq-lens 2048,16384,65536 [--repeats 11]
    python benchmarks/bench_selection.py ... --dry-run     # check the options and print the lengths, run nothing

The range builders belong to the PyTorch kernels (the Triton path reads block indices), so the layer runs
kernel="torch". Both builders are checked to give identical ranges before anything is timed. v1 and v2 are timed
alternately (the order reversed every round) after one warm-up call each; ratios are v1 time / v2 time, the ratio of
the medians (the JSON's figures), and the min / median / max of the rounds' ratios are printed beside the min /
median / max times. --topk-choice sets nsa.attention.selection.TOPK_CHOICE for the layer. The command that
reproduces the figures is printed first.

--topk-ab (issue 31 item 2.2): nsa.attention.selection.TOPK_CHOICES "sort" (a full sort of every row) against
"topk" (packed int64 keys + torch.topk) at the m7c shape (B 1, H 12, G 2, d_k 64, l 32, d 16, l_sel 64, n_sel 16,
bf16 on cuda; fp32 under TRITON_INTERPRET=1 on cpu, small S only): (1) the Triton tiled selection
select_blocks(method="tiled") under each choice (importance kernel + sort vs the keys kernel + topk), its lse the
compressed branch's forward; (2) choose_blocks alone (the PyTorch path) on that importance. The blocks of both
choices are checked equal before anything is timed (a difference exits 1). Timed alternately, the order swapped
each round (sort, topk, topk, sort, ...), --repeats calls each, after one warm-up call each; min / median / max
of each, ratio = topk / sort of the medians (below 1: topk faster) and the min / median / max of the rounds' ratios
(the JSON's *_ratio_min / *_ratio_max per S). A GPU result, like any timing, is only evidence on a quiet machine.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench_attention import SHAPES  # noqa: E402  (same directory: one shape for both benchmarks)

SHAPE = SHAPES["small"]
from nsa import NSAAttention, NSAConfig  # noqa: E402
from nsa.attention.kernels.common import interpreting  # noqa: E402
from nsa.attention.selection import RANGE_BUILDERS  # noqa: E402


TOPK_SHAPE = dict(b=1, h=12, g=2, d_k=64, l=32, d=16, l_sel=64, n_sel=16)  # the m7c model's selection


def _alternated(fns: dict, device: str, repeats: int) -> dict:
    """Seconds of each fn's calls, {name: [one per round]}: called alternately (the order reversed every round)
    after one warm-up each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fns[name]()
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def _figures(times: dict, a: str, b: str) -> dict:
    """From _alternated's times: min / median / max seconds of each of a and b, b / a of the medians ("ratio") and
    the min / median / max of the rounds' b / a ("ratio_min", "ratio_rounds_median", "ratio_max")."""
    rounds = [tb / ta for ta, tb in zip(times[a], times[b])]
    out = {name: {"min": min(times[name]), "median": statistics.median(times[name]), "max": max(times[name])}
           for name in (a, b)}
    out.update(ratio=out[b]["median"] / out[a]["median"], ratio_min=min(rounds),
               ratio_rounds_median=statistics.median(rounds), ratio_max=max(rounds))
    return out


def _triple(t: dict) -> str:
    """min/median/max seconds as ms."""
    return f"{t['min'] * 1e3:.3f}/{t['median'] * 1e3:.3f}/{t['max'] * 1e3:.3f}"


def _ratios(f: dict) -> str:
    return f"{f['ratio']:.3f} (rounds {f['ratio_min']:.3f}/{f['ratio_rounds_median']:.3f}/{f['ratio_max']:.3f})"


def topk_ab(args) -> int:
    """The --topk-ab comparison (module docstring)."""
    from nsa.attention import selection
    from nsa.attention.geometry import num_cmp_blocks
    from nsa.attention.kernels.range_attn import host as range_attn
    from nsa.attention.kernels.selection import host as triton_selection

    c = TOPK_SHAPE
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    saved = selection.TOPK_CHOICE
    rows = []
    print(f"top-n_sel choices sort vs topk, {c}, {dtype}, device={args.device}, {args.repeats} alternated calls "
          "each: ms min/median/max; topk/sort of the medians (the rounds' topk/sort min/median/max)")
    try:
        for s in [int(x) for x in args.seq_lens.split(",")]:
            gen = torch.Generator().manual_seed(s)
            n_cmp = num_cmp_blocks(s, c["l"], c["d"])

            def tensor(heads, length):  # [B, heads, length, d] seen through [B, length, heads, d] storage
                return torch.randn(c["b"], length, heads, c["d_k"], generator=gen).to(dev, dtype).transpose(1, 2)

            q, k_cmp, v_cmp = tensor(c["h"], s), tensor(c["g"], n_cmp), tensor(c["g"], n_cmp)
            with torch.no_grad():
                lse = range_attn.compressed_attention_lse(q, k_cmp, v_cmp, c["l"], c["d"])[1]

            def tiled(name):
                def run():
                    selection.TOPK_CHOICE = name
                    return triton_selection.select_blocks(q, k_cmp, lse, c["l"], c["d"], c["l_sel"], c["n_sel"],
                                                          method="tiled")
                return run

            blocks = {name: tiled(name)() for name in ("sort", "topk")}
            if not torch.equal(blocks["sort"], blocks["topk"]):
                print(f"S={s}: the tiled selection's blocks differ between sort and topk", file=sys.stderr)
                return 1
            imp = triton_selection.block_importance(q, k_cmp, lse, c["l"], c["d"], c["l_sel"])
            pos = torch.arange(s, device=dev)
            choose = {name: (lambda name=name: selection.choose_blocks(imp, pos, c["n_sel"], c["l_sel"], method=name))
                      for name in ("sort", "topk")}
            if not torch.equal(choose["sort"](), choose["topk"]()):
                print(f"S={s}: choose_blocks differs between sort and topk", file=sys.stderr)
                return 1
            f_tiled = _figures(_alternated({name: tiled(name) for name in ("sort", "topk")}, args.device,
                                           args.repeats), "sort", "topk")
            f_choose = _figures(_alternated(choose, args.device, args.repeats), "sort", "topk")
            imp = None  # frees the importance before the next S (choose holds it only through this name)
            row = {"seq_len": s}
            for what, f in (("tiled", f_tiled), ("choose", f_choose)):
                for name in ("sort", "topk"):
                    row.update({f"{what}_{name}_ms": f[name]["median"] * 1e3,
                                f"{what}_{name}_ms_min": f[name]["min"] * 1e3,
                                f"{what}_{name}_ms_max": f[name]["max"] * 1e3})
                row.update({f"{what}_ratio": f["ratio"], f"{what}_ratio_min": f["ratio_min"],
                            f"{what}_ratio_max": f["ratio_max"]})
            rows.append(row)
            print(f"S {s}: tiled sort {_triple(f_tiled['sort'])} topk {_triple(f_tiled['topk'])} topk/sort "
                  f"{_ratios(f_tiled)} | choose_blocks sort {_triple(f_choose['sort'])} topk "
                  f"{_triple(f_choose['topk'])} topk/sort {_ratios(f_choose)}")
    finally:
        selection.TOPK_CHOICE = saved
    if args.json:
        import json

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": args.device, "dtype": str(dtype), "shape": c, "parity": True,
                                         "repeats": args.repeats, "by_seq_len": rows,
                                         "tiled_ratio_max": max(r["tiled_ratio"] for r in rows),
                                         "choose_ratio_max": max(r["choose_ratio"] for r in rows)}, indent=2) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="1024,2048,4096")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the results here: per S and the minimum speed-ups "
                                              "(ranges_speedup_min, forward_speedup_min); with --topk-ab per S and "
                                              "the largest topk/sort ratios (tiled_ratio_max, choose_ratio_max)")
    ap.add_argument("--topk-choice", choices=("auto", "sort", "topk"), default="auto",
                    help="the layer's top-n_sel choice (nsa.attention.selection.TOPK_CHOICE; auto: QUALIFIED_TOPK)")
    ap.add_argument("--topk-ab", action="store_true",
                    help="time the top-n_sel choices sort and topk side by side instead (module docstring)")
    ap.add_argument("--dry-run", action="store_true", help="check the options and print what would be timed, run "
                                                            "nothing (no device is needed)")
    args = ap.parse_args(argv)
    try:
        seq_lens = [int(s) for s in args.seq_lens.split(",") if s.strip()]
    except ValueError:
        seq_lens = []
    if not seq_lens or min(seq_lens) < 1 or args.repeats < 1:
        ap.error(f"--seq-lens {args.seq_lens!r} must be comma-separated integers >= 1, and --repeats >= 1")
    if args.topk_ab and args.device == "cpu" and not interpreting():  # Triton: a GPU, or the interpreter
        ap.error("--topk-ab on cpu runs the Triton selection kernels through Triton's interpreter: set "
                 "TRITON_INTERPRET=1 (fp32, small --seq-lens), or use --device cuda")
    if args.dry_run:
        what = ("the top-n_sel choices sort and topk (tiled selection, then choose_blocks)" if args.topk_ab else
                f"the range builders v1 and v2 and the layer's forward under each (top-n_sel {args.topk_choice})")
        print(f"{what} at S {', '.join(map(str, seq_lens))} on {args.device}, {args.repeats} repeats")
        return 0
    print("reproduce: python benchmarks/bench_selection.py " + shlex.join(sys.argv[1:] if argv is None else argv))
    if args.topk_ab:
        return topk_ab(args)
    from nsa.attention import selection

    selection.TOPK_CHOICE = args.topk_choice
    rows = []
    torch.manual_seed(0)
    base = NSAAttention(NSAConfig(**SHAPE, kernel="torch")).to(args.device)
    print(f"selection ranges v1 vs v2, B=1 {SHAPE}, device={args.device}")
    print(f"{args.repeats} alternated calls each: ms min/median/max; v1/v2 of the medians (the rounds' v1/v2 "
          "min/median/max)")
    for s in seq_lens:
        x = torch.randn(1, s, SHAPE["dim"], device=args.device)
        blocks = base.selected_blocks(x)
        pos = torch.arange(s, device=args.device)
        v1, v2 = RANGE_BUILDERS["v1"](blocks, pos, base.cfg.l_sel), RANGE_BUILDERS["v2"](blocks, pos, base.cfg.l_sel)
        if not torch.equal(v1, v2):
            print(f"S={s}: v1 and v2 ranges differ", file=sys.stderr)
            return 1
        ranges = _figures(_alternated({sel: (lambda sel=sel: RANGE_BUILDERS[sel](blocks, pos, base.cfg.l_sel))
                                       for sel in ("v2", "v1")}, args.device, args.repeats), "v2", "v1")
        layers = {}
        for sel in ("v1", "v2"):
            layers[sel] = NSAAttention(NSAConfig(**SHAPE, selection=sel, kernel="torch")).to(args.device)
            layers[sel].load_state_dict(base.state_dict())
        with torch.no_grad():
            fwd = _figures(_alternated({sel: (lambda sel=sel: layers[sel](x)) for sel in ("v2", "v1")}, args.device,
                                       args.repeats), "v2", "v1")
        print(f"S {s}: ranges v1 {_triple(ranges['v1'])} v2 {_triple(ranges['v2'])} v1/v2 {_ratios(ranges)} | "
              f"forward v1 {_triple(fwd['v1'])} v2 {_triple(fwd['v2'])} v1/v2 {_ratios(fwd)}")
        rows.append({"seq_len": s, "ranges_v1_ms": ranges["v1"]["median"] * 1e3,
                     "ranges_v2_ms": ranges["v2"]["median"] * 1e3, "ranges_speedup": ranges["ratio"],
                     "forward_v1_ms": fwd["v1"]["median"] * 1e3, "forward_v2_ms": fwd["v2"]["median"] * 1e3,
                     "forward_speedup": fwd["ratio"]})
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
