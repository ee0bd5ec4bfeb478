"""Timings and peak memory of the selected-branch Triton kernels (nsa.attention.kernels.selected_attn.host) against
the PyTorch path and dense causal SDPA: the measurements its docstring leaves pending.

    python benchmarks/bench_selected_kernel.py                         # CUDA, bf16, the model's shape, S 8K..64K
    python benchmarks/bench_selected_kernel.py --seq 16384 --bwd-tiles 4 8 16 32 --torch-path
    python benchmarks/bench_selected_kernel.py --json

Per sequence length: the inverted-index build alone; the forward with loop="kv" and loop="query"; forward+backward
for each bwd_tiles (kv forward); optionally the PyTorch path (kernels.selected_attention, slow); dense causal
SDPA (GQA) forward+backward as the baseline. Times are triton.testing.do_bench medians (ms); peak is
torch.cuda.max_memory_allocated above what the inputs hold (MB). Selections come from choose_blocks on random
importance (block 0, own and previous blocks forced). Without CUDA it runs once on the CPU through Triton's
interpreter at toy sizes (a smoke run, not a measurement).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

if __name__ == "__main__":  # the interpreter must be chosen before triton is imported
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _timer(cuda: bool):
    if cuda:
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100)

    def once(fn):
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return once


def _peak_mb(fn, cuda: bool) -> float | None:
    import torch

    if not cuda:
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _one(s, hpg, groups, d, l_sel, n_sel, bwd_tiles, torch_path, device, dtype) -> dict:
    import torch
    import torch.nn.functional as F

    from nsa.attention import kernels
    from nsa.attention.kernels.selected_attn import host as ts
    from nsa.attention.selection import choose_blocks, selection_ranges_v2

    cuda = device == "cuda"
    timer = _timer(cuda)
    h = groups * hpg
    gen = torch.Generator(device="cpu").manual_seed(s)
    q = torch.randn(1, s, h, d, generator=gen).to(device, dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(1, s, groups, d, generator=gen).to(device, dtype).transpose(1, 2).requires_grad_()
    v = torch.randn(1, s, groups, d, generator=gen).to(device, dtype).transpose(1, 2).requires_grad_()
    do = torch.randn(1, h, s, d, generator=gen).to(device, dtype)
    pos = torch.arange(s, device=device)
    blocks = choose_blocks(torch.rand(1, groups, s, -(-s // l_sel), device=device), pos, n_sel, l_sel)
    qpt_fwd, qpt_bwd = ts._per_tile(hpg, d, d, ts.BWD_TILES)
    b32 = blocks.to(torch.int32)
    row = {"S": s, "pairs": int((blocks >= 0).sum())}
    # the inverted index alone, each build (on a GPU index_build "auto" takes the Triton one; under the
    # interpreter the torch one, and the Triton build's tl.sort takes seconds)
    row["index_ms"] = timer(lambda: ts._build_index(b32, l_sel, qpt_fwd, qpt_bwd, "auto"))
    if cuda:
        row["index_torch_ms"] = timer(lambda: ts._build_index(b32, l_sel, qpt_fwd, qpt_bwd, "torch"))

    def fwd(loop):
        with torch.no_grad():
            ts.selected_attention(q, k, v, blocks, l_sel, loop=loop)

    def fwd_bwd(tiles):
        out = ts.selected_attention(q, k, v, blocks, l_sel, loop="kv", bwd_tiles=tiles)
        torch.autograd.grad(out, (q, k, v), do)

    def path(ranges):
        out = kernels.selected_attention(q, k, v, ranges, l_sel)
        torch.autograd.grad(out, (q, k, v), do)

    def dense():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.autograd.grad(out, (q, k, v), do)

    cases = [(f"fwd_{loop}", functools.partial(fwd, loop)) for loop in ts.LOOPS]
    cases += [(f"fwd_bwd_kv_t{tiles}", functools.partial(fwd_bwd, tiles)) for tiles in bwd_tiles]
    if torch_path:
        cases.append(("fwd_bwd_torch", functools.partial(path, selection_ranges_v2(blocks, pos, l_sel))))
    cases.append(("fwd_bwd_dense", dense))
    for name, fn in cases:
        row[f"{name}_ms"] = timer(fn)
        row[f"{name}_peak_mb"] = _peak_mb(fn, cuda)
    return row


def run(seq, hpg, groups, d, l_sel, n_sel, bwd_tiles, torch_path, device, dtype):
    import torch

    rows = []
    for s in seq:
        rows.append(_one(s, hpg, groups, d, l_sel, n_sel, bwd_tiles, torch_path, device, dtype))
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--seq", type=int, nargs="+", default=[8192, 16384, 32768, 65536] if cuda else [256])
    parser.add_argument("--hpg", type=int, default=6)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--l-sel", type=int, default=64)
    parser.add_argument("--n-sel", type=int, default=16)
    parser.add_argument("--bwd-tiles", type=int, nargs="+", default=[8, 16, 32] if cuda else [16])
    parser.add_argument("--torch-path", action="store_true", help="also time the PyTorch path (kernels.selected_attention)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = run(args.seq, args.hpg, args.groups, args.d, args.l_sel, args.n_sel, args.bwd_tiles, args.torch_path,
               "cuda" if cuda else "cpu", dtype)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu (interpreter smoke run)'}, {dtype}, "
          f"hpg {args.hpg}, G {args.groups}, d {args.d}, l_sel {args.l_sel}, n_sel {args.n_sel}")
    for row in rows:
        print(" ".join(f"{key}={val:.3f}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
