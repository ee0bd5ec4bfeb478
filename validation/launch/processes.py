"""The processes of one launch: finding them all through /proc, ending them, and making them die with us.

``ProcessTree`` tracks every process of a run: the child, its descendants (by parent pid), every member of a process
group or session one of them leads (torchrun starts each worker in a session of its own), and every process whose
environment carries the launch's id (``LAUNCH_ID_VAR``), found even after it was orphaned. ``end_processes`` ends
them: SIGTERM, a grace period, then SIGKILL. ``die_with_parent`` (PR_SET_PDEATHSIG) makes a launched child go when
nsa-validate itself is killed; ``signals_deferred`` holds a Ctrl-C / SIGTERM / SIGHUP back while a child is being
started and recorded (validation.launch.interrupts).

``end_launches`` ends the processes of launches known only by their ids (and the sessions their children led),
wherever they were re-parented: what validation.launch.sentinel does once nsa-validate itself is gone, and what a
``--resume`` does with the launch ids an earlier attempt recorded in its command.json files.

``become_subreaper`` (PR_SET_CHILD_SUBREAPER, ``nsa-validate run`` sets it) makes every process a launch leaves
orphaned (the ranks of a torchrun agent that was killed, a daemon) a child of nsa-validate instead of PID 1: it stays
in nsa-validate's own subtree, where ``end_descendants`` (the final sweep after a run or an interrupt) finds and
ends it whatever its environment says, and where its exit status is reaped.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Callable

from validation.launch import interrupts
from validation.launch.spec import KILL_WAIT_S, LAUNCH_ID_VAR

log = logging.getLogger("validation.launch")

signals_deferred = interrupts.deferred
sigint_deferred = signals_deferred  # the name it had when only Ctrl-C was handled


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int):
    """(state, ppid, pgrp, sid, start ticks) of `pid` from /proc/PID/stat, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _image(pid: int) -> bytes:
    """What `pid` runs: its command line (b"" when unreadable). It changes when the process calls exec: a process
    signalled between fork and exec (a worker its agent was just starting) may have lost the signal, since the child
    of fork runs with its parent's dispositions (SIGTERM ignored, or a Python handler that cannot run before exec),
    and after exec it is a program that was never asked to stop."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _proc_table() -> dict[int, tuple] | None:
    """{pid: _stat(pid)} of every process, or None when /proc cannot be read (not Linux)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table = {}
    for name in names:
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                table[int(name)] = info
    return table


