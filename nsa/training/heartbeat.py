"""The heartbeat file format: one writer, two readers, defined here once.

Every rank of a training run appends to its own file ``out_dir/heartbeat_rank{r}.jsonl``: one JSON object per
line, terminated by ``\\n``. A record always has these keys, in this order::

    ts    unix time of the write (float)
    rank  the writer's global rank (int)
    pid   the writer's process id (int)
    host  socket.gethostname() of the writer (str): a watchdog only signals pids on its own host
    step  the optimizer step the rank has reached (int)
    msg   what happened: "boot", "step", "checkpoint", "stopping" (a stop decided, its checkpoint being written), or
          a terminal "done" / "stop" / "error"; and the progress of the phases outside the training steps (below)

followed by any metrics (floats, ints, strings, bools or None). Non-finite floats are written as null, so every
line is valid JSON. A rank whose latest ``msg`` is in ``TERMINAL_MSGS`` has finished.

A rank writes records at real progress points only (no thread beats for it), so its silence means no progress,
in every phase, not only between training steps::

    "starting"   a start-up stage done (``stage``: model_built, model_on_device, model_wrapped, optimizer_built,
                 data_ready, checkpoint_loaded, ready)
    "loading"    a checkpoint load begins (``path``); the next record is "starting" with stage checkpoint_loaded
    "capturing"  the CUDA-graph warm-up and capture begin; "cuda_graphs" when done
    "compiling"  the first forward of a compiled model (or of JIT-compiled kernels) begins (``during``: "train" or
                 "eval"); the record after it comes once that forward (and, for "train", its step) is done
    "eval"       an evaluation's progress: ``batch`` batches of ``batches`` done (0: begun), then once more with
                 ``val_loss`` after the ranks' losses are reduced
    "saving"     a checkpoint save begins; "checkpoint" (``path``) when it is complete

The records in ``LONG_CALL_MSGS`` open one long call with no progress point inside it (a checkpoint read or written
whole, a compilation, a graph capture): a watchdog allows a rank whose latest record is one of them a longer silence
(``nsa.training.watchdog``: ``long_call_after_s``) before it calls it stalled; every other record, the usual one.

Each line reaches the file with ONE ``write(2)`` on a descriptor opened with ``O_APPEND``, so a concurrent reader
sees whole lines; only the last line of a file may be partial while it is being written, and readers ignore a
line without its newline. A resumed run appends to the files of the run it resumes.

``read_heartbeats`` parses whole files; ``latest_heartbeats`` reads only the tail of each file (binary seeks from
the end, growing the window until a whole line is found), so a watchdog can poll files of any length.
``mark_files`` notes where each file ends; given those marks, ``latest_heartbeats`` and ``first_heartbeat`` look
only at the records appended since (by place in the file, whatever the writers' clocks say).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger(__name__)

HEARTBEAT_NAME = "heartbeat_rank{rank}.jsonl"
TERMINAL_MSGS = ("done", "stop", "error")
# records that open one long call without progress points inside it (see the module's docstring)
LONG_CALL_MSGS = ("loading", "saving", "compiling", "capturing")
RESERVED_KEYS = ("ts", "rank", "pid", "host", "step", "msg")

_NAME_RE = re.compile(r"^heartbeat_rank(\d+)\.jsonl$")
_TAIL_BLOCK = 4096  # first backwards read; doubles up to _TAIL_BLOCK_MAX while no whole line is found
_TAIL_BLOCK_MAX = 1 << 20


def heartbeat_path(out_dir: str | os.PathLike, rank: int) -> Path:
    """``out_dir/heartbeat_rank{rank}.jsonl``."""
    return Path(out_dir) / HEARTBEAT_NAME.format(rank=int(rank))


# --------------------------------------------------------------------------------------------------- writing


def _metric_value(key: str, value):
    """A JSON-safe scalar for metric `key`: non-finite floats become None; 0-d numpy/torch values are unwrapped."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy scalars, 0-d arrays, 1-element torch tensors
    if callable(item):
        try:
            return _metric_value(key, item())
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"heartbeat metric {key!r}: expected a float, int, str, bool or None, got {type(value).__name__}")


