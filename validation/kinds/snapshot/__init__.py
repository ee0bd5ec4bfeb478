"""`snapshot`: the node's environment before anything runs: git sha, `python -m torch.utils.collect_env`,
`nvidia-smi -q -x` (and pynvml) when present, package versions (validation.launch.environment.snapshot), in-process. With
`launcher: slurm`, every node of an `nnodes` allocation also snapshots itself into RUN_DIR/<step>/nodes/<node>/
(`python -m validation.launch.environment`, one task per node), and each node's record joins results' environment.

Own keys: none. Launch keys: launcher, nnodes, timeout_s (each external tool's limit).
Metrics: {"git_sha", "gpu_count", "files": [...], "problems": [...], "nodes": [node names] (launcher slurm),
"pcie_gen_min" (the lowest maximum PCIe link generation of the GPUs, from nvidia_smi.xml; None without a GPU),
"pcie": {"gpus", "pcie_gen_current_min", "pcie_width_min", "text"}}.
A missing tool is a problem noted, not a failure; a node without its snapshot fails the step. The snapshot is the
writer of results' environment: run() puts this machine's record there (and each node's under "nodes").

Options: none. Result: the step record, its metrics a Metrics (the keys above; pcie a Pcie).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from validation.launch import environment
from validation import kinds
from validation.formatting import fmt_num
from validation.launch.telemetry import pcie_links
from validation.kinds.blocks import Block, Bullets, code
from validation.kinds.base import NoOptions, StepKind, command_launch, run_path
from validation.results.codec import absent, blank, decode, encode
from validation.results.run import Step as StepRecord


@dataclasses.dataclass(frozen=True)
class Pcie:
    """The GPUs' PCIe links (validation.launch.telemetry.pcie_links: gpus, pcie_gen_min, pcie_width_min, ...; kept
    in `extra`), and a sentence for the report."""
    text: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's metrics (the module docstring). pcie_gen_min and pcie are written together, by every snapshot
    since they were added (a record from before has neither)."""
    git_sha: str | None = None
    gpu_count: int | None = None
    files: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    pcie_gen_min: int | None = absent(beside="pcie")
    pcie: Pcie | None = absent()
    nodes: list[str] = absent([])  # launcher slurm: the nodes that snapshotted themselves


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A snapshot step's record: its metrics (None: {}, a step that never ran)."""
    metrics: Metrics | None = blank()


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
    listing = 10
    summary = ("git sha, `python -m torch.utils.collect_env`, `nvidia-smi -q -x` (and pynvml) when present, package "
               "versions")
    launch_keys = ("launcher", "nnodes", "timeout_s")
    metrics = ("git_sha", "gpu_count", "files.<i>", "problems.<i>", "nodes.<i>", "pcie_gen_min", "pcie.*")
    host_only = True  # a machine without the runbook's GPUs is still snapshotted (that is what it shows)
    plan_note = "in-process: git sha, python -m torch.utils.collect_env, nvidia-smi -q -x, packages"
    result_type = Result

    def launches(self, step, winners, run_dir):
        if step.launch.launcher.type != "slurm":
            return []  # runs in-process
        # the submitting machine runs in-process; every node of a job gets its own snapshot (nodes/<name>/)
        argv = [sys.executable, "-m", "validation.launch.environment", run_path(run_dir, f"{step.name}/nodes")]
        return [command_launch(step, argv, run_dir, label="nodes", nnodes=step.launch.nnodes)]

    def run(self, options: NoOptions, ctx) -> Result:
        step = ctx.step
        env, files, problems = environment.snapshot(ctx.run_dir / step.name, ctx.cwd, timeout_s=step.launch.timeout_s)
        run_env = ctx.results["environment"]  # results' environment: this machine's record, and each node's
        run_env.update(env)
        artifacts = [ctx.rel(f) for f in files]
        this = decode(_Identity, env, "environment", lenient=True)
        m = dataclasses.replace(pcie_metrics(files), git_sha=this.git_sha, gpu_count=this.gpu_count,
                                files=list(artifacts), problems=list(problems))
        if not ctx.launches:
            return Result(status="passed", reason="; ".join(problems) or None, metrics=m, artifacts=artifacts)
        # launcher slurm: a snapshot of every node of an allocation
        spec = ctx.launches[0]
        lr = ctx.launch(spec, 0, 1)
        known = run_env.setdefault("nodes", {})
        names, unreadable, node_problems = [], [], []
        nodes_dir = ctx.run_dir / step.name / "nodes"
        for node_dir in sorted(d for d in (nodes_dir.iterdir() if nodes_dir.is_dir() else []) if d.is_dir()):
            artifacts += [ctx.rel(f) for f in sorted(node_dir.iterdir())]
            node_env, problem = _node_environment(node_dir / "environment.json")
            if problem is not None:  # a node whose snapshot cannot be read has not snapshotted itself
                unreadable.append(f"node {node_dir.name}: {problem}")
                continue
            names.append(node_dir.name)
            own = node_env.get("problems")  # a node's missing or failing tools, as the machine's own are noted
            node_problems += [f"node {node_dir.name}: {p}" for p in (own if isinstance(own, list) else [])
                              if isinstance(p, str)]
            known.setdefault(node_dir.name, {}).update(
                snapshot=encode(decode(NodeSnapshot, node_env, "environment.json", lenient=True)))
        status = "passed"
        problems = problems + node_problems
        m = dataclasses.replace(m, nodes=names, problems=list(problems))
        if lr.status != "ok" or len(names) < spec.nnodes:
            status = "failed"
            problems = problems + unreadable + [f"node snapshots: {len(names)} of {spec.nnodes} ({lr.reason})"]
        return Result(status=status, reason="; ".join(problems) or None, metrics=m, artifacts=artifacts)

    def view(self, result: Result, view: dict) -> dict:
        problems = (result.metrics or Metrics()).problems
        reason = result.reason or None  # what the step section shows (view's "reason")
        if reason in problems or reason == "; ".join(problems):
            return {"reason": None}  # shown as the problems below
        return {}

    def blocks(self, result: Result) -> list[Block]:
        """The commit, the GPUs, the PCIe links, every problem the snapshot found and the files it wrote."""
        m = result.metrics or Metrics()
        files = m.files or [str(f) for f in result.artifacts]
        text = m.pcie.text if m.pcie is not None else None
        return [Bullets([f"Git SHA: {code(fmt_num(m.git_sha))}; GPUs: {fmt_num(m.gpu_count)}",
                         *([text] if text else []), *(f"Problem: {p}" for p in m.problems),
                         "Artifacts: " + (", ".join(code(f) for f in files) or "none")])]