def launch_ids_of(pid: int) -> list[bytes]:
    """The launch ids `pid`'s environment carries in LAUNCH_ID_VAR (a nested launch adds its own after a comma);
    [] when it carries none or its environment cannot be read (gone, or another user's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return []
    prefix = LAUNCH_ID_VAR.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].split(b",")
    return []


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            return float(next(int(line.split()[1]) for line in f if line.startswith(b"btime ")))
    except (OSError, ValueError, StopIteration):
        return None


class ProcessTree:
    """Every process of one run: the child, its descendants (by parent pid), every member of a process group or
    session one of them leads, and processes whose environment carries this launch's id in ``LAUNCH_ID_VAR``
    (found even when they were orphaned before a poll saw them: a double-forked daemon, the workers of a torchrun
    that was killed). A process is known by pid AND start time, so a reused pid is never taken for a member."""

    def __init__(self, root: subprocess.Popen, launch_id: str, started: float):
        self.root = root
        self.launch_id = launch_id.encode()
        self.members: dict[int, int] = {}  # pid -> start ticks
        self.seen: dict[int, int] = {}  # every member ever seen (pid -> start ticks): orphans of ours to reap
        self.groups: set[int] = {root.pid}  # process group and session ids of members
        self._own = {os.getpid(), os.getpgrp(), os.getsid(0)}
        boot = _boot_time()
        # processes started before the launch (minus clock slack) cannot belong to it: their environ is not read
        self._min_start = None if boot is None else int((started - boot - 2.0) * _CLK_TCK)
        self.refresh()

    def _carries_id(self, pid: int) -> bool:
        return self.launch_id in launch_ids_of(pid)

    def refresh(self) -> dict[int, int]:
        """The run's live processes now ({pid: start ticks}); remembers them. Empty without /proc."""
        table = _proc_table()
        if table is None:
            return {}
        live = {}
        root = self.root.pid
        if self.root.poll() is None and root in table and table[root][0] != "Z":
            live[root] = table[root][4]
        for pid, start in self.members.items():
            info = table.get(pid)
            if info is not None and info[4] == start and info[0] != "Z":
                live[pid] = start
        if self._min_start is not None:
            for pid, (state, _, _, _, start) in table.items():
                if (pid not in live and state != "Z" and start >= self._min_start and pid not in self._own
                        and self._carries_id(pid)):
                    live[pid] = start
        groups = set(self.groups)
        changed = True
        while changed:  # fixpoint: children of members, members of their groups/sessions
            changed = False
            for pid, (state, ppid, pgrp, sid, start) in table.items():
                if pid in live or state == "Z" or pid in self._own:
                    continue
                if ppid in live or pgrp in groups or sid in groups:
                    live[pid] = start
                    groups.update((pgrp, sid))
                    changed = True
        self.members = live
        self.seen.update(live)
        # a group/session id is kept only while a live member carries it: a pid is not reused while it names one
        self.groups = {g for pid in live for g in table[pid][2:4]} - self._own
        self._reap(table)
        return live

    def _reap(self, table: dict[int, tuple]) -> None:
        """Collect the exit status of members that ended as children of this process (orphans re-parented to a
        subreaper nsa-validate), so they do not stay zombies. The root is left to its Popen."""
        me = os.getpid()
        for pid, (state, ppid, _, _, start) in table.items():
            if state == "Z" and ppid == me and pid != self.root.pid and self.seen.get(pid) == start:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                self.seen.pop(pid, None)

    def alive(self) -> bool:
        return self.root.poll() is None or bool(self.refresh())

    def signal(self, sig: int, only_new: set[tuple[int, int, bytes]] | None = None) -> set[tuple[int, int, bytes]]:
        """Send `sig` to the run's process groups and members; with `only_new` (the (pid, start, image) triples
        signalled before), only to members not among them: processes that appeared since, and processes that ran
        another program when they were signalled (they called exec since; see _image). Returns the (pid, start,
        image) triples of the members it was sent to."""
        table = _proc_table()
        if table is None:  # no /proc: the child's process group is all that can be reached
            targets_groups, targets = {self.root.pid}, {}
        else:
            targets_groups = {g for g in self.groups if any(table.get(p, (0, 0, -1, -1))[2] == g
                                                              for p in self.members)}
            targets = self.members
            if self.root.poll() is None:
                targets_groups.add(self.root.pid)
        images = {pid: _image(pid) for pid in targets}  # read before the signal: an exec after it is seen next time
        if only_new is not None:
            targets_groups = set()
            targets = {pid: start for pid, start in targets.items() if (pid, start, images[pid]) not in only_new}
        reached_groups = set()
        for group in sorted(targets_groups - self._own):
            try:
                os.killpg(group, sig)
                reached_groups.add(group)
            except (ProcessLookupError, PermissionError):
                pass
        sent = set()
        for pid, start in sorted(targets.items()):
            info = _stat(pid) if table is not None else None
            if pid in self._own or (table is not None and (info is None or info[4] != start)):
                continue
            if info is not None and info[2] in reached_groups:
                # its group's signal reached it: a second one would be a second request (a launched nsa-validate
                # takes that as "hurry" and skips its own grace period)
                sent.add((pid, start, images[pid]))
                continue
            try:
                os.kill(pid, sig)
                sent.add((pid, start, images[pid]))
            except (ProcessLookupError, PermissionError):
                pass
        return sent