def encode_record(ts: float, rank: int, pid: int, host: str, step: int, msg: str, /, **metrics) -> bytes:
    """One heartbeat line (UTF-8, newline-terminated) in the documented key order."""
    for key in metrics:
        if key in RESERVED_KEYS:
            raise ValueError(f"heartbeat metric name {key!r} is reserved (reserved: {', '.join(RESERVED_KEYS)})")
    record = {
        "ts": float(ts),
        "rank": int(rank),
        "pid": int(pid),
        "host": str(host),
        "step": int(step),
        "msg": str(msg),
    }
    for key, value in metrics.items():
        record[key] = _metric_value(key, value)
    # allow_nan=False: any non-finite value that slipped through is a bug, not an invalid-JSON line on disk.
    line = json.dumps(record, allow_nan=False, separators=(",", ":"))
    return (line + "\n").encode("utf-8")


class HeartbeatWriter:
    """Appends heartbeat records for one rank to ``heartbeat_path(out_dir, rank)``.

    The file is opened in append mode (a resumed run continues the same file). Every ``write`` is one line and
    one system call, so it is on its way to the file (not in a user-space buffer) when ``write`` returns.
    `clock` supplies ``ts`` (tests pass a fake one).
    """

    def __init__(self, out_dir: str | os.PathLike, rank: int, *, clock: Callable[[], float] = time.time):
        self.rank = int(rank)
        if self.rank < 0:
            raise ValueError(f"heartbeat rank must be >= 0, got {rank}")
        self.path = heartbeat_path(out_dir, self.rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._host = socket.gethostname()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self._end_cut_off_line()
        except BaseException:
            self.close()
            raise

    def _end_cut_off_line(self) -> None:
        """A file whose last line has no newline (its writer was killed mid-write, or its disk filled) gets one,
        so this writer's first record starts a line of its own instead of being glued to the cut-off one (where
        neither would decode). The cut-off line stays, complete now, and readers skip it as undecodable."""
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            last = f.read(1)
        if last and last != b"\n":
            os.write(self._fd, b"\n")

    @property
    def closed(self) -> bool:
        return self._fd is None

    def write(self, step: int, msg: str, **metrics) -> None:
        """Append one record ``{ts, rank, pid, host, step, msg, **metrics}``."""
        if self._fd is None:
            raise ValueError(f"heartbeat writer for {self.path} is closed")
        data = encode_record(self._clock(), self.rank, os.getpid(), self._host, step, msg, **metrics)
        view = memoryview(data)
        while view:  # a regular file takes the whole line at once; loop only in case the kernel says otherwise
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> "HeartbeatWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten close must not leak the descriptor
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------------- reading


def parse_line(line: bytes) -> dict | None:
    """The record on one complete line, or None when it is not a heartbeat record."""
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):  # JSONDecodeError is a ValueError
        return None
    if not isinstance(record, dict):
        return None
    ts, step, msg = record.get("ts"), record.get("step"), record.get("msg")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return None
    if isinstance(step, bool) or not isinstance(step, int) or not isinstance(msg, str):
        return None
    return record


class Heartbeats(dict):
    """``read_heartbeats``' result: ``{rank: [record, ...]}``, plus ``bad_lines``: ``{rank: count}`` of complete
    lines that were skipped because they did not decode to a heartbeat record (ranks with none are absent)."""

    def __init__(self):
        super().__init__()
        self.bad_lines: dict[int, int] = {}


def _require_dir(out_dir: str | os.PathLike) -> Path:
    path = Path(out_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"heartbeat directory not found: {path}")
    return path


def heartbeat_files(out_dir: str | os.PathLike) -> dict[int, Path]:
    """``{rank: path}`` of every heartbeat file in `out_dir` (ranks sorted)."""
    path = _require_dir(out_dir)
    found = {}
    for entry in path.iterdir():
        match = _NAME_RE.match(entry.name)
        if match:
            found[int(match.group(1))] = entry
    return dict(sorted(found.items()))


