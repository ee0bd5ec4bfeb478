"""From a runbook to concrete launches: the exact argv, environment and timeout of every process a step starts.

Each step's kind builds its launches (validation.kinds: StepKind.launches) as validation.launch.LaunchSpec records.
`nsa-validate plan` prints these without running anything; the runner executes the same records, so what the plan
shows is what runs. Trainer launches always write into their own directory (--out-dir RUN_DIR/<step>/...),
whatever out_dir the config names.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from pathlib import Path
from typing import Any

from validation.launch import environment
from validation.launch.spec import RANKS_DIR, LaunchSpec
from validation.launch.torchrun import PLAN_PORT, local_command_lines
from validation.results.codec import decode, encode
from validation.runbook.loader import Runbook, Step

Num = int | float


@dataclasses.dataclass(frozen=True)
class PlannedLaunch:
    """One launch of a step in the plan (what `plan --json` prints for it): its label, argv, wrapper and env, the
    command lines the launcher runs for it on this machine, its ranks and nodes, launcher, directory, limits, the
    winners it waits for and, for a Slurm launch, its batch script."""
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


def planned(runbook: Runbook, skipped: dict[str, str] | None = None) -> list[PlannedStep]:
    """The plan of `runbook` as records (describe's JSON, read by text_lines)."""
    skipped = skipped or {}
    return [PlannedStep(
        phase=step.phase, step=step.name, kind=step.kind, skip=skipped.get(step.name),
        notes=runbook.step_notes(step.name),
        jobs=step.kind_impl.concurrency(step),  # launches run this many at a time (pytest, sanitizer)
        launches=[PlannedLaunch(
            label=spec.label, argv=spec.argv, wrapper=spec.wrapper, env=spec.env,
            # what the launcher runs (launch.torchrun.local_command_lines), the port still to pick
            commands=([] if spec.launcher == "slurm" else
                      local_command_lines(spec, PLAN_PORT, Path(spec.step_dir) / RANKS_DIR)),
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


def text_lines(runbook: Runbook, rows: list[dict[str, Any]] | list[PlannedStep]) -> list[tuple[str, str | None]]:
    """What `nsa-validate plan` prints, as (line, style) pairs: per step its header, notes, and every command the
    launcher runs for it (or a Slurm launch's batch script) with its limits; then the acceptance criteria."""
    kinds = {step.name: step.kind_impl for step in runbook.steps()}
    out: list[tuple[str, str | None]] = [(f"{runbook.name}: {runbook.description}" if runbook.description else
                                          runbook.name, "bold")]
    for row in (r if isinstance(r, PlannedStep) else decode(PlannedStep, r, f"plan[{i}]") for i, r in enumerate(rows)):
        out.append(("", None))
        out.append((f"{row.phase} / {row.step} ({row.kind})"
                    + (f"  SKIPPED here: {row.skip}" if row.skip else ""), "yellow" if row.skip else "bold"))
        note = kinds[row.step].plan_note
        if note:
            out.append((f"  {note}", None))
        if row.jobs > 1:
            out.append((f"  its launches run up to {row.jobs} at a time (jobs: {row.jobs})", None))
        out += [(f"  note: {text}", None) for text in row.notes]  # its own value overriding a --set default
        for launch in row.launches:
            label = f"[{launch.label}] " if launch.label else ""
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
