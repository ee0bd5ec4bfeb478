"""torchrun command lines: one node's ``python -m torch.distributed.run`` prefix, a command put under it, and the
agents of a multi-node job emulated on this machine (``launcher: torchrun`` with ``nnodes > 1``)."""

from __future__ import annotations

import os
import re
import socket
import sys
import uuid
from pathlib import Path

from nsa.training.outputs import write_json
from validation.launch.spec import LaunchSpec, safe_name

PREFIX_TEMPLATE_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
RANK_PREFIX_TEMPLATE = "[default${rank}]:"  # torchrun's tee prefix with the GLOBAL rank (not the local one)
NODE_NAME_VAR = "NSA_NODE_NAME"  # the trainer records it as its node's name (env.json "nodes")
AGENTS_JSON = "agents.json"
AGENTS_GRACE_S = 30.0  # a local agent failed: the others get this long to end by themselves
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")


def free_port() -> int:
    """A TCP port that is free on every local address right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torchrun_prefix(nproc_per_node: int, master_port: int, log_dir: Path | None = None, *, nnodes: int = 1,
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
        prefix.append(f"--master-port={int(master_port)}")
    else:
        endpoint = rdzv_endpoint or f"127.0.0.1:{int(master_port)}"
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


def local_agents_argv(spec: LaunchSpec, port: int, step_dir: Path, ranks_dir: Path) -> list[str]:
    """`spec.nnodes` torchrun agents on this machine forming one job (validation.launch.agents runs them); each has
    its own node name (NSA_NODE_NAME=node<i>) and torchrun log directory (ranks/node<i>), and every rank's output
    is prefixed with its global rank."""
    rdzv_id = f"nsav-{safe_name(step_dir.name)[:40]}-{uuid.uuid4().hex[:8]}"
    agents = []
    for i in range(spec.nnodes):
        prefix = torchrun_prefix(spec.nproc_per_node, port, ranks_dir / f"node{i}", nnodes=spec.nnodes, node_rank=i,
                                 rdzv_backend=spec.rdzv_backend, rdzv_endpoint=spec.rdzv_endpoint, rdzv_id=rdzv_id)
        agents.append({"name": f"node{i}", "argv": list(spec.wrapper) + torchrun_argv(spec.argv, prefix),
                       "env": {NODE_NAME_VAR: f"node{i}", PREFIX_TEMPLATE_VAR: RANK_PREFIX_TEMPLATE}})
    path = step_dir / AGENTS_JSON
    write_json(path, {"agents": agents, "grace_s": AGENTS_GRACE_S})
    return [sys.executable, "-m", "validation.launch.agents", str(path)]
