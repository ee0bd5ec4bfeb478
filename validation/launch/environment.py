"""What machine this is: the environment record of a run, the snapshot step's artifacts, and requirement checks."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from nsa.training.outputs import NODE_ENV_PREFIXES, NODE_NAME_VARS, git_changes, git_output, git_sha
from validation.launch import slurm, telemetry
from validation.launch.spec import safe_name
from validation.runbook.model import Requirements
from validation.version import source_digest

PACKAGES = ("torch", "numpy", "scipy", "pandas", "nsa-validate", "typer", "rich", "jinja2", "matplotlib", "pyyaml",
            "tensorboard", "pyarrow", "datasets", "pynvml", "nvidia-ml-py")


def packages() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _torch():
    import torch  # start-up: torch loads when devices are probed, not with nsa-validate --help

    return torch


@dataclasses.dataclass(frozen=True)
class TorchBuild:
    """The installed torch's version and the CUDA and ROCm versions it was built for (None: none)."""
    torch: str
    cuda: str | None = None
    hip: str | None = None

    @property
    def sees_gpus(self) -> bool:
        """Whether the build can see a GPU at all (a CUDA or ROCm build)."""
        return self.cuda is not None or self.hip is not None


def torch_build() -> TorchBuild | None:
    """Torch's version and the CUDA and ROCm versions it was built for, read from the installed torch/version.py,
    which torch/__init__.py imports them from, without importing torch (2 s of a core on a small machine, in every
    `nsa-validate run`); torch's own when it is imported already. None where torch or that file cannot be found or
    read."""
    loaded = sys.modules.get("torch")
    if loaded is not None and hasattr(loaded, "version"):
        return _build_of(loaded)
    try:
        spec = importlib.util.find_spec("torch")
        path = Path(next(iter(spec.submodule_search_locations or []))) / "version.py"
    except Exception:  # noqa: BLE001 - no torch to be found
        return None
    return _build_from(path)


def _build_of(torch) -> TorchBuild:
    """An imported torch's own TorchBuild."""
    return TorchBuild(str(torch.__version__), torch.version.cuda, torch.version.hip)


def _build_from(path: Path) -> TorchBuild | None:
    """torch_build's record from a torch/version.py (None where it cannot be read or is not as expected)."""
    try:
        namespace: dict[str, Any] = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - torch's own file
    except Exception:  # noqa: BLE001 - unreadable or not Python: torch itself is asked
        return None
    version, cuda, hip = (namespace.get(k) for k in ("__version__", "cuda", "hip"))
    if not isinstance(version, str) or not all(v is None or isinstance(v, str) for v in (cuda, hip)):
        return None
    return TorchBuild(version, cuda, hip)


def _no_gpu_build() -> bool:
    """Whether the installed torch is built without CUDA and ROCm, so that it can see no GPU (torch_build)."""
    build = torch_build()
    return build is not None and not build.sees_gpus


def gpus() -> list[dict[str, Any]]:
    """Visible CUDA devices: index, name, memory_gb, capability (major.minor as a float). A torch built without
    CUDA and ROCm sees none, and is not imported to say so."""
    if _no_gpu_build():
        return []
    torch = _torch()
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": props.name, "memory_gb": round(props.total_memory / 1024 ** 3, 2),
                    "capability": float(f"{props.major}.{props.minor}")})
    return out


def git_state(cwd: Path | None = None) -> dict[str, Any]:
    """{"git_branch": the checked-out branch ("HEAD" when detached), "git_dirty": True when tracked files differ
    from the commit, "git_changes": how many (nsa.training.outputs.git_changes, env.json's rule)}, in `cwd` (else the
    current directory); each None outside a git checkout."""
    where = cwd if cwd is not None else Path.cwd()
    branch = git_output(["rev-parse", "--abbrev-ref", "HEAD"], where)
    changes = git_changes(where)
    return {"git_branch": branch or None, "git_dirty": None if changes is None else changes > 0,
            "git_changes": changes}


