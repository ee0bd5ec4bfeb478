"""One attempt of a launch on this machine (``Run``: start the command in its own session, poll it, end it), and
the step-directory helpers every attempt shares (``note``, ``set_aside``).

validation.launch.attempt.launch decides what runs and retries a port clash; validation.launch.slurm.SlurmRun, the
attempt as a Slurm job, builds on ``Run``. Both import this module; it imports neither. How a run ends (the
statuses, stack dumps on a stall, ending the processes) is described in validation.launch.attempt.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from nsa.training.watchdog import STALLED, WAITING, Watch, check, signal_stack_dumps
from validation.contracts import TELEMETRY_CSV, stack_dumps
from validation.launch.diagnosis import NOTE_PREFIX
from validation.launch import sentinel
from validation.launch.interrupts import describe as describe_interrupt
from validation.launch.processes import (ProcessTree, die_with_parent, end_processes, parent_death_signal,
                                         signals_deferred, start_ticks)
from validation.launch.spec import DUMP_WAIT_S, LAUNCH_ID_VAR, LaunchSpec, Progress
from validation.launch.telemetry import Sampler

log = logging.getLogger("validation.launch")


class Run:
    """One attempt: start, poll, end. Sets status, returncode, pid, how_ended, verdict, stack_dumps, error."""

    def __init__(self, spec: LaunchSpec, argv: list[str], log_path: Path, started: float, deadline: float):
        self.spec, self.argv, self.log_path = spec, argv, log_path
        self.started, self.deadline = started, deadline
        self.status = "error"
        self.returncode: int | None = None
        self.pid: int | None = None
        self.how_ended = ""  # "SIGTERM" / "SIGKILL" when the launcher ended the processes
        self.verdict = None  # the stall verdict (hang)
        self.signalled: list[int] = []
        self.stack_dumps: list[Path] = []
        self.error = ""  # why it could not start
        self.last_step: int | None = None
        self.toks_per_s: float | None = None
        self.out_dir = Path(spec.trainer_out_dir) if spec.trainer_out_dir is not None else None
        # the heartbeats this launch writes, told from those already in out_dir (the run a --resume continues, a
        # stale job's) by their place in the files and timed on this clock, not the ranks' (another node's may be
        # off): begin_watch() marks the files just before the launch starts
        self.watch: Watch | None = None
        self.expected_ranks = (spec.expected_ranks if spec.expected_ranks is not None
                               else spec.nproc_per_node * spec.nnodes)
        # in every launched process's environment (LAUNCH_ID_VAR) and in command.json: what finds them all, also
        # after nsa-validate was killed (validation.launch.sentinel, and a --resume)
        self.launch_id = uuid.uuid4().hex

    def begin_watch(self) -> None:
        """Mark the heartbeat files as they are now (before the launch starts): only what is appended from now on is
        this launch's (nsa.training.watchdog.Watch)."""
        self.watch = Watch(self.out_dir, self.started) if self.out_dir is not None else None

    def execute(self) -> None:
        self.begin_watch()
        launch_id = self.launch_id
        env = self.spec.child_env()
        env[LAUNCH_ID_VAR] = ",".join(filter(None, (env.get(LAUNCH_ID_VAR, ""), launch_id)))  # nested launches
        proc = tree = sampler = None
        done = False
        try:
            with signals_deferred():  # a signal between Popen and tracking would leave the child unknown
                proc = self._start(env)
                if proc is None:
                    return
                self.pid = proc.pid
                tree = ProcessTree(proc, launch_id, self.started)
                sentinel.watch(launch_id, proc.pid, start_ticks(proc.pid), self.spec.term_grace_s)
            sampler = self._start_telemetry(proc.pid)
            self._wait(proc, tree)
            leftovers = tree.refresh()
            if leftovers:  # e.g. a daemon the child left behind: it belongs to the run, it ends with it
                note(self.log_path, f"ending {len(leftovers)} process(es) left behind: {sorted(leftovers)}")
                end_processes(tree, self.spec.term_grace_s)
            done = True
        except KeyboardInterrupt as exc:
            if tree is not None:
                note(self.log_path, f"interrupted ({describe_interrupt(exc)} to the launcher): ending the run's "
                                    "processes")
                how = end_processes(tree, self.spec.term_grace_s)
                note(self.log_path, f"interrupted after {time.time() - self.started:.1f}s; processes ended "
                                     f"({how or 'already gone'}); exit code {proc.returncode}")
            raise
        finally:
            if not done and tree is not None:  # KeyboardInterrupt (handled above) or a bug in a callback
                end_processes(tree, self.spec.term_grace_s)
            if sampler is not None:
                sampler.stop()
                if sampler.error:
                    note(self.log_path, f"telemetry sampler failed: {sampler.error}")
            if proc is not None:
                self.returncode = proc.returncode
            if tree is not None:  # its processes are ended (or survived SIGKILL, logged): the launch is over
                sentinel.forget(launch_id)

    def _start_telemetry(self, pid: int):
        """The device telemetry sampler of this launch (a thread, validation.launch.telemetry), or None."""
        if self.spec.telemetry_s is None:
            return None
        path = Path(self.spec.step_dir) / TELEMETRY_CSV
        set_aside(path, "prev")
        return Sampler(path, pid, self.spec.telemetry_s, cores=self.spec.cores(),
                       launch_id=self.launch_id).start()

    def _start(self, env: dict[str, str]) -> subprocess.Popen | None:
        """The child, started in a new session with its output on the log; None (and self.error) if it can't be."""
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            log.info("launching %s (cwd %s, log %s)", self.argv, self.spec.cwd, self.log_path)
            return subprocess.Popen(self.argv, cwd=self.spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=fd, start_new_session=True, close_fds=True,
                                    preexec_fn=(functools.partial(die_with_parent, parent_death_signal(self.argv),
                                                                  os.getpid())
                                                if sys.platform.startswith("linux") else None))
        except (OSError, ValueError) as exc:  # missing executable or cwd, permission denied; a NUL in an argument
            # or a variable, a variable named with '=', text that has no bytes (ValueError, UnicodeEncodeError)
            self.error = f"could not start {self.argv[0]!r} in {self.spec.cwd}: {exc}{_culprit(self.argv, env)}"
            os.write(fd, f"{NOTE_PREFIX}{time.strftime('%H:%M:%S')}] {self.error}\n".encode())
            return None
        finally:
            os.close(fd)

    def _wait(self, proc: subprocess.Popen, tree: ProcessTree) -> None:
        spec = self.spec
        while True:
            now = time.monotonic()
            if now >= self.deadline and proc.poll() is None:  # one that ended by itself meanwhile: its own status
                self.status = "timeout"
                self.how_ended = end_processes(tree, spec.term_grace_s)
                if not self.how_ended and proc.returncode is not None:
                    # nothing was left to end: the child exited by itself after the poll above (while the process
                    # table was read), nothing of ours ended it, and its exit is its own status
                    self.status = self._exit_status(proc.returncode)
                return
            try:
                proc.wait(timeout=min(spec.poll_s, max(self.deadline - now, 0.01)))
            except subprocess.TimeoutExpired:
                pass
            if proc.returncode is not None:
                self.status = self._exit_status(proc.returncode)
                return
            tree.refresh()
            verdict = self._look_at_heartbeats()
            if verdict is not None and verdict.state == STALLED and spec.stall_timeout_s is not None:
                self._on_stall(proc, tree, verdict)
                return
            if spec.on_progress is not None:
                state = verdict.state if verdict is not None else ("running" if self.out_dir is None else WAITING)
                spec.on_progress(Progress(time.time() - self.started, self.last_step, self.toks_per_s, state))

    @staticmethod
    def _exit_status(code: int) -> str:
        if code == 0:
            return "ok"
        if code in (-signal.SIGINT, 128 + signal.SIGINT):
            return "interrupted"
        return "failed"

    def _look_at_heartbeats(self):
        """The heartbeat verdict (None without trainer_out_dir); updates last_step and toks_per_s."""
        if self.out_dir is None:
            return None
        stall = self.spec.stall_timeout_s if self.spec.stall_timeout_s is not None else 1e12
        try:
            if self.watch is None:  # not begun by execute (a caller that polls on its own): every record counts
                self.watch = Watch()
            verdict = check(self.out_dir, stall, expected_ranks=self.expected_ranks, watch=self.watch)
        except FileNotFoundError:  # the trainer has not created its out_dir yet
            return None
        except OSError as exc:
            log.debug("heartbeats in %s unreadable: %s", self.out_dir, exc)
            return None
        rank0 = verdict.latest.get(0)
        if rank0 is not None:
            self.last_step = int(rank0["step"])
            tps = rank0.get("toks_per_s")
            if rank0.get("msg") == "step" and isinstance(tps, (int, float)) and math.isfinite(tps):
                self.toks_per_s = float(tps)
        return verdict

    def _on_stall(self, proc: subprocess.Popen, tree: ProcessTree, verdict) -> None:
        self.status, self.verdict = "hang", verdict
        self._dumps_then(verdict, lambda: setattr(self, "how_ended", end_processes(tree, self.spec.term_grace_s)),
                         alive=lambda: proc.poll() is None)

    def _dumps_then(self, verdict, end, alive=lambda: True, local: bool = True, waiting: list[int] = (),
                    since: float | None = None) -> None:
        """Ask the stalled ranks for stack dumps (with `local`, SIGUSR1 to those on this host), wait for them and
        for those of the ranks `waiting` (asked another way, since `since`), then `end()`."""
        stalled = {r: verdict.latest[r] for r in verdict.dump_ranks if r in verdict.latest}
        t_sig = time.time()
        self.signalled = []
        if local:
            asked = _asked(verdict)
            log.warning("stall: %s; asking %s for stack dumps", verdict.reason, asked)
            note(self.log_path, f"stall: {verdict.reason}; sending SIGUSR1 (stack dumps) to {asked}")
            self.signalled = signal_stack_dumps(stalled)
        ranks = sorted({r for r, rec in stalled.items() if rec.get("pid") in self.signalled} | set(waiting))
        self._wait_for_dumps(ranks, (t_sig if since is None else since) - 1.0, alive)
        self.verdict = self._stall_as_ended(verdict)
        end()
        self.stack_dumps = stack_dumps(self.out_dir, self.started)

    def _stall_as_ended(self, verdict):
        """The stall as it stands once the dumps are in, before the ranks are ended: the verdict that caught it is
        the first rank over the threshold, and the ranks of one hang stop within moments of each other (the rank
        that hung and those that then wait for it in a collective, in either order), so that verdict can name a
        rank waiting for the culprit and not the culprit. The ranks stalled now are all of them. `verdict` when the
        heartbeats cannot be read again or show no stall now (the decision to end the run is already made)."""
        again = self._look_at_heartbeats()
        return again if again is not None and again.state == STALLED else verdict

    def _wait_for_dumps(self, ranks: list[int], since: float, alive=lambda: True) -> None:
        """Up to DUMP_WAIT_S for a stack dump file of each of `ranks` written after `since`."""
        deadline = time.monotonic() + DUMP_WAIT_S
        while ranks and time.monotonic() < deadline and alive():
            fresh = stack_dumps(self.out_dir, since)
            if all(any(p.name.startswith((f"stackdump_rank{r}.", f"stackdump_rank{r}_")) for p in fresh)
                   for r in ranks):
                time.sleep(0.5)  # let the other dump of each rank (Python level / C level) finish too
                return
            time.sleep(0.2)


