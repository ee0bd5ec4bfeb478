"""Why a launch ended as it did: the reason sentence and the evidence excerpt of a LaunchResult.

The failing rank is the one whose ``error_rank{r}.txt`` the trainer wrote first, else the root cause in torchrun's
failure summary, else the first rank whose traceback shows in the combined log; its traceback comes from that
error file, else its own log, else the combined log. A hang's excerpt is where each stalled rank was (its stack
dumps, innermost frames first). Logs are read here only as evidence for a person (tracebacks, torchrun's own
failure summary and port-clash message): what the orchestrator learns about the trainer's state comes from its
files (validation.contracts).
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
_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\):\s*\n(?:.*\n){0,3}?\s*rank\s*:\s*(\d+)"
                            r"[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
_FAILURE_RE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)
_CLASH_RE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)


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
    """Whether torchrun's log says its master port was taken."""
    return bool(_CLASH_RE.search(read_tail(log_path, 256 << 10)))


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
        while j < min(n, i + 5000):
            r2, t2 = lines[j]
            j += 1
            if r2 != rank:
                continue
            t2 = t2.rstrip()
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
        if exception:
            found.append(_Traceback(rank, body, exception, i))
        i += 1
    return found


def _last_line(text: str) -> str:
    """The last meaningful line: not blank, not a launcher note, not torchrun's own error summary."""
    for rank, line in reversed(tagged_lines(text)):
        s = line.strip()
        if not s or s.startswith(NOTE_PREFIX) or set(s) <= set("=-") or _GLOG_RE.match(s):
            continue
        return s
    return ""


def torchrun_failures(log_text: str) -> tuple[int | None, dict[int, int]]:
    """(root-cause rank, {rank: exit code}) from torchrun's failure summary (the last one in the log)."""
    cut = log_text.rfind("Root Cause (first observed failure):")
    start = log_text.rfind("Failures:", 0, cut if cut >= 0 else len(log_text))
    summary = log_text[start if start >= 0 else max(cut, 0):]
    codes = {int(m.group(1)): int(m.group(2)) for m in _FAILURE_RE.finditer(summary)}
    roots = list(_ROOT_CAUSE_RE.finditer(log_text))
    return (int(roots[-1].group(1)) if roots else None), codes


def _failure(log_path: Path, rank_logs: dict[int, Path], out_dir: Path | None, since: float,
             logs: bool = True) -> tuple[int | None, int | None, _Traceback | None, str]:
    """(failing rank, its exit code, its traceback, the last meaningful log line) for a failed run.

    The failing rank is the one whose out_dir/error_rank{r}.txt was written first (the trainer writes it as it
    fails, so the order is causal: a crash on one rank makes the others fail in their next collective), else the
    root cause torchrun names (the first exit it noticed), else the first rank whose traceback shows in the
    combined log. `logs` False: only the error files are looked at."""
    log_text = read_tail(log_path)
    root, codes = torchrun_failures(log_text)
    errors = error_files(out_dir, since)
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
        if tbs:
            tb = tbs[-1]
            tb.rank = rank
            return rank, codes.get(rank), tb, ""
        last = _last_line(text)
        if last:
            return rank, codes.get(rank), None, last
    # 3. the combined log: that rank's last traceback, else the last one there (a plain child, torchrun itself)
    if combined:
        of_rank = [tb for tb in combined if tb.rank == rank] if rank is not None else []
        return rank, codes.get(rank) if rank is not None else None, (of_rank or combined)[-1], ""
    return rank, codes.get(rank) if rank is not None else None, None, _last_line(log_text)


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
    """(kind, frames innermost first) of the signalled thread in one stack dump file, or None.

    ``stackdump_rank{r}.txt`` (faulthandler, written at the signal even when the thread is stuck in C code): the
    last "Current thread" block. ``stackdump_rank{r}_{time}.txt`` (Python level, written once the interpreter
    runs the handler): the MainThread section without the handler's own frames."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, s in enumerate(lines) if s.startswith("Current thread ")]
    if starts:
        block = []
        for s in lines[starts[-1] + 1:]:
            if not s.strip() or s.startswith(("Thread ", "Current thread ")):
                break
            block.append(s)
        return "C level, at the signal", block
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


