"""Slurm: the few Slurm commands the launcher needs (sbatch, squeue, scontrol, scancel), as argv lists with their
output parsed, and ``SlurmRun``, one launch attempt as a Slurm job. No shell is ever used to run them.

A step's job is the batch script of validation.launch.sbatch (``batch_script``, ``SlurmOptions``; importable from
here too): bash built from quoted values only, one torchrun agent per node meeting by c10d rendezvous, with the job
id as the rendezvous id. Every rank's output carries its global rank (``[defaultN]:``) so the step's log splits per
rank.

Job states map to launcher statuses with ``map_state``: COMPLETED -> ok, FAILED / NODE_FAIL / BOOT_FAIL /
PREEMPTED / OUT_OF_MEMORY / CANCELLED by someone else -> failed, TIMEOUT / DEADLINE -> timeout.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nsa.training.outputs import write_json
from nsa.training.watchdog import STALLED
from validation.launch.diagnosis import clip
from validation.launch.interrupts import describe as describe_interrupt
from validation.launch.local import Run, note
from validation.launch.processes import signals_deferred
from validation.launch.sbatch import SlurmOptions, batch_script, validate_sbatch_line  # noqa: F401 (read from here)
from validation.launch.spec import LAUNCH_ID_VAR, LaunchSpec, Progress

log = logging.getLogger("validation.launch")

SLURM_SCRIPT = "job.sbatch"
SLURM_JOB_JSON = "slurm_job.json"

COMMAND_TIMEOUT_S = 30.0  # for one sbatch/squeue/scontrol/scancel call

# Slurm job states (squeue %T / scontrol JobState) that mean the job is over.
FINAL_STATES = {"COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "CANCELLED", "PREEMPTED",
                "OUT_OF_MEMORY", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
_STATE_TEXT = {
    "FAILED": "the job failed",
    "NODE_FAIL": "a node of the job failed (NODE_FAIL)",
    "BOOT_FAIL": "a node of the job failed to boot (BOOT_FAIL)",
    "PREEMPTED": "the job was preempted by the scheduler (PREEMPTED)",
    "OUT_OF_MEMORY": "the job ran out of memory (OUT_OF_MEMORY)",
    "CANCELLED": "the job was cancelled outside nsa-validate (CANCELLED)",
    "TIMEOUT": "the job reached its Slurm time limit (TIMEOUT)",
    "DEADLINE": "the job reached its deadline (DEADLINE)",
    "SPECIAL_EXIT": "the job ended in SPECIAL_EXIT",
    "REVOKED": "the job was revoked (REVOKED)",
}
class SlurmError(RuntimeError):
    """A Slurm command could not be run or answered with an error; the message names the command."""


@dataclass
class JobInfo:
    job_id: str
    state: str  # e.g. "COMPLETED"; "UNKNOWN" when Slurm no longer knows the job
    exit_code: int | None = None  # the batch script's exit code
    signal: int | None = None  # the signal that ended it (0: none)
    reason: str | None = None
    nodes: list[str] = field(default_factory=list)


def available() -> bool:
    """Whether this machine can submit jobs (sbatch, squeue, scontrol, scancel on PATH)."""
    return all(shutil.which(c) for c in ("sbatch", "squeue", "scontrol", "scancel"))


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """One Slurm command's stdout. It runs in a session of its own, with SIGINT / SIGTERM / SIGHUP to nsa-validate
    held back until it answers (at most COMMAND_TIMEOUT_S): a Ctrl-C in the terminal, which reaches its whole
    foreground process group, must not kill an sbatch that has already queued its job before it printed the job id,
    nor an scancel before it reached the controller.
    Its output goes to files, not pipes, so that the call ends when the command does: a process it leaves behind
    holding a pipe open (a site's sbatch wrapper starting a helper) would hold the call to its timeout, and lose the
    job id printed long before. Output that is not UTF-8 is read with replacement characters."""
    try:
        with signals_deferred(), tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            code = subprocess.run(argv, stdout=out, stderr=err, env=env, cwd=cwd, timeout=COMMAND_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, start_new_session=True).returncode
            stdout, stderr = (_read_back(f) for f in (out, err))
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found (is Slurm installed and on PATH?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(argv)}: no answer within {COMMAND_TIMEOUT_S:g}s") from None
    if code != 0:
        text = (stderr or stdout).strip().splitlines()
        raise SlurmError(f"{shlex.join(argv)}: exit {code}: {text[-1] if text else 'no message'}")
    return stdout


def _read_back(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", "replace")


# Slurm's client settings: kept when a job is submitted from inside another allocation (submission_env)
CLIENT_VARS = ("SLURM_CONF", "SLURM_CLUSTERS", "SLURM_TIME_FORMAT")
ALLOCATION_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")  # set inside an allocation (salloc, a batch job, an srun step)


def submission_env(env: dict[str, str], keep: frozenset[str] | set[str] = frozenset()) -> dict[str, str]:
    """`env` without the SLURM_* / SLURMD_* variables of an enclosing allocation (nsa-validate run inside `salloc`,
    an sbatch job or an srun step: SLURM_JOB_ID is set), except Slurm's client settings (CLIENT_VARS) and the names in
    `keep` (the step's own variables). sbatch exports the submitting environment into the job (--export=ALL), and
    srun there reads SLURM_* as its options: the outer allocation's SLURM_MEM_PER_CPU beside the job's own
    SLURM_MEM_PER_NODE makes every srun of the job fail ("mutually exclusive"). Outside an allocation `env` is
    returned as it is (a SLURM_* variable there is the user's own setting)."""
    if not any(env.get(name) for name in ALLOCATION_VARS):
        return dict(env)
    return {k: v for k, v in env.items()
            if not k.startswith(("SLURM_", "SLURMD_")) or k in CLIENT_VARS or k in keep}


# sbatch's input environment variables that would override the batch script's own #SBATCH lines (sbatch takes its
# environment over the script's directives): SBATCH_OUTPUT set in a user's shell sent the job's output elsewhere
# (checked on a real sbatch), the clusters ones send the job where squeue and scancel do not look, SBATCH_EXPORT
# would keep the step's environment from the job, SBATCH_GPUS_PER_NODE would replace the runbook's gpus_per_node
# (which the step's GPU check reads; sbatch has no such variable for --cpus-per-task), and SBATCH_GPUS,
# SBATCH_GPUS_PER_TASK, SBATCH_GPUS_PER_SOCKET would give the job GPUs beside it, as the #SBATCH lines of the same
# options that validate_sbatch_line refuses. Left out of what sbatch gets; so are SBATCH_GRES and SBATCH_GPU_BIND
# where the line of the same value would be refused (GPUs in the GRES list, a GPU binding other than none:
# GPU_INPUT_VARS); the others (SBATCH_ACCOUNT, a GRES list of other resources, ...) are the user's defaults and stay.
OWN_INPUT_VARS = ("SBATCH_OUTPUT", "SBATCH_ERROR", "SBATCH_OPEN_MODE", "SBATCH_JOB_NAME", "SBATCH_REQUEUE",
                  "SBATCH_NO_REQUEUE", "SBATCH_WAIT", "SBATCH_ARRAY_INX", "SBATCH_EXPORT", "SBATCH_CLUSTERS",
                  "SLURM_CLUSTERS", "SBATCH_GPUS_PER_NODE", "SBATCH_GPUS", "SBATCH_GPUS_PER_TASK",
                  "SBATCH_GPUS_PER_SOCKET")
GPU_INPUT_VARS = {"SBATCH_GRES": "--gres", "SBATCH_GPU_BIND": "--gpu-bind"}  # variable -> the option it sets


def _overrides_own(name: str, value: str) -> bool:
    """Whether sbatch's input variable `name` would override what the script's own lines say (OWN_INPUT_VARS,
    GPU_INPUT_VARS)."""
    if name in OWN_INPUT_VARS:
        return True
    option = GPU_INPUT_VARS.get(name)
    return option is not None and validate_sbatch_line(f"{option}={value}") is not None


def submit(script: Path, env: dict[str, str], cwd: Path) -> str:
    """sbatch the script, without the input variables that would override its own lines (OWN_INPUT_VARS,
    GPU_INPUT_VARS); returns the job id."""
    env = {k: v for k, v in env.items() if not _overrides_own(k, v)}
    out = _run(["sbatch", "--parsable", str(Path(script).resolve())], env=env, cwd=cwd).strip()
    job_id = out.split(";", 1)[0]  # "<id>" or "<id>;<cluster>"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch --parsable {script}: unexpected answer {out!r}")
    return job_id


def queue_state(job_id: str) -> str | None:
    """The job's state while squeue lists it (PENDING, RUNNING, COMPLETING, ...); None once it left the queue."""
    try:
        out = _run(["squeue", "-h", "-j", str(job_id), "-o", "%T"]).strip()
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    return out.splitlines()[0].strip() if out else None


def script_jobs(script: Path) -> dict[str, str]:
    """{job id: state} of this user's jobs that Slurm still knows (queued, running, or finished within MinJobAge:
    ``squeue --states=all``) with `script` as their batch script: the jobs of one step (its script's path is the
    step's own), oldest first. What finds a job whose id sbatch never printed (it queued the job, then timed out or
    was killed)."""
    out = _run(["squeue", "-h", "--states=all", "-u", str(os.getuid()), "-o", "%i|%T|%o"])
    path = str(Path(script).resolve())
    jobs = {}
    for line in out.splitlines():
        job_id, _, rest = line.partition("|")
        state, _, command = rest.partition("|")
        if job_id.strip().isdigit() and command.strip() == path:
            jobs[job_id.strip()] = state.strip()
    return dict(sorted(jobs.items(), key=lambda item: int(item[0])))


_KV_RE = re.compile(r"(\w+)=(\S*)")


def _job_fields(text: str) -> dict[str, str]:
    """The Key=Value fields of ``scontrol show job -o``, each key's first. Values are single words, except the job's
    name (JobName, before UserId) and the paths at the end (Command, WorkDir, StdOut, ...): these may hold spaces,
    and then text that reads as a field (a run directory ".../x ExitCode=0:0 JobState=COMPLETED" would make a failed
    job COMPLETED). The fields read here (JobState, Reason, ExitCode, NodeList) come after the name, before the
    paths."""
    _, sep, rest = text.partition(" UserId=")
    fields: dict[str, str] = {}
    for key, value in _KV_RE.findall("UserId=" + rest if sep else text):
        fields.setdefault(key, value)
    return fields


def job_info(job_id: str) -> JobInfo:
    """State and exit code from ``scontrol show job`` (Slurm forgets finished jobs after MinJobAge; then
    state is "UNKNOWN")."""
    try:
        out = _run(["scontrol", "show", "job", "-o", str(job_id)])
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return JobInfo(job_id=str(job_id), state="UNKNOWN", reason="Slurm no longer knows the job")
        raise
    fields = _job_fields(out)
    exit_code = sig = None
    exit_field, node_list = fields.get("ExitCode", ""), fields.get("NodeList")
    if ":" in exit_field:
        a, b = exit_field.split(":", 1)
        exit_code, sig = (int(a) if a.isdigit() else None), (int(b) if b.isdigit() else None)
    nodes = []
    if node_list and node_list != "(null)":
        try:
            nodes = _run(["scontrol", "show", "hostnames", node_list]).split()
        except SlurmError:
            nodes = [node_list]
    return JobInfo(job_id=str(job_id), state=fields.get("JobState", "UNKNOWN"), exit_code=exit_code, signal=sig,
                   reason=fields.get("Reason"), nodes=nodes)


def cancel(job_id: str, signal_name: str | None = None) -> None:
    argv = ["scancel"] + ([f"--signal={signal_name}"] if signal_name else []) + [str(job_id)]
    _run(argv)


CANCEL_ATTEMPTS = 3  # scancel calls for one job before giving up (each at most COMMAND_TIMEOUT_S)
CANCEL_PAUSE_S = 2.0  # between two of them


def cancel_retried(job_id: str, log_path: Path, what: str = "") -> bool:
    """scancel the job, again after a failure (the controller did not answer, or refused), at most CANCEL_ATTEMPTS
    times CANCEL_PAUSE_S apart: a job left running holds its nodes until a later attempt of the step finds it. Every
    failed call is noted in `log_path`, and so is the outcome once one failed; True when scancel answered."""
    for attempt in range(1, CANCEL_ATTEMPTS + 1):
        try:
            cancel(job_id)
        except SlurmError as exc:
            last = attempt == CANCEL_ATTEMPTS
            note(log_path, f"scancel {job_id}{what} (attempt {attempt} of {CANCEL_ATTEMPTS}): {exc}"
                           + ("" if last else f"; trying again in {CANCEL_PAUSE_S:g}s"))
            if not last:
                time.sleep(CANCEL_PAUSE_S)
            continue
        if attempt > 1:
            note(log_path, f"scancel {job_id}{what}: done at attempt {attempt} of {CANCEL_ATTEMPTS}")
        return True
    note(log_path, f"could not cancel Slurm job {job_id}{what}: scancel failed {CANCEL_ATTEMPTS} times; the job may "
                   "still be running (the next run of this step cancels it)")
    return False


def wait_gone(job_id: str, timeout_s: float = 60.0, poll_s: float = 0.5) -> bool:
    """Poll until squeue no longer lists the job; False if it still does after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if queue_state(job_id) is None:
            return True
        time.sleep(poll_s)
    return queue_state(job_id) is None


def map_state(info: JobInfo) -> tuple[str, str]:
    """(launcher status, reason) of a job that ended by itself or by someone else's hand (a job nsa-validate
    cancelled keeps the launcher's own verdict: timeout or hang)."""
    state = info.state.split()[0].rstrip("+") if info.state else "UNKNOWN"
    code = f"exit code {info.exit_code}" if info.exit_code is not None else "exit code unknown"
    if info.signal:
        code += f", signal {info.signal}"
    head = f"Slurm job {info.job_id}"
    if state == "COMPLETED" and (info.exit_code in (0, None)):
        return "ok", f"{head} COMPLETED"
    if state in ("TIMEOUT", "DEADLINE"):
        return "timeout", f"{head}: {_STATE_TEXT[state]}"
    if state in _STATE_TEXT:
        return "failed", f"{head}: {_STATE_TEXT[state]} ({code})"
    if state == "UNKNOWN":
        return "failed", f"{head}: final state unknown ({info.reason or 'scontrol does not know the job'})"
    return "failed", f"{head} ended in state {state} ({code})"


class SlurmRun(Run):
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
        return self.spec.batch_script()

    def execute(self) -> None:
        if self._cancel_stale():  # what its ranks wrote until now (heartbeats, dumps) is not this job's
            self.started = time.time()
        self.begin_watch()
        try:
            text = self.script_text()
        except ValueError as exc:  # a path Slurm cannot take (validation.launch.sbatch.sbatch_path_problem)
            self.error = f"could not write the Slurm batch script: {exc}"
            note(self.log_path, self.error)
            return
        self.script.write_text(text)
        # the launch's environment without an enclosing allocation's SLURM_* (the job inherits what sbatch gets)
        env = submission_env(self.spec.child_env(), keep=set(self.spec.exported_env()))
        env[LAUNCH_ID_VAR] = ",".join(filter(None, (env.get(LAUNCH_ID_VAR, ""), self.launch_id)))
        cancelled = ""
        try:
            try:
                with signals_deferred():  # a signal between sbatch and recording the job id would lose the job
                    # until the id is known, the file says a submission may have queued a job of this script (a
                    # later attempt finds it by the script: _cancel_stale)
                    write_json(self.job_file, {"job_id": None, "script": str(self.script.resolve()),
                                               "submitted": time.time(), "state": "SUBMITTING"})
                    try:
                        self.job_id = submit(self.script, env, Path(self.spec.cwd))
                    except SlurmError as exc:
                        self.job_id = self._submitted_anyway(exc)
                        if self.job_id is None:
                            raise
                    write_json(self.job_file, {"job_id": self.job_id, "script": str(self.script.resolve()),
                                               "submitted": time.time(), "state": "SUBMITTED"})
            except SlurmError as exc:
                self.error = f"could not submit the Slurm job: {exc}"
                note(self.log_path, self.error)
                return
            note(self.log_path, f"submitted Slurm job {self.job_id} ({self.spec.nnodes} node(s))")
            cancelled = self._follow()
        except KeyboardInterrupt as exc:  # also one held back during submission: the job is cancelled either way
            if self.job_id is not None:
                note(self.log_path, f"interrupted ({describe_interrupt(exc)} to the launcher): cancelling Slurm job "
                                    f"{self.job_id}")
                self._cancel()
            raise
        except BaseException as exc:  # a failing callback, a full disk: the job must not outlive the launch
            if self.job_id is not None:
                note(self.log_path, f"launcher error ({type(exc).__name__}: {clip(str(exc), 160)}): cancelling "
                                    f"Slurm job {self.job_id}")
                self._cancel()
            raise
        info = self._final_info()
        self.nodes = info.nodes
        # a batch script killed by signal N (Slurm's ExitCode 0:N) is -N, as a local child killed by it
        self.returncode = -info.signal if info.signal else info.exit_code
        if cancelled:  # timeout / hang: our own verdict stands
            self.how_ended = f"scancel of Slurm job {self.job_id}"
        else:
            self.status, reason = map_state(info)
            self.scheduler_reason = None if self.status == "ok" else reason
        write_json(self.job_file, {"job_id": self.job_id, "script": str(self.script), "state": info.state,
                                   "exit_code": info.exit_code, "nodes": info.nodes, "status": self.status})

    def _submitted_anyway(self, exc: SlurmError) -> str | None:
        """The job sbatch queued although it failed to answer (`exc`: it timed out, or was killed, after the
        controller took the job): squeue lists it with this step's script. Followed as if sbatch had answered (any
        other such job is cancelled); None when squeue lists none (or cannot say: the file still says SUBMITTING,
        and the next attempt of this step looks again)."""
        try:
            found = script_jobs(self.script)
        except SlurmError as err:
            note(self.log_path, f"sbatch failed ({exc}) and squeue cannot say whether it queued a job: {err}")
            return None
        if not found:
            return None
        job_id = list(found)[-1]
        others = [j for j, state in found.items() if j != job_id and state not in FINAL_STATES]
        note(self.log_path, f"sbatch failed ({exc}), but Slurm lists job {job_id} of this step's script: following "
                            "it")
        for other in others:
            note(self.log_path, f"cancelling Slurm job {other}, another job of this step's script")
            cancel_retried(other, self.log_path)
        return job_id

    def _final_info(self) -> JobInfo:
        """The job's final state (it left the queue; COMPLETING ends soon); UNKNOWN when Slurm cannot say."""
        info = None
        for _ in range(10):
            try:
                info = job_info(self.job_id)
            except SlurmError as exc:  # the controller did not answer: ask again, then give up
                info = JobInfo(job_id=self.job_id, state="UNKNOWN", reason=str(exc))
            if info.state in FINAL_STATES:
                break
            time.sleep(0.5)
        return info

    def _follow(self) -> str:
        """Poll until the job leaves the queue; returns "" or why it was cancelled ("timeout" / "hang")."""
        spec = self.spec
        state = None
        while True:
            if time.monotonic() >= self.deadline:
                self.status = "timeout"
                if state == "PENDING":  # the job never started: say so, and why Slurm held it
                    self.scheduler_reason = self._never_started()
                self._cancel()
                return "timeout"
            try:
                state = queue_state(self.job_id)
            except SlurmError as exc:  # a slow controller: try again at the next poll
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

    def _never_started(self) -> str:
        """The reason of a step that timed out while its job was still PENDING (Slurm's Reason: Resources,
        Priority, QOSMaxJobsPerUserLimit, ...)."""
        try:
            why = job_info(self.job_id).reason
        except SlurmError:
            why = None
        return (f"timed out after {self.spec.timeout_s:g}s (counted from submission) with Slurm job {self.job_id} "
                f"still PENDING ({why or 'reason unknown'}): it never started; processes ended with scancel of "
                f"Slurm job {self.job_id}")

    def _remote_dumps(self, verdict) -> list[int]:
        """Stalled ranks on other hosts (every stalled rank with remote_dumps=True), and the ranks there not yet
        stalled (Verdict.dump_ranks), are asked for stack dumps by
        the trainer's watchdog, run once on every node of the job (srun --overlap); returns those ranks."""
        host = socket.gethostname()
        ranks = [r for r in verdict.dump_ranks
                 if self.spec.remote_dumps or verdict.latest.get(r, {}).get("host") not in (None, host)]
        if not ranks or self.out_dir is None:
            return []
        self.remote_dump_ranks = ranks
        argv = ["srun", f"--jobid={self.job_id}", "--overlap", f"--nodes={self.spec.nnodes}", "--ntasks-per-node=1",
                sys.executable, "-m", "nsa.training.watchdog", "--dir", str(self.out_dir.resolve()), "--once", "--halt", "0",
                "--include-earlier", "--stall-after", f"{self.spec.stall_timeout_s:g}",
                "--ranks", str(self.expected_ranks)]
        note(self.log_path, f"stall: asking rank(s) {ranks} on the job's nodes for stack dumps: {' '.join(argv)}")
        try:
            # the launch's whole environment (with inherit_env, spec.env holds only the step's own variables: srun
            # would run without PATH, SLURM_CONF, ...), less an enclosing allocation's SLURM_* (submission_env)
            env = submission_env(self.spec.child_env(), keep=set(self.spec.exported_env()))
            out = subprocess.run(argv, cwd=self.spec.cwd, env=env, capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL, encoding="utf-8", errors="replace")
            if out.returncode not in (0, 1):  # the watchdog's 1 means "stalled": what we expect
                note(self.log_path, f"srun watchdog exited {out.returncode}: {clip(out.stderr.strip())}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            note(self.log_path, f"srun watchdog: {exc}")
        return ranks

    def _cancel(self) -> None:
        if not cancel_retried(self.job_id, self.log_path):
            return
        try:
            gone = wait_gone(self.job_id, timeout_s=max(60.0, self.spec.term_grace_s * 3))
        except SlurmError as exc:
            note(self.log_path, f"after scancel {self.job_id}: {exc}")
            return
        if not gone:
            note(self.log_path, f"Slurm job {self.job_id} is still listed by squeue after scancel")

    def _cancel_stale(self) -> bool:
        """A job this step submitted before (an nsa-validate that was killed) must not run beside the new one;
        True when there was one to cancel."""
        try:
            record = json.loads(self.job_file.read_text())
            old, state = record.get("job_id"), record.get("state")
        except (OSError, ValueError, AttributeError):
            return False
        try:
            if not old and state == "SUBMITTING":  # an earlier submission whose answer never came
                found = [j for j, s in script_jobs(self.script).items() if s not in FINAL_STATES]
            else:
                found = [str(old)] if old and queue_state(str(old)) is not None else []
        except SlurmError as exc:
            note(self.log_path, f"could not check the earlier Slurm job {old or 'of this step'}: {exc}")
            return bool(old)
        for job in found:
            note(self.log_path, f"cancelling Slurm job {job}, left running by an earlier run of this step")
            if not cancel_retried(job, self.log_path, " (the earlier job)"):
                continue
            try:
                wait_gone(job)
            except SlurmError as exc:
                note(self.log_path, f"after scancel of the earlier Slurm job {job}: {exc}")
        return bool(found)