def end_processes(tree: ProcessTree, grace_s: float) -> str:
    """End every process of the run: SIGTERM (and SIGCONT, so that a stopped one can act on it), up to `grace_s` to
    exit, then SIGKILL; reap the child. Returns how it ended: "" (nothing was alive), "SIGTERM" or "SIGKILL". A
    process that appears during the grace period (a worker its agent was just starting) gets its SIGTERM too, and so
    does one that called exec after its SIGTERM (which it may have lost between fork and exec). A KeyboardInterrupt
    during the grace period, or a second signal to nsa-validate (interrupts.hurry), skips to SIGKILL; the
    KeyboardInterrupt is raised again once everything is gone."""
    tree.refresh()
    if not tree.alive():
        return ""
    how, interrupt = "SIGTERM", None
    try:  # the first SIGTERM too: an interrupt while it is sent still ends everything (SIGKILL below)
        signalled = tree.signal(signal.SIGTERM)
        tree.signal(signal.SIGCONT)  # a stopped process (SIGSTOP, Ctrl-Z) runs its SIGTERM handler within the grace
        end = time.monotonic() + grace_s
        while time.monotonic() < end and not interrupts.hurry() and (tree.refresh() or tree.alive()):
            new = tree.signal(signal.SIGTERM, only_new=signalled)
            if new:
                tree.signal(signal.SIGCONT, only_new=signalled)
            signalled |= new
            time.sleep(0.1)
    except KeyboardInterrupt as exc:
        interrupt = exc
    if tree.alive():
        how = "SIGKILL"
        end = time.monotonic() + KILL_WAIT_S
        while True:
            tree.signal(signal.SIGKILL)
            time.sleep(0.05)
            if not tree.alive():
                break
            if time.monotonic() > end:
                log.error("processes %s of %s survived SIGKILL", sorted(tree.refresh()), tree.root.args)
                break
    try:
        tree.root.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        log.error("pid %d did not exit after SIGKILL", tree.root.pid)
    tree.refresh()  # reaps members that ended as our children
    if interrupt is not None:
        raise interrupt
    return how


def parent_death_signal(argv: list[str]) -> int:
    """SIGKILL for a torchrun agent (its own SIGTERM shutdown can hang with its workers already gone; the trainer's
    ranks get their own SIGTERM when the agent dies: nsa.training.safety.stop_with_launcher), SIGTERM for anything else."""
    return signal.SIGKILL if "torch.distributed.run" in argv else signal.SIGTERM


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """In the child, before exec: `sig` when nsa-validate dies, even by SIGKILL (Linux PR_SET_PDEATHSIG), so a
    killed orchestrator does not leave a training run behind.

    `parent`: nsa-validate's pid (os.getpid() where the child is started). PR_SET_PDEATHSIG only watches the parent
    the child has when it is set: one that died between the fork and here is missed, and the child (already
    re-parented) would run on. With `parent`, a child whose parent is no longer `parent` sends itself `sig` at once.
    A Python handler the child inherited for `sig` (nsa-validate's own, or the one that holds signals back while a
    child starts) is reset to the default action first: it would catch `sig` here, before exec, and the child would
    go on to exec and run (exec resets such handlers to the default anyway; an ignored signal stays ignored)."""
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):  # not the main thread of the child's interpreter
            pass
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)



PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux PR_SET_CHILD_SUBREAPER): a process orphaned below
    it (a torchrun rank whose agent was killed) is re-parented to it, not to PID 1, so it stays in this process's
    subtree (``descendants``) until it is ended and reaped. False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int | None = None, table: dict[int, tuple] | None = None) -> dict[int, int]:
    """Every live (not zombie) process below `pid` (default: this one) by parent pid: {pid: start ticks}."""
    root = os.getpid() if pid is None else pid
    table = _proc_table() if table is None else table
    if not table:
        return {}
    children: dict[int, list[int]] = {}
    for p, info in table.items():
        children.setdefault(info[1], []).append(p)
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child != root:
                found[child] = table[child][4]
                todo.append(child)
    return {p: start for p, start in found.items() if table[p][0] != "Z"}


def reap_children(exclude: set[int] = frozenset()) -> int:
    """Collect every zombie child of this process except `exclude` (pids a Popen still owns); returns how many."""
    table = _proc_table() or {}
    me, n = os.getpid(), 0
    for pid, (state, ppid, _, _, _) in table.items():
        if state == "Z" and ppid == me and pid not in exclude:
            try:
                os.waitpid(pid, os.WNOHANG)
                n += 1
            except ChildProcessError:
                pass
    return n


