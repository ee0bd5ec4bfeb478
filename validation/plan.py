"""From a runbook to concrete launches: the exact argv, environment and timeout of every process a step starts.

`nsa-validate plan` prints these without running anything; the runner executes the same objects, so what the
plan shows is what runs. Trainer launches always write into their own directory (--out-dir RUN_DIR/<step>/...),
whatever out_dir the config names.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validation import slurm
from validation.launcher import LOG_NAME, RANKS_DIR, RECORDED_ENV_PREFIXES, safe_name
from validation.runbook import Launch, Launcher, Runbook, Step, references, resolve_references



@dataclass
class PlannedLaunch:
    step: str
    label: str                      # "" for single-launch steps; the sweep point / ab variant otherwise
    argv: list[str]                 # without the torchrun prefix (the launcher adds it for nproc_per_node > 1)
    env: dict[str, str]             # variables set on top of the inherited environment
    nproc_per_node: int
    dir: str                        # relative to the run directory
    out_dir: str | None             # the trainer's out_dir, relative to the run directory
    timeout_s: float
    stall_timeout_s: float | None
    master_port: str | int = "auto"
    port_retries: int = 3
    params: dict[str, Any] = field(default_factory=dict)
    repeat: int = 0
    wrapper: list[str] = field(default_factory=list)  # e.g. nsys profile ... (profile steps)
    unresolved: list[str] = field(default_factory=list)  # winners this launch waits for
    launcher: Launcher = field(default_factory=Launcher)
    nnodes: int = 1
    torchrun: bool = False  # a trainer launch (torchrun even with one process)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def slurm_options(self) -> slurm.SlurmOptions:
        lc = self.launcher
        return slurm.SlurmOptions(partition=lc.partition, account=lc.account, time_limit=lc.time_limit,
                                  gpus_per_node=lc.gpus_per_node, cpus_per_task=lc.cpus_per_task, sbatch=lc.sbatch)

    def job_name(self) -> str:
        return "nsav-" + safe_name(f"{self.step}-{self.label}" if self.label else self.step)

    def batch_script(self, run_dir: Path | None = None, cwd: Path | None = None) -> str | None:
        """The Slurm batch script this launch submits (launcher slurm), paths under `run_dir` (RUN_DIR/...)."""
        if self.launcher.type != "slurm":
            return None
        return slurm.batch_script(job_name=self.job_name(), nnodes=self.nnodes, nproc_per_node=self.nproc_per_node,
                                  argv=[*self.wrapper, *self.argv], env=self.env, cwd=Path(cwd or Path.cwd()),
                                  log_path=Path(_at(run_dir, f"{self.dir}/{LOG_NAME}")),
                                  ranks_dir=Path(_at(run_dir, f"{self.dir}/{RANKS_DIR}")),
                                  options=self.slurm_options(), python=sys.executable, torchrun=self.torchrun)


def trainer_args(args: dict[str, Any]) -> list[str]:
    """{"steps": 300, "ddp": 1, "fsdp": True, "compile": False} -> ["--steps", "300", "--ddp", "1", "--fsdp"]."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def _at(run_dir: Path | None, rel: str) -> str:
    """A path for a command line: absolute under the run directory, or RUN_DIR/... in plan mode."""
    return str(Path(run_dir) / rel) if run_dir is not None else f"RUN_DIR/{rel}"


def _train_launch(step: Step, launch: Launch, label: str, rel_dir: str, winners, run_dir, extra_args=None,
                  extra_env=None, params=None, repeat: int = 0) -> PlannedLaunch:
    env = {**launch.env, **(extra_env or {})}
    args = {**launch.args, **(extra_args or {})}
    unresolved = sorted({r for v in list(env.values()) + list(args.values()) for r in references(v)})
    if winners is not None:
        env = {k: resolve_references(v, winners) for k, v in env.items()}
        args = {k: resolve_references(v, winners) for k, v in args.items()}
        unresolved = []
    argv = [sys.executable, "-m", "nsa.training"]
    if launch.config:
        argv += ["--config", launch.config]
    out_dir = f"{rel_dir}/out"
    argv += trainer_args(args) + ["--out-dir", _at(run_dir, out_dir)]
    return PlannedLaunch(step=step.name, label=label, argv=argv, env=env, nproc_per_node=launch.nproc_per_node,
                         dir=rel_dir, out_dir=out_dir, timeout_s=launch.timeout_s,
                         stall_timeout_s=launch.stall_timeout_s, master_port=launch.master_port,
                         port_retries=launch.port_retries, params=params or {}, repeat=repeat, unresolved=unresolved,
                         launcher=launch.launcher, nnodes=launch.nnodes,
                         torchrun=launch.nproc_per_node > 1 or launch.nnodes > 1 or launch.launcher.type == "slurm")


