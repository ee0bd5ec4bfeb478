"""Run one step's command (the trainer through torchrun, a test suite, any argv) as a subprocess and account for it.

``launch(spec)`` starts ``spec.argv`` (prefixed by torchrun when ``nproc_per_node > 1`` or ``torchrun=True``) in its
own session, with stdout and stderr going to ``step_dir/stdout.log`` (a file, never a pipe, so a chatty child can
not block), and polls until it ends. It returns a ``LaunchResult``; a child's failure is a result, never an
exception. What ``step_dir`` holds afterwards::

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

How a run ends (``LaunchResult.status``):

- ``ok`` / ``failed``: the child exited by itself with 0 / anything else. ``reason`` names the exit code, the
  failing rank and its exception line; ``excerpt`` holds that traceback. The failing rank is the one whose
  ``trainer_out_dir/error_rank{r}.txt`` was written first (the others usually fail in their next collective
  because of it), else the root cause in torchrun's failure summary, else the first rank whose traceback shows in
  the combined log; the traceback comes from that error file, else the last one in that rank's log, else the last
  one in the combined log ("[defaultN]:"/"[rankN]:" prefixes stripped); with no traceback, the last meaningful log
  line (e.g. "nsa-train: error: ..."). The trainer's ``status.json`` (written during this launch) is mentioned.
- ``timeout``: ``timeout_s`` passed. ``hang``: a rank of the trainer wrote no heartbeat for ``stall_timeout_s``
  (``nsa.training.watchdog.check``, counting only records written after the launch): its processes are asked for stack
  dumps (SIGUSR1), given ``DUMP_WAIT_S`` to write them, then ended; ``stack_dumps`` lists them.
- ``interrupted``: the child died of SIGINT (exit -2 or 130). A Ctrl-C in the caller (KeyboardInterrupt while
  waiting) is not a result: the processes are ended and KeyboardInterrupt is raised again.
- ``error``: the command could not be started (missing executable or cwd).

Ending a run (timeout, hang, Ctrl-C, leftovers after a normal exit) means SIGTERM to every process of the run, up
to ``term_grace_s`` (default 10 s) to exit, then SIGKILL. "Every process" is more than the child's process group:
torchrun starts each worker in a session of its own, so the launcher tracks the child's descendants through
/proc (pid + start time, so a reused pid is never signalled), every process group and session they lead, and
every process whose environment carries this launch's id: the launcher adds ``NSAV_LAUNCH_ID`` (``LAUNCH_ID_VAR``)
to the child's environment, and descendants inherit it even after they were orphaned. When ``launch`` returns or
raises, none of them is alive. (Zombies re-parented to init are reaped by init, not by the launcher.)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nsa.training.outputs import write_json
from validation import slurm
from validation.slurm import SlurmOptions
from nsa.training.watchdog import STALLED, WAITING, check, signal_stack_dumps

log = logging.getLogger(__name__)

STATUSES = ("ok", "failed", "timeout", "hang", "interrupted", "error")

COMMAND_JSON = "command.json"
LOG_NAME = "stdout.log"
RANKS_DIR = "ranks"
TERM_GRACE_S = 10.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the processes to be gone
DUMP_WAIT_S = 5.0  # after SIGUSR1 on a stall, how long to wait for the stack dump files
CLASH_WINDOW_S = 120.0  # a port clash is only retried when the attempt failed within this many seconds
EXCERPT_MAX_LINES = 40
_LOG_TAIL_BYTES = 2 << 20  # tracebacks are looked for in the last 2 MiB of a log
_NOTE_PREFIX = "[launcher "

LAUNCH_ID_VAR = "NSAV_LAUNCH_ID"  # added to the child's environment: finds every process of a run (_ProcessTree)
# Environment prefixes recorded with every launch (command.json, results.json); the rest is inherited as is.
RECORDED_ENV_PREFIXES = ("NSA_", "NCCL_", "TORCH_", "CUDA_", "OMP_", "CONFIG")
_SECRET_RE = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY", re.IGNORECASE)
_CLASH_RE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
_TB_HEADER = "Traceback (most recent call last):"
_TB_STOP = ("Traceback (most recent call last):", "During handling of the above exception",
            "The above exception was the direct cause")
_GLOG_RE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # torch/glog log records ("E1121 20:47:18.637 ...")
_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\):\s*\n(?:.*\n){0,3}?\s*rank\s*:\s*(\d+)"
                            r"[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
_FAILURE_RE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


# ------------------------------------------------------------------------------------------------- the API


@dataclass
class Progress:
    """Live information passed to ``LaunchSpec.on_progress`` at every poll.

    step / toks_per_s: from rank 0's latest heartbeat of this launch (toks_per_s: the latest "step" record's);
    None until known. state: the heartbeat verdict ("waiting", "running", "stalled", "finished") when
    ``trainer_out_dir`` is set, else "running".
    """

    elapsed_s: float
    step: int | None
    toks_per_s: float | None
    state: str


@dataclass
class LaunchSpec:
    """What to run and how to watch it. `env` is used as given, plus ``LAUNCH_ID_VAR``. A port clash (torchrun
    failed within ``CLASH_WINDOW_S`` and its log says "address already in use") is retried on a fresh free port up
    to `port_retries` times, also when `master_port` was given; ``port_retries=0`` insists on the port."""

    argv: list[str]  # the command WITHOUT any torchrun prefix, e.g. [sys.executable, "-m", "nsa.training", ...]
    env: dict[str, str]  # the child's whole environment
    cwd: Path
    step_dir: Path  # command.json, stdout.log, ranks/ go here (created)
    nproc_per_node: int = 1  # > 1 (or torchrun=True): run through torchrun
    torchrun: bool = False
    master_port: int | None = None  # None: a free port
    port_retries: int = 3  # port clashes retried on a fresh port (0: never)
    timeout_s: float = 3600.0  # for the whole launch, retries included
    trainer_out_dir: Path | None = None  # the trainer's out_dir: progress from its heartbeats, stall watch
    stall_timeout_s: float | None = None  # None: no stall watch (needs trainer_out_dir)
    expected_ranks: int | None = None  # ranks that must write heartbeats; None: nproc_per_node
    poll_s: float = 1.0
    on_progress: Callable[[Progress], None] | None = None
    wrapper: list[str] = field(default_factory=list)  # a command the launch runs under, e.g. nsys profile ...
    term_grace_s: float = TERM_GRACE_S  # SIGTERM -> SIGKILL when ending the run
    # multi-node and schedulers
    launcher: str = "torchrun"  # "torchrun": processes on this machine; "slurm": an sbatch job (see _SlurmRun)
    nnodes: int = 1  # torchrun: > 1 starts that many agents here (emulated nodes); slurm: nodes of the job
    rdzv_backend: str = "c10d"  # torchrun multi-node: "c10d" rendezvous or "static" (--node-rank/--master-addr)
    rdzv_endpoint: str | None = None  # torchrun multi-node "host:port"; None: 127.0.0.1 and a free port
    slurm: SlurmOptions | None = None  # the job's allocation (launcher slurm)
    remote_dumps: bool | None = None  # launcher slurm, on a stall: None: ranks on other hosts are asked for stack
    # dumps by `srun --overlap python -m nsa.training.watchdog --once` on every node; True: every rank that way (tests)
    job_env: dict[str, str] | None = None  # exported by the batch script (the step's own variables); None: the
    # recorded NSA_/NCCL_/TORCH_/... variables of `env`. The job inherits the rest of `env` from sbatch as usual.
    job_name: str = "nsav"  # the Slurm job name


@dataclass
class LaunchResult:
    status: str  # one of STATUSES
    returncode: int | None  # the child's (torchrun's) exit code; negative: killed by that signal; None: not started
    duration_s: float
    argv: list[str]  # the exact argv of the last attempt (torchrun prefix included)
    log_path: Path  # combined stdout+stderr of the last attempt
    rank_logs: dict[int, Path]  # rank -> its own log (torchrun runs only)
    reason: str  # one sentence
    excerpt: str | None  # the failing rank's traceback (<= EXCERPT_MAX_LINES lines); for a hang, a stack dump
    stack_dumps: list[Path]  # non-empty trainer_out_dir/stackdump_*.txt written during this launch
    attempts: int  # port-clash retries + 1
    master_port: int | None = None  # the port of the last attempt (torchrun runs)
    pid: int | None = None  # the child's pid (= its process group and session id)
    job_id: str | None = None  # the Slurm job (launcher slurm)
    nodes: list[str] = field(default_factory=list)  # the nodes the job ran on (launcher slurm)


def free_port() -> int:
    """A TCP port that is free on every local address right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torchrun_prefix(nproc_per_node: int, master_port: int, log_dir: Path | None = None, *, nnodes: int = 1,
                    node_rank: int = 0, rdzv_backend: str = "c10d", rdzv_endpoint: str | None = None,
                    rdzv_id: str = "nsav") -> list[str]:
    """``python -m torch.distributed.run`` for one node (of `nnodes`); with `log_dir`, every rank's stdout and
    stderr also go to files under it (``--redirects 3 --tee 3``: to the files AND, prefixed "[defaultN]:", to
    torchrun's output). Multi-node: c10d rendezvous at `rdzv_endpoint` (default 127.0.0.1:`master_port`) with id
    `rdzv_id`, or static (``--node-rank``, ``--master-addr``/``--master-port`` from the endpoint)."""
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive int, got {nproc_per_node!r}")
    prefix = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}"]
    if nnodes == 1:
        prefix.append(f"--master-port={int(master_port)}")
    else:
        endpoint = rdzv_endpoint or f"127.0.0.1:{int(master_port)}"
        if rdzv_backend == "static":
            host, _, port = endpoint.rpartition(":")
            prefix += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={host}",
                       f"--master-port={port}"]
        elif rdzv_backend == "c10d":
            prefix += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                       f"--rdzv-id={rdzv_id}"]
        else:
            raise ValueError(f"rdzv_backend must be 'c10d' or 'static', got {rdzv_backend!r}")
    if log_dir is not None:
        prefix += ["--log-dir", str(log_dir), "--redirects", "3", "--tee", "3"]
    return prefix


