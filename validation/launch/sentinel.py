"""The run's sentinel: ends what nsa-validate's launches left running when nsa-validate itself dies (SIGKILL, the OOM
killer), where nothing of nsa-validate is left to do it.

A launched child gets a parent-death signal (validation.launch.processes.die_with_parent), but its own children do
not: an ordinary child of a pytest step, one in a session of its own, a daemon a test started with ``setsid``. With
nsa-validate gone they are re-parented to PID 1 (nsa-validate was their subreaper), and nothing would end them.
``python -m validation.launch.sentinel PID`` (PID: nsa-validate's, named in its message) is a small process in a
session of its own (so that a Ctrl-C or a hang-up of the terminal does not reach it) that runs beside the run
(``validation.launch.session.guarded``) with a pipe as its standard input, once the run's first launch starts
(``enable`` then ``watch``: a dry run or an invalid request starts none). Each local launch tells it its id
(LAUNCH_ID_VAR, which every process the launch starts inherits) and the session its child leads when it starts
(``watch``), and that it is over when it ends (``forget``). When nsa-validate exits normally it says so ("q") and the
sentinel exits. When the pipe closes without that line, nsa-validate is gone: the sentinel ends every process of the
launches still open (SIGTERM, their grace period, then SIGKILL: validation.launch.processes.end_launches), says so
on its standard error, and exits.

What it cannot find: a process that both left the launch's session and dropped LAUNCH_ID_VAR from its environment
(``env -i``, a program that clears its environment), or one started outside the launch's tree (``ssh``,
``systemd-run``, a container runtime). ``--resume`` ends what it finds of an earlier attempt's launches the same way,
from the launch ids their command.json recorded (validation.launch.attempt.recorded_launch_ids).

Protocol (one line each, ASCII): ``+ID SID START GRACE`` a launch started (SID: the session its child leads, START:
the child's start ticks, GRACE: seconds between SIGTERM and SIGKILL), ``-ID`` it ended, ``q`` nsa-validate is
exiting normally.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from validation.launch.processes import end_launches

log = logging.getLogger("validation.launch")

_ROOT = Path(__file__).resolve().parents[2]  # where `validation` is importable from, for the sentinel's interpreter


class Sentinel:
    """nsa-validate's end of the sentinel: its process and the pipe it reads."""

    def __init__(self, proc: subprocess.Popen, fd: int):
        self.proc, self.fd = proc, fd

    def tell(self, line: str) -> None:
        """One line to the sentinel (a write of less than PIPE_BUF bytes: whole, also from several threads)."""
        if self.fd < 0:
            return
        try:
            os.write(self.fd, (line + "\n").encode("ascii"))
        except OSError as exc:  # the sentinel is gone: the run goes on without it
            log.warning("the run's sentinel is gone (%s): launches are no longer watched", exc)

    def stop(self, timeout_s: float = 10.0) -> None:
        """nsa-validate is exiting normally: the sentinel exits without ending anything; waited for."""
        self.tell("q")
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_current: list[Sentinel] = []  # the sentinel of this process's run, while there is one
_state = SimpleNamespace(enabled=False)
_lock = threading.Lock()  # launches side by side start in threads: one sentinel


def enable() -> None:
    """This process runs launches that must not outlive it (`nsa-validate run`): the first watch() starts the
    sentinel."""
    _state.enabled = True


def start() -> Sentinel | None:
    """Start the sentinel of this process's run (Linux; None elsewhere, or when it cannot be started)."""
    with _lock:
        if _current or not sys.platform.startswith("linux"):
            return _current[0] if _current else None
        return _start()


def _start() -> Sentinel | None:
    read_fd, write_fd = os.pipe()  # not inheritable: no launched process holds the write end open
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(_ROOT), os.environ.get("PYTHONPATH"))))}
    try:
        # its argument: nsa-validate's pid, for the message once it is gone (the sentinel's own parent may be gone
        # before the sentinel's interpreter has started)
        proc = subprocess.Popen([sys.executable, "-m", "validation.launch.sentinel", str(os.getpid())], stdin=read_fd,
                                stdout=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        os.close(write_fd)
        log.warning("could not start the run's sentinel (%s): processes a launch leaves behind outlive a killed "
                    "nsa-validate", exc)
        return None
    finally:
        os.close(read_fd)
    _current.append(Sentinel(proc, write_fd))
    return _current[0]


def stop() -> None:
    """Stop the sentinel (nsa-validate exits normally) and start no other; nothing when there is none."""
    _state.enabled = False
    while _current:
        _current.pop().stop()


def watch(launch_id: str, pid: int, start_ticks: int | None, grace_s: float) -> None:
    """Tell the sentinel a launch started: its id and the session its child `pid` leads (the first such call after
    enable() starts the sentinel; without enable(), nothing)."""
    if _state.enabled and not _current:
        start()
    for sentinel in list(_current):
        sentinel.tell(f"+{launch_id} {pid} {-1 if start_ticks is None else start_ticks} {grace_s:g}")


def forget(launch_id: str) -> None:
    """Tell the sentinel the launch ended (its processes are gone)."""
    for sentinel in list(_current):
        sentinel.tell(f"-{launch_id}")


def parse(lines) -> tuple[dict[str, tuple[int, int | None, float]], bool]:
    """({launch id: (session id, its leader's start ticks, grace)} still open, whether "q" came) from the lines."""
    open_launches: dict[str, tuple[int, int | None, float]] = {}
    for raw in lines:
        line = raw.decode("ascii", "replace").strip() if isinstance(raw, bytes) else raw.strip()
        if line == "q":
            return open_launches, True
        if line.startswith("+"):
            parts = line[1:].split()
            try:
                sid, start, grace = int(parts[1]), int(parts[2]), float(parts[3])
            except (IndexError, ValueError):
                continue
            open_launches[parts[0]] = (sid, None if start < 0 else start, grace)
        elif line.startswith("-"):
            open_launches.pop(line[1:], None)
    return open_launches, False


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):  # its own session already keeps the terminal's away
        signal.signal(sig, signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    # nsa-validate's pid as it gave it: by now this process's parent may already be PID 1 (or a subreaper)
    parent = int(args[0]) if args and args[0].isdigit() else os.getppid()
    launches, quit_ = parse(iter(sys.stdin.buffer.readline, b""))
    if quit_ or not launches:
        return 0
    grace = max(g for _, _, g in launches.values())
    ended = end_launches(list(launches), [(sid, start) for sid, start, _ in launches.values()], grace_s=grace)
    if ended:
        print(f"nsa-validate (pid {parent}) is gone: its sentinel ended {len(ended)} process(es) its launches "
              f"left running: {ended}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