def _node_environment(path: Path) -> tuple[dict[str, Any], str | None]:
    """(a node's snapshot, None), or ({}, why it cannot be read: missing, not valid JSON, not a record)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, f"{path.name} missing"
    except OSError as exc:
        return {}, f"{path.name} unreadable: {exc.strerror or exc}"
    except ValueError as exc:
        return {}, f"{path.name} is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return {}, f"{path.name} is not a JSON object"
    return data, None


def pcie_metrics(files: list) -> Metrics:
    """pcie_gen_min and pcie (the gpus' links, the lowest current generation and width, a sentence) from the
    snapshot's nvidia_smi.xml (validation.launch.telemetry.pcie_links); without it (no nvidia-smi, a CPU machine)
    pcie_gen_min is None and the sentence says so."""
    xml = next((f for f in files if getattr(f, "name", "") == "nvidia_smi.xml"), None)
    try:
        links = pcie_links(xml.read_text(errors="replace")) if xml is not None else None
    except OSError:
        links = None
    if not links or not links.gpus:
        return Metrics(pcie=Pcie("PCIe: not measured (no GPU in nvidia-smi's inventory, or no nvidia-smi)",
                                {"gpus": []}))
    per_gpu = ", ".join(f"GPU {g.gpu} Gen{fmt_num(g.gen)} x{fmt_num(g.width)} (max Gen{fmt_num(g.gen_max)} "
                        f"x{fmt_num(g.width_max)})" for g in links.gpus)
    text = (f"PCIe: lowest maximum link Gen{fmt_num(links.pcie_gen_min)} x{fmt_num(links.pcie_width_min)}; "
            f"now {per_gpu} (an idle GPU lowers its link)")
    return Metrics(pcie_gen_min=links.pcie_gen_min, pcie=Pcie(text, encode(links)))


kinds.register(Snapshot())
