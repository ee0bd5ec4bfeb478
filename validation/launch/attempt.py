"""``launch(spec)``: run one launch to its end, retrying torchrun on a taken port, and account for it.

``launch`` starts ``spec.argv`` (under torchrun when ``spec.uses_torchrun``; several local agents for ``nnodes > 1``;
an sbatch job for ``launcher: slurm``, see validation.launch.slurm) in its own session, with stdout and stderr going
to ``step_dir/stdout.log`` (a file, never a pipe, so a chatty child can not block), and polls until it ends. It
returns a ``LaunchResult``; a child's failure is a result, never an exception. What ``step_dir`` holds afterwards::

    command.json            {"argv", "cwd", "env" (what differs from os.environ + NSA_/NCCL_/TORCH_/CUDA_/OMP_/
                            CONFIG* variables, secrets redacted), "env_unset", "timeout_s", "attempt", "master_port"};
                            written (temp file + rename) BEFORE the child starts
    stdout.log              the child's combined stdout+stderr (torchrun tees every rank into it with a
                            "[defaultN]:" prefix), followed by "[launcher] ..." notes on how it ended
    ranks/                  torchrun --log-dir: ranks/<run id>/attempt_0/<local rank>/{stdout,stderr}.log
    ranks/rank{r}.log       one file per rank (its stdout, then its stderr), written after the run
    stdout.attempt{n}.log,  an earlier attempt that failed on a port clash (kept; retried on a fresh port)
    ranks.attempt{n}/
    stdout.prev{n}.log, ... set aside when step_dir already held a launch's files (nothing is overwritten)

How a run ends (``LaunchResult.status``; the reason and excerpt: validation.launch.diagnosis):

- ``ok`` / ``failed``: the child exited by itself with 0 / anything else.
- ``timeout``: ``timeout_s`` passed. ``hang``: a rank of the trainer wrote no heartbeat for ``stall_timeout_s``
  (``nsa.training.watchdog.check``, counting only records written after the launch): its processes are asked for
  stack dumps (SIGUSR1), given ``DUMP_WAIT_S`` to write them, then ended; ``stack_dumps`` lists them.
- ``interrupted``: the child died of SIGINT (exit -2 or 130). A Ctrl-C, SIGTERM or SIGHUP to the caller
  (KeyboardInterrupt, or validation.launch.interrupts.Interrupted, while waiting) is not a result: the processes
  are ended and the exception is raised again.
- ``error``: the command could not be started (missing executable or cwd).

Ending a run (timeout, hang, Ctrl-C, leftovers after a normal exit) means SIGTERM to every process of the run
(validation.launch.processes), up to ``term_grace_s`` (default 10 s) to exit, then SIGKILL. When ``launch`` returns
or raises, none of them is alive.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from nsa.training.outputs import write_json
from nsa.training.watchdog import STALLED, WAITING, check, signal_stack_dumps
from validation.contracts import stack_dumps
from validation.launch.diagnosis import NOTE_PREFIX, explain, port_clash, read_tail, tagged_lines
from validation.launch.interrupts import describe as describe_interrupt
from validation.launch.processes import (ProcessTree, die_with_parent, end_processes, parent_death_signal,
                                         signals_deferred)
from validation.launch.spec import (CLASH_WINDOW_S, COMMAND_JSON, DUMP_WAIT_S, LAUNCH_ID_VAR, LOG_NAME, RANKS_DIR,
                                    LaunchResult, LaunchSpec, Progress, recorded_env, validate)
from validation.launch.torchrun import free_port, local_agents_argv, torchrun_argv, torchrun_prefix

log = logging.getLogger("validation.launch")


def launch(spec: LaunchSpec) -> LaunchResult:
    """Run `spec` to its end (see the module docstring). Raises only for an invalid spec (ValueError/TypeError)
    and KeyboardInterrupt (after ending every process of the run)."""
    validate(spec)
    step_dir = Path(spec.step_dir)
    step_dir.mkdir(parents=True, exist_ok=True)
    log_path = step_dir / LOG_NAME
    ranks_dir = step_dir / RANKS_DIR
    for old in (log_path, ranks_dir):
        set_aside(old, "prev")
    use_torchrun = spec.uses_torchrun
    started = time.time()
    t0 = time.monotonic()
    deadline = t0 + spec.timeout_s
    port = spec.master_port
    attempts = 0
    while True:
        attempts += 1
        if spec.launcher == "slurm":
            from validation.launch.slurm import SlurmRun  # the Slurm attempt builds on Run (below)

            run = SlurmRun(spec, step_dir, log_path, ranks_dir, started, deadline)
            argv = run.argv
            port = None
        else:
            if use_torchrun and port is None:
                port = free_port()
            if spec.nnodes > 1:
                argv = local_agents_argv(spec, port, step_dir, ranks_dir)
            else:
                argv = list(spec.wrapper) + (torchrun_argv(spec.argv, torchrun_prefix(spec.nproc_per_node, port,
                                                                                       ranks_dir))
                                             if use_torchrun else list(spec.argv))
            run = Run(spec, argv, log_path, started, deadline)
        _write_command_json(step_dir / COMMAND_JSON, spec, argv, attempts, port if use_torchrun else None)
        attempt_t0 = time.monotonic()
        run.execute()  # raises KeyboardInterrupt (after ending the processes or cancelling the job)
        clash = (use_torchrun and run.status == "failed" and attempts <= spec.port_retries
                 and time.monotonic() - attempt_t0 < CLASH_WINDOW_S and port_clash(log_path))
        if not clash:
            break
        log.warning("port %s is in use (attempt %d); retrying on a fresh port", port, attempts)
        note(log_path, f"port {port} is in use (address already in use); retrying on a fresh port")
        set_aside(log_path, "attempt")
        set_aside(ranks_dir, "attempt")
        port = None

    rank_logs = collect_rank_logs(ranks_dir, log_path) if use_torchrun else {}
    out_dir = Path(spec.trainer_out_dir) if spec.trainer_out_dir is not None else None
    dumps = run.stack_dumps if run.stack_dumps else stack_dumps(out_dir, started)
    reason, excerpt = explain(run, log_path, rank_logs, out_dir, started, dumps, spec)
    result = LaunchResult(status=run.status, returncode=run.returncode, duration_s=time.monotonic() - t0,
                          argv=argv, log_path=log_path, rank_logs=rank_logs, reason=reason, excerpt=excerpt,
                          stack_dumps=dumps, attempts=attempts, master_port=port if use_torchrun else None,
                          pid=run.pid, job_id=getattr(run, "job_id", None), nodes=list(getattr(run, "nodes", [])))
    if run.status != "error":
        note(log_path, f"{result.status}: {reason}")
    log.info("%s: %s (%.1fs)", result.status, reason, result.duration_s)  # the caller reports outcomes
    return result


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
        self.expected_ranks = (spec.expected_ranks if spec.expected_ranks is not None
                               else spec.nproc_per_node * spec.nnodes)

    def execute(self) -> None:
        launch_id = uuid.uuid4().hex
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
            sampler = self._start_telemetry(proc.pid)
            self._wait(proc, tree)
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
            if not done and sampler is not None:
                sampler.stop()
        leftovers = tree.refresh()
        if leftovers:  # e.g. a daemon the child left behind: it belongs to the run, it ends with it
            note(self.log_path, f"ending {len(leftovers)} process(es) left behind: {sorted(leftovers)}")
            end_processes(tree, self.spec.term_grace_s)
        if sampler is not None:
            sampler.stop()
            if sampler.error:
                note(self.log_path, f"telemetry sampler failed: {sampler.error}")
        self.returncode = proc.returncode

    def _start_telemetry(self, pid: int):
        """The device telemetry sampler of this launch (a thread, validation.launch.telemetry), or None."""
        if self.spec.telemetry_s is None:
            return None
        from validation.launch.telemetry import TELEMETRY_CSV, Sampler

        path = Path(self.spec.step_dir) / TELEMETRY_CSV
        set_aside(path, "prev")
        return Sampler(path, pid, self.spec.telemetry_s).start()

    def _start(self, env: dict[str, str]) -> subprocess.Popen | None:
        """The child, started in a new session with its output on the log; None (and self.error) if it can't be."""
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            log.info("launching %s (cwd %s, log %s)", self.argv, self.spec.cwd, self.log_path)
            return subprocess.Popen(self.argv, cwd=self.spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=fd, start_new_session=True, close_fds=True,
                                    preexec_fn=(functools.partial(die_with_parent, parent_death_signal(self.argv))
                                                if sys.platform.startswith("linux") else None))
        except OSError as exc:  # missing executable or cwd, permission denied
            self.error = f"could not start {self.argv[0]!r} in {self.spec.cwd}: {exc}"
            os.write(fd, f"{NOTE_PREFIX}{time.strftime('%H:%M:%S')}] {self.error}\n".encode())
            return None
        finally:
            os.close(fd)

    def _wait(self, proc: subprocess.Popen, tree: ProcessTree) -> None:
        spec = self.spec
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                self.status = "timeout"
                self.how_ended = end_processes(tree, spec.term_grace_s)
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
            verdict = check(self.out_dir, stall, expected_ranks=self.expected_ranks, since=self.started)
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
        stalled = {r: verdict.latest[r] for r in verdict.stalled_ranks if r in verdict.latest}
        t_sig = time.time()
        self.signalled = []
        if local:
            log.warning("stall: %s; asking rank(s) %s for stack dumps", verdict.reason, sorted(stalled))
            note(self.log_path, f"stall: {verdict.reason}; sending SIGUSR1 (stack dumps) to rank(s) "
                                 f"{sorted(stalled)}")
            self.signalled = signal_stack_dumps(stalled)
        ranks = sorted({r for r, rec in stalled.items() if rec.get("pid") in self.signalled} | set(waiting))
        self._wait_for_dumps(ranks, (t_sig if since is None else since) - 1.0, alive)
        end()
        self.stack_dumps = stack_dumps(self.out_dir, self.started)

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
    """Append one launcher line to the combined log (O_APPEND: safe while the child writes too)."""
    line = f"{NOTE_PREFIX}{time.strftime('%H:%M:%S')}] {text}\n"
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _write_command_json(path: Path, spec: LaunchSpec, argv: list[str], attempt: int, port: int | None) -> None:
    env, unset = recorded_env(spec.child_env())
    body = {"argv": argv, "cwd": str(spec.cwd), "env": env, "env_unset": unset, "timeout_s": spec.timeout_s,
            "attempt": attempt, "master_port": port}
    write_json(path, body)


