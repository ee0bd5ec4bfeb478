"""The collective benchmark of the `comm` step: run under torchrun over the run's ranks (NCCL on CUDA, gloo on CPU).

    python -m torch.distributed.run --nproc_per_node=2 -m validation.analysis.comm_bench --out DIR \
        [--kinds all_reduce,all_gather,reduce_scatter,broadcast] [--min-bytes 4096 --max-bytes 4194304 | --sizes a,b]
        [--iters 20] [--warmup 5] [--backend auto|gloo|nccl]

For every kind and every message size (doubling from min to max, or the given sizes): `warmup` untimed calls, a
barrier, then `iters` calls timed together (on CUDA, synchronized after the last); each rank's mean time per call,
and the row's time is the maximum over the ranks (the slowest rank decides when a collective is done; nccl-tests
by default averages its ranks' times, -a 1). Message sizes follow nccl-tests (validation.analysis.collectives):
all-reduce and broadcast the buffer, all-gather the gathered output, reduce-scatter the full input; a size is
rounded down to a whole number of float32 elements per rank (all-gather, reduce-scatter: per rank's shard), and the
row records the bytes actually moved.

Rank 0 writes DIR/comm.json: {"world_size", "backend", "device", "device_name" (the GPU's name as
torch.cuda.get_device_name gives it, "cpu" with gloo: what the bandwidths' ceiling reads), "dtype", "iters",
"warmup", "threads", "kinds": {kind: [validation.analysis.collectives.bandwidth_row(...) rows sorted by bytes]}}.
At one rank the collectives move nothing: the rows hold the time of the call and busbw 0 (validation.analysis.collectives.bus_factor).

Only this process imports torch; the `comm` step (validation.kinds.comm) reads the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from validation.analysis.collectives import bandwidth_row, size_range

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
OUTPUT = "comm.json"
ELEMENT = 4  # float32


def sizes_between(lo: int, hi: int) -> list[int]:
    """lo, 2 lo, 4 lo, ... up to hi (inclusive); lo >= 1 (a smaller start never doubles past hi)."""
    if lo < 1:
        raise ValueError(f"the smallest message size must be at least 1 byte, got {lo}")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def elements(kind: str, nbytes: int, world: int) -> int:
    """Elements per rank's buffer (all_gather: the input shard; reduce_scatter: the output shard) for `nbytes`."""
    per = nbytes // ELEMENT
    if kind in ("all_gather", "reduce_scatter"):
        per //= world
    return max(1, per)


def message_bytes(kind: str, count: int, world: int) -> int:
    """The nccl-tests message size of a call with `count` elements per rank's buffer (see elements)."""
    return count * ELEMENT * (world if kind in ("all_gather", "reduce_scatter") else 1)