def read_heartbeats(out_dir: str | os.PathLike) -> Heartbeats:
    """Every complete record of every rank, in file order. A trailing line without its newline (being written)
    is ignored; blank lines are skipped; undecodable lines are skipped and counted in ``result.bad_lines``."""
    result = Heartbeats()
    for rank, path in heartbeat_files(out_dir).items():
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # removed between listing and opening
            continue
        end = data.rfind(b"\n")
        records, bad = [], 0
        for line in data[: end + 1].splitlines() if end >= 0 else ():
            if not line.strip():
                continue
            record = parse_line(line)
            if record is None:
                bad += 1
            else:
                records.append(record)
        result[rank] = records
        if bad:
            result.bad_lines[rank] = bad
            log.warning("%s: skipped %d undecodable line(s)", path, bad)
    return result


def _lines_backwards(f, end: int) -> Iterator[tuple[int, bytes]]:
    """The complete lines of binary file `f` within bytes [0, end), last first, as (offset of the line's first
    byte, the line without its newline).

    Reads blocks backwards from `end`; a trailing partial line (no newline before `end`) is never yielded.
    """
    pos, buf, block = end, b"", _TAIL_BLOCK
    tail_cut = False  # whether the partial tail after the last newline has been dropped
    while pos > 0:
        size = min(block, pos)
        pos -= size
        f.seek(pos)
        chunk = f.read(size)
        if len(chunk) != size:  # truncated underneath us: nothing trustworthy left to read
            return
        buf = chunk + buf
        if not tail_cut:
            cut = buf.rfind(b"\n")
            if cut < 0:
                block = min(block * 2, _TAIL_BLOCK_MAX)
                continue
            buf, tail_cut = buf[:cut], True
        line_end = pos + len(buf)  # where the last line in buf ends (the offset of its newline)
        parts = buf.split(b"\n")
        buf = parts[0]  # may be the end of a line that starts before `pos`: keep it for the next block
        for line in reversed(parts[1:]):
            start = line_end - len(line)
            yield start, line
            line_end = start - 1
        if len(parts) == 1:
            block = min(block * 2, _TAIL_BLOCK_MAX)
    if tail_cut:
        yield 0, buf  # pos == 0: the file's first line is complete


@dataclass(frozen=True)
class FileMark:
    """Where one heartbeat file stood at some moment (``mark_files``), to tell the records appended since then
    from the earlier ones by their place in the file, whatever their ``ts`` say (a writer's clock need not agree
    with the reader's: another node on a shared filesystem).

    dev, ino: the file's identity; end: the offset just past its last complete line; tail: up to
    ``_MARK_TAIL`` bytes before `end`, to recognise the same bytes later (a file truncated and written again keeps
    its inode).
    """

    dev: int
    ino: int
    end: int
    tail: bytes


_MARK_TAIL = 64


def _mark_open_file(f) -> FileMark:
    st = os.fstat(f.fileno())
    size = st.st_size
    end, pos, block = 0, size, _TAIL_BLOCK
    while pos > 0:  # the last newline before `size`
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            end = start + cut + 1
            break
        pos, block = start, min(block * 2, _TAIL_BLOCK_MAX)
    f.seek(max(0, end - _MARK_TAIL))
    tail = f.read(end - max(0, end - _MARK_TAIL))
    return FileMark(st.st_dev, st.st_ino, end, tail)


def mark_files(out_dir: str | os.PathLike) -> dict[int, FileMark]:
    """``{rank: FileMark}`` of every heartbeat file in `out_dir` now; {} when `out_dir` does not exist (yet)."""
    try:
        paths = heartbeat_files(out_dir)
    except FileNotFoundError:
        return {}
    marks = {}
    for rank, path in paths.items():
        try:
            with open(path, "rb") as f:
                marks[rank] = _mark_open_file(f)
        except FileNotFoundError:
            continue
    return marks


def _new_from(f, mark: FileMark | None) -> int:
    """The offset in open file `f` from which its lines were written after `mark` was taken: `mark.end` when `f`
    is the marked file, grown by appends only; 0 when it is another file (replaced, or moved aside and created
    again) or was truncated or rewritten since."""
    if mark is None:
        return 0
    st = os.fstat(f.fileno())
    if (st.st_dev, st.st_ino) != (mark.dev, mark.ino) or st.st_size < mark.end:
        return 0
    f.seek(mark.end - len(mark.tail))
    return mark.end if f.read(len(mark.tail)) == mark.tail else 0


