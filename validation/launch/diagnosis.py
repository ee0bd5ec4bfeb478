"""Why a launch ended as it did: the reason sentence and the evidence excerpt of a LaunchResult.

The failing rank is the one whose ``error_rank{r}.txt`` the trainer wrote first, else the root cause in torchrun's
failure summary, else the first rank whose traceback shows in the combined log; its traceback comes from that
error file, else its own log, else the combined log, unless the log says what ended it after that traceback (a C++
exception's abort, or a SIGKILL once its output went on: the traceback was one it handled), then that line. A
hang's excerpt is where each stalled rank was (its stack dumps, innermost frames first). Logs are read here only as
evidence for a person (tracebacks, torchrun's own failure summary and port-clash message): what the orchestrator
learns about the trainer's state comes from its files (validation.contracts).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from validation.contracts import error_files, read_status_json
from validation.launch.spec import EXCERPT_MAX_LINES, LaunchSpec

NOTE_PREFIX = "[launcher "  # the launcher's own lines in a combined log (validation.launch.local.note)
_LOG_TAIL_BYTES = 2 << 20  # tracebacks are looked for in the last 2 MiB of a log
_TB_HEADER = "Traceback (most recent call last):"
_TB_STOP = ("Traceback (most recent call last):", "During handling of the above exception",
            "The above exception was the direct cause")
_GLOG_RE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # torch/glog log records ("E1121 20:47:18.637 ...")
# blanks inside a line are [ \t] (never \s, which spans lines): a pattern anchored at every line start that could
# run over a log's blank lines retries each of them to its end, quadratic in the run (a tail of 200,000 blank lines
# held the diagnosis of a failed launch for minutes)
_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\):[ \t\r]*\n(?:.*\n){0,3}?"
                            r"[ \t]*rank[ \t]*:[ \t]*(\d+)[^\n]*\n[ \t]*exitcode[ \t]*:[ \t]*(-?\d+)")
_FAILURE_RE = re.compile(r"^[ \t]*rank[ \t]*:[ \t]*(\d+) \(local_rank: \d+\)[ \t\r]*\n"
                         r"[ \t]*exitcode[ \t]*:[ \t]*(-?\d+)", re.MULTILINE)
_CLASH_RE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
_RANK_LOG_HEADER_RE = re.compile(r"^===== rank \d+ (stdout|stderr) \(.*\) =====$")  # attempt.collect_rank_logs
# triton.compiler.errors.CompilationError: "at LINE:COL:", at most 12 lines of the kernel up to the failing one, a
# "^" under the failing column, then the error itself ("ValueError('...')")
_TRITON_AT_RE = re.compile(r"^[\w.]+: at \d+:\d+:$")
_TRITON_SOURCE_LINES = 12
_TERMINATE_RE = re.compile(r"^terminate called after throwing an instance of '([^']+)'")
# a C++ backtrace (c10::Error's "Exception raised from X at FILE:LINE (most recent call first):" + "frame #N: ...")
_CPP_FRAME_RE = re.compile(r"^(frame #\d+: |Exception raised from .* \(most recent call first\):$)")
# signals that end a rank from outside on purpose (torchrun stopping the others after a failure, the launcher):
# a rank they ended never caused the failure
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_SUMMARY_ENTRY_RE = re.compile(r"^[ \t]*time[ \t]*:[ \t]*(\S+)[^\n]*\n(?:.*\n){0,2}?[ \t]*rank[ \t]*:[ \t]*(\d+) "
                               r"\(local_rank: \d+\)[^\n]*\n[ \t]*exitcode[ \t]*:[ \t]*(-?\d+)", re.MULTILINE)


def read_tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def port_clash(log_path: Path) -> bool:
    """Whether torchrun's log says its master port was taken: "address already in use" in a line of torchrun's own
    (not a rank's "[defaultN]:" output) of a log without torchrun's failure summary (its workers never ran; a rank
    that failed, out of memory or otherwise, is never a port clash)."""
    text = read_tail(log_path, 256 << 10)
    if "Root Cause (first observed failure):" in text:
        return False
    return any(rank is None and _CLASH_RE.search(line) for rank, line in tagged_lines(text))


_DEFAULT_PREFIX_RE = re.compile(r"^\[default(\d+)\]:")
_RANK_PREFIX_RE = re.compile(r"^\[rank(\d+)\]: ?")


def tagged_lines(text: str) -> list[tuple[int | None, str]]:
    """(rank or None, line) with torchrun's "[defaultN]:" and torch's "[rankN]: " prefixes stripped."""
    out = []
    for line in text.splitlines():
        rank = None
        match = _DEFAULT_PREFIX_RE.match(line)
        if match:
            rank, line = int(match.group(1)), line[match.end():]
        match = _RANK_PREFIX_RE.match(line)
        if match:
            rank, line = int(match.group(1)), line[match.end():]
        out.append((rank, line))
    return out


@dataclass
class _Traceback:
    rank: int | None
    lines: list[str]
    exception: str  # the exception line ("ValueError: bad thing")
    position: int = 0  # index of its first line in the text it came from
    end: int = 0  # index of the first line after it (its exception's continuation lines included)

    def excerpt(self) -> str:
        lines = self.lines
        if len(lines) > EXCERPT_MAX_LINES:
            lines = [lines[0], f"  ... ({len(lines) - EXCERPT_MAX_LINES + 2} lines cut) ..."] + \
                    lines[-(EXCERPT_MAX_LINES - 2):]
        return "\n".join(lines)


def tracebacks(text: str) -> list[_Traceback]:
    """Every Python traceback in `text`, in order: from "Traceback (most recent call last):" to the exception line
    (plus its continuation lines); lines of other ranks interleaved in a combined log are skipped."""
    lines = tagged_lines(text)
    found, i, n = [], 0, len(lines)
    while i < n:
        rank, line = lines[i]
        if line.rstrip() != _TB_HEADER:
            i += 1
            continue
        body, exception, j = [line.rstrip()], "", i + 1
        source = 0  # lines of a Triton CompilationError's kernel source still to come (blank ones included)
        while j < min(n, i + 5000):
            r2, t2 = lines[j]
            j += 1
            if r2 != rank:
                continue
            t2 = t2.rstrip()
            if exception and source:  # "at L:C:", the kernel's source up to a "^" line, then what was wrong
                if t2.startswith(_TB_STOP) or t2.startswith(NOTE_PREFIX) or _GLOG_RE.match(t2):
                    j -= 1
                    break
                body.append(t2)
                source -= 1
                if t2.strip() == "^":
                    source = 0
                    if j < n and lines[j][0] == rank and lines[j][1].strip():
                        body.append(lines[j][1].rstrip())
                        exception += " " + lines[j][1].strip()
                        j += 1
                continue
            if exception:  # continuation of a multi-line message
                if (not t2.strip() or t2.startswith(_TB_STOP) or t2.startswith(NOTE_PREFIX) or _GLOG_RE.match(t2)
                        or len(body) >= 400):
                    j -= 1
                    break
                body.append(t2)
                continue
            if t2[:1] in (" ", "\t"):
                body.append(t2)
                continue
            if not t2.strip():
                continue
            if t2.startswith(_TB_HEADER):
                j -= 1
                break
            exception = t2.strip()
            body.append(t2)
            if _TRITON_AT_RE.search(exception):
                source = _TRITON_SOURCE_LINES + 1
        if exception:
            found.append(_Traceback(rank, body, exception, i, j))
        i += 1
    return found


def _last_line(text: str) -> str:
    """The last meaningful line: not blank, not a launcher note, not torchrun's own error summary, not a rank log's
    section header (collect_rank_logs), not a C++ stack frame. A process ended by an uncaught C++ exception (the
    NCCL watchdog's abort, a CUDA error in a C++ thread): that exception's type and the first line of its
    message ("terminate called after throwing an instance of 'T'" + "  what():  MESSAGE")."""
    lines = tagged_lines(text)
    for i in range(len(lines) - 1, -1, -1):
        match = _TERMINATE_RE.match(lines[i][1].strip())
        if match:
            for _, after in lines[i + 1:i + 4]:
                if after.strip().startswith("what():"):
                    return f"{match.group(1)}: {after.strip()[len('what():'):].strip()}"
            return lines[i][1].strip()
    for rank, line in reversed(lines):
        s = line.strip()
        if (not s or s.startswith(NOTE_PREFIX) or set(s) <= set("=-") or _GLOG_RE.match(s)
                or _RANK_LOG_HEADER_RE.match(s) or _CPP_FRAME_RE.match(s)):
            continue
        return s
    return ""


def _said_after(text: str, tb: _Traceback, code: int | None, rank: int | None = None) -> str:
    """What ended the process after its last traceback `tb` in `text` (of `rank` only, where given), or "" when the
    traceback is the last word: a C++ exception that terminated it later (an NCCL watchdog's abort after a warning's
    traceback), or, for a process SIGKILLed (the OOM killer: no exception of its own), its last meaningful line once
    its output went on after the traceback (a traceback that was logged and handled: a compiler's warning)."""
    later = [line for r, line in tagged_lines(text)[tb.end:] if rank is None or r == rank]
    last = _last_line("\n".join(later))
    if not last:
        return ""
    if any(_TERMINATE_RE.match(line.strip()) for line in later) or code == -signal.SIGKILL:
        return last
    return ""


def torchrun_failures(log_text: str) -> tuple[int | None, dict[int, int]]:
    """(root-cause rank, {rank: exit code}) from torchrun's failure summary (the last one in the log)."""
    cut = log_text.rfind("Root Cause (first observed failure):")
    start = log_text.rfind("Failures:", 0, cut if cut >= 0 else len(log_text))
    summary = log_text[start if start >= 0 else max(cut, 0):]
    codes = {int(m.group(1)): int(m.group(2)) for m in _FAILURE_RE.finditer(summary)}
    roots = list(_ROOT_CAUSE_RE.finditer(log_text))
    return (int(roots[-1].group(1)) if roots else None), codes


def _killed_first(log_text: str, root: int | None, codes: dict[int, int], error_ranks: set[int]) -> bool:
    """Whether torchrun's root cause `root` is a rank that a signal killed (SIGKILL from the OOM killer, SIGSEGV,
    SIGABRT, ...; not a stop signal) before any rank exited by itself: it left no error file (a signal gives no
    Python exception), and every rank that exited with a code of its own was noticed later. The error files of
    the others are then consequences (their next collective failed: "Connection closed by peer")."""
    if root is None or root in error_ranks or codes.get(root, 0) >= 0:
        return False
    try:
        if signal.Signals(-codes[root]) in _STOP_SIGNALS:
            return False
    except ValueError:
        pass
    cut = log_text.rfind("Root Cause (first observed failure):")
    start = log_text.rfind("Failures:", 0, cut)
    if cut < 0 or start < 0:
        return False
    entries = [(m.group(1), int(m.group(2)), int(m.group(3)))
               for m in _SUMMARY_ENTRY_RE.finditer(log_text[start:])]
    when = {rank: time for time, rank, _ in entries}
    if root not in when:
        return False
    return not any(rank != root and code >= 0 and time <= when[root] for time, rank, code in entries)


def _failure(log_path: Path, rank_logs: dict[int, Path], out_dir: Path | None, since: float,
             logs: bool = True) -> tuple[int | None, int | None, _Traceback | None, str]:
    """(failing rank, its exit code, its traceback, the last meaningful log line) for a failed run.

    The failing rank is the one whose out_dir/error_rank{r}.txt was written first (the trainer writes it as it
    fails, so the order is causal: a crash on one rank makes the others fail in their next collective), unless
    torchrun's root cause is a rank a signal killed before any rank exited by itself (_killed_first: it wrote no
    error file, the others' are consequences); else the root cause torchrun names (the first exit it noticed),
    else the first rank whose traceback shows in the combined log. `logs` False: only the error files are looked
    at."""
    log_text = read_tail(log_path)
    root, codes = torchrun_failures(log_text)
    errors = error_files(out_dir, since)
    if logs and _killed_first(log_text, root, codes, {err_rank for _, err_rank, _ in errors}):
        errors = []
    for _, err_rank, path in errors:  # 1. the trainer's own record of the exception, oldest first
        tbs = tracebacks(read_tail(path))
        if tbs:
            tb = tbs[-1]
            tb.rank = err_rank
            return err_rank, codes.get(err_rank), tb, ""
    if not logs:
        return None, None, None, ""
    combined = tracebacks(log_text)
    rank = root
    if rank is None:
        ranked = [tb for tb in combined if tb.rank is not None]
        if ranked:
            rank = ranked[0].rank
    if rank is not None and rank in rank_logs:  # 2. the failing rank's own log
        text = read_tail(rank_logs[rank])
        tbs = tracebacks(text)
        later = _said_after(text, tbs[-1], codes.get(rank)) if tbs else ""
        if later:
            return rank, codes.get(rank), None, later
        if tbs:
            tb = tbs[-1]
            tb.rank = rank
            return rank, codes.get(rank), tb, ""
        last = _last_line(text)
        if last:
            return rank, codes.get(rank), None, last
    # 3. the combined log: that rank's last traceback, else (no failing rank known: a plain child, torchrun itself)
    # the last one there; never another process's traceback for a known rank (a victim's, torchrun's own)
    if rank is not None:
        of_rank = [tb for tb in combined if tb.rank == rank]
        later = _said_after(log_text, of_rank[-1], codes.get(rank), rank) if of_rank else ""
        if later:
            return rank, codes.get(rank), None, later
        if of_rank:
            return rank, codes.get(rank), of_rank[-1], ""
        return rank, codes.get(rank), None, _last_line("\n".join(line for r, line in tagged_lines(log_text)
                                                                  if r == rank))
    if combined:
        return None, None, combined[-1], ""
    return None, None, None, _last_line(log_text)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"killed by signal {-code} (exit code {code})"
    return f"exit code {code}"


def clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dump_frames(path: Path) -> tuple[str, list[str]] | None:
    """(kind, frames innermost first) of the main thread (where the rank's training loop waits) in one stack dump
    file, or None.

    ``stackdump_rank{r}.txt`` (faulthandler, written at the signal even when the thread is stuck in C code): the
    last "Current thread" block (the thread the signal landed on), unless that is a thread that threading started
    (outermost frame: threading's _bootstrap) or no thread was current (the signal landed on a thread without
    Python frames): then the last block that is not such a thread (the main thread of the last dump).
    ``stackdump_rank{r}_{time}.txt`` (Python level, written once the interpreter runs the handler): the MainThread
    section without the handler's own frames."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    blocks = [(lines[i].startswith("Current thread "), lines[i + 1:_block_end(lines, i)])
              for i, s in enumerate(lines) if s.startswith(("Current thread ", "Thread "))]
    if blocks:
        currents = [frames for current, frames in blocks if current]
        if currents and not _started_by_threading(currents[-1]):
            return "C level, at the signal", currents[-1]
        others = [frames for _, frames in blocks if frames and not _started_by_threading(frames)]
        if others or currents:
            return "C level, at the signal", (others or currents)[-1]
    start = next((i for i, s in enumerate(lines) if s.startswith("## thread MainThread")), None)
    if start is None:
        return None
    section = []
    for s in lines[start + 1:]:
        if s.startswith("## thread "):
            break
        if s.strip().startswith("File ") and (" in _on_usr1" in s or " in dump_stacks" in s):
            break  # the signal handler's frames
        section.append(s)
    while section and not section[-1].strip():
        section.pop()
    return "Python level", list(reversed(_pair_frames(section)))


def _started_by_threading(frames: list[str]) -> bool:
    """Whether a faulthandler thread block is a thread that threading started (outermost frame: its _bootstrap)."""
    return bool(frames) and "threading.py" in frames[-1] and frames[-1].rstrip().endswith(" in _bootstrap")


def _block_end(lines: list[str], head: int) -> int:
    """The index after the last frame line of the faulthandler thread block whose header is lines[head]."""
    end = head + 1
    while end < len(lines) and lines[end].strip() and not lines[end].startswith(("Thread ", "Current thread ")):
        end += 1
    return end


def _pair_frames(lines: list[str]) -> list[str]:
    """traceback.format_stack lines ("File ..." + optional source line) joined, so reversing keeps pairs."""
    frames: list[str] = []
    for s in lines:
        if s.strip().startswith("File ") or not frames:
            frames.append(s)
        else:
            frames[-1] += "\n" + s
    return frames


def _dump_excerpt(dumps: list[Path], ranks: list[int]) -> str | None:
    """Where each stalled rank was when asked for its stack (innermost frames first), <= 40 lines in all."""
    ranks = sorted(ranks) or sorted({int(m.group(1)) for p in dumps
                                     if (m := re.match(r"^stackdump_rank(\d+)", p.name))})
    if not ranks:
        return None
    budget = max(4, EXCERPT_MAX_LINES // len(ranks))
    out: list[str] = []
    for rank in ranks:
        mine = [p for p in dumps if re.match(rf"^stackdump_rank{rank}(\.|_)", p.name)]
        mine.sort(key=lambda p: (p.name != f"stackdump_rank{rank}.txt", p.name))  # C level first
        for path in mine:
            got = _dump_frames(path)
            if got and got[1]:
                kind, frames = got
                lines = [f"rank {rank} ({path.name}, {kind}, innermost first):"]
                for frame in frames:
                    lines.extend(frame.splitlines())
                out.extend(lines[:budget])
                break
    return "\n".join(out[:EXCERPT_MAX_LINES]) if out else None


def explain(run, log_path: Path, rank_logs: dict[int, Path], out_dir: Path | None, since: float,
             dumps: list[Path], spec: LaunchSpec) -> tuple[str, str | None]:
    """(reason, excerpt) for the result."""
    status_json = read_status_json(out_dir, since)
    trainer = ""
    if status_json is not None and status_json.get("status"):
        trainer = f"; trainer status.json: {status_json.get('status')}"
        if status_json.get("reason"):
            trainer += f" ({clip(str(status_json['reason']), 160)})"
    ended = f"; processes ended with {run.how_ended}" if run.how_ended else ""
    step = f" at step {run.last_step}" if run.last_step is not None else ""

    if run.status == "error":
        return run.error, None
    if run.status == "ok":
        return f"exit code 0{trainer}", None
    if run.status == "timeout" and getattr(run, "scheduler_reason", None):  # Slurm's own time limit
        return f"{run.scheduler_reason}{trainer}", failure_excerpt(log_path, rank_logs, out_dir, since)
    if run.status == "timeout":
        return (f"timed out after {spec.timeout_s:g}s{step} (last heartbeat of rank 0){ended}{trainer}"
                if run.last_step is not None else f"timed out after {spec.timeout_s:g}s{ended}{trainer}"), \
            failure_excerpt(log_path, rank_logs, out_dir, since)
    if run.status == "hang":
        verdict = run.verdict
        dumped = f"{len(dumps)} stack dump file(s)" if dumps else "no stack dump written"
        remote = getattr(run, "remote_dump_ranks", None)
        via = f" (rank(s) {remote} through the watchdog on the job's nodes)" if remote else ""
        return (f"stalled: {verdict.reason}; SIGUSR1 sent to {len(run.signalled)} process(es) here{via}, {dumped}"
                f"{ended}{trainer}"), _dump_excerpt(dumps, verdict.stalled_ranks)
    # failed / interrupted: exited by itself with a non-zero code
    rank, rank_code, tb, last = _failure(log_path, rank_logs, out_dir, since)
    head = getattr(run, "scheduler_reason", None) or _exit_text(run.returncode)
    if (spec.launcher == "torchrun" and spec.nnodes > 1 and run.returncode is not None
            and 128 < run.returncode < 128 + signal.NSIG and not getattr(run, "scheduler_reason", None)):
        # validation.launch.agents exits with 128 + N when the first agent that failed was killed by signal N
        try:
            name = signal.Signals(run.returncode - 128).name
        except ValueError:
            name = f"signal {run.returncode - 128}"
        head += f" (a node's torchrun agent was killed by {name})"
    if rank is not None:
        head += f" (rank {rank}" + (f": {_exit_text(rank_code)}" if rank_code is not None else "") + ")"
    if tb is not None:
        return f"{head}: {clip(tb.exception)}{trainer}", tb.excerpt()
    if last:
        return f"{head}: {clip(last)}{trainer}", None
    return f"{head} (no error message in the logs){trainer}", None


def failure_excerpt(log_path: Path, rank_logs: dict[int, Path], out_dir: Path | None, since: float) -> str | None:
    """The trainer's error_rank*.txt traceback of a timed-out run, if any (a rank that failed while the others
    waited); tracebacks in the logs are not used: ending the run makes torchrun print its own."""
    _, _, tb, _ = _failure(log_path, rank_logs, out_dir, since, logs=False)
    return tb.excerpt() if tb is not None else None