def probe(cwd: Path | None = None) -> dict[str, Any]:
    """The environment record stored in results.json (torch is imported only where its build may see a GPU:
    torch_build)."""
    build = torch_build()
    if build is None or build.sees_gpus:
        build = _build_of(_torch())
    devices = gpus() if build.sees_gpus else []  # (torch_build read once: a build that sees none is not asked)
    nccl = None
    if devices:
        try:
            nccl = ".".join(map(str, _torch().cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL
            nccl = None
    return {
        "git_sha": git_sha(cwd), **git_state(cwd), "host": socket.gethostname(), "platform": platform.platform(),
        "python": sys.version.split()[0], "torch": build.torch, "cuda": build.cuda, "nccl": nccl,
        "gpus": devices, "gpu_count": len(devices), "cpu_count": os.cpu_count(), "packages": packages(),
        "source_digest": source_digest(),  # what `run --reuse` matches a later run's source against
    }


def unmet(req: Requirements, env: dict[str, Any] | Callable[[], dict[str, Any]], nproc_per_node: int = 1) -> str | None:
    """Why this machine cannot run a step with these requirements, or None. `env` is the probe() record, or a
    function returning it: called only when a requirement needs it (a CPU runbook is planned without torch)."""
    gpus_needed = max(req.gpus, nproc_per_node if req.backend == "nccl" else 0)
    needs_probe = gpus_needed or req.min_cuda_capability is not None or req.min_gpu_memory_gb is not None \
        or req.backend == "nccl"
    if not needs_probe:
        return None
    env = env() if callable(env) else env
    have = env.get("gpu_count", 0)
    if gpus_needed and have < gpus_needed:
        return f"needs {gpus_needed} GPU(s), found {have}"
    # the GPUs the step uses: the first gpus_needed, or the first (cuda:0) of a step that asks for no GPU count
    devices = env.get("gpus", [])[:max(gpus_needed, 1)]
    if req.min_cuda_capability is not None:
        if not devices:
            return f"needs CUDA capability >= {req.min_cuda_capability:g}, found no GPU"
        low = min(d["capability"] for d in devices)
        if low < req.min_cuda_capability:
            return f"needs CUDA capability >= {req.min_cuda_capability:g}, found {low:g}"
    if req.min_gpu_memory_gb is not None:
        if not devices:
            return f"needs GPUs with >= {req.min_gpu_memory_gb:g} GiB, found no GPU"
        low = min(d["memory_gb"] for d in devices)
        if low < req.min_gpu_memory_gb:
            # GiB, as torch reports a device's memory: an "80 GB" H100 has 79.18
            return f"needs GPUs with >= {req.min_gpu_memory_gb:g} GiB, found {low:g} GiB"
    if req.backend == "nccl" and env.get("nccl") is None:
        return "needs the NCCL backend (CUDA build of torch with NCCL), not available here"
    return None


def unmet_for(step, env: dict[str, Any] | Callable[[], dict[str, Any]]) -> str | None:
    """Why this machine cannot run `step` (a runbook Step), or None. Launcher slurm: the job's nodes are checked by
    Slurm's allocation (gpus_per_node), not here; what this machine needs is the Slurm commands."""
    launch = step.launch
    if launch.launcher.type == "slurm":  # a snapshot step runs here too, without needing this machine's GPUs
        if not slurm.available():
            return "launcher slurm: sbatch, squeue, scontrol and scancel must be on PATH"
        if step.requires.gpus and launch.launcher.gpus_per_node < min(step.requires.gpus, launch.nproc_per_node):
            return (f"needs {step.requires.gpus} GPU(s) but the Slurm job asks for gpus_per_node="
                    f"{launch.launcher.gpus_per_node}")
        return None
    return unmet(step.requires, env, ranks_here(step))


def ranks_here(step) -> int:
    """How many ranks (a GPU each, with NCCL) `step` runs on this machine: its nproc_per_node x nnodes for a kind
    that launches ranks (a trainer, a comm step: nproc_per_node is one of its launch keys), or the most of any launch
    it plans (a scaling step's largest world size on one node); 1 for a kind that launches one process."""
    launch = step.launch
    takes = step.is_training or "nproc_per_node" in step.kind_impl.launch_keys
    planned = [spec.nproc_per_node * spec.nnodes for spec in step.kind_impl.launches(step, None, None)]
    return max([launch.nproc_per_node * launch.nnodes if takes else 1, *planned])


def snapshot(step_dir: Path, cwd: Path, timeout_s: float = 300) -> tuple[dict[str, Any], list[Path], list[str]]:
    """The runbook's preflight: git sha, collect_env, nvidia-smi XML, package versions. Returns (environment,
    files written, problems) — a tool that is absent or fails is a problem noted, not a failure."""
    step_dir.mkdir(parents=True, exist_ok=True)
    env = probe(cwd)
    files, problems = [], []
    (step_dir / "git_sha.txt").write_text((env["git_sha"] or "unknown (not a git checkout)") + "\n")
    files.append(step_dir / "git_sha.txt")
    commands = [("collect_env.txt", [sys.executable, "-m", "torch.utils.collect_env"])]
    if shutil.which("nvidia-smi"):
        commands.append(("nvidia_smi.xml", ["nvidia-smi", "-q", "-x"]))
    else:
        problems.append("nvidia-smi not found: no GPU inventory XML")
    for name, argv in commands:
        try:
            out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                                 encoding="utf-8", errors="replace")
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{' '.join(argv[:3])}: {exc}")
            continue
        (step_dir / name).write_text(out.stdout + (f"\n# stderr\n{out.stderr}" if out.returncode else ""))
        files.append(step_dir / name)
        if out.returncode:
            why = _failure_line(out.stdout, out.stderr)
            problems.append(f"{' '.join(argv[:3])} exited {out.returncode}" + (f": {why}" if why else ""))
    if importlib.util.find_spec("pynvml") is not None:  # optional: a richer inventory
        try:
            env["nvml"] = _nvml_inventory()
        except Exception as exc:  # noqa: BLE001 - no driver, or NVML refuses
            if telemetry.nvml_no_driver(telemetry.load_nvml(), exc):
                env["nvml"] = []  # a machine without the NVIDIA driver: no GPU, not a problem
            else:
                problems.append(f"pynvml: {exc}")

    (step_dir / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    files.append(step_dir / "environment.json")
    return env, files, problems


def _failure_line(stdout: str, stderr: str, limit: int = 200) -> str:
    """What a failed tool said about why: the last line of its stderr (a Python traceback's error), else the first
    line of its output (nvidia-smi says why on stdout: "NVIDIA-SMI has failed because it couldn't communicate with
    the NVIDIA driver...", "Failed to initialize NVML: Driver/library version mismatch"); "" when it said nothing."""
    err = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    out = [line.strip() for line in (stdout or "").splitlines() if line.strip()]
    line = err[-1] if err else out[0] if out else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _nvml_inventory() -> list[dict[str, Any]]:
    pynvml = telemetry.load_nvml()  # installed: checked by find_spec before the call
    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "memory_gb": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 1024 ** 3, 2),
                        "driver": pynvml.nvmlSystemGetDriverVersion()})
        return out
    finally:
        pynvml.nvmlShutdown()