def _call(dist, kind: str, count: int, world: int, device):
    """A zero-argument function issuing one `kind` collective on preallocated buffers."""
    if kind == "all_reduce":
        buf = torch.ones(count, dtype=torch.float32, device=device)
        return lambda: dist.all_reduce(buf)
    if kind == "broadcast":
        buf = torch.ones(count, dtype=torch.float32, device=device)
        return lambda: dist.broadcast(buf, src=0)
    if kind == "all_gather":
        shard = torch.ones(count, dtype=torch.float32, device=device)
        out = torch.empty(count * world, dtype=torch.float32, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the newer name first
        return lambda: gather(out, shard)
    if kind == "reduce_scatter":
        full = torch.ones(count * world, dtype=torch.float32, device=device)
        out = torch.empty(count, dtype=torch.float32, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, full)
    raise ValueError(f"unknown collective {kind!r}")


def busy(seconds: float, work) -> None:
    """Compute on this rank's threads for `seconds` (the compute phase of a training step)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work()


def measure(dist, kind: str, nbytes: int, world: int, device, iters: int, warmup: int,
            compute_ms: float = 0.0) -> tuple[int, float]:
    """(message bytes, seconds per call: the slowest rank's mean) of `kind` at about `nbytes`.

    compute_ms 0: nccl-tests' protocol, `iters` calls back to back after a barrier. compute_ms > 0: every timed
    call follows `compute_ms` of computation on every rank and a barrier, and is timed alone (the collective as a
    training step issues it, after its backward: on a CPU the computation leaves the collective's threads cold)."""
    count = elements(kind, nbytes, world)
    call = _call(dist, kind, count, world, device)
    cuda = device.type == "cuda"
    for _ in range(warmup):
        call()
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    if compute_ms > 0:
        a = torch.randn(256, 256, device=device)
        total = 0.0
        for _ in range(iters):
            busy(compute_ms / 1e3, lambda: a @ a)
            if cuda:
                torch.cuda.synchronize(device)
            dist.barrier()
            start = time.perf_counter()
            call()
            if cuda:
                torch.cuda.synchronize(device)
            total += time.perf_counter() - start
        elapsed = total
    else:
        start = time.perf_counter()
        for _ in range(iters):
            call()
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    per_call = torch.tensor([elapsed / iters], dtype=torch.float64, device=device)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    return message_bytes(kind, count, world), float(per_call.item())


def run(args: argparse.Namespace) -> dict:
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if "RANK" not in os.environ:  # run without torchrun: a one-rank group
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group(backend=backend, **({"device_id": device} if backend == "nccl" else {}))
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        if args.sizes:
            sizes = sorted({int(s) for s in args.sizes.split(",")})
        else:
            lo, hi = size_range(args.min_bytes, args.max_bytes, backend)
            sizes = sizes_between(lo, hi)
        kinds = {}
        for kind in args.kinds.split(","):
            rows = {}
            for nbytes in sizes:
                moved, seconds = measure(dist, kind, nbytes, world, device, args.iters, args.warmup,
                                         args.compute_ms)
                rows[moved] = bandwidth_row(kind, world, moved, max(seconds, 1e-12))
            kinds[kind] = [rows[b] for b in sorted(rows)]
            if rank == 0:
                print(f"comm_bench: {kind}: {len(rows)} sizes, {sizes[0]}..{sizes[-1]} B", flush=True)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        result = {"world_size": world, "backend": backend, "device": str(device), "device_name": name,
                  "dtype": "float32",
                  "iters": args.iters, "warmup": args.warmup, "compute_ms": args.compute_ms, "threads": torch.get_num_threads(), "kinds": kinds}
        if rank == 0:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            tmp = out / (OUTPUT + ".tmp")
            tmp.write_text(json.dumps(result, indent=1) + "\n")
            tmp.replace(out / OUTPUT)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m validation.analysis.comm_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help=f"directory of {OUTPUT}")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated collectives")
    p.add_argument("--sizes", default=None, help="comma-separated message sizes in bytes (instead of min/max)")
    p.add_argument("--min-bytes", type=int, default=None, help="default 8 KiB (nccl) / 4 KiB (gloo)")
    p.add_argument("--max-bytes", type=int, default=None, help="default 1 GiB (nccl) / 4 MiB (gloo)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compute-ms", type=float, default=0.0,
                   help="computation before every timed call (0: back to back, as nccl-tests)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    bad = [k for k in args.kinds.split(",") if k not in KINDS]
    if bad or args.iters < 1 or args.warmup < 0 or args.compute_ms < 0:
        print(f"comm_bench: kinds must be among {', '.join(KINDS)}, iters >= 1, warmup >= 0, compute-ms >= 0", file=sys.stderr)
        return 2
    bounds = {"--min-bytes": args.min_bytes, "--max-bytes": args.max_bytes}
    bad = [f"{name} {value}" for name, value in bounds.items() if value is not None and value < 1]
    if args.sizes is not None:
        try:
            bad += [f"--sizes {s}" for s in args.sizes.split(",") if int(s) < 1]
        except ValueError:
            bad.append(f"--sizes {args.sizes!r}")
    if bad:  # 0 would read as "not given" (the default range), a negative start would double without end
        print(f"comm_bench: message sizes are whole numbers of bytes >= 1, got {', '.join(bad)}", file=sys.stderr)
        return 2
    if args.min_bytes and args.max_bytes and args.min_bytes > args.max_bytes:
        print(f"comm_bench: --min-bytes {args.min_bytes} > --max-bytes {args.max_bytes}", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
