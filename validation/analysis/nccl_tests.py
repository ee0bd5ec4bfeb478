"""nccl-tests (github.com/NVIDIA/nccl-tests) for the `comm` step: which binary runs which collective, its command
line, whether it is usable here, and the parser of its output table (torch-free).

The `comm` step runs one single-process `<kind>_perf -b MIN -e MAX -f 2 -g N -n ITERS -w WARMUP` per collective,
N = the step's nproc_per_node (one process driving N GPUs: nccl-tests needs an MPI build and mpirun/srun to span
processes, which torchrun does not provide), so source nccl-tests is for one node.

Its output (what `parse` reads): a `# nThread ... nGpus ...` line, one `#  Rank  i Group ... device ...` line per
rank, a header whose `size count type redop root time algbw busbw #wrong ...` names the columns (older versions
lack `root` or say `error` for `#wrong`), one data row per size (time in microseconds; the first time/algbw/busbw
triple is out-of-place, the second in-place), then `# Out of bounds values` and `# Avg bus bandwidth`. The rows
use the out-of-place figures; algbw and busbw are recomputed from size and time with validation.analysis.collectives (the
same conventions nccl-tests uses, without its two-decimal rounding). Versions before 2.13 write `#  Rank i Pid ...`
(no Group). Versions 2.13.0 to 2.13.3 print the `redop` column of all_gather and broadcast (collectives without a
reduction) blank under a header that names it: such a row has one field fewer, its `root` integer where `redop` is,
and is read with that column left out.

A table is a measurement only when nccl-tests checked it and finished: wrong results (a `#wrong` count above 0 in
either column of any row, or `# Out of bounds values : N FAILED` with N > 0; the older `error` column is the largest
deviation, judged within a tolerance by that same count) raise WrongResults; an output that stops before its
footer (truncated, or the run ended on an error: nccl-tests prints no footer then) raises NcclTestsError. `N/A` in
`#wrong` (nccl-tests run with -c 0) is a table nccl-tests did not check, read as it is.
"""

from __future__ import annotations

import re
import shutil

from validation.analysis.collectives import bandwidth_row

BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
            "reduce_scatter": "reduce_scatter_perf", "broadcast": "broadcast_perf"}

_RANK_RE = re.compile(r"^#\s+Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+\S+\s+device\s+\d+"
                      r"(?:\s+\[[^\]]*\]\s+(?P<name>.*\S))?")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_BOUNDS_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")


class NcclTestsError(ValueError):
    """The output is not a complete nccl-tests table (no header, no row, or no footer)."""


class WrongResults(NcclTestsError):
    """nccl-tests found wrong results: a row's `#wrong` count or the out-of-bounds count above 0."""


def missing_binaries(kinds, path: str | None = None) -> list[str]:
    """The `<kind>_perf` binaries of `kinds` not found on PATH (`path`: a PATH value; None: this process's)."""
    return [BINARIES[k] for k in kinds if shutil.which(BINARIES[k], path=path) is None]


def command(kind: str, min_bytes: int, max_bytes: int, gpus: int, iters: int, warmup: int) -> list[str]:
    """`<kind>_perf` over min..max bytes doubling, `gpus` GPUs in one process, with the step's iterations."""
    return [BINARIES[kind], "-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(gpus),
            "-n", str(iters), "-w", str(warmup)]


def parse(text: str, kind: str, world_size: int | None = None) -> dict:
    """{"world_size", "rows": [bandwidth_row(...) + "reported_busbw_gbps"], "avg_busbw_gbps", "devices"} of one
    nccl-tests run's output. world_size: the number of `# Rank` lines (or `world_size` when given); devices: the
    GPU name each `# Rank` line ends with (`device 0 [0x18] NVIDIA H100 80GB HBM3`), in their order. Raises
    NcclTestsError (WrongResults when nccl-tests found wrong results; see the module doc)."""
    columns: list[str] | None = None
    ranks = 0
    devices: list[str] = []
    rows: dict[int, dict] = {}
    avg = bounds = None
    wrong: list[int] = []  # the sizes with a #wrong count above 0
    for line in text.splitlines():
        stripped = line.strip()
        rank = _RANK_RE.match(stripped)
        if rank:
            ranks += 1
            if rank.group("name"):
                devices.append(rank.group("name"))
            continue
        if stripped.startswith("#"):
            body = stripped[1:].split()
            if columns is None and body[:2] == ["size", "count"] and "time" in body and "busbw" in body:
                columns = body
            m = _AVG_RE.match(stripped)
            if m:
                avg = float(m.group(1))
            m = _BOUNDS_RE.match(stripped)
            if m:
                bounds = int(m.group(1))
            continue
        if columns is None or not stripped or not stripped[0].isdigit():
            continue
        fields = stripped.split()
        names = _row_columns(columns, fields)
        if fields[0].isdigit() and _wrong(names, fields):
            wrong.append(int(fields[0]))
        if len(fields) < names.index("busbw") + 1:
            continue
        try:
            nbytes = int(fields[0])
            time_us = float(fields[names.index("time")])
            reported = float(fields[names.index("busbw")])
        except ValueError:
            continue  # N/A or a line of something else
        if nbytes <= 0 or time_us <= 0:
            continue
        rows[nbytes] = (nbytes, time_us, reported)
    if columns is None:
        raise NcclTestsError("no nccl-tests table header (`# size count type ... time algbw busbw`) in the output")
    if wrong:
        raise WrongResults(f"nccl-tests found wrong results (#wrong > 0) at {', '.join(map(str, wrong))} B")
    if bounds:
        raise WrongResults(f"nccl-tests found wrong results: {bounds} out-of-bounds value(s)")
    world = world_size or ranks
    if not world:
        raise NcclTestsError("no `# Rank N Group ...` line: the number of ranks is unknown")
    if not rows:
        raise NcclTestsError("the nccl-tests table holds no row")
    if avg is None and bounds is None:
        raise NcclTestsError(f"the nccl-tests output stops after its {max(rows)} B row, before the `# Out of bounds "
                             "values` and `# Avg bus bandwidth` lines: the run did not finish (truncated, or an "
                             "error)")
    out = []
    for nbytes in sorted(rows):
        _, time_us, reported = rows[nbytes]
        row = bandwidth_row(kind, world, nbytes, time_us * 1e-6)
        row["reported_busbw_gbps"] = reported
        out.append(row)
    return {"world_size": world, "rows": out, "avg_busbw_gbps": avg, "devices": devices}


def _row_columns(columns: list[str], fields: list[str]) -> list[str]:
    """The header's column names as they line up with one data row's fields: the header's, less `redop` where the
    row left it blank (nccl-tests 2.13.0 to 2.13.3 for a collective without a reduction: the field under `redop` is
    then the `root` integer; an operation's name never is one)."""
    if "redop" in columns and "root" in columns and columns.index("root") == columns.index("redop") + 1:
        i = columns.index("redop")
        if i < len(fields) and re.fullmatch(r"-?\d+", fields[i]):
            return columns[:i] + columns[i + 1:]
    return columns


def _wrong(columns: list[str], fields: list[str]) -> bool:
    """Whether a data row has a `#wrong` count above 0 (out-of-place or in-place; N/A: not checked)."""
    for i, name in enumerate(columns):
        if name == "#wrong" and i < len(fields) and fields[i] != "N/A":
            try:
                if float(fields[i]) != 0:
                    return True
            except ValueError:
                continue
    return False