def _culprit(argv: list[str], env: dict[str, str]) -> str:
    """' (argument 2)' / ' (environment variable 'NAME')': the first item of a command that no process can be
    started with (a NUL, a name with '=', a character with no bytes), for the error; '' when none is."""
    def bad(text: str, name: bool = False) -> bool:
        try:
            os.fsencode(text)
        except UnicodeError:
            return True
        return "\0" in text or (name and "=" in text)

    for i, arg in enumerate(argv):
        if bad(arg):
            return f" (argument {i})"
    for key, value in env.items():
        if bad(key, name=True) or bad(value):
            return f" (environment variable {key!r})"
    return ""


def _asked(verdict) -> str:
    """'rank(s) [1] (stalled) and [0] (not yet stalled: may wait on them)' for the launch log."""
    others = [r for r in verdict.dump_ranks if r not in verdict.stalled_ranks]
    text = f"rank(s) {verdict.stalled_ranks} (stalled)"
    return text + (f" and {others} (not yet stalled: may wait on them)" if others else "")


def set_aside(path: Path, tag: str) -> None:
    """Rename `path` (when it exists) to the first free `stem.{tag}{n}suffix`, so nothing is overwritten."""
    if not path.exists():
        return
    n = 1
    while True:
        target = path.with_name(f"{path.stem}.{tag}{n}{path.suffix}")
        if not target.exists():
            path.rename(target)
            return
        n += 1


def note(log_path: Path, text: str) -> None:
    """Append one launcher line to the combined log (O_APPEND: safe while the child writes too). It starts a line of
    its own: after output that did not end in a newline (a child's last words without one) a newline comes first,
    so the child's last line stays its own and the note is still read as a note (diagnosis.NOTE_PREFIX)."""
    line = f"{NOTE_PREFIX}{time.strftime('%H:%M:%S')}] {text}\n".encode("utf-8", "replace")
    try:
        fd, readable = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644), True
    except PermissionError:  # a log this process may write but not read: the note as it is
        fd, readable = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), False
    try:
        size = os.fstat(fd).st_size
        if readable and size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)
