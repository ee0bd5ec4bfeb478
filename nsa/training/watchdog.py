"""Stall detection over the heartbeat files (``nsa.training.heartbeat``) of a training run.

A watchdog polls ``out_dir/heartbeat_rank*.jsonl`` every ``interval_s``. When some rank that has not finished
has written nothing for ``stall_after_s`` (``long_call_after_s`` when its latest record opens one long call with no
progress point inside it: a checkpoint load or save, a compilation, a CUDA-graph capture; ``heartbeat.LONG_CALL_MSGS``;
by default ``LONG_CALL_FACTOR`` times ``stall_after_s``) it

1. writes ``out_dir/.HALT`` (``HALT_NAME``; atomically, JSON ``{"ts", "by": "watchdog", "reason"}``): the trainer
   checks for this file at every step and stops cleanly with a final checkpoint;
2. sends SIGUSR1 to the stalled ranks' processes that run on this host: the trainer then dumps every thread's
   stack to ``out_dir/stackdump_*.txt`` and keeps going;
3. returns (exit code 1 from the CLI).

Started before a run (the CLI without ``--once`` or ``--include-earlier``), it judges only the records appended to
the files after it started, told from the earlier ones (a resumed run appends to the files of the run it resumes)
by their place in the files, not by their ``ts``; and it counts a rank's silence on its own clock (``Watch``), one
that a step of the host's wall clock does not move (``steady_clock``). The writers' clocks need not agree with the
watchdog's: a rank on another node of a shared filesystem may be an hour off.

``check`` is a pure function of the files and the clock; ``run`` is the loop; ``main`` is the CLI::

    python -m nsa.training.watchdog --dir artifacts/run --halt 1 --interval 30 [--stall-after 300] [--ranks N] [--no-dump]
                           [--once] [--max-wait-start 600] [--long-call-after S]

Exit codes: 0 the run finished (``--once``: running or finished), 1 stalled, 2 usage error (bad flag, missing
directory), 3 no heartbeat appeared within ``--max-wait-start`` seconds (``--once``: none yet).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nsa.training.heartbeat import (FileMark, first_heartbeat, heartbeat_files, in_long_call, is_finished,
                                   latest_entries, mark_files)
from nsa.training.outputs import write_json

log = logging.getLogger(__name__)

HALT_NAME = ".HALT"

WAITING, RUNNING, STALLED, FINISHED = "waiting", "running", "stalled", "finished"
EXIT_CODES = {FINISHED: 0, RUNNING: 0, STALLED: 1, WAITING: 3}
EXIT_USAGE = 2
# a rank inside one long call (heartbeat.LONG_CALL_MSGS) is stalled after this many times the usual silence, unless
# long_call_after_s says otherwise: its next record comes only once the call returns
LONG_CALL_FACTOR = 3.0


def long_call_limit(stall_after_s: float, long_call_after_s: float | None = None) -> float:
    """The silence allowed to a rank whose latest record opens a long call: `long_call_after_s`, by default
    ``LONG_CALL_FACTOR * stall_after_s``; never less than `stall_after_s`."""
    allowed = LONG_CALL_FACTOR * stall_after_s if long_call_after_s is None else float(long_call_after_s)
    return max(float(stall_after_s), allowed)


@dataclass
class WatchdogConfig:
    out_dir: Path
    stall_after_s: float = 300.0
    interval_s: float = 30.0
    halt: bool = True
    dump_stacks: bool = True
    expected_ranks: int | None = None
    max_wait_start_s: float = 600.0
    since: float | None = None  # ignore heartbeat records older than this unix time (see check; clock-dependent)
    # judge only the records appended to the heartbeat files after run() started, told by their place in the files
    # (see Watch), so that the writers' clocks need not agree with this one's
    only_new: bool = False
    # the silence allowed inside one long call (heartbeat.LONG_CALL_MSGS); None: LONG_CALL_FACTOR * stall_after_s
    long_call_after_s: float | None = None

    def __post_init__(self):
        self.out_dir = Path(self.out_dir)
        for name in ("stall_after_s", "interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WatchdogConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.long_call_after_s is not None and not self.long_call_after_s > 0:
            raise ValueError(f"WatchdogConfig.long_call_after_s must be None or > 0, got {self.long_call_after_s!r}")
        if not self.max_wait_start_s >= 0:
            raise ValueError(f"WatchdogConfig.max_wait_start_s must be >= 0, got {self.max_wait_start_s!r}")
        _check_expected_ranks(self.expected_ranks)


@dataclass
class Verdict:
    """One look at a run's heartbeats.

    state: "waiting" (no heartbeat yet) | "running" | "stalled" | "finished".
    stalled_ranks: the ranks that are stalled (sorted).
    ages: seconds since each rank's latest heartbeat; for an expected rank without any, seconds since the run's
        first heartbeat.
    reason: one human-readable sentence.
    latest: each rank's latest record (what the ages were computed from).
    """

    state: str
    stalled_ranks: list[int] = field(default_factory=list)
    ages: dict[int, float] = field(default_factory=dict)
    reason: str = ""
    latest: dict[int, dict] = field(default_factory=dict, repr=False)

    @property
    def dump_ranks(self) -> list[int]:
        """The ranks to ask for stack dumps on a stall: the stalled ones and every other rank not yet finished. A
        hang spreads: the rank that stopped is stalled first, the others follow once they wait for it in a
        collective, and where they wait is half the diagnosis; how far behind the threshold they are when the
        first is caught depends on the machine's load. A SIGUSR1 dump does not stop a rank."""
        return sorted(set(self.stalled_ranks) | {r for r, rec in self.latest.items() if not is_finished(rec)})


