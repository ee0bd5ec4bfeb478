"""From a runbook to concrete launches: the exact argv, environment and timeout of every process a step starts.

Each step's kind builds its launches (validation.kinds: StepKind.launches) as validation.launch.LaunchSpec records.
`nsa-validate plan` prints these without running anything; the runner executes the same records, so what the plan
shows is what runs. Trainer launches always write into their own directory (--out-dir RUN_DIR/<step>/...),
whatever out_dir the config names.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
from pathlib import Path
from typing import Any, Mapping

from validation.kinds.base import RETRY_KEY
from validation.launch import environment
from validation.launch.spec import RANKS_DIR, LaunchSpec
from validation.launch.torchrun import PLAN_PORT, local_command_lines
from validation.results.codec import decode, encode
from validation.runbook.loader import Runbook, Step

Num = int | float


@dataclasses.dataclass(frozen=True)
class PlannedLaunch:
    """One launch of a step in the plan (what `plan --json` prints for it): its label, argv, wrapper and env (the
    variables it starts with on top of this process's environment: launch_env), the command lines the launcher runs
    for it on this machine, its ranks and nodes, launcher, directory, limits, the winners it waits for and, for a
    Slurm launch, its batch script."""
    label: str | None
    argv: list[Any]
    wrapper: list[Any]
    env: dict[str, Any]
    commands: list[list[str]]
    nproc_per_node: int
    nnodes: int
    launcher: str | None
    dir: str | None
    timeout_s: Num | None
    stall_timeout_s: Num | None
    waits_for: list[str]
    batch_script: str | None


@dataclasses.dataclass(frozen=True)
class PlannedStep:
    """One step of the plan: its phase, name and kind, why it would be skipped here, its notes, how many of its
    launches run at a time and its launches (describe's docstring)."""
    phase: str | None
    step: str
    kind: str
    skip: str | None
    notes: list[str]
    jobs: int
    launches: list[PlannedLaunch]


def step_launches(step: Step, winners: dict[str, dict[str, Any]] | None = None,
                  run_dir: Path | None = None) -> list[LaunchSpec]:
    """Every process `step` starts, in order. winners=None (plan mode) leaves ${...winner...} references as text;
    run_dir=None writes paths as RUN_DIR/..."""
    return step.kind_impl.launches(step, winners, run_dir)


def plan(runbook: Runbook) -> list[tuple[Step, list[LaunchSpec]]]:
    return [(step, step_launches(step)) for step in runbook.steps()]


THREADS_VAR = "OMP_NUM_THREADS"


def launch_env(step: Step, spec: LaunchSpec, environ: Mapping[str, str] | None = None,
               cpus: int | None = None) -> dict[str, str]:
    """The variables a launch of `step` is started with on top of this process's environment (`environ`, default
    os.environ; `cpus`, default os.cpu_count()): the spec's own, plus, for a trainer launch or several ranks run by
    torchrun on this machine where neither sets OMP_NUM_THREADS, this machine's cores shared between its ranks
    (OMP_NUM_THREADS = cpus // world size, at least 1). A Slurm node keeps torchrun's own default."""
    env = dict(spec.env)
    environ = os.environ if environ is None else environ
    if ((spec.nproc_per_node > 1 or step.is_training) and spec.launcher == "torchrun"
            and THREADS_VAR not in environ and THREADS_VAR not in env):
        cpus = os.cpu_count() if cpus is None else cpus
        env[THREADS_VAR] = str(max(1, (cpus or 1) // max(1, spec.world_size)))
    return env


def planned_port(spec: LaunchSpec) -> int | str:
    """The port a planned launch's torchrun command shows: the runbook's master_port when it gives one (the first
    attempt uses it; a clash is retried on a free port), else PLAN_PORT (the launcher picks a free one)."""
    return spec.master_port if spec.master_port is not None else PLAN_PORT


def planned(runbook: Runbook, skipped: dict[str, str] | None = None) -> list[PlannedStep]:
    """The plan of `runbook` as records (describe's JSON, read by text_lines)."""
    skipped = skipped or {}
    return [PlannedStep(
        phase=step.phase, step=step.name, kind=step.kind, skip=skipped.get(step.name),
        notes=runbook.step_notes(step.name),
        jobs=step.kind_impl.concurrency(step),  # launches run this many at a time (pytest, sanitizer)
        launches=[PlannedLaunch(
            label=spec.label, argv=spec.argv, wrapper=spec.wrapper, env=launch_env(step, spec),
            # what the launcher runs (launch.torchrun.local_command_lines), a port not given still to pick
            commands=([] if spec.launcher == "slurm" else
                      local_command_lines(spec, planned_port(spec), Path(spec.step_dir) / RANKS_DIR)),
            nproc_per_node=spec.nproc_per_node, nnodes=spec.nnodes, launcher=spec.launcher, dir=spec.dir,
            timeout_s=spec.timeout_s, stall_timeout_s=spec.stall_timeout_s, waits_for=spec.unresolved,
            batch_script=spec.batch_script()) for spec in launches])
        for step, launches in plan(runbook)]


def describe(runbook: Runbook, skipped: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A JSON-ready description of the plan (also what `nsa-validate plan --json` prints): per step its phase,
    kind, why it would be skipped here, `jobs` (how many of its launches run at a time), `notes` (its own values
    that override a --set default: precedence is --set of the step's key > the step's own key > --set of a
    defaults key > the file's defaults) and launches (each with `commands`: the command lines the launcher runs
    for it on this machine, from the launcher's own function; a Slurm launch shows its batch script instead)."""
    return [encode(step) for step in planned(runbook, skipped)]


def skipped_here(runbook: Runbook) -> dict[str, str]:
    """{step: why it would be skipped on this machine}: requirements it does not meet, or its kind's own reason (a
    tool not found). The machine is probed (torch imported) only when a step's requirements need it."""
    env = functools.cache(environment.probe)
    skipped = {}
    for step in runbook.steps():
        reason = environment.unmet_for(step, env) or step.kind_impl.skip_reason(step)
        if reason:
            skipped[step.name] = reason
    return skipped


def retried(step: Step) -> int:
    """How often the step runs a disturbed repeat again (its kind decides from repeats: ab, sweep, triage), else 0."""
    return step.launch.retry_disturbed if RETRY_KEY in step.kind_impl.launch_keys else 0


def text_lines(runbook: Runbook, rows: list[dict[str, Any]] | list[PlannedStep]) -> list[tuple[str, str | None]]:
    """What `nsa-validate plan` prints, as (line, style) pairs: per step its header, notes, and every command the
    launcher runs for it (or a Slurm launch's batch script) with its limits; then the acceptance criteria. A command's
    line, read by a POSIX shell (shlex.split), is its launch's `[label]` as one word when it has a label, then a
    NAME=value word per variable, then the argv."""
    steps = {step.name: step for step in runbook.steps()}
    out: list[tuple[str, str | None]] = [(f"{runbook.name}: {runbook.description}" if runbook.description else
                                          runbook.name, "bold")]
    for row in (r if isinstance(r, PlannedStep) else decode(PlannedStep, r, f"plan[{i}]") for i, r in enumerate(rows)):
        out.append(("", None))
        out.append((f"{row.phase} / {row.step} ({row.kind})"
                    + (f"  SKIPPED here: {row.skip}" if row.skip else ""), "yellow" if row.skip else "bold"))
        note = steps[row.step].kind_impl.plan_note
        if note:
            out.append((f"  {note}", None))
        retries = retried(steps[row.step])
        if retries:  # launches decided while the step runs (validation.kinds.trainer.run_all)
            out.append((f"  a repeat measured while other work used the machine is run again, every launch of it, up "
                        f"to {retries} time(s) (retry_disturbed: {retries}), each in <dir>_retry<attempt>", None))
        if row.jobs > 1:
            out.append((f"  its launches run up to {row.jobs} at a time (jobs: {row.jobs})", None))
        out += [(f"  note: {text}", None) for text in row.notes]  # its own value overriding a --set default
        for launch in row.launches:
            label = f"[{shlex.quote(launch.label)}] " if launch.label else ""  # one word: a label may hold ' or a space
            env_text = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in launch.env.items())
            if launch.batch_script:  # launcher slurm: the script is what runs
                out.append((f"  {label}sbatch, {launch.nnodes} node(s), batch script:", None))
                out += [(f"    {line}", None) for line in launch.batch_script.rstrip().split("\n")]
            else:  # what the launcher runs: one command, or one torchrun agent per (emulated) node
                out += [(f"  {label}{env_text + ' ' if env_text else ''}{shlex.join(str(a) for a in argv)}", None)
                        for argv in launch.commands]
            extra = f"timeout {launch.timeout_s:g}s"
            if launch.stall_timeout_s:
                extra += f", stall after {launch.stall_timeout_s:g}s"
            if launch.waits_for:
                extra += f", uses the winner of {', '.join(launch.waits_for)}"
            out.append((f"    ({extra})", None))
    if runbook.acceptance:
        out += [("", None), ("acceptance", "bold")]
        out += [(f"  [{c.severity}] {c.name}: {c.expr.text}", None) for c in runbook.acceptance]
    return out
