"""Reduce a trainer's training.csv to the statistics that acceptance criteria and reports read.

The trainer's columns are defined in nsa.training.outputs (TRAINING_COLUMNS, MFU_COLUMN); this module defines which of
them are summarized (METRIC_COLUMNS), the statistics computed for each (STAT_NAMES) and every key of a summary
(see summarize()). Reading never raises for bad content: a missing, empty, truncated or garbled file is
reported as data (CsvRead.problem, summary "status"/"reason") so a dead run still gets a clear verdict.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nsa.training.outputs import MFU_COLUMN, TRAINING_COLUMNS

if TYPE_CHECKING:
    import pandas as pd


class MetricsError(ValueError):
    """A caller passed an invalid argument (window, world size, selection goal)."""


# METRIC_COLUMNS (summarized per window), STAT_NAMES (statistics of each), DERIVED_KEYS (always in a summary): their
# names live in validation.analysis.metric_names, which `plan` reads without pandas
from validation.analysis.metric_names import (DERIVED_KEYS, METRIC_COLUMNS, RATE_METRICS, STAT_NAMES,  # noqa: E402
                                             THROUGHPUT_CV_MAX)
# Values of a summary's "status".
STATUSES = ("ok", "short", "missing", "empty", "corrupt")
# Statuses whose statistics can be used (short: fewer window rows than asked, but at least one).
USABLE_STATUSES = ("ok", "short")
# Columns a training.csv must have (the trainer contract); "mfu" is optional.
REQUIRED_COLUMNS = tuple(TRAINING_COLUMNS)

STEP_COLUMN = "step"
PLATEAU_REL_TOL = 0.05            # mem_plateau: the last quarter may exceed the middle half by 5% ...
PLATEAU_ABS_TOL_GB = 0.05         # ... or by 0.05 GB, whichever is larger
PLATEAU_MIN_ROWS = 8              # mem_plateau is None below this many rows
DRIFT_MIN_ROWS = 9                # throughput_drift is None below this many rows after the warmup (3 a third)
TIE_REL_TOL = 0.01                # select_best: means within 1% of the best mean are a tie

assert set(METRIC_COLUMNS) <= set(TRAINING_COLUMNS) | {MFU_COLUMN[0]}
assert STEP_COLUMN in TRAINING_COLUMNS


@dataclass
class Window:
    """The rows statistics are computed over: the last `last` rows after excluding the first `warmup` rows
    (rows are steps: training.csv holds one row per optimizer step, sorted by step)."""

    last: int = 50
    warmup: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.last, bool) or not isinstance(self.last, int) or self.last < 1:
            raise MetricsError(f"window last: expected a positive integer number of steps, got {self.last!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise MetricsError(f"window warmup: expected a non-negative integer number of steps, got {self.warmup!r}")


@dataclass
class CsvRead:
    """What read_training_csv found.

    frame:           numeric columns (step as int64, the others float64; an empty cell is NaN), one row per step,
                     sorted by step, a duplicated step keeping its last occurrence in the file. Empty when
                     `problem` is set.
    problem:         None when the file is usable, else one sentence starting with "missing:", "empty:",
                     "no data rows", "missing columns:" or "unparseable:".
    dropped_rows:    rows that could not be parsed and were left out (e.g. a last line cut off by a kill).
    duplicate_steps: rows replaced by a later row with the same step.
    path:            the file read.
    cut_last_line:   the file ends without a newline, so its last row was left out (one of dropped_rows): what a
                     writer killed mid-row leaves, unlike a damaged row elsewhere.
    first_bad_row:   'line N: <text>' of the first row left out, or None.
    """

    frame: pd.DataFrame
    problem: str | None = None
    dropped_rows: int = 0
    duplicate_steps: int = 0
    path: str = ""
    cut_last_line: bool = False
    first_bad_row: str | None = None


def _pandas():
    import pandas  # start-up: pandas loads when a csv is read, not with the modules that import this one

    return pandas


def _empty_frame() -> pd.DataFrame:
    pd = _pandas()
    return pd.DataFrame({STEP_COLUMN: pd.Series([], dtype="int64")})


def unread_csv(path: str | Path, why: str) -> CsvRead:
    """A training.csv that is there but is not this run's (e.g. an earlier launch's): read as missing, `why` said."""
    return CsvRead(_empty_frame(), f"missing: {path}: {why}", path=str(path))


def _parse_float(cell: str) -> float | None:
    """float of a cell; "" -> NaN; None when it is not a number."""
    cell = cell.strip()
    if cell == "":
        return math.nan
    try:
        return float(cell)
    except ValueError:
        return None


def read_training_csv(path: str | Path) -> CsvRead:
    """Read a trainer's training.csv. Never raises for bad content: problems are returned in CsvRead.problem.

    A last line without its newline (the writer was killed mid-row) is dropped and counted, even when it parses:
    its last number may be cut short. A row whose field count differs from the header's, whose step is not an
    integer, or with a non-numeric value in a known column is dropped and counted. Blank lines are ignored.
    """
    pd = _pandas()
    path = Path(path)
    empty = _empty_frame()
    if not path.is_file():
        return CsvRead(empty, f"missing: {path}", path=str(path))
    fast = _read_clean_if_complete(path)
    if fast is not None:  # the common case, a well-formed file: pandas' C parser, no per-row Python
        return _finish(fast, 0, path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return CsvRead(empty, f"unparseable: {path}: cannot read ({exc.strerror or exc})", path=str(path))
    text = raw.decode("utf-8-sig", errors="replace")  # -sig: a byte-order mark is not part of the first column
    if not text.strip():
        return CsvRead(empty, f"empty: {path}", path=str(path))

    lines = text.splitlines()
    complete = text.endswith(("\n", "\r"))
    try:
        header = [h.strip() for h in next(csv.reader([lines[0]]))]
    except (csv.Error, StopIteration) as exc:
        return CsvRead(empty, f"unparseable: {path}: header line: {exc}", path=str(path))
    if len(lines) == 1 and not complete:
        # Only a partial header was written.
        return CsvRead(empty, f"unparseable: {path}: the header line is incomplete ({lines[0][:80]!r})",
                       path=str(path))
    duplicates = sorted({h for h in header if header.count(h) > 1})
    if duplicates:
        return CsvRead(empty, f"unparseable: {path}: duplicate column(s) {', '.join(duplicates)} in the header",
                       path=str(path))
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        return CsvRead(empty, f"missing columns: {', '.join(missing)} (in {path}; header: {lines[0][:200]!r})",
                       path=str(path))

    known = set(REQUIRED_COLUMNS) | {MFU_COLUMN[0]}
    columns: dict[str, list[float]] = {h: [] for h in header}
    extra_numeric = {h: True for h in header if h not in known}
    dropped = 0
    first_bad: tuple[int, str] | None = None
    data_rows = 0
    cut = False
    body = lines[1:]
    for i, line in enumerate(body):
        if not line.strip():
            continue
        data_rows += 1
        lineno = i + 2
        ok = True
        if i == len(body) - 1 and not complete:
            ok, cut = False, True  # cut off mid-row
        values: list[float | None] = []
        if ok:
            try:
                cells = next(csv.reader([line]))
            except (csv.Error, StopIteration):
                cells = []
            if len(cells) != len(header):
                ok = False
            else:
                values = [_parse_float(c) for c in cells]
                for h, v in zip(header, values):
                    if h in known and v is None:
                        ok = False
                        break
                step = values[header.index(STEP_COLUMN)]
                if ok and (step is None or not math.isfinite(step) or step != int(step) or abs(step) >= 2**63):
                    ok = False  # the step column is int64
        if not ok:
            dropped += 1
            if first_bad is None:
                first_bad = (lineno, line)
            continue
        for h, v in zip(header, values):
            if v is None:
                extra_numeric[h] = False
                v = math.nan
            columns[h].append(v)

    if data_rows == 0:
        return CsvRead(empty, "no data rows", path=str(path))
    if not columns[STEP_COLUMN]:
        lineno, line = first_bad or (2, "")
        return CsvRead(empty, f"unparseable: {path}: none of the {data_rows} data rows is numeric "
                              f"(line {lineno}: {line[:80]!r})", dropped_rows=dropped, path=str(path))

    frame = pd.DataFrame({h: np.asarray(v, dtype="float64") for h, v in columns.items()
                          if h in known or extra_numeric[h]})
    bad = f"line {first_bad[0]}: {first_bad[1][:80]!r}" if first_bad else None
    return _finish(frame, dropped, path, cut_last_line=cut, first_bad_row=bad)


def _finish(frame: pd.DataFrame, dropped: int, path: Path, cut_last_line: bool = False,
            first_bad_row: str | None = None) -> CsvRead:
    frame[STEP_COLUMN] = frame[STEP_COLUMN].astype("int64")
    n_before = len(frame)
    frame = frame.drop_duplicates(subset=STEP_COLUMN, keep="last")
    frame = frame.sort_values(STEP_COLUMN, kind="stable").reset_index(drop=True)
    return CsvRead(frame, None, dropped_rows=dropped, duplicate_steps=n_before - len(frame), path=str(path),
                   cut_last_line=cut_last_line, first_bad_row=first_bad_row)


def _read_clean_if_complete(path: Path) -> pd.DataFrame | None:
    """The whole file through pandas' C parser when it is clean: it ends with a newline, the header has every
    required column once, every row as many cells as the header (_cells_match_header), every known column is
    numeric, every required cell present, steps are integers. None (use the row-by-row reader, which explains each
    problem) otherwise. Reads the file once, in C."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if not raw or raw[-1:] not in (b"\n", b"\r"):
        return None
    end = raw.find(b"\n")
    try:
        header = [h.strip() for h in next(csv.reader([raw[:end if end >= 0 else len(raw)].decode("utf-8-sig")]))]
    except (UnicodeDecodeError, csv.Error, StopIteration):
        return None
    if len(set(header)) != len(header) or any(c not in header for c in REQUIRED_COLUMNS):
        return None
    if not _cells_match_header(raw):
        return None
    return _read_clean(raw, header, set(REQUIRED_COLUMNS) | {MFU_COLUMN[0]})