def _check_expected_ranks(expected_ranks) -> None:
    if expected_ranks is not None and (isinstance(expected_ranks, bool) or not isinstance(expected_ranks, int)
                                       or expected_ranks < 1):
        raise ValueError(f"expected_ranks must be a positive int or None, got {expected_ranks!r}")


def _run_start(out_dir: Path, since: float | None = None) -> float | None:
    """ts of the earliest first record over all heartbeat files (reads only their heads); with `since`, of the
    earliest record at or after it (a resumed run appends to the files of the run it resumes: their first records
    are that earlier run's)."""
    starts = []
    for path in heartbeat_files(out_dir).values():
        try:
            record = first_heartbeat(path, since=since)
        except FileNotFoundError:
            continue
        if record is not None:
            starts.append(float(record["ts"]))
    return min(starts) if starts else None


def _on_this_clock(ts: float, low: float | None, high: float) -> float:
    """When a record stamped `ts` by its writer's clock was written, on this clock: it appeared after `low` (None:
    not known) and by `high`. A ts within those bounds is taken as it is (the clocks agree); one outside them says
    the writer's clock is off, and `high` is taken, the latest the record can have been written, so that the
    rank's age is never overstated (a stall is never declared before the threshold has passed on this clock)."""
    if low is None:
        return min(ts, high)
    return ts if low <= ts <= high else high


def steady_clock() -> Callable[[], float]:
    """A clock in unix seconds that never steps: the wall clock when it is made, plus the monotonic time since. A
    rank's silence and the wait for a first heartbeat are durations; read on the wall clock, an NTP correction or
    a `date -s` that steps it an hour ahead would make a live rank an hour silent (a .HALT stopping a healthy run),
    one that steps it back would hide a hung rank for an hour. A heartbeat stamped by a wall clock that stepped is
    placed by when it appeared (``Watch``)."""
    origin_wall, origin = time.time(), time.monotonic()
    return lambda: origin_wall + (time.monotonic() - origin)


class Watch:
    """What a watchdog loop keeps from one check to the next (``run`` keeps one and passes it to every ``check``),
    so that its verdicts rest on its own clock and on where records lie in the files, not on the writers' clocks
    (another node's may be off by an hour, and on a shared filesystem its records are as fresh as anyone's).

    With `out_dir` (``only_new``), the heartbeat files are marked as they are now (``heartbeat.mark_files``) and
    only records appended since then count: the earlier ones are the run before's (a resumed run appends to its
    files). A file replaced, truncated or created after the mark counts as a whole.

    A record's write time is estimated on this clock: a record that was not there at the previous check (or,
    with `out_dir`, at `started`) appeared between that check and this one; its ts is used when it lies in that
    window, else the check that first saw it. A record already there at the first check (without `out_dir`) has
    only that upper bound: min(ts, first seen). So a writer whose clock is behind is not taken for stalled, one
    whose clock is ahead does not look fresh for as long as it is ahead, and with agreeing clocks the ages are the
    records' own.
    """

    def __init__(self, out_dir=None, started: float | None = None):
        self.clock = steady_clock()  # check's `now` when none is given
        self.after: dict[int, FileMark] | None = mark_files(out_dir) if out_dir is not None else None
        self.last_check: float | None = started if out_dir is not None else None
        self.records: dict[int, tuple] = {}  # rank: (its latest record, that record's estimated write time)
        self.firsts: dict[int, tuple] = {}   # rank: ((st_dev, st_ino), estimated write time of its first record)


