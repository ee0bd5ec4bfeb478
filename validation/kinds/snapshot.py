"""`snapshot`: the node's environment before anything runs: git sha, `python -m torch.utils.collect_env`,
`nvidia-smi -q -x` (and pynvml) when present, package versions (validation.launch.environment.snapshot), in-process. With
`launcher: slurm`, every node of an `nnodes` allocation also snapshots itself into RUN_DIR/<step>/nodes/<node>/
(`python -m validation.launch.environment`, one task per node), and each node's record joins results' environment.

Own keys: none. Launch keys: launcher, nnodes, timeout_s (each external tool's limit).
Metrics: {"git_sha", "gpu_count", "files": [...], "problems": [...], "nodes": [node names] (launcher slurm),
"pcie_gen_min" (the lowest maximum PCIe link generation of the GPUs, from nvidia_smi.xml; None without a GPU),
"pcie": {"gpus", "pcie_gen_current_min", "pcie_width_min", "text"}}.
A missing tool is a problem noted, not a failure; a node without its snapshot fails the step.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from validation.launch import environment
from validation import kinds
from validation.formatting import as_list, fmt_num
from validation.launch.telemetry import pcie_links
from validation.kinds.blocks import Block, Bullets, code
from validation.kinds.base import StepKind, command_launch, run_path
from validation.results.codec import absent, decode, encode


@dataclasses.dataclass(frozen=True)
class Pcie:
    """The GPUs' PCIe links (validation.launch.telemetry.pcie_links: gpus, pcie_gen_min, pcie_width_min, ...; kept
    in `extra`), and a sentence for the report."""
    text: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Result:
    """The step's metrics (the module docstring)."""
    git_sha: str | None = None
    gpu_count: int | None = None
    files: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    pcie_gen_min: int | None = None
    pcie: Pcie = dataclasses.field(default_factory=Pcie)
    nodes: list[str] = absent([])  # launcher slurm: the nodes that snapshotted themselves


@dataclasses.dataclass(frozen=True)
class _Identity:
    """What the step's metrics take of the environment snapshot (validation.launch.environment.snapshot), as
    written."""
    git_sha: Any = None
    gpu_count: Any = None


@dataclasses.dataclass(frozen=True)
class NodeSnapshot:
    """What results' environment keeps of a node's own snapshot (its environment.json), as the node wrote it: the
    node's entry's "snapshot" (None where the file lacks a key)."""
    gpu_count: Any = None
    gpus: Any = None
    torch: Any = None
    host: Any = None
    comm_env: Any = None