def collect_rank_logs(ranks_dir: Path, log_path: Path) -> dict[int, Path]:
    """{rank: ranks/rank{r}.log}: each rank's torchrun files (ranks/*/attempt_*/<local rank>/{stdout,stderr}.log,
    the latest attempt) concatenated; when torchrun wrote none, the combined log's "[defaultN]:" lines per rank."""
    found: dict[int, tuple[int, Path]] = {}  # rank -> (attempt number, its directory)
    if ranks_dir.is_dir():
        for rank_dir in ranks_dir.glob("*/attempt_*/*"):
            attempt = rank_dir.parent.name.rpartition("_")[2]
            if not (rank_dir.name.isdigit() and attempt.isdigit() and rank_dir.is_dir()):
                continue
            rank = int(rank_dir.name)  # the local rank: the global one on a single node
            if rank not in found or int(attempt) >= found[rank][0]:
                found[rank] = (int(attempt), rank_dir)
    rank_logs = {}
    if found:
        for rank, (_, rank_dir) in sorted(found.items()):
            target = ranks_dir / f"rank{rank}.log"
            with open(target, "wb") as out:
                for stream in ("stdout", "stderr"):
                    src = rank_dir / f"{stream}.log"
                    out.write(f"===== rank {rank} {stream} ({src.relative_to(ranks_dir)}) =====\n".encode())
                    try:
                        with open(src, "rb") as f:
                            shutil.copyfileobj(f, out)
                    except OSError as exc:
                        out.write(f"(unreadable: {exc})\n".encode())
            rank_logs[rank] = target
        return rank_logs
    # fallback: split the combined log by torchrun's tee prefix
    per_rank: dict[int, list[str]] = {}
    for rank, text in tagged_lines(read_tail(log_path, 1 << 62)):
        if rank is not None:
            per_rank.setdefault(rank, []).append(text)
    if per_rank:
        ranks_dir.mkdir(parents=True, exist_ok=True)
        for rank, lines in sorted(per_rank.items()):
            target = ranks_dir / f"rank{rank}.log"
            target.write_text("\n".join(lines) + "\n", encoding="utf-8")
            rank_logs[rank] = target
    return rank_logs