def check(out_dir, stall_after_s: float, now: float | None = None, expected_ranks: int | None = None,
          since: float | None = None, watch: Watch | None = None,
          long_call_after_s: float | None = None) -> Verdict:
    """The state of the run whose heartbeats are in `out_dir`, at time `now` (default: time.time()).

    The ranks looked at are 0..expected_ranks-1 when `expected_ranks` is given (files of other ranks, e.g. left
    by an earlier run with more ranks, are ignored), else every rank with a heartbeat file. A rank is stalled when
    its latest record is not terminal and is older than `stall_after_s`, or, when that record opens one long call
    without progress points (``heartbeat.in_long_call``: a checkpoint load or save, a compilation, a graph capture),
    older than ``long_call_limit(stall_after_s, long_call_after_s)``; an expected rank with no record at all
    is stalled once the run's first heartbeat (any rank) is older than `stall_after_s`. The run is finished when
    every rank's latest record is terminal. With `since` (a unix time), records older than it are ignored, as if
    absent: a watchdog started before a run does not mistake the previous run's final heartbeats for this one's
    (this compares the writers' clocks with `since`: a ``Watch`` does the same by place in the files).
    `watch`, a ``Watch`` the caller keeps from one call to the next (``run`` does), makes the verdict independent
    of the writers' clocks: the ages and the run's start are the records' write times as estimated on this clock
    (see ``Watch``), and with a ``Watch`` made with `out_dir` only the records appended since it was made count.
    Without `now`, a ``Watch``'s own clock is read (its ``steady_clock``: a step of the wall clock is no silence),
    else the wall clock. Without a ``Watch``, the ages are `now` minus the records' ts: a record stamped in the
    future (the writer's clock ahead) would not grow older than 0 s until this clock caught up with it, one stamped
    in the past (clock behind) would be stalled at once.
    Raises FileNotFoundError when `out_dir` is not a directory.
    """
    if not stall_after_s > 0:
        raise ValueError(f"stall_after_s must be > 0, got {stall_after_s!r}")
    if long_call_after_s is not None and not long_call_after_s > 0:
        raise ValueError(f"long_call_after_s must be None or > 0, got {long_call_after_s!r}")
    long_limit = long_call_limit(stall_after_s, long_call_after_s)
    _check_expected_ranks(expected_ranks)
    out_dir = Path(out_dir)
    if now is None:
        now = watch.clock() if watch is not None else time.time()
    now = float(now)
    entries = latest_entries(out_dir, watch.after if watch is not None else None)
    if since is not None:
        entries = {r: e for r, e in entries.items() if float(e.record["ts"]) >= since}
    written: dict[int, float] = {}
    if watch is not None:
        written = _estimate_write_times(out_dir, watch, entries, now)
    latest = {r: e.record for r, e in entries.items()}
    if expected_ranks is not None:
        latest = {r: rec for r, rec in latest.items() if r < expected_ranks}
    if not latest:
        return Verdict(WAITING, reason=f"no heartbeats yet in {out_dir}")

    ranks = sorted(range(expected_ranks)) if expected_ranks is not None else sorted(latest)
    missing = [r for r in ranks if r not in latest]
    ages = {r: now - (written[r] if watch is not None else float(rec["ts"])) for r, rec in latest.items()}
    stalled, problems = [], []
    for r in sorted(latest):
        rec = latest[r]
        long_call = in_long_call(rec)
        if not is_finished(rec) and ages[r] > (long_limit if long_call else stall_after_s):
            stalled.append(r)
            problems.append(f"rank {r} last heartbeat {ages[r]:.0f}s ago (step {rec['step']}, msg {rec['msg']!r}"
                            + (f": one long call, allowed {long_limit:g}s)" if long_call else ")"))
    if missing:
        if watch is not None:  # the first record written since the watch began, of any rank, on this clock
            start = min((first for _, first in watch.firsts.values()), default=now)
        else:
            start = _run_start(out_dir, since)
        if since is not None and start is None:
            start = since
        since_start = now - start if start is not None else 0.0
        for r in missing:
            ages[r] = since_start
        if since_start > stall_after_s:
            stalled.extend(missing)
            problems.append(f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never wrote a "
                            f"heartbeat ({since_start:.0f}s after the run's first one)")
    ages = dict(sorted(ages.items()))

    if stalled:
        reason = "; ".join(problems) + f" (stall threshold {stall_after_s:g}s)"
        return Verdict(STALLED, sorted(stalled), ages, reason, latest)

    finished = [r for r in ranks if r in latest and is_finished(latest[r])]
    if not missing and len(finished) == len(ranks):
        ends = ", ".join(f"rank {r}: {latest[r]['msg']} at step {latest[r]['step']}" for r in ranks)
        return Verdict(FINISHED, [], ages, f"all {len(ranks)} rank(s) finished ({ends})", latest)

    alive = [r for r in ranks if r in latest and not is_finished(latest[r])]
    parts = [f"{len(alive)} rank(s) alive"]
    if finished:
        parts.append(f"{len(finished)} finished")
    if missing:
        parts.append(f"waiting for rank(s) {', '.join(map(str, missing))} ({ages[missing[0]]:.0f}s since start)")
    if alive:
        oldest = max(alive, key=lambda r: ages[r])
        parts.append(f"oldest heartbeat {ages[oldest]:.0f}s (rank {oldest}, step {latest[oldest]['step']})")
    return Verdict(RUNNING, [], ages, "; ".join(parts), latest)