def _cells_match_header(raw: bytes) -> bool:
    """Whether every line of `raw` that is not blank has as many commas as its first (the header). pandas' C parser
    fills a row with fewer cells with NaN, and reads a file whose rows all have one cell more than the header with
    the first column as its index (every column's values under its neighbour's name); the row-by-row reader drops
    such rows and counts them. Counted with numpy, not per row. A quote (a comma inside a quoted cell parts no
    cells) or a carriage return that ends no line says no: the row-by-row reader decides."""
    if b'"' in raw or raw.count(b"\r") != raw.count(b"\r\n"):
        return False
    data = np.frombuffer(raw, dtype=np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    if ends.size == 0:
        return False
    starts = np.concatenate(([0], ends[:-1] + 1))
    commas = np.flatnonzero(data == ord(","))
    per_line = np.searchsorted(commas, ends) - np.searchsorted(commas, starts)
    length = ends - starts
    blank = (length == 0) | ((length == 1) & (data[ends - 1] == ord("\r")))  # "\n" or "\r\n" alone
    return bool(np.all(per_line[~blank] == per_line[0]))


def _read_clean(raw: bytes, header: list[str], known: set[str]) -> pd.DataFrame | None:
    pd = _pandas()
    try:
        frame = pd.read_csv(io.BytesIO(raw), encoding="utf-8-sig", skipinitialspace=True, engine="c",
                            on_bad_lines="error", skip_blank_lines=True)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError, OSError):
        return None
    frame.columns = [str(c).strip() for c in frame.columns]
    if list(frame.columns) != header or frame.empty:
        return None
    keep = {}
    for name in frame.columns:
        column = frame[name]
        if not pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
            if name in known:
                return None
            continue  # a non-numeric extra column is left out, as the row reader does
        keep[name] = column.to_numpy(dtype="float64")
    required = [c for c in REQUIRED_COLUMNS if c in keep]
    if len(required) != len(REQUIRED_COLUMNS) or any(np.isnan(keep[c]).any() for c in required):
        return None
    step = keep[STEP_COLUMN]
    if not (np.isfinite(step).all() and (step == np.floor(step)).all() and (np.abs(step) < 2 ** 63).all()):
        return None
    return pd.DataFrame(keep)