class Snapshot(StepKind):
    name = "snapshot"
    summary = ("git sha, `python -m torch.utils.collect_env`, `nvidia-smi -q -x` (and pynvml) when present, package "
               "versions")
    launch_keys = ("launcher", "nnodes", "timeout_s")
    metrics = ("git_sha", "gpu_count", "files.<i>", "problems.<i>", "nodes.<i>", "pcie_gen_min", "pcie.*")
    host_only = True  # a machine without the runbook's GPUs is still snapshotted (that is what it shows)
    plan_note = "in-process: git sha, python -m torch.utils.collect_env, nvidia-smi -q -x, packages"

    def launches(self, step, winners, run_dir):
        if step.launch.launcher.type != "slurm":
            return []  # runs in-process
        # the submitting machine runs in-process; every node of a job gets its own snapshot (nodes/<name>/)
        argv = [sys.executable, "-m", "validation.launch.environment", run_path(run_dir, f"{step.name}/nodes")]
        return [command_launch(step, argv, run_dir, label="nodes", nnodes=step.launch.nnodes)]

    def run(self, step, launches, result, ctx) -> None:
        env, files, problems = environment.snapshot(ctx.run_dir / step.name, ctx.cwd, timeout_s=step.launch.timeout_s)
        ctx.results["environment"].update(env)
        artifacts = [ctx.rel(f) for f in files]
        result["artifacts"] = artifacts
        this = decode(_Identity, env, "environment", lenient=True)
        m = dataclasses.replace(pcie_metrics(files), git_sha=this.git_sha, gpu_count=this.gpu_count,
                                files=list(artifacts), problems=list(problems))
        result["metrics"] = encode(m)
        status = "passed"
        if launches:  # launcher slurm: a snapshot of every node of an allocation
            lr = ctx.launch(launches[0], 0, 1)
            ctx.record(result, launches[0], lr)
            known = ctx.results["environment"].setdefault("nodes", {})
            names = []
            nodes_dir = ctx.run_dir / step.name / "nodes"
            for node_dir in sorted(d for d in (nodes_dir.iterdir() if nodes_dir.is_dir() else []) if d.is_dir()):
                try:
                    node_env = json.loads((node_dir / "environment.json").read_text())
                except (OSError, ValueError):
                    node_env = {}
                node_env = node_env if isinstance(node_env, dict) else {}
                names.append(node_dir.name)
                known.setdefault(node_dir.name, {}).update(
                    snapshot=encode(decode(NodeSnapshot, node_env, "environment.json", lenient=True)))
                result["artifacts"] += [ctx.rel(f) for f in sorted(node_dir.iterdir())]
            result["metrics"] = encode(dataclasses.replace(m, nodes=names))
            if lr.status != "ok" or len(names) < launches[0].nnodes:
                status = "failed"
                problems = problems + [f"node snapshots: {len(names)} of {launches[0].nnodes} ({lr.reason})"]
        result.update(status=status, reason="; ".join(problems) or None)

    def view(self, result: dict, view: dict) -> dict:
        problems = decode(Result, result.get("metrics"), lenient=True).problems
        if view["reason"] in problems or view["reason"] == "; ".join(problems):
            return {"reason": None}  # shown as the problems below
        return {}

    def blocks(self, result: dict) -> list[Block]:
        """The commit, the GPUs, the PCIe links, every problem the snapshot found and the files it wrote."""
        m = decode(Result, result.get("metrics"), lenient=True)
        files = m.files or [str(f) for f in as_list(result.get("artifacts"))]
        return [Bullets([f"Git SHA: {code(fmt_num(m.git_sha))}; GPUs: {fmt_num(m.gpu_count)}",
                         *([m.pcie.text] if m.pcie.text else []), *(f"Problem: {p}" for p in m.problems),
                         "Artifacts: " + (", ".join(code(f) for f in files) or "none")])]


def pcie_metrics(files: list) -> Result:
    """pcie_gen_min and pcie (the gpus' links, the lowest current generation and width, a sentence) from the
    snapshot's nvidia_smi.xml (validation.launch.telemetry.pcie_links); without it (no nvidia-smi, a CPU machine)
    pcie_gen_min is None and the sentence says so."""
    xml = next((f for f in files if getattr(f, "name", "") == "nvidia_smi.xml"), None)
    try:
        links = pcie_links(xml.read_text(errors="replace")) if xml is not None else None
    except OSError:
        links = None
    if not links or not links.gpus:
        return Result(pcie=Pcie("PCIe: not measured (no GPU in nvidia-smi's inventory, or no nvidia-smi)",
                                {"gpus": []}))
    per_gpu = ", ".join(f"GPU {g.gpu} Gen{fmt_num(g.gen)} x{fmt_num(g.width)} (max Gen{fmt_num(g.gen_max)} "
                        f"x{fmt_num(g.width_max)})" for g in links.gpus)
    text = (f"PCIe: lowest maximum link Gen{fmt_num(links.pcie_gen_min)} x{fmt_num(links.pcie_width_min)}; "
            f"now {per_gpu} (an idle GPU lowers its link)")
    return Result(pcie_gen_min=links.pcie_gen_min, pcie=Pcie(text, encode(links)))


kinds.register(Snapshot())