def _estimate_write_times(out_dir: Path, watch: Watch, entries: dict, now: float) -> dict[int, float]:
    """Each rank's latest record's write time on this clock (``Watch``); updates `watch` (its files' first
    records, the time of this check)."""
    low = watch.last_check
    written, paths = {}, None
    for r, entry in entries.items():
        ts = float(entry.record["ts"])
        known = watch.records.get(r)
        if known is not None and known[0] == entry.record:  # the same record (its file may have been moved)
            written[r] = known[1]
        else:
            written[r] = _on_this_clock(ts, low, now)
            watch.records[r] = (entry.record, written[r])
        file_id = entry.place[:2]
        if r not in watch.firsts or watch.firsts[r][0] != file_id:  # the first look at this file's records
            try:
                paths = heartbeat_files(out_dir) if paths is None else paths
                first = first_heartbeat(paths[r], after=watch.after.get(r) if watch.after is not None else None)
            except (FileNotFoundError, KeyError):
                first = None
            first_ts = float(first["ts"]) if first is not None else ts
            watch.firsts[r] = (file_id, min(_on_this_clock(first_ts, low, now), written[r]))
    for r in [r for r in watch.firsts if r not in entries]:  # moved aside or removed: not this run's start
        del watch.firsts[r]
    watch.last_check = now
    return written


def write_halt(out_dir, reason: str) -> Path:
    """Write ``out_dir/.HALT`` atomically (temp file + rename) with ``{"ts", "by": "watchdog", "reason"}``."""
    return write_json(Path(out_dir) / HALT_NAME, {"ts": time.time(), "by": "watchdog", "reason": str(reason)},
                      indent=None)