def node_snapshot_main(argv: list[str] | None = None) -> int:
    """``python -m validation.launch.environment NODES_DIR``: this node's snapshot into NODES_DIR/<node name> (the name:
    $NSA_NODE_NAME, else $SLURMD_NODENAME, else the host name). Run on every node of a Slurm allocation by a
    snapshot step with launcher slurm."""
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m validation.launch.environment NODES_DIR"
    if args in (["-h"], ["--help"]):
        print(usage + "\n\nThis node's snapshot into NODES_DIR/<node name> ($NSA_NODE_NAME, else $SLURMD_NODENAME, "
              "else the host name).")
        return 0
    if len(args) != 1 or args[0].startswith("-"):  # an option is no directory (--help made ./--help/<node>)
        print(usage, file=sys.stderr)
        return 2
    name = next((os.environ[v] for v in NODE_NAME_VARS if os.environ.get(v)), None) or socket.gethostname()
    name = safe_name(name) or "node"
    node_dir = Path(args[0]) / name
    env, files, problems = snapshot(node_dir, Path.cwd())
    # what decides multi-node communication: the NCCL/IB/Slurm variables, the GPU topology and the IB devices
    env.update(node=name, comm_env={k: v for k, v in sorted(os.environ.items()) if k.startswith(NODE_ENV_PREFIXES)})
    for fname, argv in (("nvidia_topo.txt", ["nvidia-smi", "topo", "-m"]), ("ibv_devinfo.txt", ["ibv_devinfo"])):
        if shutil.which(argv[0]):
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=60, encoding="utf-8",
                                     errors="replace")
                (node_dir / fname).write_text(out.stdout + out.stderr)
                files.append(node_dir / fname)
            except (OSError, subprocess.TimeoutExpired) as exc:
                problems.append(f"{argv[0]}: {exc}")
    env["problems"] = problems  # what this node lacks (a missing or failing tool): the snapshot step reports it

    (node_dir / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    print(f"[snapshot] {name}: {len(files)} file(s)" + (f"; {'; '.join(problems)}" if problems else ""))
    return 0


if __name__ == "__main__":
    sys.exit(node_snapshot_main())