def _params_split(params: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    env = {k[4:]: str(v) for k, v in params.items() if k.startswith("env.")}
    args = {k[5:]: v for k, v in params.items() if k.startswith("args.")}
    return env, args


def step_launches(step: Step, winners: dict[str, dict[str, Any]] | None = None,
                  run_dir: Path | None = None) -> list[PlannedLaunch]:
    """Every process `step` starts, in order. winners=None (plan mode) leaves ${...winner...} references as text;
    run_dir=None writes paths as RUN_DIR/..."""
    base = step.name
    if step.kind in ("train", "longrun"):
        return [_train_launch(step, step.launch, "", base, winners, run_dir)]
    if step.kind == "profile":
        pl = _train_launch(step, step.launch, "", base, winners, run_dir,
                           extra_args={"profile_steps": step.profile_steps}, extra_env={"NSA_NVTX": "1"})
        if nsys_available(step):
            pl.wrapper = ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--force-overwrite", "true", "-o",
                          _at(run_dir, f"{base}/nsys_profile")]
        return [pl]
    if step.kind == "sweep":
        out = []
        for label, params in step.sweep_points():
            env, args = _params_split(params)
            out.append(_train_launch(step, step.launch, label, f"{base}/{safe_name(label)}", winners, run_dir,
                                     extra_args=args,
                                     extra_env=env, params=params))
        return out
    if step.kind == "ab":
        out = []
        for repeat in range(step.repeats):
            suffix = f"_r{repeat + 1}" if step.repeats > 1 else ""
            for label, variant in [("baseline", step.baseline), *step.variants.items()]:
                params = {**{f"env.{k}": v for k, v in variant.env.items()},
                          **{f"args.{k}": v for k, v in variant.args.items()}}
                out.append(_train_launch(step, step.launch, label, f"{base}/{label}{suffix}", winners,
                                         run_dir, extra_args=variant.args, extra_env=variant.env, params=params,
                                         repeat=repeat))
        return out
    if step.kind == "pytest":
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *step.tests,
                "--junitxml", _at(run_dir, f"{base}/pytest.xml"), *step.pytest_args]
        return [PlannedLaunch(step=step.name, label="", argv=argv, env=dict(step.launch.env), nproc_per_node=1,
                              dir=base, out_dir=None, timeout_s=step.launch.timeout_s, stall_timeout_s=None,
                              launcher=step.launch.launcher)]
    if step.kind == "bench":
        argv = [sys.executable, *step.command, "--json", _at(run_dir, f"{base}/bench.json")]
        return [PlannedLaunch(step=step.name, label="", argv=argv, env=dict(step.launch.env), nproc_per_node=1,
                              dir=base, out_dir=None, timeout_s=step.launch.timeout_s, stall_timeout_s=None,
                              launcher=step.launch.launcher)]
    if step.kind == "snapshot" and step.launch.launcher.type == "slurm":
        # the submitting machine runs in-process; every node of a job gets its own snapshot (nodes/<name>/)
        argv = [sys.executable, "-m", "validation.environment", _at(run_dir, f"{base}/nodes")]
        return [PlannedLaunch(step=step.name, label="nodes", argv=argv, env=dict(step.launch.env), nproc_per_node=1,
                              dir=base, out_dir=None, timeout_s=step.launch.timeout_s, stall_timeout_s=None,
                              launcher=step.launch.launcher, nnodes=step.launch.nnodes)]
    return []  # snapshot: runs in-process


def nsys_available(step: Step) -> bool:
    """Whether a profile step runs under Nsight Systems: profiler nsys, or auto with nsys on PATH."""
    if step.launch.launcher.type == "slurm":  # nsys here says nothing about the nodes; torch profiler there
        return False
    return step.profiler in ("nsys", "auto") and shutil.which("nsys") is not None


def plan(runbook: Runbook) -> list[tuple[Step, list[PlannedLaunch]]]:
    return [(step, step_launches(step)) for step in runbook.steps()]


def describe(runbook: Runbook, skipped: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A JSON-ready description of the plan (also what `nsa-validate plan --json` prints)."""
    skipped = skipped or {}
    rows = []
    for step, launches in plan(runbook):
        rows.append({
            "phase": step.phase, "step": step.name, "kind": step.kind, "skip": skipped.get(step.name),
            "launches": [{"label": pl.label, "argv": pl.argv, "wrapper": pl.wrapper, "env": pl.env,
                          "nproc_per_node": pl.nproc_per_node, "nnodes": pl.nnodes, "launcher": pl.launcher.type,
                          "dir": pl.dir, "timeout_s": pl.timeout_s, "stall_timeout_s": pl.stall_timeout_s,
                          "waits_for": pl.unresolved, "batch_script": pl.batch_script()} for pl in launches],
        })
    return rows


def recorded_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_ENV_PREFIXES)}
