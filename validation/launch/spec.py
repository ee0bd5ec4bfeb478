"""The launch record: ``LaunchSpec``, the one description of a process a step starts, from the plan to the end.

The planner (validation.runbook.plan, through each step kind) builds a LaunchSpec per process: argv, the variables the
step sets (``inherit_env=True``: they are added to this process's environment when it starts), its directory under
RUN_DIR, timeouts, nodes and launcher. ``nsa-validate plan`` prints these records; the runner hands the same records,
with the working directory and a progress callback filled in, to ``launch``. Whether a launch goes through torchrun
is decided once, by ``LaunchSpec.uses_torchrun``, and whether it is a Slurm job by ``LaunchSpec.launcher``.

A LaunchSpec built directly (the launcher's own tests, benchmarks) gives the child's whole environment in ``env``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from validation.launch import sbatch
from validation.launch.sbatch import SlurmOptions

STATUSES = ("ok", "failed", "timeout", "hang", "interrupted", "error")

COMMAND_JSON = "command.json"
LOG_NAME = "stdout.log"
RANKS_DIR = "ranks"
TERM_GRACE_S = 10.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the processes to be gone
DUMP_WAIT_S = 5.0  # after SIGUSR1 on a stall, how long to wait for the stack dump files
CLASH_WINDOW_S = 120.0  # a port clash is only retried when the attempt failed within this many seconds
EXCERPT_MAX_LINES = 40
PLAN_RUN_DIR = Path("RUN_DIR")  # where a planned launch's paths point before a run directory exists

LAUNCH_ID_VAR = "NSAV_LAUNCH_ID"  # added to the child's environment: finds every process of a run (ProcessTree)
# Environment prefixes recorded with every launch (command.json, results.json); the rest is inherited as is.
RECORDED_ENV_PREFIXES = ("NSA_", "NCCL_", "TORCH_", "CUDA_", "OMP_", "CONFIG")
_SECRET_RE = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY", re.IGNORECASE)


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
    """What to run and how to watch it. `env` is used as given (``inherit_env``: added to os.environ), plus
    ``LAUNCH_ID_VAR``. A port clash (torchrun failed within ``CLASH_WINDOW_S`` and its log says "address already in
    use") is retried on a fresh free port up to `port_retries` times, also when `master_port` was given;
    ``port_retries=0`` insists on the port."""

    argv: list[str]  # the command WITHOUT any torchrun prefix, e.g. [sys.executable, "-m", "nsa.training", ...]
    env: dict[str, str]  # the child's whole environment; with inherit_env, only the launch's own variables
    cwd: Path = Path(".")
    step_dir: Path = Path(".")  # command.json, stdout.log, ranks/ go here (created)
    nproc_per_node: int = 1  # > 1 (or torchrun=True): run through torchrun
    torchrun: bool = False  # a trainer launch: torchrun even with one process (see uses_torchrun)
    master_port: int | None = None  # None: a free port
    port_retries: int = 3  # port clashes retried on a fresh port (0: never)
    timeout_s: float = 3600.0  # for the whole launch, retries included
    trainer_out_dir: Path | None = None  # the trainer's out_dir: progress from its heartbeats, stall watch
    stall_timeout_s: float | None = None  # None: no stall watch (needs trainer_out_dir)
    expected_ranks: int | None = None  # ranks that must write heartbeats; None: nproc_per_node * nnodes
    poll_s: float = 1.0
    on_progress: Callable[[Progress], None] | None = None
    wrapper: list[str] = field(default_factory=list)  # a command the launch runs under, e.g. nsys profile ...
    term_grace_s: float = TERM_GRACE_S  # SIGTERM -> SIGKILL when ending the run
    telemetry_s: float | None = None  # device telemetry every this many seconds into step_dir (launch.telemetry)
    # multi-node and schedulers
    launcher: str = "torchrun"  # "torchrun": processes on this machine; "slurm": an sbatch job (launch.slurm)
    nnodes: int = 1  # torchrun: > 1 starts that many agents here (emulated nodes); slurm: nodes of the job
    rdzv_backend: str = "c10d"  # torchrun multi-node: "c10d" rendezvous or "static" (--node-rank/--master-addr)
    rdzv_endpoint: str | None = None  # torchrun multi-node "host:port"; None: 127.0.0.1 and a free port
    slurm: SlurmOptions | None = None  # the job's allocation (launcher slurm)
    remote_dumps: bool | None = None  # launcher slurm, on a stall: None: ranks on other hosts are asked for stack
    # dumps by `srun --overlap python -m nsa.training.watchdog --once` on every node; True: every rank that way (tests)
    job_env: dict[str, str] | None = None  # exported by the batch script; None: see exported_env()
    job_name: str = "nsav"  # the Slurm job name
    # the plan's view of the launch
    inherit_env: bool = False  # env holds only the variables the step sets, on top of os.environ at start
    run_dir: Path | None = None  # the run directory step_dir and trainer_out_dir lie in (None: PLAN_RUN_DIR)
    step: str = ""  # the runbook step this launch belongs to
    label: str = ""  # "" for single-launch steps; the sweep point / ab variant otherwise
    params: dict[str, Any] = field(default_factory=dict)  # {"env.X": v, "args.y": w} of a sweep point / variant
    repeat: int = 0
    unresolved: list[str] = field(default_factory=list)  # sweep winners this launch waits for (plan mode)
    window: int | None = None  # a trainer launch's statistics window (last N steps), when not its step's (an A/B variant)

    # ------------------------------------------------------------------ derived, decided here only
    @property
    def uses_torchrun(self) -> bool:
        """Whether the command runs under torchrun (locally, or in every node's task of a Slurm job)."""
        return self.torchrun or self.nproc_per_node > 1 or self.nnodes > 1

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def dir(self) -> str:
        """step_dir relative to the run directory, e.g. "bucket_sweep/NSA_DDP_BUCKET_MB_25"."""
        return _relative(self.step_dir, self.run_dir)

    @property
    def out_dir(self) -> str | None:
        """The trainer's out_dir relative to the run directory, or None (not a trainer launch)."""
        return None if self.trainer_out_dir is None else _relative(self.trainer_out_dir, self.run_dir)

    def cores(self) -> float | None:
        """The cores the launch is set to use on one node: its ranks there (nproc_per_node, or one process without
        torchrun) times each rank's threads (OMP_NUM_THREADS of its environment; torchrun sets 1 for several ranks
        where it is unset); None (every core) when nothing says."""
        threads = self.child_env().get("OMP_NUM_THREADS")
        try:
            per_rank = int(threads) if threads else (1 if self.uses_torchrun and self.nproc_per_node > 1 else None)
        except ValueError:
            per_rank = None
        return None if not per_rank or per_rank < 1 else float(per_rank * (self.nproc_per_node or 1))

    def child_env(self) -> dict[str, str]:
        """The environment the child starts with (before LAUNCH_ID_VAR is added)."""
        return {**os.environ, **self.env} if self.inherit_env else dict(self.env)

    def exported_env(self) -> dict[str, str]:
        """What a Slurm batch script exports: the step's own variables (job_env, or env with inherit_env), else
        the recorded NSA_/NCCL_/TORCH_/... variables of env; the job inherits the rest from sbatch."""
        if self.job_env is not None:
            return dict(self.job_env)
        return dict(self.env) if self.inherit_env else recorded_env(self.env)[0]

    def slurm_options(self) -> SlurmOptions:
        return self.slurm or SlurmOptions()

    def batch_script(self) -> str | None:
        """The Slurm batch script this launch submits (launcher slurm), else None. A planned launch (no run
        directory) shows its paths as RUN_DIR/...; a launch about to run, as absolute paths."""
        if self.launcher != "slurm":
            return None
        def where(path: Path) -> Path:  # a planned launch's RUN_DIR/... stays as it is
            return Path(path) if self.run_dir is None and not Path(path).is_absolute() else Path(path).resolve()

        return sbatch.batch_script(job_name=self.job_name, nnodes=self.nnodes, nproc_per_node=self.nproc_per_node,
                                  argv=[*self.wrapper, *self.argv], env=self.exported_env(),
                                  cwd=Path(self.cwd).resolve(), log_path=where(Path(self.step_dir) / LOG_NAME),
                                  ranks_dir=where(Path(self.step_dir) / RANKS_DIR), options=self.slurm_options(),
                                  python=sys.executable, torchrun=self.uses_torchrun, telemetry_s=self.telemetry_s,
                                  telemetry_dir=where(Path(self.step_dir)), cores=self.cores())


def _relative(path: Path, run_dir: Path | None) -> str:
    return str(Path(path).relative_to(run_dir if run_dir is not None else PLAN_RUN_DIR))


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


SAFE_NAME_MAX = 100  # bytes: a file name holds 255, and a step's names get suffixes (_r2, a prefix of a scan)


def safe_name(text: str) -> str:
    """`text` as a file-name and id component: every character but letters, digits and -_. becomes _, and so does a
    leading `.`, so the result (a matrix value, a test file) is one name inside its directory: never `.` or `..`
    (nor hidden), never a path. A name longer than SAFE_NAME_MAX bytes keeps its start and ends with 8 hex digits of
    the text's sha256, so that two long values stay two names and no name exceeds a file system's 255 bytes."""
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
    out = "_" + out[1:] if out.startswith(".") else out
    if len(out.encode()) <= SAFE_NAME_MAX:
        return out
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    head = out[:SAFE_NAME_MAX - 9]
    while len(head.encode()) > SAFE_NAME_MAX - 9:  # letters of other scripts take several bytes
        head = head[:-1]
    return f"{head}_{digest}"


def recorded_env(env: dict[str, str], *, only_prefixed: bool = False) -> tuple[dict[str, str], list[str]]:
    """What is recorded of a launch's environment `env` (values of secret-looking names redacted), and the names
    os.environ has but `env` lacks. command.json keeps the variables that differ from os.environ plus every
    NSA_/NCCL_/TORCH_/CUDA_/OMP_/CONFIG* one; results.json (``only_prefixed``) keeps the prefixed ones the step sets."""
    kept = {}
    for key, value in sorted(env.items()):
        if key.startswith(RECORDED_ENV_PREFIXES) or (not only_prefixed and os.environ.get(key) != value):
            kept[key] = "<redacted>" if _SECRET_RE.search(key) else value
    unset = [] if only_prefixed else sorted(k for k in os.environ if k not in env)
    return kept, unset


def validate(spec: LaunchSpec) -> None:
    """Raise TypeError/ValueError for a spec that cannot be launched."""
    if not isinstance(spec.argv, (list, tuple)) or not spec.argv or not all(isinstance(a, str) for a in spec.argv):
        raise TypeError(f"LaunchSpec.argv must be a non-empty list of str, got {spec.argv!r}")
    if not isinstance(spec.wrapper, (list, tuple)) or not all(isinstance(a, str) for a in spec.wrapper):
        raise TypeError(f"LaunchSpec.wrapper must be a list of str, got {spec.wrapper!r}")
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
    if spec.telemetry_s is not None and (isinstance(spec.telemetry_s, bool)  # NaN too: `not NaN > 0`
                                         or not isinstance(spec.telemetry_s, (int, float)) or not spec.telemetry_s > 0):
        raise ValueError(f"LaunchSpec.telemetry_s must be None or > 0, got {spec.telemetry_s!r}")
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
    if spec.rdzv_endpoint is not None and not (
            re.fullmatch(r"[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}", spec.rdzv_endpoint)
            and 1 <= int(spec.rdzv_endpoint.rsplit(":", 1)[1]) <= 65535):
        raise ValueError(f"LaunchSpec.rdzv_endpoint must be host:port (a port from 1 to 65535), got "
                         f"{spec.rdzv_endpoint!r}")
    if spec.on_progress is not None and not callable(spec.on_progress):
        raise TypeError("LaunchSpec.on_progress must be callable")
