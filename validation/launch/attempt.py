"""``launch(spec)``: run one launch to its end, retrying torchrun on a taken port, and account for it.

``launch`` starts ``spec.argv`` (under torchrun when ``spec.uses_torchrun``; several local agents for ``nnodes > 1``;
an sbatch job for ``launcher: slurm``, see validation.launch.slurm; one attempt on this machine is
validation.launch.local.Run) in its own session, with stdout and stderr going to ``step_dir/stdout.log`` (a file,
never a pipe, so a chatty child can not block), and polls until it ends. It returns a ``LaunchResult``; a child's
failure is a result, never an exception. What ``step_dir`` holds afterwards::

    command.json            {"argv", "cwd", "env" (what differs from os.environ + NSA_/NCCL_/TORCH_/CUDA_/OMP_/
                            CONFIG* variables, secrets redacted), "env_unset", "timeout_s", "attempt", "master_port",
                            "launch_id" (LAUNCH_ID_VAR in every process it starts: a --resume ends what an
                            attempt killed with nsa-validate left running, recorded_launch_ids; null for a Slurm
                            job, whose processes run on its nodes: the resume cancels the job instead)};
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
  (``nsa.training.watchdog.check``, counting only records written after the launch): its processes, and those of
  every other rank not yet finished (they may wait on it in a collective), are asked for stack dumps (SIGUSR1), given ``DUMP_WAIT_S`` to write them, then ended; ``stack_dumps`` lists them.
- ``interrupted``: the child died of SIGINT (exit -2 or 130). A Ctrl-C, SIGTERM or SIGHUP to the caller
  (KeyboardInterrupt, or validation.launch.interrupts.Interrupted, while waiting) is not a result: the processes
  are ended and the exception is raised again. So is a KeyboardInterrupt ``spec.on_progress`` raises (a caller
  told to stop), also at the poll between a port clash and its retry: no further attempt starts.
- ``error``: the command could not be started (missing executable or cwd).

Ending a run (timeout, hang, Ctrl-C, leftovers after a normal exit) means SIGTERM to every process of the run
(validation.launch.processes), up to ``term_grace_s`` (default 10 s) to exit, then SIGKILL. When ``launch`` returns
or raises, none of them is alive.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from nsa.training.outputs import write_json
from nsa.training.watchdog import WAITING
from validation.contracts import stack_dumps, telemetry_files
from validation.launch.agents import local_agents_argv
from validation.launch.diagnosis import explain, port_clash, read_tail, tagged_lines
from validation.launch.interrupts import describe as describe_interrupt
from validation.launch.local import Run, note, set_aside
from validation.launch.slurm import SlurmRun
from validation.launch.spec import (CLASH_WINDOW_S, COMMAND_JSON, LOG_NAME, RANKS_DIR, LaunchResult, LaunchSpec,
                                    Progress, recorded_env, validate)
from validation.launch.torchrun import free_port, local_command_lines

log = logging.getLogger("validation.launch")


def launch(spec: LaunchSpec) -> LaunchResult:
    """Run `spec` to its end (see the module docstring). Raises only for an invalid spec (ValueError/TypeError)
    and KeyboardInterrupt (after ending every process of the run)."""
    validate(spec)
    step_dir = Path(spec.step_dir)
    step_dir.mkdir(parents=True, exist_ok=True)
    log_path = step_dir / LOG_NAME
    ranks_dir = step_dir / RANKS_DIR
    # an earlier launch's files of this step: its log and rank logs, and its telemetry (a Slurm job's one file per
    # node: a node this launch does not use again would be read as this launch's: contracts.telemetry_files)
    for old in (log_path, ranks_dir, *telemetry_files(step_dir)):
        set_aside(old, "prev")
    use_torchrun = spec.uses_torchrun
    started = time.time()
    t0 = time.monotonic()
    deadline = t0 + spec.timeout_s
    # a multi-node launch with a given rendezvous endpoint uses that endpoint's port, whatever master_port says
    # (validation.launch.torchrun.torchrun_prefix): that is the port it records
    endpoint_port = (int(spec.rdzv_endpoint.rpartition(":")[2]) if spec.launcher == "torchrun" and spec.nnodes > 1
                     and spec.rdzv_endpoint is not None else None)
    port = spec.master_port if endpoint_port is None else endpoint_port
    attempts = 0
    while True:
        attempts += 1
        if spec.launcher == "slurm":
            run = SlurmRun(spec, step_dir, log_path, ranks_dir, started, deadline)
            argv = run.argv
            port = None
        else:
            if use_torchrun and port is None:
                port = free_port()
            if spec.nnodes > 1:
                argv = local_agents_argv(spec, port, step_dir, ranks_dir)
            else:
                argv = local_command_lines(spec, port, ranks_dir)[0]
            run = Run(spec, argv, log_path, started, deadline)
        _write_command_json(step_dir / COMMAND_JSON, spec, argv, attempts, port if use_torchrun else None,
                            None if spec.launcher == "slurm" else run.launch_id)
        attempt_t0 = time.monotonic()
        run.execute()  # raises KeyboardInterrupt (after ending the processes or cancelling the job)
        # a retry only helps where it gets a fresh port: a new Slurm job, or one the launcher picks here (not a
        # multi-node launch's given rdzv_endpoint, which every attempt would use again)
        fresh_port = spec.launcher == "slurm" or spec.nnodes == 1 or spec.rdzv_endpoint is None
        clash = (use_torchrun and fresh_port and run.status == "failed" and attempts <= spec.port_retries
                 and time.monotonic() - attempt_t0 < CLASH_WINDOW_S and port_clash(log_path))
        if not clash:
            break
        taken = f"port {port}" if port is not None else "the job's rendezvous port"  # Slurm: set in the job
        try:  # the caller's poll: one told to stop meanwhile (launches side by side) raises, and no attempt follows
            _poll_between_attempts(spec, started)
        except KeyboardInterrupt as exc:
            note(log_path, f"{taken} is in use (address already in use); not retried: interrupted "
                           f"({describe_interrupt(exc)} to the launcher)")
            raise
        log.warning("%s is in use (attempt %d); retrying on a fresh port", taken, attempts)
        note(log_path, f"{taken} is in use (address already in use); retrying on a fresh port")
        set_aside(log_path, "attempt")
        set_aside(ranks_dir, "attempt")
        port = None

    rank_logs = collect_rank_logs(ranks_dir, log_path) if use_torchrun else {}
    out_dir = Path(spec.trainer_out_dir) if spec.trainer_out_dir is not None else None
    since = run.started  # later than `started` when a Slurm job left by an earlier run had to be cancelled first
    dumps = run.stack_dumps if run.stack_dumps else stack_dumps(out_dir, since)
    reason, excerpt = explain(run, log_path, rank_logs, out_dir, since, dumps, spec)
    result = LaunchResult(status=run.status, returncode=run.returncode, duration_s=time.monotonic() - t0,
                          argv=argv, log_path=log_path, rank_logs=rank_logs, reason=reason, excerpt=excerpt,
                          stack_dumps=dumps, attempts=attempts, master_port=port if use_torchrun else None,
                          pid=run.pid, job_id=getattr(run, "job_id", None), nodes=list(getattr(run, "nodes", [])))
    if run.status != "error":
        note(log_path, f"{result.status}: {reason}")
    log.info("%s: %s (%.1fs)", result.status, reason, result.duration_s)  # the caller reports outcomes
    return result


def _poll_between_attempts(spec: LaunchSpec, started: float) -> None:
    """Call spec.on_progress as an attempt's poll would (nothing is running: no step, no rate yet), so that a caller
    that raises there to stop the launch (validation.execution.runner, launches side by side) stops it before the
    next attempt starts. An attempt that fails within its first poll (a port clash usually does) calls it never."""
    if spec.on_progress is not None:
        spec.on_progress(Progress(time.time() - started, None, None,
                                  WAITING if spec.trainer_out_dir is not None else "running"))


def _write_command_json(path: Path, spec: LaunchSpec, argv: list[str], attempt: int, port: int | None,
                        launch_id: str | None) -> None:
    env, unset = recorded_env(spec.child_env())
    body = {"argv": argv, "cwd": str(spec.cwd), "env": env, "env_unset": unset, "timeout_s": spec.timeout_s,
            "attempt": attempt, "master_port": port, "launch_id": launch_id}
    write_json(path, body)


def recorded_launch_ids(run_dir: Path) -> list[str]:
    """The launch ids the command.json files under `run_dir` recorded (every launch's last attempt), in path order:
    what a --resume looks for in the environment of processes an earlier attempt left running."""
    ids = []
    for path in sorted(Path(run_dir).rglob(COMMAND_JSON)):
        try:
            launch_id = json.loads(path.read_text()).get("launch_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(launch_id, str) and launch_id:
            ids.append(launch_id)
    return ids


# the combined log's tail the per-rank fallback splits (the whole log was read: 392 MB of memory and 8 s for 67 MB)
RANK_LOG_TAIL_BYTES = 16 << 20


def collect_rank_logs(ranks_dir: Path, log_path: Path) -> dict[int, Path]:
    """{rank: ranks/rank{r}.log}: each rank's torchrun files (ranks/*/attempt_*/<local rank>/{stdout,stderr}.log,
    the latest attempt) concatenated; when torchrun wrote none, the "[defaultN]:" lines per rank of the combined log's
    last RANK_LOG_TAIL_BYTES."""
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
                            size = f.tell()
                            if size:
                                f.seek(size - 1)
                                if f.read(1) != b"\n":  # cut mid-line (SIGKILL): the next header on a line of its own
                                    out.write(b"\n")
                    except OSError as exc:
                        out.write(f"(unreadable: {exc})\n".encode())
            rank_logs[rank] = target
        return rank_logs
    # fallback: split the combined log by torchrun's tee prefix
    per_rank: dict[int, list[str]] = {}
    for rank, text in tagged_lines(read_tail(log_path, RANK_LOG_TAIL_BYTES)):
        if rank is not None:
            per_rank.setdefault(rank, []).append(text)
    if per_rank:
        ranks_dir.mkdir(parents=True, exist_ok=True)
        for rank, lines in sorted(per_rank.items()):
            target = ranks_dir / f"rank{rank}.log"
            target.write_text("\n".join(lines) + "\n", encoding="utf-8")
            rank_logs[rank] = target
    return rank_logs