def end_descendants(grace_s: float = 2.0) -> list[int]:
    """The final sweep of a run: end every process still below this one (with ``become_subreaper``, that is every
    process any launch started, orphans included, whatever their environment): SIGTERM, up to `grace_s`, SIGKILL,
    repeated until none is left (one that forks while being ended is caught in the next round); zombies reaped.
    Returns the pids that were found. Call it when no launch of this process is running any more."""

    def below() -> dict[int, int] | None:
        table = _proc_table()
        return None if table is None else descendants(None, table)

    return _end_until_gone(below, grace_s, hurry=interrupts.hurry)


def _end_until_gone(find: Callable[[], dict[int, int] | None], grace_s: float, *,
                    hurry: Callable[[], bool] = lambda: False, same_start: bool = False) -> list[int]:
    """End the processes `find` returns ({pid: start ticks}; None: the process table cannot be read, nothing is
    done), found afresh each round: SIGTERM (once to each process, again only to one that called exec since: see
    _image), up to `grace_s` (or until `hurry()`), then SIGKILL, until none is left or they outlive SIGKILL by
    KILL_WAIT_S; zombie children reaped. same_start: a pid found again with another start is another process (its
    pid reused) and is left alone. Returns the pids found, sorted."""
    found: dict[int, int] = {}
    termed: set[tuple[int, int, bytes]] = set()  # (pid, start, image) sent SIGTERM: each is asked once (see _image)
    sig, deadline, kill_deadline = signal.SIGTERM, time.monotonic() + grace_s, None
    while True:
        live = find()
        if live is None:
            return []
        if same_start:
            live = {p: t for p, t in live.items() if found.get(p, t) == t}
        if not live:
            break
        found.update(live)
        for pid, start in live.items():
            key = (pid, start, _image(pid)) if sig == signal.SIGTERM else None
            if key in termed:  # asked already: a SIGTERM every round would cut short the cleanup it asked for
                continue
            try:
                os.kill(pid, sig)
                if key is not None:
                    termed.add(key)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
        reap_children()
        if sig == signal.SIGTERM and (time.monotonic() > deadline or hurry()):
            sig, kill_deadline = signal.SIGKILL, time.monotonic() + KILL_WAIT_S
        if kill_deadline is not None and time.monotonic() > kill_deadline:
            log.error("processes %s survived SIGKILL", sorted(live))
            break
    reap_children()
    return sorted(found)


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat), None when it is gone or /proc is unreadable: with
    the pid it names one process, whatever pid is reused later."""
    info = _stat(pid)
    return None if info is None else info[4]


def launch_processes(ids, sessions=(), table: dict[int, tuple] | None = None) -> dict[int, int]:
    """The live processes of the launches `ids` ({pid: start ticks}): every process whose environment carries one
    of the ids (LAUNCH_ID_VAR), and every member of a session in `sessions` ((session id, start ticks of its
    leader); a session whose leader's pid now names another process is not one of them). This process and its own
    process group and session are never among them."""
    table = _proc_table() if table is None else table
    if not table:
        return {}
    wanted = {i.encode() if isinstance(i, str) else bytes(i) for i in ids if i}
    me = os.getpid()
    valid_sessions = set()
    for sid, start in sessions:
        leader = table.get(sid)
        if leader is None or start is None or leader[4] == start:
            valid_sessions.add(sid)
    valid_sessions -= {me, os.getpgrp(), os.getsid(0)}
    found = {}
    for pid, (state, _, _, sid, start) in table.items():
        if state == "Z" or pid == me:
            continue
        if sid in valid_sessions or (wanted and wanted.intersection(launch_ids_of(pid))):
            found[pid] = start
    return found


def end_launches(ids, sessions=(), grace_s: float = 2.0) -> list[int]:
    """End every process of the launches `ids` (launch_processes): SIGTERM, up to `grace_s`, SIGKILL, repeated until
    none is left (one that forks meanwhile is caught in the next round). Returns the pids found."""
    return _end_until_gone(lambda: launch_processes(ids, sessions), grace_s, same_start=True)
