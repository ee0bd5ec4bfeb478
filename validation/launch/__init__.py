"""Starting, watching and ending the processes of a step: one launch record, one way to run it.

    spec        LaunchSpec (the one launch record, from the plan to the launcher), LaunchResult, Progress
    torchrun    torchrun argv: one node's prefix, a command under it; the rank-prefix and node-name variables;
                local_command_lines: what a local launch runs (the launcher and `nsa-validate plan` both call it)
    attempt     launch(spec): attempts (a port clash retried on a fresh port), step files
    local       one attempt on this machine (Run), the step-directory helpers every attempt shares (note, set_aside)
    processes   the /proc tree of a launch, ending process groups, dying with the orchestrator, the subreaper sweep
    interrupts  SIGINT / SIGTERM / SIGHUP to nsa-validate: Interrupted (a KeyboardInterrupt with the signal), exit codes
    session     guarded(body): the signal handlers, the subreaper, the sentinel and the final sweep around
                `nsa-validate run`
    sentinel    `python -m validation.launch.sentinel`: ends what the launches left running once nsa-validate itself
                was killed (told each launch's id and session as it starts)
    diagnosis   why a launch ended: failing rank, traceback excerpt, stack-dump excerpt
    sbatch      the batch script of a launch and its allocation (SlurmOptions)
    slurm       sbatch/squeue/scontrol/scancel, SlurmRun (one attempt as a Slurm job)
    agents      `python -m validation.launch.agents`: several torchrun agents on this machine as one job
                (local_agents_argv writes what they run)
    telemetry   the device telemetry sampler beside a launch (a thread; per node of a Slurm job a background
                `python -m validation.launch.telemetry`), its metrics and the low-GPU-utilisation diagnosis
    environment this machine: its record, the snapshot step's files, requirement checks
                (`python -m validation.launch.environment NODES_DIR`: a node's own snapshot)

The names below are imported on first use, so reading a runbook or a plan loads only the launch record (spec, with
the batch script it shows: sbatch, torchrun).
"""

from __future__ import annotations

import importlib

_EXPORTS = {"launch": "attempt", "LaunchSpec": "spec", "LaunchResult": "spec", "Progress": "spec",
            "STATUSES": "spec", "recorded_env": "spec", "safe_name": "spec", "free_port": "torchrun",
            "torchrun_prefix": "torchrun"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"validation.launch.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'validation.launch' has no attribute {name!r}")
