"""From a runbook to concrete launches: the exact argv, environment and timeout of every process a step starts.

Each step's kind builds its launches (validation.steps: StepKind.launches) as validation.launch.LaunchSpec records.
`nsa-validate plan` prints these without running anything; the runner executes the same records, so what the plan
shows is what runs. Trainer launches always write into their own directory (--out-dir RUN_DIR/<step>/...),
whatever out_dir the config names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from validation.launch.spec import LaunchSpec
from validation.runbook import Runbook, Step


def step_launches(step: Step, winners: dict[str, dict[str, Any]] | None = None,
                  run_dir: Path | None = None) -> list[LaunchSpec]:
    """Every process `step` starts, in order. winners=None (plan mode) leaves ${...winner...} references as text;
    run_dir=None writes paths as RUN_DIR/..."""
    return step.kind_impl.launches(step, winners, run_dir)


def plan(runbook: Runbook) -> list[tuple[Step, list[LaunchSpec]]]:
    return [(step, step_launches(step)) for step in runbook.steps()]


def describe(runbook: Runbook, skipped: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A JSON-ready description of the plan (also what `nsa-validate plan --json` prints): per step its phase,
    kind, why it would be skipped here, `jobs` (how many of its launches run at a time), `notes` (its own values
    that override a --set default: precedence is --set of the step's key > the step's own key > --set of a
    defaults key > the file's defaults) and launches."""
    skipped = skipped or {}
    rows = []
    for step, launches in plan(runbook):
        rows.append({
            "phase": step.phase, "step": step.name, "kind": step.kind, "skip": skipped.get(step.name),
            "notes": runbook.step_notes(step.name),
            "jobs": step.options.get("jobs", 1),  # launches run this many at a time (pytest, sanitizer)
            "launches": [{"label": spec.label, "argv": spec.argv, "wrapper": spec.wrapper, "env": spec.env,
                          "nproc_per_node": spec.nproc_per_node, "nnodes": spec.nnodes, "launcher": spec.launcher,
                          "dir": spec.dir, "timeout_s": spec.timeout_s, "stall_timeout_s": spec.stall_timeout_s,
                          "waits_for": spec.unresolved, "batch_script": spec.batch_script()} for spec in launches],
        })
    return rows