def window_rows(frame: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The rows of `frame` (sorted by step) that `window` selects: the last `last` after the first `warmup`."""
    return frame.iloc[window.warmup:].tail(window.last)


def window_values(source: CsvRead | str | Path, column: str, window: Window) -> list[float]:
    """The finite values of one column over the window (the per-step sample an A/B comparison uses); an empty
    list when the file has a problem or no such column. `source` is a CsvRead or a training.csv path."""
    read = source if isinstance(source, CsvRead) else read_training_csv(source)
    if read.problem is not None or column not in read.frame:
        return []
    values = window_rows(read.frame, window)[column].to_numpy(dtype="float64")
    return [float(v) for v in values if math.isfinite(v)]


def _num(value: Any) -> float | None:
    """A plain float for JSON, None for missing/NaN/inf."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def window_mean(values: Any, column: str | None = None) -> float | None:
    """A window's figure of `column` from its per-step values (the finite ones): for a rate of work that is the same
    in every step (RATE_METRICS: tokens/s, MFU, tokens/s per GPU or node) the window's work over its time, which is the harmonic mean of the
    rates (n / the sum of 1 / rate: the steps' times add up, their rates do not), else the plain mean. A rate that is
    not above 0 (outside its physical range: validation.analysis.plausibility says so) has no time to add up: the
    plain mean then. None without a finite value."""
    arr = np.asarray(values, dtype="float64")
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # near 1e308 or 1e-308: None below
        mean = (arr.size / float(np.sum(1.0 / arr)) if column in RATE_METRICS and bool(np.all(arr > 0))
                else float(arr.mean()))
    return _num(mean)


def column_stats(values: Any, column: str | None = None) -> dict[str, float | int | None]:
    """STAT_NAMES over the finite values of `values` (NaN cells are left out; n counts the values used); the mean
    is the window's figure of `column` (window_mean: a rate's is its work over its time), cv the stdev over it."""
    arr = np.asarray(values, dtype="float64")
    arr = arr[np.isfinite(arr)]
    n = int(arr.size)
    if n == 0:
        return {name: (0 if name == "n" else None) for name in STAT_NAMES}
    mean = window_mean(arr, column)
    mean = math.nan if mean is None else mean
    with np.errstate(over="ignore", invalid="ignore"):  # values near 1e308 overflow: inf/NaN become None below
        median, stdev = float(np.median(arr)), float(arr.std(ddof=0))
    out = {"mean": mean, "median": median, "stdev": stdev,
           "cv": (stdev / abs(mean)) if mean != 0 else None, "min": float(arr.min()), "max": float(arr.max()),
           "n": n}
    assert tuple(out) == STAT_NAMES
    return {k: (v if k == "n" else _num(v)) for k, v in out.items()}


def _mem_plateau(frame: pd.DataFrame) -> bool | None:
    if "mem_alloc_gb" not in frame or len(frame) < PLATEAU_MIN_ROWS:
        return None
    n = len(frame)
    q = n // 4
    mem = frame["mem_alloc_gb"].to_numpy(dtype="float64")
    middle, tail = mem[q:n - q], mem[n - q:]
    middle, tail = middle[np.isfinite(middle)], tail[np.isfinite(tail)]
    if middle.size == 0 or tail.size == 0:
        return None
    mid_max, tail_max = float(middle.max()), float(tail.max())
    return bool(tail_max - mid_max <= max(PLATEAU_REL_TOL * abs(mid_max), PLATEAU_ABS_TOL_GB))


def _throughput_drift(frame: pd.DataFrame, warmup: int) -> float | None:
    """How far tokens/s moved over the run: the median of the last third of the rows after the warmup over the
    median of the first third, minus 1 (-0.2: the end of the run is 20% slower than its start). The whole run, not
    the window: a slow decline that the window's CV cannot see (each window steady, the run slowing). Medians of
    thirds, not a fit: steps are autocorrelated, and a few slow steps (a checkpoint, a GC pause) move no median.
    None below DRIFT_MIN_ROWS finite values or without a positive first median. How far noise alone moves it:
    validation.analysis.significance.drift.throughput_drift_interval (the longrun kind records both)."""
    rows = drift_rows(frame, warmup)
    if rows is None:
        return None
    values, third = rows[1], rows[1].size // 3
    first, last = float(np.median(values[:third])), float(np.median(values[-third:]))
    return _num(last / first - 1.0) if first > 0 else None


def drift_rows(frame: pd.DataFrame, warmup: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(row positions, tokens/s) of the rows the throughput drift reads: after the warmup, with a finite tokens/s;
    None below DRIFT_MIN_ROWS of them."""
    if "toks_per_s" not in frame:
        return None
    values = frame["toks_per_s"].to_numpy(dtype="float64")[warmup:]
    kept = np.isfinite(values)
    return ((np.arange(values.size) + warmup)[kept], values[kept]) if int(kept.sum()) >= DRIFT_MIN_ROWS else None


def drift_thirds(frame: pd.DataFrame, warmup: int) -> tuple[list[int], list[int]] | None:
    """The row positions (in the frame's order) of the two parts of the run the throughput drift compares (the first
    and the last third of the rows after the warmup with a finite tokens/s), or None where it has none (fewer than
    DRIFT_MIN_ROWS such rows)."""
    rows = drift_rows(frame, warmup)
    if rows is None:
        return None
    positions, third = [int(i) for i in rows[0]], rows[0].size // 3
    return positions[:third], positions[-third:]


def summarize(read: CsvRead, window: Window, world_size: int = 1) -> dict[str, Any]:
    """Statistics of one run's training.csv, as a JSON-ready dict (plain types, None instead of NaN).

    | key                  | meaning                                                                            |
    |----------------------|------------------------------------------------------------------------------------|
    | status               | ok; short (fewer window rows than asked, at least one; stats still computed);     |
    |                      | missing (no file); empty (empty file, header only, or every row in the warmup);    |
    |                      | corrupt (missing columns or nothing parseable)                                     |
    | reason               | one sentence when status is missing/empty/corrupt, else None                      |
    | note                 | one sentence when status is short or rows were dropped, else None                 |
    | steps                | number of rows (distinct steps) in the file                                        |
    | last_step            | the highest step, None without rows                                                |
    | dropped_rows         | unparseable rows left out (e.g. a last line cut off by a kill)                     |
    | cut_last_line        | True when one of them is a last line without its newline (a writer cut off)       |
    | first_bad_row        | 'line N: <text>' of the first row left out, else None                              |
    | window               | {last, warmup: as asked; n: rows used; first_step, last_step: of the rows used}   |
    | <column>             | for each of METRIC_COLUMNS in the file: {mean, median, stdev (population), cv     |
    |                      | (stdev/mean), min, max, n} over the window's finite values (None when n == 0);    |
    |                      | the mean of a rate (RATE_METRICS: toks_per_s, mfu) is the window's work over its  |
    |                      | time, the harmonic mean of the per-step rates (window_mean)                       |
    | toks_per_s_per_gpu   | the window's toks_per_s (global: its tokens over its time) / world_size           |
    | first_loss           | loss of the first row                                                              |
    | final_loss           | loss of the last row                                                               |
    | loss_drop            | first_loss - final_loss                                                            |
    | mem_peak_gb          | max mem_reserved_gb over all rows                                                  |
    | mem_plateau          | True when max mem_alloc_gb over the last 25% of rows exceeds the max over the      |
    |                      | middle 50% by at most max(5%, 0.05 GB): memory stopped growing; None under 8 rows  |
    | throughput_stable    | cv of toks_per_s over the window <= 0.15; None without throughput data            |
    | throughput_drift     | median toks_per_s of the last third of the rows after the warmup / that of the     |
    |                      | first third - 1 (the whole run, not the window); None under 9 rows                |

    Scalar keys (toks_per_s_per_gpu ... throughput_drift) are always present, None when not computable;
    per-column dicts are present only for columns the file has (never for missing/empty/corrupt).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise MetricsError(f"world_size: expected a positive integer, got {world_size!r}")
    frame = read.frame
    out: dict[str, Any] = {
        "status": "ok", "reason": None, "note": None,
        "steps": 0, "last_step": None, "dropped_rows": int(read.dropped_rows),
        "cut_last_line": bool(read.cut_last_line), "first_bad_row": read.first_bad_row,
        "window": {"last": window.last, "warmup": window.warmup, "n": 0, "first_step": None, "last_step": None},
    }
    scalars: dict[str, Any] = dict.fromkeys(DERIVED_KEYS)

    if read.problem is not None:
        p = read.problem
        status = ("missing" if p.startswith("missing:") else
                  "empty" if p.startswith(("empty:", "no data rows")) else "corrupt")
        out.update(status=status, reason=p)
        out.update(scalars)
        return out

    out["steps"] = int(len(frame))
    out["last_step"] = int(frame[STEP_COLUMN].iloc[-1]) if len(frame) else None
    notes = []
    if read.dropped_rows:
        notes.append(f"{read.dropped_rows} unparseable row(s) dropped")
    win = window_rows(frame, window)
    n = len(win)
    out["window"].update(n=n, first_step=int(win[STEP_COLUMN].iloc[0]) if n else None,
                         last_step=int(win[STEP_COLUMN].iloc[-1]) if n else None)
    if n == 0:
        out.update(status="empty", reason=f"no rows after the warmup: {len(frame)} row(s), warmup {window.warmup}",
                   note="; ".join(notes) or None)
        out.update(scalars)
        return out
    if n < window.last:
        out["status"] = "short"
        notes.insert(0, f"window has {n} of the {window.last} steps asked ({len(frame)} rows, "
                        f"warmup {window.warmup})")
    out["note"] = "; ".join(notes) or None

    for col in METRIC_COLUMNS:
        if col in win:
            out[col] = column_stats(win[col], col)

    if "toks_per_s" in out and out["toks_per_s"]["mean"] is not None:
        scalars["toks_per_s_per_gpu"] = out["toks_per_s"]["mean"] / world_size
        cv = out["toks_per_s"]["cv"]
        scalars["throughput_stable"] = None if cv is None else bool(cv <= THROUGHPUT_CV_MAX)
    if "loss" in frame:
        first, final = _num(frame["loss"].iloc[0]), _num(frame["loss"].iloc[-1])
        scalars.update(first_loss=first, final_loss=final,
                       loss_drop=None if first is None or final is None else _num(first - final))
    if "mem_reserved_gb" in frame:
        mem = frame["mem_reserved_gb"].to_numpy(dtype="float64")
        mem = mem[np.isfinite(mem)]
        scalars["mem_peak_gb"] = float(mem.max()) if mem.size else None
    scalars["mem_plateau"] = _mem_plateau(frame)
    scalars["throughput_drift"] = _throughput_drift(frame, window.warmup)
    assert tuple(scalars) == DERIVED_KEYS
    out.update(scalars)
    return out


def scaling_efficiency(multi_toks_per_s: float | None, single_toks_per_s: float | None, n: int) -> float | None:
    """Throughput of n devices relative to n times one device: multi / (n * single). None when not computable
    (a value missing or non-finite, single <= 0, n < 1)."""
    if multi_toks_per_s is None or single_toks_per_s is None or n is None or n < 1:
        return None
    multi, single = float(multi_toks_per_s), float(single_toks_per_s)
    if not (math.isfinite(multi) and math.isfinite(single)) or single <= 0:
        return None
    return multi / (n * single)


def model_tflops(flops_per_token: float | None, toks_per_s: float | None) -> float | None:
    """Achieved model TFLOP/s of a run (all ranks together): flops_per_token (env.json, the model's forward and
    backward FLOPs per token) x global tokens/s / 1e12. None when either is unknown or not finite."""
    if flops_per_token is None or toks_per_s is None:
        return None
    value = float(flops_per_token) * float(toks_per_s) / 1e12
    return value if math.isfinite(value) and value >= 0 else None


def _fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"


def select_best(candidates: list[tuple[str, dict]], metric: str = "toks_per_s",
                goal: str = "max") -> tuple[str | None, str]:
    """The seed runbook's rule "choose highest mean (tie -> lower variance)".

    Compares summary[metric]["mean"] (goal "max" or "min"). Means within TIE_REL_TOL (1%) of the best mean are a
    tie, broken by the lower stdev (then the better mean, then list order). Candidates whose summary status is
    not ok/short, or without a mean for the metric, are excluded. Returns (label or None, one sentence).
    """
    if goal not in ("max", "min"):
        raise MetricsError(f"goal: expected 'max' or 'min', got {goal!r}")
    usable: list[tuple[int, str, float, float | None]] = []
    excluded: list[str] = []
    for i, (label, summary) in enumerate(candidates):
        status = summary.get("status") if isinstance(summary, dict) else None
        stats = summary.get(metric) if isinstance(summary, dict) else None
        mean = stats.get("mean") if isinstance(stats, dict) else None
        if status not in USABLE_STATUSES:
            excluded.append(f"{label} ({status or 'no summary'})")
        elif mean is None or not math.isfinite(mean):
            excluded.append(f"{label} (no {metric})")
        else:
            usable.append((i, label, float(mean), stats.get("stdev")))
    if not usable:
        why = f"; excluded: {', '.join(excluded)}" if excluded else ""
        return None, f"no candidate has a {metric} mean to compare{why}."

    sign = 1.0 if goal == "max" else -1.0
    best_mean = max(usable, key=lambda c: (sign * c[2], -c[0]))[2]
    tied = [c for c in usable if abs(c[2] - best_mean) <= TIE_REL_TOL * abs(best_mean)]
    inf = float("inf")
    winner = min(tied, key=lambda c: (inf if c[3] is None else c[3], -sign * c[2], c[0]))

    def desc(c: tuple[int, str, float, float | None]) -> str:
        sd = "n/a" if c[3] is None else _fmt(c[3])
        return f"{c[1]} (mean {_fmt(c[2])}, stdev {sd})"

    others = [desc(c) for c in usable if c is not winner]
    text = f"{desc(winner)} has the {'highest' if goal == 'max' else 'lowest'} {metric} mean"
    if len(tied) > 1:
        rivals = [c for c in tied if c is not winner]
        lower = all(c[3] is None or (winner[3] is not None and winner[3] < c[3]) for c in rivals)
        text = (f"{desc(winner)} wins a tie (means within {TIE_REL_TOL:.0%}) with "
                f"{', '.join(desc(c) for c in rivals)} on "
                f"{'lower stdev' if lower else 'equal stdev and the better mean'}")
        others = [desc(c) for c in usable if c not in tied]
    if others:
        text += f"; others: {', '.join(others)}"
    if excluded:
        text += f"; excluded: {', '.join(excluded)}"
    return winner[1], text + "."