def launch(spec: LaunchSpec) -> LaunchResult:
    """Run `spec` to its end (see the module docstring). Raises only for an invalid spec (ValueError/TypeError)
    and KeyboardInterrupt (after ending every process of the run)."""
    _validate(spec)
    step_dir = Path(spec.step_dir)
    step_dir.mkdir(parents=True, exist_ok=True)
    log_path = step_dir / LOG_NAME
    ranks_dir = step_dir / RANKS_DIR
    for old in (log_path, ranks_dir):
        _set_aside(old, "prev")
    use_torchrun = spec.torchrun or spec.nproc_per_node > 1 or spec.nnodes > 1
    started = time.time()
    t0 = time.monotonic()
    deadline = t0 + spec.timeout_s
    port = spec.master_port
    attempts = 0
    while True:
        attempts += 1
        if spec.launcher == "slurm":
            run = _SlurmRun(spec, step_dir, log_path, ranks_dir, started, deadline)
            argv = run.argv
            port = None
        else:
            if use_torchrun and port is None:
                port = free_port()
            if spec.nnodes > 1:
                argv = _local_agents_argv(spec, port, step_dir, ranks_dir)
            else:
                argv = list(spec.wrapper) + (_torchrun_argv(spec.argv, torchrun_prefix(spec.nproc_per_node, port,
                                                                                       ranks_dir))
                                             if use_torchrun else list(spec.argv))
            run = _Run(spec, argv, log_path, started, deadline)
        _write_command_json(step_dir / COMMAND_JSON, spec, argv, attempts, port if use_torchrun else None)
        attempt_t0 = time.monotonic()
        run.execute()  # raises KeyboardInterrupt (after ending the processes or cancelling the job)
        clash = (use_torchrun and run.status == "failed" and attempts <= spec.port_retries
                 and time.monotonic() - attempt_t0 < CLASH_WINDOW_S and _port_clash(log_path))
        if not clash:
            break
        log.warning("port %s is in use (attempt %d); retrying on a fresh port", port, attempts)
        _note(log_path, f"port {port} is in use (address already in use); retrying on a fresh port")
        _set_aside(log_path, "attempt")
        _set_aside(ranks_dir, "attempt")
        port = None

    rank_logs = _collect_rank_logs(ranks_dir, log_path) if use_torchrun else {}
    out_dir = Path(spec.trainer_out_dir) if spec.trainer_out_dir is not None else None
    dumps = run.stack_dumps if run.stack_dumps else _stack_dumps(out_dir, started)
    reason, excerpt = _explain(run, log_path, rank_logs, out_dir, started, dumps, spec)
    result = LaunchResult(status=run.status, returncode=run.returncode, duration_s=time.monotonic() - t0,
                          argv=argv, log_path=log_path, rank_logs=rank_logs, reason=reason, excerpt=excerpt,
                          stack_dumps=dumps, attempts=attempts, master_port=port if use_torchrun else None,
                          pid=run.pid, job_id=getattr(run, "job_id", None), nodes=list(getattr(run, "nodes", [])))
    if run.status != "error":
        _note(log_path, f"{result.status}: {reason}")
    log.info("%s: %s (%.1fs)", result.status, reason, result.duration_s)  # the caller reports outcomes
    return result


