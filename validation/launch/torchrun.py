"""torchrun command lines: one node's ``python -m torch.distributed.run`` prefix, a command put under it, and the
variables that give every rank's output its global rank and every agent its node's name (a multi-node job emulated
on this machine: validation.launch.agents; a Slurm job: validation.launch.sbatch)."""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

PREFIX_TEMPLATE_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
RANK_PREFIX_TEMPLATE = "[default${rank}]:"  # torchrun's tee prefix with the GLOBAL rank (not the local one)
NODE_NAME_VAR = "NSA_NODE_NAME"  # the trainer records it as its node's name (env.json "nodes")
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")


def free_port() -> int:
    """A TCP port that is free on every local address right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _port(port: int | str) -> str:
    """A port as it goes on a command line: a number, or the placeholder `nsa-validate plan` shows for a port the
    launcher picks when the launch starts (PLAN_PORT)."""
    return port if isinstance(port, str) and not port.isdigit() else str(int(port))


def torchrun_prefix(nproc_per_node: int, master_port: int | str, log_dir: Path | None = None, *, nnodes: int = 1,
                    node_rank: int = 0, rdzv_backend: str = "c10d", rdzv_endpoint: str | None = None,
                    rdzv_id: str = "nsav") -> list[str]:
    """``python -m torch.distributed.run`` for one node (of `nnodes`); with `log_dir`, every rank's stdout and
    stderr also go to files under it (``--redirects 3 --tee 3``: to the files AND, prefixed "[defaultN]:", to
    torchrun's output). Multi-node: c10d rendezvous at `rdzv_endpoint` (default 127.0.0.1:`master_port`) with id
    `rdzv_id`, or static (``--node-rank``, ``--master-addr``/``--master-port`` from the endpoint)."""
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive int, got {nproc_per_node!r}")
    prefix = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}"]
    if nnodes == 1:
        prefix.append(f"--master-port={_port(master_port)}")
    else:
        endpoint = rdzv_endpoint or f"127.0.0.1:{_port(master_port)}"
        if rdzv_backend == "static":
            host, _, port = endpoint.rpartition(":")
            prefix += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={host}",
                       f"--master-port={port}"]
        elif rdzv_backend == "c10d":
            prefix += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                       f"--rdzv-id={rdzv_id}"]
        else:
            raise ValueError(f"rdzv_backend must be 'c10d' or 'static', got {rdzv_backend!r}")
    if log_dir is not None:
        prefix += ["--log-dir", str(log_dir), "--redirects", "3", "--tee", "3"]
    return prefix



def _is_python(executable: str) -> bool:
    if _PYTHON_RE.match(Path(executable).name):
        return True
    try:
        return os.path.realpath(executable) == os.path.realpath(sys.executable)
    except OSError:
        return False


def torchrun_argv(argv: list[str], prefix: list[str]) -> list[str]:
    """torchrun (`prefix`) + `argv`: ``python -m mod args`` becomes ``-m mod args`` and ``python script.py args``
    becomes ``script.py args`` (torchrun then runs them with that interpreter, unbuffered); anything else runs as
    is (``--no-python``)."""
    if _is_python(argv[0]):
        if len(argv) >= 3 and argv[1] == "-m":
            return [argv[0], *prefix[1:], "-m", *argv[2:]]
        if len(argv) >= 2 and not argv[1].startswith("-"):
            return [argv[0], *prefix[1:], *argv[1:]]
    return [*prefix, "--no-python", *argv]


PLAN_PORT = "<free>"  # the port of a planned launch: the launcher picks a free one when the launch starts
PLAN_RDZV_ID = "nsav-<step>-<id>"  # the rendezvous id of a planned multi-node launch (one per launch)


def agent_commands(spec, port: int | str, ranks_dir: Path, rdzv_id: str) -> list[dict]:
    """The `spec.nnodes` torchrun agents on this machine that form one job (a validation.launch.spec.LaunchSpec
    with nnodes > 1; validation.launch.agents runs them together): {"name", "argv", "env"} each. Each has its own
    node name (NSA_NODE_NAME=node<i>) and torchrun log directory (ranks/node<i>), and every rank's output is
    prefixed with its global rank."""
    agents = []
    for i in range(spec.nnodes):
        prefix = torchrun_prefix(spec.nproc_per_node, port, ranks_dir / f"node{i}", nnodes=spec.nnodes, node_rank=i,
                                 rdzv_backend=spec.rdzv_backend, rdzv_endpoint=spec.rdzv_endpoint, rdzv_id=rdzv_id)
        agents.append({"name": f"node{i}", "argv": list(spec.wrapper) + torchrun_argv(spec.argv, prefix),
                       "env": {NODE_NAME_VAR: f"node{i}", PREFIX_TEMPLATE_VAR: RANK_PREFIX_TEMPLATE}})
    return agents


def local_command_lines(spec, port: int | str, ranks_dir: Path, rdzv_id: str = PLAN_RDZV_ID) -> list[list[str]]:
    """What a launch of `spec` (a validation.launch.spec.LaunchSpec) runs on this machine: its one command (under
    torchrun when spec.uses_torchrun, under spec.wrapper), or with nnodes > 1 each local agent's
    (validation.launch.agents runs them together). The launcher runs these (validation.launch.attempt);
    `nsa-validate plan` prints them, with PLAN_PORT for the port still to pick."""
    if spec.nnodes > 1:
        return [agent["argv"] for agent in agent_commands(spec, port, ranks_dir, rdzv_id)]
    if spec.uses_torchrun:
        return [list(spec.wrapper) + torchrun_argv(spec.argv, torchrun_prefix(spec.nproc_per_node, port, ranks_dir))]
    return [list(spec.wrapper) + list(spec.argv)]