def _process_start_time(pid: int) -> float | None:
    """Unix start time of process `pid` from /proc (Linux), or None when it cannot be known."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3 (state)
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def signal_stack_dumps(latest: dict[int, dict]) -> list[int]:
    """Send SIGUSR1 to the process of each record in `latest` (pass those of Verdict.dump_ranks) when it
    runs on this host and still exists; returns the pids signalled.

    Skipped without error: records from another host (or with no ``host``), pids that no longer exist or belong
    to another user, this process itself, and (Linux) a pid reused by a process that started after the record
    was written (so an unrelated process is never signalled).
    """
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None:  # not on this platform
        return []
    host = socket.gethostname()
    signalled = []
    for rank, record in sorted(latest.items()):
        pid = record.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1 or pid == os.getpid():
            continue  # pid 0 / -1 would signal a whole process group / every process
        if record.get("host") != host or pid in signalled:
            continue
        started = _process_start_time(pid)
        if started is not None and started > float(record.get("ts", 0.0)) + 1.0:
            log.info("rank %d: pid %d was reused by a newer process; not signalled", rank, pid)
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue
        signalled.append(pid)
    return signalled


def _act_on_stall(cfg: WatchdogConfig, verdict: Verdict, emit) -> None:
    halt_path, halt_error = None, None
    if cfg.halt:
        try:
            halt_path = write_halt(cfg.out_dir, verdict.reason)
        except OSError as exc:  # a full disk, a read-only mount: the stall is still a stall, the dumps still asked
            halt_error = f"could not write {Path(cfg.out_dir) / HALT_NAME}: {exc}"
            log.error("%s", halt_error)
    pids = []
    if cfg.dump_stacks:
        pids = signal_stack_dumps({r: verdict.latest[r] for r in verdict.dump_ranks if r in verdict.latest})
    emit("stalled", {"verdict": verdict, "halt_path": halt_path, "halt_error": halt_error, "signalled_pids": pids})


def run(cfg: WatchdogConfig, *, sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] | None = None,
        on_event: Callable[[str, object], None] | None = None) -> Verdict:
    """Check every ``cfg.interval_s`` until the run stalls, finishes, or shows no heartbeat for
    ``cfg.max_wait_start_s``; returns the last Verdict. `now`: the loop's clock in unix seconds (default
    ``steady_clock()``, which a step of the wall clock does not move).

    Events passed to ``on_event(kind, info)``: ``("check", Verdict)`` after every check;
    ``("stalled", {"verdict", "halt_path", "halt_error", "signalled_pids"})`` once the stall has been acted on
    (``halt_path`` is None with ``cfg.halt`` off, or when .HALT could not be written: then ``halt_error`` says why,
    else it is None); ``("gave_up", Verdict)`` when no heartbeat appeared in time.
    """
    emit = on_event if on_event is not None else (lambda kind, info: None)
    now = steady_clock() if now is None else now
    started = now()
    watch = Watch(cfg.out_dir, started) if cfg.only_new else Watch()
    waiting_since = started  # None while heartbeats are there
    while True:
        if cfg.out_dir.is_dir():
            verdict = check(cfg.out_dir, cfg.stall_after_s, now=now(), expected_ranks=cfg.expected_ranks,
                            since=cfg.since, watch=watch, long_call_after_s=cfg.long_call_after_s)
        else:  # started before the trainer created its out_dir
            verdict = Verdict(WAITING, reason=f"waiting for {cfg.out_dir} to appear")
        emit("check", verdict)
        if verdict.state == STALLED:
            _act_on_stall(cfg, verdict, emit)
            return verdict
        if verdict.state == FINISHED:
            return verdict
        if verdict.state != WAITING:
            waiting_since = None
        elif waiting_since is None:  # the files went away (a retry moves them aside): a new start is awaited
            waiting_since = now()
        if verdict.state == WAITING and now() - waiting_since >= cfg.max_wait_start_s:
            gave_up = Verdict(WAITING, reason=f"no heartbeat in {cfg.out_dir} after {now() - waiting_since:.0f}s "
                                              f"(max wait {cfg.max_wait_start_s:g}s)")
            emit("gave_up", gave_up)
            return gave_up
        sleep(cfg.interval_s)


# ----------------------------------------------------------------------------------------------------- CLI


def _number(convert, minimum, strict: bool, noun: str):
    """An argparse type: `convert(text)` that must be > minimum (strict) or >= minimum, and finite."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected {noun} {'>' if strict else '>='} {minimum}, got {text!r}")
        return value

    return parse