# ----------------------------------------------------------------------------------------------- one attempt


class _Run:
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
        env = dict(self.spec.env)
        env[LAUNCH_ID_VAR] = ",".join(filter(None, (env.get(LAUNCH_ID_VAR, ""), launch_id)))  # nested launches
        proc = tree = None
        done = False
        try:
            with _sigint_deferred():  # a Ctrl-C between Popen and tracking would leave the child unknown
                proc = self._start(env)
                if proc is None:
                    return
                self.pid = proc.pid
                tree = _ProcessTree(proc, launch_id, self.started)
            self._wait(proc, tree)
            done = True
        except KeyboardInterrupt:
            if tree is not None:
                _note(self.log_path, "interrupted (Ctrl-C in the launcher): ending the run's processes")
                how = _end(tree, self.spec.term_grace_s)
                _note(self.log_path, f"interrupted after {time.time() - self.started:.1f}s; processes ended "
                                     f"({how or 'already gone'}); exit code {proc.returncode}")
            raise
        finally:
            if not done and tree is not None:  # KeyboardInterrupt (handled above) or a bug in a callback
                _end(tree, self.spec.term_grace_s)
        leftovers = tree.refresh()
        if leftovers:  # e.g. a daemon the child left behind: it belongs to the run, it ends with it
            _note(self.log_path, f"ending {len(leftovers)} process(es) left behind: {sorted(leftovers)}")
            _end(tree, self.spec.term_grace_s)
        self.returncode = proc.returncode

    def _start(self, env: dict[str, str]) -> subprocess.Popen | None:
        """The child, started in a new session with its output on the log; None (and self.error) if it can't be."""
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            log.info("launching %s (cwd %s, log %s)", self.argv, self.spec.cwd, self.log_path)
            return subprocess.Popen(self.argv, cwd=self.spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=fd, start_new_session=True, close_fds=True,
                                    preexec_fn=(functools.partial(die_with_parent, _parent_death_signal(self.argv))
                                                if sys.platform.startswith("linux") else None))
        except OSError as exc:  # missing executable or cwd, permission denied
            self.error = f"could not start {self.argv[0]!r} in {self.spec.cwd}: {exc}"
            os.write(fd, f"{_NOTE_PREFIX}{time.strftime('%H:%M:%S')}] {self.error}\n".encode())
            return None
        finally:
            os.close(fd)

    def _wait(self, proc: subprocess.Popen, tree: _ProcessTree) -> None:
        spec = self.spec
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                self.status = "timeout"
                self.how_ended = _end(tree, spec.term_grace_s)
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

    def _on_stall(self, proc: subprocess.Popen, tree: _ProcessTree, verdict) -> None:
        self.status, self.verdict = "hang", verdict
        self._dumps_then(verdict, lambda: setattr(self, "how_ended", _end(tree, self.spec.term_grace_s)),
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
            _note(self.log_path, f"stall: {verdict.reason}; sending SIGUSR1 (stack dumps) to rank(s) "
                                 f"{sorted(stalled)}")
            self.signalled = signal_stack_dumps(stalled)
        ranks = sorted({r for r, rec in stalled.items() if rec.get("pid") in self.signalled} | set(waiting))
        self._wait_for_dumps(ranks, (t_sig if since is None else since) - 1.0, alive)
        end()
        self.stack_dumps = _stack_dumps(self.out_dir, self.started)

    def _wait_for_dumps(self, ranks: list[int], since: float, alive=lambda: True) -> None:
        """Up to DUMP_WAIT_S for a stack dump file of each of `ranks` written after `since`."""
        deadline = time.monotonic() + DUMP_WAIT_S
        while ranks and time.monotonic() < deadline and alive():
            fresh = _stack_dumps(self.out_dir, since)
            if all(any(p.name.startswith((f"stackdump_rank{r}.", f"stackdump_rank{r}_")) for p in fresh)
                   for r in ranks):
                time.sleep(0.5)  # let the other dump of each rank (Python level / C level) finish too
                return
            time.sleep(0.2)


# ------------------------------------------------------------------------------------- multi-node, Slurm

AGENTS_JSON = "agents.json"
SLURM_SCRIPT = "job.sbatch"
SLURM_JOB_JSON = "slurm_job.json"
AGENTS_GRACE_S = 30.0  # a local agent failed: the others get this long to end by themselves


def _local_agents_argv(spec: LaunchSpec, port: int, step_dir: Path, ranks_dir: Path) -> list[str]:
    """`spec.nnodes` torchrun agents on this machine forming one job (validation.agents runs them); each has
    its own node name (NSA_NODE_NAME=node<i>) and torchrun log directory (ranks/node<i>), and every rank's output
    is prefixed with its global rank."""
    rdzv_id = f"nsav-{safe_name(step_dir.name)[:40]}-{uuid.uuid4().hex[:8]}"
    agents = []
    for i in range(spec.nnodes):
        prefix = torchrun_prefix(spec.nproc_per_node, port, ranks_dir / f"node{i}", nnodes=spec.nnodes, node_rank=i,
                                 rdzv_backend=spec.rdzv_backend, rdzv_endpoint=spec.rdzv_endpoint, rdzv_id=rdzv_id)
        agents.append({"name": f"node{i}", "argv": list(spec.wrapper) + _torchrun_argv(spec.argv, prefix),
                       "env": {slurm.NODE_NAME_VAR: f"node{i}",
                               slurm.PREFIX_TEMPLATE_VAR: slurm.RANK_PREFIX_TEMPLATE}})
    path = step_dir / AGENTS_JSON
    write_json(path, {"agents": agents, "grace_s": AGENTS_GRACE_S})
    return [sys.executable, "-m", "validation.agents", str(path)]


def safe_name(text: str) -> str:
    """`text` as a file-name and id component: every character but letters, digits and -_. becomes _."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


class _SlurmRun(_Run):
    """One attempt as a Slurm job: write the batch script, cancel a job an earlier (killed) nsa-validate left
    running for this step, sbatch, follow squeue (progress and stall watch from the heartbeats, as for local
    runs), scancel on timeout / stall / Ctrl-C (and wait until squeue no longer lists the job), then map the final
    JobState (scontrol) to a status. The job appends its output to the step's stdout.log."""

    def __init__(self, spec: LaunchSpec, step_dir: Path, log_path: Path, ranks_dir: Path, started: float,
                 deadline: float):
        self.script = step_dir / SLURM_SCRIPT
        self.job_file = step_dir / SLURM_JOB_JSON
        super().__init__(spec, ["sbatch", "--parsable", str(self.script)], log_path, started, deadline)
        self.ranks_dir = ranks_dir
        self.job_id: str | None = None
        self.nodes: list[str] = []
        self.scheduler_reason: str | None = None
        self.remote_dump_ranks: list[int] = []

    def script_text(self) -> str:
        spec = self.spec
        env = spec.job_env if spec.job_env is not None else recorded_env(spec.env)[0]
        return slurm.batch_script(job_name=spec.job_name, nnodes=spec.nnodes, nproc_per_node=spec.nproc_per_node,
                                  argv=list(spec.wrapper) + list(spec.argv), env=env, cwd=Path(spec.cwd).resolve(),
                                  log_path=self.log_path.resolve(), ranks_dir=self.ranks_dir.resolve(),
                                  options=spec.slurm or slurm.SlurmOptions(), python=sys.executable,
                                  torchrun=spec.torchrun or spec.nproc_per_node > 1 or spec.nnodes > 1)

    def execute(self) -> None:
        self._cancel_stale()
        self.script.write_text(self.script_text())
        launch_id = uuid.uuid4().hex
        env = dict(self.spec.env)
        env[LAUNCH_ID_VAR] = ",".join(filter(None, (env.get(LAUNCH_ID_VAR, ""), launch_id)))
        cancelled = ""
        try:
            try:
                with _sigint_deferred():  # a Ctrl-C between sbatch and recording the job id would lose the job
                    self.job_id = slurm.submit(self.script, env, Path(self.spec.cwd))
                    write_json(self.job_file, {"job_id": self.job_id, "script": str(self.script),
                                               "submitted": time.time(), "state": "SUBMITTED"})
            except slurm.SlurmError as exc:
                self.error = f"could not submit the Slurm job: {exc}"
                _note(self.log_path, self.error)
                return
            _note(self.log_path, f"submitted Slurm job {self.job_id} ({self.spec.nnodes} node(s))")
            cancelled = self._follow()
        except KeyboardInterrupt:  # also one held back during submission: the job is cancelled either way
            if self.job_id is not None:
                _note(self.log_path, f"interrupted (Ctrl-C in the launcher): cancelling Slurm job {self.job_id}")
                self._cancel()
            raise
        info = self._final_info()
        self.nodes = info.nodes
        self.returncode = info.exit_code
        if cancelled:  # timeout / hang: our own verdict stands
            self.how_ended = f"scancel of Slurm job {self.job_id}"
        else:
            self.status, reason = slurm.map_state(info)
            self.scheduler_reason = None if self.status == "ok" else reason
        write_json(self.job_file, {"job_id": self.job_id, "script": str(self.script), "state": info.state,
                                   "exit_code": info.exit_code, "nodes": info.nodes, "status": self.status})

    def _final_info(self) -> slurm.JobInfo:
        """The job's final state (it left the queue; COMPLETING ends soon); UNKNOWN when Slurm cannot say."""
        info = None
        for _ in range(10):
            try:
                info = slurm.job_info(self.job_id)
            except slurm.SlurmError as exc:  # the controller did not answer: ask again, then give up
                info = slurm.JobInfo(job_id=self.job_id, state="UNKNOWN", reason=str(exc))
            if info.state in slurm.FINAL_STATES:
                break
            time.sleep(0.5)
        return info

    def _follow(self) -> str:
        """Poll until the job leaves the queue; returns "" or why it was cancelled ("timeout" / "hang")."""
        spec = self.spec
        while True:
            if time.monotonic() >= self.deadline:
                self.status = "timeout"
                self._cancel()
                return "timeout"
            try:
                state = slurm.queue_state(self.job_id)
            except slurm.SlurmError as exc:  # a slow controller: try again at the next poll
                log.warning("squeue: %s", exc)
                state = "UNKNOWN"
            if state is None:
                return ""
            verdict = self._look_at_heartbeats() if state == "RUNNING" else None
            if verdict is not None and verdict.state == STALLED and spec.stall_timeout_s is not None:
                self.status, self.verdict = "hang", verdict
                asked = time.time()
                remote = self._remote_dumps(verdict)
                self._dumps_then(verdict, self._cancel, local=not spec.remote_dumps, waiting=remote, since=asked)
                return "hang"
            if spec.on_progress is not None:
                shown = verdict.state if verdict is not None else state.lower()
                spec.on_progress(Progress(time.time() - self.started, self.last_step, self.toks_per_s, shown))
            time.sleep(spec.poll_s)

    def _remote_dumps(self, verdict) -> list[int]:
        """Stalled ranks on other hosts (every stalled rank with remote_dumps=True) are asked for stack dumps by
        the trainer's watchdog, run once on every node of the job (srun --overlap); returns those ranks."""
        host = socket.gethostname()
        ranks = [r for r in verdict.stalled_ranks
                 if self.spec.remote_dumps or verdict.latest.get(r, {}).get("host") not in (None, host)]
        if not ranks or self.out_dir is None:
            return []
        self.remote_dump_ranks = ranks
        argv = ["srun", f"--jobid={self.job_id}", "--overlap", f"--nodes={self.spec.nnodes}", "--ntasks-per-node=1",
                sys.executable, "-m", "nsa.training.watchdog", "--dir", str(self.out_dir.resolve()), "--once", "--halt", "0",
                "--include-earlier", "--stall-after", f"{self.spec.stall_timeout_s:g}",
                "--ranks", str(self.expected_ranks)]
        _note(self.log_path, f"stall: asking rank(s) {ranks} on the job's nodes for stack dumps: {' '.join(argv)}")
        try:
            out = subprocess.run(argv, cwd=self.spec.cwd, env=self.spec.env, capture_output=True, text=True,
                                 timeout=60, stdin=subprocess.DEVNULL)
            if out.returncode not in (0, 1):  # the watchdog's 1 means "stalled": what we expect
                _note(self.log_path, f"srun watchdog exited {out.returncode}: {_clip(out.stderr.strip())}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            _note(self.log_path, f"srun watchdog: {exc}")
        return ranks

    def _cancel(self) -> None:
        try:
            slurm.cancel(self.job_id)
            gone = slurm.wait_gone(self.job_id, timeout_s=max(60.0, self.spec.term_grace_s * 3))
        except slurm.SlurmError as exc:
            _note(self.log_path, f"scancel {self.job_id}: {exc}")
            return
        if not gone:
            _note(self.log_path, f"Slurm job {self.job_id} is still listed by squeue after scancel")

    def _cancel_stale(self) -> None:
        """A job this step submitted before (an nsa-validate that was killed) must not run beside the new one."""
        try:
            old = json.loads(self.job_file.read_text()).get("job_id")
        except (OSError, ValueError, AttributeError):
            return
        if not old:
            return
        try:
            if slurm.queue_state(str(old)) is None:
                return
            _note(self.log_path, f"cancelling Slurm job {old}, left running by an earlier run of this step")
            slurm.cancel(str(old))
            slurm.wait_gone(str(old))
        except slurm.SlurmError as exc:
            _note(self.log_path, f"could not check or cancel the earlier Slurm job {old}: {exc}")




@contextlib.contextmanager
def _sigint_deferred():
    """Hold back SIGINT (main thread only) for the block; an interrupt that came in is delivered at its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)  # default_int_handler raises KeyboardInterrupt
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int):
    """(state, ppid, pgrp, sid, start ticks) of `pid` from /proc/PID/stat, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


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


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            return float(next(int(line.split()[1]) for line in f if line.startswith(b"btime ")))
    except (OSError, ValueError, StopIteration):
        return None


class _ProcessTree:
    """Every process of one run: the child, its descendants (by parent pid), every member of a process group or
    session one of them leads, and processes whose environment carries this launch's id in ``LAUNCH_ID_VAR``
    (found even when they were orphaned before a poll saw them: a double-forked daemon, the workers of a torchrun
    that was killed). A process is known by pid AND start time, so a reused pid is never taken for a member."""

    def __init__(self, root: subprocess.Popen, launch_id: str, started: float):
        self.root = root
        self.launch_id = launch_id.encode()
        self.members: dict[int, int] = {}  # pid -> start ticks
        self.groups: set[int] = {root.pid}  # process group and session ids of members
        self._own = {os.getpid(), os.getpgrp(), os.getsid(0)}
        boot = _boot_time()
        # processes started before the launch (minus clock slack) cannot belong to it: their environ is not read
        self._min_start = None if boot is None else int((started - boot - 2.0) * _CLK_TCK)
        self.refresh()

    def _carries_id(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's
            return False
        prefix = LAUNCH_ID_VAR.encode() + b"="
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                return self.launch_id in item[len(prefix):].split(b",")
        return False

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
        # a group/session id is kept only while a live member carries it: a pid is not reused while it names one
        self.groups = {g for pid in live for g in table[pid][2:4]} - self._own
        return live

    def alive(self) -> bool:
        return self.root.poll() is None or bool(self.refresh())

    def signal(self, sig: int) -> None:
        table = _proc_table()
        if table is None:  # no /proc: the child's process group is all that can be reached
            targets_groups, targets = {self.root.pid}, {}
        else:
            targets_groups = {g for g in self.groups if any(table.get(p, (0, 0, -1, -1))[2] == g
                                                              for p in self.members)}
            targets = self.members
            if self.root.poll() is None:
                targets_groups.add(self.root.pid)
        for group in sorted(targets_groups - self._own):
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid, start in sorted(targets.items()):
            info = _stat(pid) if table is not None else None
            if pid in self._own or (table is not None and (info is None or info[4] != start)):
                continue
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _end(tree: _ProcessTree, grace_s: float) -> str:
    """End every process of the run: SIGTERM, up to `grace_s` to exit, then SIGKILL; reap the child. Returns how
    it ended: "" (nothing was alive), "SIGTERM" or "SIGKILL". A KeyboardInterrupt during the grace period skips
    to SIGKILL and is raised again once everything is gone."""
    tree.refresh()
    if not tree.alive():
        return ""
    tree.signal(signal.SIGTERM)
    how, interrupt = "SIGTERM", None
    try:
        end = time.monotonic() + grace_s
        while time.monotonic() < end and tree.alive():
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
    if interrupt is not None:
        raise interrupt
    return how


# ---------------------------------------------------------------------------------------------------- files


def _set_aside(path: Path, tag: str) -> None:
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


def _note(log_path: Path, text: str) -> None:
    """Append one launcher line to the combined log (O_APPEND: safe while the child writes too)."""
    line = f"{_NOTE_PREFIX}{time.strftime('%H:%M:%S')}] {text}\n"
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    finally:
        os.close(fd)


def recorded_env(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What command.json keeps of `env`: variables that differ from os.environ plus every NSA_/NCCL_/TORCH_/
    CUDA_/OMP_/CONFIG* one (values of secret-looking names redacted), and the names os.environ has but `env` lacks."""
    kept = {}
    for key, value in sorted(env.items()):
        if os.environ.get(key) != value or key.startswith(RECORDED_ENV_PREFIXES):
            kept[key] = "<redacted>" if _SECRET_RE.search(key) else value
    unset = sorted(k for k in os.environ if k not in env)
    return kept, unset


def _write_command_json(path: Path, spec: LaunchSpec, argv: list[str], attempt: int, port: int | None) -> None:
    env, unset = recorded_env(spec.env)
    body = {"argv": argv, "cwd": str(spec.cwd), "env": env, "env_unset": unset, "timeout_s": spec.timeout_s,
            "attempt": attempt, "master_port": port}
    write_json(path, body)


def _read_tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _port_clash(log_path: Path) -> bool:
    return bool(_CLASH_RE.search(_read_tail(log_path, 256 << 10)))


def _collect_rank_logs(ranks_dir: Path, log_path: Path) -> dict[int, Path]:
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
    for rank, text in _tagged_lines(_read_tail(log_path, 1 << 62)):
        if rank is not None:
            per_rank.setdefault(rank, []).append(text)
    if per_rank:
        ranks_dir.mkdir(parents=True, exist_ok=True)
        for rank, lines in sorted(per_rank.items()):
            target = ranks_dir / f"rank{rank}.log"
            target.write_text("\n".join(lines) + "\n", encoding="utf-8")
            rank_logs[rank] = target
    return rank_logs


def _stack_dumps(out_dir: Path | None, since: float) -> list[Path]:
    """Non-empty out_dir/stackdump_*.txt modified at or after `since`."""
    if out_dir is None or not out_dir.is_dir():
        return []
    dumps = []
    for path in sorted(out_dir.glob("stackdump_*.txt")):
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_size > 0 and st.st_mtime >= since:
            dumps.append(path)
    return dumps


# --------------------------------------------------------------------------------------- explaining the end

_DEFAULT_PREFIX_RE = re.compile(r"^\[default(\d+)\]:")
_RANK_PREFIX_RE = re.compile(r"^\[rank(\d+)\]: ?")


def _tagged_lines(text: str) -> list[tuple[int | None, str]]:
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


def _tracebacks(text: str) -> list[_Traceback]:
    """Every Python traceback in `text`, in order: from "Traceback (most recent call last):" to the exception line
    (plus its continuation lines); lines of other ranks interleaved in a combined log are skipped."""
    lines = _tagged_lines(text)
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
                if (not t2.strip() or t2.startswith(_TB_STOP) or t2.startswith(_NOTE_PREFIX) or _GLOG_RE.match(t2)
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
    for rank, line in reversed(_tagged_lines(text)):
        s = line.strip()
        if not s or s.startswith(_NOTE_PREFIX) or set(s) <= set("=-") or _GLOG_RE.match(s):
            continue
        return s
    return ""


def _torchrun_failures(log_text: str) -> tuple[int | None, dict[int, int]]:
    """(root-cause rank, {rank: exit code}) from torchrun's failure summary (the last one in the log)."""
    cut = log_text.rfind("Root Cause (first observed failure):")
    start = log_text.rfind("Failures:", 0, cut if cut >= 0 else len(log_text))
    summary = log_text[start if start >= 0 else max(cut, 0):]
    codes = {int(m.group(1)): int(m.group(2)) for m in _FAILURE_RE.finditer(summary)}
    roots = list(_ROOT_CAUSE_RE.finditer(log_text))
    return (int(roots[-1].group(1)) if roots else None), codes


def _error_files(out_dir: Path | None, since: float) -> list[tuple[float, int, Path]]:
    """(mtime, rank, path) of out_dir/error_rank{r}.txt written during this launch, oldest first."""
    if out_dir is None or not out_dir.is_dir():
        return []
    found = []
    for path in out_dir.glob("error_rank*.txt"):
        match = re.match(r"^error_rank(\d+)\.txt$", path.name)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if match and mtime >= since - 1.0:
            found.append((mtime, int(match.group(1)), path))
    return sorted(found)


def _trainer_status(out_dir: Path | None, since: float) -> dict | None:
    if out_dir is None:
        return None
    path = out_dir / "status.json"
    try:
        if path.stat().st_mtime < since - 1.0:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _failure(log_path: Path, rank_logs: dict[int, Path], out_dir: Path | None, since: float,
             logs: bool = True) -> tuple[int | None, int | None, _Traceback | None, str]:
    """(failing rank, its exit code, its traceback, the last meaningful log line) for a failed run.

    The failing rank is the one whose out_dir/error_rank{r}.txt was written first (the trainer writes it as it
    fails, so the order is causal: a crash on one rank makes the others fail in their next collective), else the
    root cause torchrun names (the first exit it noticed), else the first rank whose traceback shows in the
    combined log. `logs` False: only the error files are looked at."""
    log_text = _read_tail(log_path)
    root, codes = _torchrun_failures(log_text)
    errors = _error_files(out_dir, since)
    for _, err_rank, path in errors:  # 1. the trainer's own record of the exception, oldest first
        tbs = _tracebacks(_read_tail(path))
        if tbs:
            tb = tbs[-1]
            tb.rank = err_rank
            return err_rank, codes.get(err_rank), tb, ""
    if not logs:
        return None, None, None, ""
    combined = _tracebacks(log_text)
    rank = root
    if rank is None:
        ranked = [tb for tb in combined if tb.rank is not None]
        if ranked:
            rank = ranked[0].rank
    if rank is not None and rank in rank_logs:  # 2. the failing rank's own log
        text = _read_tail(rank_logs[rank])
        tbs = _tracebacks(text)
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


def _clip(text: str, limit: int = 300) -> str:
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


def _explain(run: _Run, log_path: Path, rank_logs: dict[int, Path], out_dir: Path | None, since: float,
             dumps: list[Path], spec: LaunchSpec) -> tuple[str, str | None]:
    """(reason, excerpt) for the result."""
    status_json = _trainer_status(out_dir, since)
    trainer = ""
    if status_json is not None and status_json.get("status"):
        trainer = f"; trainer status.json: {status_json.get('status')}"
        if status_json.get("reason"):
            trainer += f" ({_clip(str(status_json['reason']), 160)})"
    ended = f"; processes ended with {run.how_ended}" if run.how_ended else ""
    step = f" at step {run.last_step}" if run.last_step is not None else ""

    if run.status == "error":
        return run.error, None
    if run.status == "ok":
        return f"exit code 0{trainer}", None
    if run.status == "timeout" and getattr(run, "scheduler_reason", None):  # Slurm's own time limit
        return f"{run.scheduler_reason}{trainer}", _failure_excerpt(log_path, rank_logs, out_dir, since)
    if run.status == "timeout":
        return (f"timed out after {spec.timeout_s:g}s{step} (last heartbeat of rank 0){ended}{trainer}"
                if run.last_step is not None else f"timed out after {spec.timeout_s:g}s{ended}{trainer}"), \
            _failure_excerpt(log_path, rank_logs, out_dir, since)
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
        return f"{head}: {_clip(tb.exception)}{trainer}", tb.excerpt()
    if last:
        return f"{head}: {_clip(last)}{trainer}", None
    return f"{head} (no error message in the logs){trainer}", None


def _failure_excerpt(log_path: Path, rank_logs: dict[int, Path], out_dir: Path | None, since: float) -> str | None:
    """The trainer's error_rank*.txt traceback of a timed-out run, if any (a rank that failed while the others
    waited); tracebacks in the logs are not used: ending the run makes torchrun print its own."""
    _, _, tb, _ = _failure(log_path, rank_logs, out_dir, since, logs=False)
    return tb.excerpt() if tb is not None else None


# ------------------------------------------------------------------------------------------------- helpers


def _parent_death_signal(argv: list[str]) -> int:
    """SIGKILL for a torchrun agent (its own SIGTERM shutdown can hang with its workers already gone; the trainer's
    ranks get their own SIGTERM when the agent dies: nsa.training.safety.stop_with_launcher), SIGTERM for anything else."""
    return signal.SIGKILL if "torch.distributed.run" in argv else signal.SIGTERM


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In the child, before exec: `sig` when nsa-validate dies, even by SIGKILL (Linux PR_SET_PDEATHSIG), so a
    killed orchestrator does not leave a training run behind."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


def _is_python(executable: str) -> bool:
    if _PYTHON_RE.match(Path(executable).name):
        return True
    try:
        return os.path.realpath(executable) == os.path.realpath(sys.executable)
    except OSError:
        return False


def _torchrun_argv(argv: list[str], prefix: list[str]) -> list[str]:
    """torchrun (`prefix`) + `argv`: ``python -m mod args`` becomes ``-m mod args`` and ``python script.py args``
    becomes ``script.py args`` (torchrun then runs them with that interpreter, unbuffered); anything else runs as
    is (``--no-python``)."""
    if _is_python(argv[0]):
        if len(argv) >= 3 and argv[1] == "-m":
            return [argv[0], *prefix[1:], "-m", *argv[2:]]
        if len(argv) >= 2 and not argv[1].startswith("-"):
            return [argv[0], *prefix[1:], *argv[1:]]
    return [*prefix, "--no-python", *argv]


def _validate(spec: LaunchSpec) -> None:
    if not isinstance(spec.argv, (list, tuple)) or not spec.argv or not all(isinstance(a, str) for a in spec.argv):
        raise TypeError(f"LaunchSpec.argv must be a non-empty list of str, got {spec.argv!r}")
    if not isinstance(spec.env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in spec.env.items()):
        raise TypeError("LaunchSpec.env must be a dict of str to str")
    for name in ("nproc_per_node", "port_retries"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "nproc_per_node" else 0):
            raise ValueError(f"LaunchSpec.{name} must be an int >= {1 if name == 'nproc_per_node' else 0}, "
                             f"got {value!r}")
    if spec.master_port is not None and (isinstance(spec.master_port, bool) or not isinstance(spec.master_port, int)
                                         or not 0 < spec.master_port < 65536):
        raise ValueError(f"LaunchSpec.master_port must be None or a port number, got {spec.master_port!r}")
    for name in ("timeout_s", "poll_s"):
        value = getattr(spec, name)
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"LaunchSpec.{name} must be > 0, got {value!r}")
    if not (isinstance(spec.term_grace_s, (int, float)) and spec.term_grace_s >= 0):
        raise ValueError(f"LaunchSpec.term_grace_s must be >= 0, got {spec.term_grace_s!r}")
    if spec.stall_timeout_s is not None:
        if not (isinstance(spec.stall_timeout_s, (int, float)) and spec.stall_timeout_s > 0):
            raise ValueError(f"LaunchSpec.stall_timeout_s must be None or > 0, got {spec.stall_timeout_s!r}")
        if spec.trainer_out_dir is None:
            raise ValueError("LaunchSpec.stall_timeout_s needs trainer_out_dir (the heartbeats to watch)")
    if spec.expected_ranks is not None and (isinstance(spec.expected_ranks, bool)
                                            or not isinstance(spec.expected_ranks, int) or spec.expected_ranks < 1):
        raise ValueError(f"LaunchSpec.expected_ranks must be None or a positive int, got {spec.expected_ranks!r}")
    if spec.launcher not in ("torchrun", "slurm"):
        raise ValueError(f"LaunchSpec.launcher must be 'torchrun' or 'slurm', got {spec.launcher!r}")
    if isinstance(spec.nnodes, bool) or not isinstance(spec.nnodes, int) or spec.nnodes < 1:
        raise ValueError(f"LaunchSpec.nnodes must be an int >= 1, got {spec.nnodes!r}")
    if spec.rdzv_backend not in ("c10d", "static"):
        raise ValueError(f"LaunchSpec.rdzv_backend must be 'c10d' or 'static', got {spec.rdzv_backend!r}")
    if spec.rdzv_endpoint is not None and not re.fullmatch(r"[A-Za-z0-9_.:\[\]-]+:\d{1,5}", spec.rdzv_endpoint):
        raise ValueError(f"LaunchSpec.rdzv_endpoint must be host:port, got {spec.rdzv_endpoint!r}")
    if spec.on_progress is not None and not callable(spec.on_progress):
        raise TypeError("LaunchSpec.on_progress must be callable")
