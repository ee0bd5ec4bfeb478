"""runbooks/h100_single.yaml stays rehearsable on a CPU machine before it runs on a GPU: with only sizes and the
device changed by --set (REHEARSAL below, the command the report of a rehearsal gives), `--dry-run --skip kernels`
accepts the runbook and plans every step outside phase `kernels` to launch here, with its own kind, and lists every
acceptance criterion of the runbook. The rehearsal itself (~2 min on 2 cores) is run by hand:

    nsa-validate run runbooks/h100_single.yaml --skip kernels --out DIR <REHEARSAL>

A step renamed, a kind or key the overrides no longer reach, or a new GPU-only step without a CPU size shows here
as a --set error or a step the plan skips."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

REHEARSAL = [
    "requirements={gpus: 0}",
    "defaults.config=configs/tiny_cpu.yaml",
    "defaults.timeout_s=900",
    "defaults.stall_timeout_s=120",
    "defaults.window=20",
    "defaults.warmup_steps=5",
    "steps.single.args.steps=40",
    "steps.dense_twin.args.steps=40",
    "steps.sdpa_audit.args.steps=12",
    "steps.sdpa_audit.window=5",
    'steps.sel_perf.command=[benchmarks/bench_selection.py, --device, cpu, --seq-lens, "1024", --repeats, "3"]',
    "steps.profiling.args.steps=10",
    "steps.profiling.window=3",
    "steps.profiling.profile_steps=2",
    "steps.fused_adamw.args.steps=30",
    "steps.longrun.args.steps=120",
    "steps.longrun.window=50",
    "steps.seq_scan.values.args.seq_len=[256, 512, 1024]",
    "steps.seq_scan_dense.values.args.seq_len=[256, 512, 1024]",
    'steps.train_bench.command=[benchmarks/bench_train.py, --device, cpu, --quick, --no-ddp, --models, "nsa,dense",'
    " --modes, eager]",
    "steps.train_bench.requires={gpus: 0}",
]

# "phase / step (kind)" and, on the same line, "SKIPPED here: why" for a step the run would not launch
_STEP = re.compile(r"^(\S+) / (\S+) \((\w+)\)(?:\s+SKIPPED here: (.*))?$")


def _file_steps() -> dict[str, str]:
    """{step: kind} of h100_single.yaml and the runbook it includes, read from the YAML files themselves."""
    steps = {}
    for name in ("gpu_kernels.yaml", "h100_single.yaml"):
        raw = yaml.safe_load((REPO / "runbooks" / name).read_text())
        for phase in raw["phases"]:
            for step in phase.get("steps") or []:
                steps[step["name"]] = step["kind"]
    return steps


def _criteria() -> list[str]:
    names = []
    for name in ("gpu_kernels.yaml", "h100_single.yaml"):
        names += [c["name"] for c in yaml.safe_load((REPO / "runbooks" / name).read_text())["acceptance"]]
    return names


def test_the_cpu_rehearsal_of_h100_single_launches_every_step_but_the_kernel_phase(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from validation.cli import app

    monkeypatch.chdir(REPO)
    args = ["run", "runbooks/h100_single.yaml", "--skip", "kernels", "--out", str(tmp_path / "run"), "--dry-run"]
    for item in REHEARSAL:
        args += ["--set", item]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    planned = {}
    for line in result.output.splitlines():
        match = _STEP.match(line)
        if match:
            phase, step, kind, skipped = match.groups()
            planned[step] = (phase, kind, skipped)
    expected = _file_steps()
    assert {step: kind for step, (_, kind, _) in planned.items()} == expected  # every step, its own kind
    skipped = {step: why for step, (phase, _, why) in planned.items() if why is not None}
    kernel_steps = {step for step, (phase, _, _) in planned.items() if phase == "kernels"}
    assert set(skipped) == kernel_steps and kernel_steps, skipped
    assert all(why == "phase kernels skipped (--skip)" for why in skipped.values()), skipped
    # the rehearsal keeps every criterion: the plan lists each one, in the runbooks' order
    listed = [line.split("] ", 1)[1] for line in result.output.splitlines() if re.match(r"^  \[(fail|warn)\] ", line)]
    names = _criteria()
    assert len(listed) == len(names) and all(text.startswith(f"{name}: ") for text, name in zip(listed, names)), listed
    assert not (tmp_path / "run").exists()