_positive_float = _number(float, 0, True, "a number")
_non_negative_float = _number(float, 0, False, "a number")
_positive_int = _number(int, 1, False, "an integer")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog or "python -m nsa.training.watchdog",
        description="Watch a training run's heartbeat files; on a stall write OUT/.HALT (the trainer stops with a "
                    "final checkpoint) and ask the stalled processes for stack dumps (SIGUSR1). Exit codes: "
                    "0 finished, 1 stalled, 2 usage error, 3 no heartbeat within --max-wait-start.")
    parser.add_argument("--dir", required=True, type=Path, metavar="OUT",
                        help="the run's output directory (holds heartbeat_rank*.jsonl)")
    parser.add_argument("--halt", type=int, choices=(0, 1), default=1,
                        help="1: write OUT/.HALT on a stall (default); 0: only report")
    parser.add_argument("--interval", type=_positive_float, default=30.0, metavar="S",
                        help="seconds between checks (default 30)")
    parser.add_argument("--stall-after", type=_positive_float, default=300.0, metavar="S",
                        help="a rank is stalled after this many seconds without a heartbeat (default 300)")
    parser.add_argument("--ranks", type=_positive_int, default=None, metavar="N",
                        help="expected world size: ranks 0..N-1 must all write heartbeats (default: the files seen)")
    parser.add_argument("--long-call-after", type=_positive_float, default=None, metavar="S",
                        help="a rank whose latest heartbeat opens one long call without progress points (a checkpoint "
                             "load or save, a compilation, a CUDA-graph capture) is stalled after this many seconds "
                             f"(default {LONG_CALL_FACTOR:g} x --stall-after)")
    parser.add_argument("--max-wait-start", type=_non_negative_float, default=600.0, metavar="S",
                        help="give up (exit 3) when no heartbeat appears within this many seconds (default 600)")
    parser.add_argument("--no-dump", action="store_true",
                        help="do not send SIGUSR1 (stack dump request) to the stalled processes and the "
                             "unfinished ones that may wait on them")
    parser.add_argument("--include-earlier", action="store_true",
                        help="also judge heartbeat records written before the watchdog started (by default they are "
                             "ignored, so a previous run's last records are not taken for this run's; --once always "
                             "judges them: it has no earlier start to count from)")
    parser.add_argument("--once", action="store_true",
                        help="check once, act on a stall, and exit: 0 running/finished, 1 stalled, 3 no heartbeat yet "
                             "(every record in OUT is judged, earlier ones included)")
    return parser


def _printer(stream=None):
    def on_event(kind: str, info) -> None:
        out = stream if stream is not None else sys.stdout
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        if kind == "check":
            line = f"{info.state}: {info.reason}"
        elif kind == "stalled":
            if info.get("halt_error"):
                halt = info["halt_error"]
            else:
                halt = f"wrote {info['halt_path']}" if info["halt_path"] is not None else "not halting (--halt 0)"
            pids = info["signalled_pids"]
            dumps = (f"stack dumps requested from pid(s) {', '.join(map(str, pids))}" if pids
                     else "no local process signalled")
            line = f"STALLED: {halt}; {dumps}"
        elif kind == "gave_up":
            line = f"gave up: {info.reason}"
        else:
            line = f"{kind}: {info}"
        print(f"[{stamp}] watchdog {line}", file=out, flush=True)
    return on_event


def main(argv: list[str] | None = None, *, prog: str | None = None) -> int:
    """CLI entry point (also dispatched to by ``nsa-train watchdog``); returns the exit code."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the message (or --help)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    name = parser.prog
    if args.once and not args.dir.exists():
        print(f"{name}: error: --dir {args.dir}: no such directory", file=sys.stderr)
        return EXIT_USAGE
    if args.dir.exists() and not args.dir.is_dir():
        print(f"{name}: error: --dir {args.dir}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    cfg = WatchdogConfig(out_dir=args.dir, stall_after_s=args.stall_after, interval_s=args.interval,
                         halt=bool(args.halt), dump_stacks=not args.no_dump, expected_ranks=args.ranks,
                         max_wait_start_s=args.max_wait_start, only_new=not (args.once or args.include_earlier),
                         long_call_after_s=args.long_call_after)
    on_event = _printer()
    try:
        if args.once:
            verdict = check(cfg.out_dir, cfg.stall_after_s, expected_ranks=cfg.expected_ranks,
                            long_call_after_s=cfg.long_call_after_s)
            on_event("check", verdict)
            if verdict.state == STALLED:
                _act_on_stall(cfg, verdict, on_event)
        else:
            verdict = run(cfg, on_event=on_event)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # e.g. the directory was removed while watching
        print(f"{name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_CODES[verdict.state]


if __name__ == "__main__":
    sys.exit(main())
