"""The report's "Run with the validated settings": one copy-paste command line that trains with what the run
validated: the trainer command of the run's baseline training step (its config and flags, the output directory
left out) under the launcher it ran with, with the step's environment variables in front: only settings that ran
together in that step. A recommended setting the step did not run with (results.json "recommendations": a
decision of another step) is named beside it ("apart"), never merged in: settings measured in separate steps have
not been validated together. Pure; built from results.json alone.
"""

from __future__ import annotations

import shlex
from typing import Any

from nsa.training.flags import tokens as flag_tokens
from validation import kinds as step_kinds
from validation.formatting import fence, finite, fmt_num, printable
from validation.results.codec import decode
from validation.results.run import Run, Step, read_run
from validation.results.trainer_launch import LaunchMetrics

TRAINER_MODULES = ("nsa.training", "nsa.train")
# Flags of a validation launch that point into its run directory: a user's own run chooses them.
RUN_DIR_FLAGS = ("--out-dir",)


def _repeatable(step: Step) -> bool:
    kind = step_kinds.find(step.kind)
    return kind is not None and kind.repeatable


def _baseline_step(run: Run) -> Step | None:
    """The train step the command is built from: one named *baseline* that passed, else the first train step that
    passed, in run order; None when no train step passed."""
    passed = [s for _, s in run.steps_in_order() if s is not None and _repeatable(s) and s.status == "passed"]
    named = [s for s in passed if "baseline" in str(s.name or "").lower()]
    return (named or passed or [None])[0]


def _trainer_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, args after it) of a recorded trainer command (python -m nsa.training ..., or under torchrun)."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1] in TRAINER_MODULES:
            return argv[i + 1], argv[i + 2:]
    return None


def _set_flag(args: list[str], flag: str, value: Any) -> list[str]:
    """args with `flag value` replaced (or appended); True as a bare flag, False/None removes it."""
    out, i = [], 0
    while i < len(args):
        if args[i] == flag:
            i += 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
            continue
        if args[i].startswith(flag + "="):
            i += 1
            continue
        out.append(args[i])
        i += 1
    return out + flag_tokens(flag, value)


def validated_command(results: dict) -> dict:
    """{"lines": [command lines joined by ' \\\\'], "text": the command, "fence": a Markdown fence longer than any
    backtick run of it as shown (a --set or environment value holding ``` on a line of its own stays inside the
    block), "step": its source step or None, "env": {name: value}, "note": what it is (or why there is none)}."""
    run = read_run(results)
    step = _baseline_step(run)
    argv = [str(a) for a in (step.command or [] if step is not None else [])]
    parsed = _trainer_args(argv) if step else None
    if step is None or parsed is None:
        has_train = any(_repeatable(s) for s in run.steps.values() if s is not None)
        why = (f"step {step.name} recorded no trainer command" if step is not None else
               "no training step passed" if has_train else "this runbook has no train step to build it from")
        return {"lines": [], "text": "", "fence": fence(""), "step": None, "env": {},
                "note": f"No validated command: {why}."}
    module, args = parsed
    for flag in RUN_DIR_FLAGS:
        args = _set_flag(args, flag, None)
    env = {str(k): str(v) for k, v in step.env.items()}  # as the step ran: nothing added
    apart = {str(k): str(v) for k, v in run.recommendations.env.items() if env.get(str(k)) != str(v)}
    metrics = decode(LaunchMetrics, step.metrics, lenient=True)
    world = int(finite(metrics.world_size) or 1)
    nnodes = max(1, int(finite(metrics.nnodes) or 1))
    torchrun = any(a in ("torch.distributed.run", "torchrun") or a.endswith("/torchrun") for a in argv) or world > 1
    if nnodes > 1:
        launcher = ["torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={world // nnodes}", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=$MASTER_ADDR:29500"]
    elif torchrun:
        launcher = ["torchrun", f"--nproc_per_node={world}"]
    else:
        launcher = ["python"]
    lines = [f"{k}={shlex.quote(env[k])}" for k in sorted(env)]
    quoted = [a if a.startswith("--rdzv-endpoint=$") else shlex.quote(a) for a in launcher]
    lines.append(" ".join(quoted + ["-m", module]))
    pairs, i = [], 0
    while i < len(args):  # one flag and its value per line
        if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            pairs.append(shlex.quote(args[i]))
            i += 1
    lines += [f"  {p}" for p in pairs]
    lines = [line + " \\" for line in lines[:-1]] + lines[-1:]
    verdict = str(run.verdict or "INCOMPLETE")
    note = (f"The trainer command of step {step.name} ({fmt_num(step.title)}) as it ran, with its "
            f"environment: settings that ran together; the run ended {verdict}.")
    if apart:
        note += (" Recommended but not run together with it (each was measured in its own step; run them together "
                 "before relying on the combination): " + ", ".join(f"{k}={v}" for k, v in sorted(apart.items())) + ".")
    if verdict != "GO":
        note += " These settings are not validated until a run of them ends GO."
    text = "\n".join(lines)
    return {"lines": lines, "text": text, "fence": fence(printable(text)), "step": str(step.name), "env": env,
            "note": note, "apart": apart}
