"""Is a process still alive, and did a launch leave any behind? Shared by tests/nsa and tests/validation (the root
tests/conftest.py puts this directory on sys.path).

The checks that decide "no process left behind" also feed the reliability figures (tests/conftest.py): every
PID or process group they inspect is counted as checked, and every one still alive after the grace period as an
orphan, so the printed figure is what was measured.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable

from reliability_figures import RECORDER


def proc_state(pid: int) -> str | None:
    """The one-letter state of `pid` from /proc (R, S, D, Z, ...), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie has exited; it only waits to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = proc_state(pid)
    return state is not None and state != "Z"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`, from /proc."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(name))
    return members


def wait_dead(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Wait up to `timeout` s for every pid to end; the ones still alive then (nothing is recorded)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def naming(text: str) -> list[int]:
    """Live (non-zombie) processes, other than this one, whose command line contains `text`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and text in cmdline(int(name)) and pid_alive(int(name)):
            found.append(int(name))
    return found


def orphans(pids: Iterable[int] = (), pgids: Iterable[int] = (), timeout: float = 10.0,
            cmdline_contains: str | None = None) -> list[int]:
    """Processes left behind by a launch: each of `pids` and each live member of the process groups `pgids` still
    alive after up to `timeout` s. With `cmdline_contains` (the run directory: every launcher, torchrun agent and
    trainer names it in its arguments), a live PID whose command line lacks it is another process that reused
    the number, not an orphan, and the whole process table is searched for any other process naming it (a
    torchrun agent, a helper) as well. Recorded in the reliability figures (checked and found)."""
    pids, pgids = sorted(set(pids)), sorted(set(pgids))

    def ours(pid: int) -> bool:
        return cmdline_contains is None or cmdline_contains in cmdline(pid)

    deadline = time.monotonic() + timeout
    while True:
        alive = ([p for p in pids if pid_alive(p) and ours(p)]
                 + [m for g in pgids for m in group_members(g)]
                 + (naming(cmdline_contains) if cmdline_contains else []))
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    alive = sorted(set(alive))
    RECORDER.record_orphans(found=len(alive), checked=len(pids) + len(pgids), scans=1 if cmdline_contains else 0)
    return alive


def assert_no_orphans(pids: Iterable[int] = (), pgids: Iterable[int] = (), timeout: float = 10.0,
                      cmdline_contains: str | None = None) -> None:
    left = orphans(pids, pgids, timeout, cmdline_contains)
    assert not left, f"processes left behind: {left}"


def heartbeat_pids(root: Path) -> list[int]:
    """Every trainer PID named in heartbeat_rank*.jsonl files under `root` (any depth)."""
    pids = set()
    for path in Path(root).glob("**/heartbeat_rank*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    pids.add(int(json.loads(line)["pid"]))
                except (ValueError, KeyError, TypeError):
                    continue
    return sorted(pids)
