"""Collective bandwidth conventions and the communication-time prediction (torch-free).

Conventions of nccl-tests (doc/PERFORMANCE.md), for n ranks and a message of S bytes timed at t seconds:

    algbw = S / t
    busbw = algbw x factor(kind, n):  all_reduce 2(n-1)/n; all_gather, reduce_scatter (n-1)/n;
                                      broadcast, all_to_all... 1 (broadcast), (n-1)/n (all_to_all)

S is the message size as nccl-tests counts it, the same as the trainer's counts (nsa.training.comm_count):
all-reduce and broadcast the buffer, all-gather the gathered output, reduce-scatter the full input.

A bandwidth table is what the `comm` step measures for one collective: rows sorted by size,

    [{"bytes": S, "time_s": t, "algbw_gbps": ..., "busbw_gbps": ...}, ...]      (GB/s = 1e9 bytes/s)

and `predict_seconds` turns the trainer's message sizes (summary.json comm sizes, or the byte model's) into a
predicted time: within the measured sizes the time is interpolated log-log between the two neighbouring rows
(each row's time already holds that size's latency and bandwidth); below the smallest size, the smallest size's
time (the latency: a smaller message is never faster); above the largest, the largest row's time plus the extra
bytes at that row's algorithm bandwidth, t(S) = t_max + (S - S_max) / algbw_max = t_max x S / S_max (algbw_max =
S_max / t_max, the row's own bytes and time: busbw / factor is the same figure); a call of 0 bytes sends nothing
and takes 0 s. Only a row's bytes and time are read: its bandwidth columns, when present, were derived from them; a
row with bytes or time at most 0 is refused (ValueError), as are an unknown kind and a world size below 1.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Iterable, Mapping, Sequence

from validation.results.codec import decode

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
GB = 1e9


def size_range(min_bytes: int | None, max_bytes: int | None, backend: str) -> tuple[int, int]:
    """(smallest, largest) message size: the given ones, else 8 KiB .. 1 GiB (nccl) / 4 KiB .. 4 MiB (gloo); a
    default never crosses the bound given beside it (min_bytes 8 MiB alone on gloo: 8 MiB .. 8 MiB)."""
    lo_default, hi_default = (8192, 1 << 30) if backend == "nccl" else (4096, 4 << 20)
    lo = min_bytes or (min(lo_default, max_bytes) if max_bytes else lo_default)
    hi = max_bytes or max(hi_default, lo)
    return lo, hi


def bus_factor(kind: str, world_size: int) -> float:
    """busbw / algbw for `kind` at `world_size` ranks (nccl-tests; 1 for broadcast); 0 at one rank, where no
    collective moves anything between ranks (nccl-tests keeps broadcast's 1 there: its busbw would read as a link's
    bandwidth that no link carried)."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; one of {', '.join(KINDS)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    n = world_size
    if n == 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind == "broadcast":
        return 1.0
    return (n - 1) / n


def bandwidth_row(kind: str, world_size: int, nbytes: int, seconds: float) -> dict:
    """One table row: the message size (a whole number of bytes), its time, algbw and busbw in GB/s."""
    whole = (isinstance(nbytes, numbers.Real) and not isinstance(nbytes, bool) and math.isfinite(nbytes)
             and nbytes == int(nbytes))
    if not (whole and nbytes > 0 and seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"a bandwidth row needs a whole number of bytes > 0 and a finite time > 0, got {nbytes} B "
                         f"in {seconds} s")
    algbw = int(nbytes) / seconds / GB  # the bytes the row records
    return {"bytes": int(nbytes), "time_s": float(seconds), "algbw_gbps": algbw,
            "busbw_gbps": algbw * bus_factor(kind, world_size)}


@dataclasses.dataclass(frozen=True)
class BandwidthRow:
    """One row of a bandwidth table as the prediction reads it (bandwidth_row's keys; a table's other keys, such as
    nccl-tests' reported busbw, are not read)."""
    bytes: int | float
    time_s: int | float
    algbw_gbps: int | float | None = None  # not read: derived from bytes and time_s (bandwidth_row)
    busbw_gbps: int | float | None = None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The predicted time of a step's messages (predict_seconds): in all, per collective, and the collectives that
    had no table."""
    total_s: float
    by_kind: dict[str, float]
    missing: list[str]


def _row(row: "BandwidthRow | Mapping") -> BandwidthRow:
    if isinstance(row, BandwidthRow):
        return row
    return decode(BandwidthRow, {k: v for k, v in row.items() if k in _ROW_KEYS}, "bandwidth table row")


_ROW_KEYS = tuple(f.name for f in dataclasses.fields(BandwidthRow))


def _checked(table: "Sequence[BandwidthRow | Mapping]") -> list[BandwidthRow]:
    pairs = sorted(((_row(r), r) for r in table), key=lambda pair: pair[0].bytes)
    if not pairs:
        raise ValueError("an empty bandwidth table")
    for r, given in pairs:
        if not (r.bytes > 0 and r.time_s > 0):
            shown = dataclasses.asdict(given) if isinstance(given, BandwidthRow) else dict(given)
            raise ValueError(f"a bandwidth row needs bytes > 0 and time_s > 0: {shown}")
    return [r for r, _ in pairs]


def time_at(table: "Sequence[BandwidthRow | Mapping]", kind: str, world_size: int, nbytes: int) -> float:
    """Predicted seconds of one `kind` collective of `nbytes` from its measured table (see the module doc)."""
    rows = _checked(table)
    bus_factor(kind, world_size)  # the kind and world size checked at every size, not only beyond the table
    if nbytes <= 0:
        return 0.0
    lo, hi = rows[0], rows[-1]
    if nbytes < lo.bytes:
        return lo.time_s  # below the smallest size the latency dominates: never faster than it
    if nbytes > hi.bytes:  # the largest row's algbw, from its own bytes and time (module doc)
        return hi.time_s * nbytes / hi.bytes
    for a, b in zip(rows, rows[1:]):
        if a.bytes <= nbytes <= b.bytes:
            if a.bytes == b.bytes:
                return a.time_s
            w = math.log(nbytes / a.bytes) / math.log(b.bytes / a.bytes)
            return math.exp(math.log(a.time_s) + w * (math.log(b.time_s) - math.log(a.time_s)))
    return lo.time_s  # a single row equal to nbytes


def predict_seconds(sizes: Mapping[str, Iterable[int]], tables: "Mapping[str, Sequence[BandwidthRow | Mapping]]",
                    world_size: int) -> Prediction:
    """The Prediction (total_s, by_kind {kind: seconds}, missing: the kinds without a table) for the messages `sizes`
    ({kind: [bytes of each call]}), each call timed by `time_at` on its kind's table."""
    by_kind, missing = {}, []
    for kind, calls in sizes.items():
        calls = [int(s) for s in calls]
        if not calls:
            continue
        table = tables.get(kind)
        if not table:
            missing.append(kind)
            continue
        rows = _checked(table)
        by_kind[kind] = sum(time_at(rows, kind, world_size, s) for s in calls)
    return Prediction(total_s=sum(by_kind.values()), by_kind=by_kind, missing=missing)
