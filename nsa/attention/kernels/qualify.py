"""Run every NSA Triton kernel once, forward and backward, at one shape: the program that runbooks/gpu_kernels.yaml
runs under compute-sanitizer (one process per case, validation.kinds.sanitizer), and a quick check by hand.

    python -m nsa.attention.kernels.qualify --dtype bf16 --seq-len 2048 --hpg 6 --method tiled
    compute-sanitizer --tool memcheck python -m nsa.attention.kernels.qualify --dtype bf16 --seq-len 65536 --hpg 1
    TRITON_INTERPRET=1 python -m nsa.attention.kernels.qualify --device cpu --dtype fp32 --seq-len 128 --hpg 2
    TRITON_INTERPRET=1 python -m nsa.attention.kernels.qualify --device cpu --dtype fp32 --check-addresses
                                                   # every access checked against its tensors (interpreter_check)
    python -m nsa.attention.kernels.qualify --dtype fp32 --fp32-dots tf32   # fp32 on the tensor cores (TF32)

The shape defaults to the m7c model's (d_k = d_v = 64, l 32, d 16, l_sel 64, n_sel 16, w 512, G = 2 KV groups) with
H = G * hpg heads and B = 1 (with --dtype fp32, --fp32-dots picks IEEE or TF32 products in the range and selected
kernels: common.dot_precision): hpg picks the branch of each kernel's launch configuration (selection block_config:
hpg 1, 2-3, >= 4), so the grid varies hpg and keeps G. Inputs are standard normal, laid out as the layer lays them
out ([B, S, heads, d] storage seen as [B, heads, S, d]); the backward gets a standard normal output gradient.

Kernels (--kernels, default all), in this order; the device is synchronised after each, so a fault is reported at
the kernel that made it:
    cmp        compressed branch (range kernels, mode COMPRESSED): forward with its log-sum-exp, backward
    win        sliding window (range kernels, mode WINDOW): forward, backward
    band       selected branch's local band with its sink (range kernels, mode BAND): forward, backward
    select     block selection, forward only (no gradient): --method tiled (importance kernel + choose_blocks) or
               fused (the top-k kernel); its input lse is the compressed forward's, computed whatever --kernels says
    index      the selected branch's inverted index of the chosen blocks by its Triton build (selected_attn/index.py,
               not yet the default), checked equal to the torch build element for element
    sel_kv     selected branch on the chosen blocks, KV-block-outer forward (the default), backward
    sel_query  selected branch, query-outer forward, backward
Exit 0 when every kernel ran; 1 when one raised (its traceback on stderr, and a last line naming it); 2 for a bad
argument (one line naming it).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

from nsa.attention.geometry import num_cmp_blocks
from nsa.attention.kernels import TRITON_HEAD_DIMS, TRITON_MAX_HEADS_PER_GROUP, interpreting, triton_status
from nsa.attention.kernels import interpreter_check
from nsa.attention.kernels.range_attn import host as range_attn
from nsa.attention.kernels.selected_attn import host as selected_attn
from nsa.attention.kernels.selection import host as selection

KERNELS = ("cmp", "win", "band", "select", "index", "sel_kv", "sel_query")
DTYPES = ("bf16", "fp16", "fp32")
METHODS = ("tiled", "fused")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m nsa.attention.kernels.qualify",
                                 description="Run every NSA Triton kernel once, forward and backward, at one shape.")
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--seq-len", type=int, default=2048, help="S (default 2048)")
    ap.add_argument("--hpg", type=int, default=6, help="heads per KV group (H = groups x hpg; default 6)")
    ap.add_argument("--method", default="tiled", choices=METHODS, help="block selection path (default tiled)")
    ap.add_argument("--batch", type=int, default=1, help="B (default 1)")
    ap.add_argument("--groups", type=int, default=2, help="KV groups G (default 2, the m7c model's)")
    ap.add_argument("--d-k", type=int, default=64, help="head width of queries and keys (default 64)")
    ap.add_argument("--d-v", type=int, default=None, help="head width of values (default: d_k)")
    ap.add_argument("--l", type=int, default=32, help="compression block length (default 32)")
    ap.add_argument("--d", type=int, default=16, help="compression stride (default 16)")
    ap.add_argument("--l-sel", type=int, default=64, help="selection block length (default 64)")
    ap.add_argument("--n-sel", type=int, default=16, help="selected blocks per query (default 16)")
    ap.add_argument("--w", type=int, default=512, help="window (default 512)")
    ap.add_argument("--kernels", default="all", help=f"comma-separated subset of {','.join(KERNELS)} (default all)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default), or cpu with TRITON_INTERPRET=1 (fp32, small shapes)")
    ap.add_argument("--fp32-dots", default="ieee", choices=("ieee", "tf32"),
                    help="with --dtype fp32, the range and selected kernels' products: ieee (IEEE fp32, PyTorch's "
                         "default matmul precision; CUDA cores, and the bf16 tile sizes spill) or tf32 (tensor cores, "
                         "as under torch.set_float32_matmul_precision('high')); default ieee")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-addresses", action="store_true",
                    help="with --device cpu: every load, store and atomic checked against its launch's tensors "
                         "(nsa.attention.kernels.interpreter_check; on a GPU: compute-sanitizer's memcheck)")
    args = ap.parse_args(argv)
    args.d_v = args.d_k if args.d_v is None else args.d_v
    args.kernels = KERNELS if args.kernels == "all" else tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    problem = check_args(args)
    if problem:
        ap.error(problem)
    return args


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (one line naming the option), or None."""
    unknown = [k for k in args.kernels if k not in KERNELS]
    if unknown or not args.kernels:
        return f"--kernels: {unknown[0]!r} is not one of {', '.join(KERNELS)}" if unknown else "--kernels: none given"
    for name in ("seq_len", "batch", "groups", "l", "d", "l_sel", "n_sel", "w"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
    if not 1 <= args.hpg <= TRITON_MAX_HEADS_PER_GROUP:
        return f"--hpg must be 1..{TRITON_MAX_HEADS_PER_GROUP} (the Triton kernels' limit), got {args.hpg}"
    for name in ("d_k", "d_v"):
        if getattr(args, name) not in TRITON_HEAD_DIMS:
            return (f"--{name.replace('_', '-')} must be one of {', '.join(map(str, TRITON_HEAD_DIMS))}, "
                    f"got {getattr(args, name)}")
    if args.l % args.d or args.l_sel % args.d:
        return f"--d {args.d} must divide --l {args.l} and --l-sel {args.l_sel}"
    if args.method == "fused" and args.n_sel > selection.FUSED_MAX_N_SEL:
        return f"--method fused keeps at most {selection.FUSED_MAX_N_SEL} blocks, got --n-sel {args.n_sel}"
    if args.seq_len < args.l:
        return f"--seq-len {args.seq_len} is shorter than one compression block (--l {args.l})"
    return None


def device_problem(args: argparse.Namespace) -> str | None:
    if args.check_addresses and args.device != "cpu":
        return "--check-addresses checks the interpreter's accesses: use it with --device cpu (on a GPU run this " \
               "program under compute-sanitizer --tool memcheck)"
    if args.check_addresses and not interpreter_check.supported():
        return "--check-addresses: this triton's interpreter lacks what the check patches"
    if args.device == "cuda" and not torch.cuda.is_available():
        return ("--device cuda: no CUDA device here; on a CPU use --device cpu with TRITON_INTERPRET=1 (fp32, "
                "small shapes)")
    if args.device == "cuda" and interpreting():
        return ("--device cuda runs the compiled kernels, but TRITON_INTERPRET is on: Triton's interpreter would run "
                "them on the host (compute-sanitizer would see none of them); unset TRITON_INTERPRET, or use "
                "--device cpu")
    if args.device == "cpu" and not interpreting():
        return "--device cpu runs the Triton kernels only under the interpreter: set TRITON_INTERPRET=1"
    if args.device == "cpu" and args.dtype != "fp32":
        return f"--device cpu (Triton's interpreter) runs fp32 only, got --dtype {args.dtype}"
    return triton_status(torch.device(args.device))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    problem = device_problem(args)
    if problem:
        print(f"qualify: error: {problem}", file=sys.stderr)
        return 2
    if args.check_addresses:
        with interpreter_check.checking():
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    # the kernels read PyTorch's fp32 matmul precision at launch (nsa.attention.kernels.common.dot_precision)
    torch.set_float32_matmul_precision("highest" if args.fp32_dots == "ieee" else "high")
    b, g, hpg, s = args.batch, args.groups, args.hpg, args.seq_len
    h, n_cmp = g * hpg, num_cmp_blocks(s, args.l, args.d)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)

    def tensor(heads: int, length: int, width: int, grad: bool = True):
        """[B, heads, length, width] seen through [B, length, heads, width] storage, as the layer lays it out."""
        x = torch.randn(b, length, heads, width, generator=gen).to(device=dev, dtype=dtype).transpose(1, 2)
        return x.detach().requires_grad_(grad)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def fwd_bwd(fn, *inputs):
        out = fn(*inputs)
        sync()
        out.backward(torch.randn(out.shape, generator=gen).to(device=dev, dtype=out.dtype))
        sync()
        return "forward, backward"

    q, k, v = tensor(h, s, args.d_k), tensor(g, s, args.d_k), tensor(g, s, args.d_v)
    k_cmp, v_cmp = tensor(g, n_cmp, args.d_k), tensor(g, n_cmp, args.d_v)
    state: dict = {}

    def lse():
        if "lse" not in state:
            with torch.no_grad():
                state["lse"] = range_attn.compressed_attention_lse(q, k_cmp, v_cmp, args.l, args.d)[1]
            sync()
        return state["lse"]

    def blocks():
        if "blocks" not in state:
            state["blocks"] = selection.select_blocks(q, k_cmp, lse(), args.l, args.d, args.l_sel, args.n_sel,
                                                             method=args.method)
            sync()
        return state["blocks"]

    def index():
        chosen = blocks().to(torch.int32).contiguous()
        qpt_fwd, qpt_bwd = selected_attn._per_tile(hpg, args.d_k, args.d_v, selected_attn.BWD_TILES)
        got = selected_attn._build_index(chosen, args.l_sel, qpt_fwd, qpt_bwd, build="triton")
        sync()
        want = selected_attn._build_index(chosen, args.l_sel, qpt_fwd, qpt_bwd, build="torch")
        for name, a, b_ in zip(("order", "pair_t", "forward tiles", "backward tiles"), got, want):
            if not torch.equal(a, b_):
                raise AssertionError(f"the Triton index's {name} differs from the torch build's in "
                                     f"{int((a != b_).sum())} of {b_.numel()} entries")
        return "Triton build, equal to the torch build"

    runs = {
        "cmp": lambda: fwd_bwd(lambda *x: range_attn.compressed_attention(*x, args.l, args.d), q, k_cmp, v_cmp),
        "win": lambda: fwd_bwd(lambda *x: range_attn.window_attention(*x, args.w), q, k, v),
        "band": lambda: fwd_bwd(lambda *x: range_attn.band_attention(*x, args.l_sel, sink=True), q, k, v),
        "select": lambda: (blocks(), f"forward ({args.method})")[1],
        "index": index,
        "sel_kv": lambda: fwd_bwd(lambda *x: selected_attn.selected_attention(*x, blocks(), args.l_sel, loop="kv"),
                                  q, k, v),
        "sel_query": lambda: fwd_bwd(
            lambda *x: selected_attn.selected_attention(*x, blocks(), args.l_sel, loop="query"), q, k, v),
    }
    dots = f" ({args.fp32_dots} dots)" if args.dtype == "fp32" else ""
    shape = (f"{args.dtype}{dots} B={b} S={s} G={g} hpg={hpg} H={h} d_k={args.d_k} d_v={args.d_v} l={args.l} "
             f"d={args.d} l_sel={args.l_sel} n_sel={args.n_sel} w={args.w} method={args.method} on {args.device}")
    print(f"qualify: {shape}{', addresses checked' if args.check_addresses else ''}", flush=True)
    for name in args.kernels:
        t0 = time.perf_counter()
        try:
            what = runs[name]()
        except Exception as exc:  # noqa: BLE001 - a kernel that fails is reported by name, then the run ends
            traceback.print_exc()
            message = (str(exc).splitlines() or [""])[0]
            print(f"qualify: FAILED {name} at {shape}: {type(exc).__name__}: {message}", file=sys.stderr, flush=True)
            return 1
        print(f"qualify: ok {name:<9} {what} ({time.perf_counter() - t0:.2f} s)", flush=True)
        for t in (q, k, v, k_cmp, v_cmp):
            t.grad = None
    print(f"qualify: all {len(args.kernels)} kernel(s) ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