@dataclass(frozen=True)
class Entry:
    """A record and where it lies: ``place`` is (st_dev, st_ino, offset of its line) of the file it was read
    from, so the same record read again is recognised, and a new one is told from it, whatever its ``ts``."""

    record: dict
    place: tuple[int, int, int]


def _latest_in_file(path: Path, after: FileMark | None = None) -> Entry | None:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        end = st.st_size  # a snapshot: lines appended from now on are not looked at
        first = _new_from(f, after)
        for offset, line in _lines_backwards(f, end):
            if offset < first:
                break
            if not line.strip():
                continue
            record = parse_line(line)
            if record is not None:
                return Entry(record, (st.st_dev, st.st_ino, offset))
            log.warning("%s: skipped an undecodable line", path)
    return None


def latest_entries(out_dir: str | os.PathLike, after: dict[int, FileMark] | None = None) -> dict[int, Entry]:
    """``latest_heartbeats`` with each record's place in its file. With `after` (``mark_files`` taken earlier),
    only records written since then count: a rank whose file holds none has no entry. A file absent from
    `after` (it did not exist then) is new as a whole."""
    latest = {}
    for rank, path in heartbeat_files(out_dir).items():
        try:
            entry = _latest_in_file(path, None if after is None else after.get(rank))
        except FileNotFoundError:
            continue
        if entry is not None:
            latest[rank] = entry
    return latest


def latest_heartbeats(out_dir: str | os.PathLike, after: dict[int, FileMark] | None = None) -> dict[int, dict]:
    """``{rank: last complete record}`` for every rank with at least one complete record (with `after`: written
    since those marks were taken, see ``latest_entries``).

    Reads each file from its end, so the cost does not grow with the file's length. Files being appended to are
    fine: only bytes present when the file was opened are read, and a partial last line is skipped.
    """
    return {rank: entry.record for rank, entry in latest_entries(out_dir, after).items()}


def first_heartbeat(path: str | os.PathLike, since: float | None = None,
                    after: FileMark | None = None) -> dict | None:
    """The first complete record of one heartbeat file (reads only its head), or None.

    With `after` (the file's ``FileMark`` taken earlier, or ``None``): the first record written since the mark was
    taken (read forward from there). With `since` (a unix time): the first record written at or after it, found by
    reading backwards from the end up to the first older record (so the cost grows with the records since then,
    not with the file); None when there is none. Records are in time order within a file (one writer appends
    them) when the writers' clocks agree; `after` does not depend on clocks.
    """
    if since is not None:
        earliest = None
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            for _, line in _lines_backwards(f, end):
                record = parse_line(line) if line.strip() else None
                if record is None:
                    continue
                if float(record["ts"]) < since:
                    break
                earliest = record
        return earliest
    with open(path, "rb") as f:
        end = os.fstat(f.fileno()).st_size  # a snapshot, as _latest_in_file: a line completed later waits
        f.seek(_new_from(f, after))
        buf, block = b"", _TAIL_BLOCK
        while True:
            chunk = f.read(min(block, max(0, end - f.tell())))
            if not chunk:
                return None
            buf += chunk
            while True:
                cut = buf.find(b"\n")
                if cut < 0:
                    break
                line, buf = buf[:cut], buf[cut + 1:]
                if line.strip():
                    record = parse_line(line)
                    if record is not None:
                        return record
            block = min(block * 2, _TAIL_BLOCK_MAX)


def is_finished(record: dict) -> bool:
    """Whether a rank whose latest record is `record` has finished (terminal msg)."""
    return record.get("msg") in TERMINAL_MSGS


def in_long_call(record: dict) -> bool:
    """Whether a rank whose latest record is `record` is inside one long call with no progress point (its msg is in
    ``LONG_CALL_MSGS``): a watchdog allows it a longer silence."""
    return record.get("msg") in LONG_CALL_MSGS
