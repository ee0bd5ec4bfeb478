"""validation.launch.environment.torch_build: the installed torch's version and the CUDA/ROCm versions it was built
for, read from torch/version.py without importing torch; probe() and gpus() import torch only where the build can
see a GPU (a CPU build cannot), so an `nsa-validate run` on a CPU machine never loads it to fill the record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from validation.launch import environment

REPO = Path(__file__).resolve().parents[3]


def _version_file() -> Path:
    return Path(torch.__file__).parent / "version.py"


def test_the_version_file_says_what_torch_says():
    build = environment._build_from(_version_file())
    assert build == environment.TorchBuild(str(torch.__version__), torch.version.cuda,
                                           getattr(torch.version, "hip", None))
    assert environment.torch_build() == build  # torch imported here: its own answer, the same


def test_a_probe_imports_torch_only_where_the_build_can_see_a_gpu():
    """In a fresh process: the record's torch and cuda are torch's own; torch is left unloaded by a CPU build's
    probe (gpus empty, nccl None) and loaded by a CUDA or ROCm build's."""
    code = ("import json, sys\nfrom validation.launch import environment as e\nr = e.probe()\n"
            "print(json.dumps({k: r[k] for k in ('torch', 'cuda', 'gpus', 'gpu_count', 'nccl')} | "
            "{'imported': 'torch' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["torch"] == str(torch.__version__) and record["cuda"] == torch.version.cuda
    gpu_build = torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None
    assert record["imported"] is gpu_build
    if not gpu_build:
        assert record["gpus"] == [] and record["gpu_count"] == 0 and record["nccl"] is None


def test_a_cuda_build_is_asked_and_an_unreadable_file_falls_back_to_torch(tmp_path, monkeypatch):
    """A version.py that names a CUDA version (a CUDA build): gpus() asks torch (here the CPU one, which answers no
    GPU); one that cannot be read, or holds no version string, gives None, and probe() then asks torch itself."""
    cuda = tmp_path / "cuda.py"
    cuda.write_text("from typing import Optional\n__version__ = '9.9.0+cu999'\ncuda: Optional[str] = '99.9'\n"
                    "hip = None\n")
    assert environment._build_from(cuda) == environment.TorchBuild("9.9.0+cu999", "99.9", None)
    asked = []
    monkeypatch.setattr(environment, "torch_build", lambda: environment._build_from(cuda))
    monkeypatch.setattr(environment, "_torch", lambda: asked.append(1) or torch)
    assert environment.gpus() == [] and asked  # the CPU torch of this process: no GPU, but it was asked
    for text in ("this is not python (", "__version__ = 3\n", "cuda = 12\n__version__ = '1.0'\n"):
        (tmp_path / "bad.py").write_text(text)
        assert environment._build_from(tmp_path / "bad.py") is None, text
    assert environment._build_from(tmp_path / "missing.py") is None
    monkeypatch.setattr(environment, "torch_build", lambda: None)
    asked.clear()
    record = environment.probe(REPO)
    assert asked and record["torch"] == str(torch.__version__) and record["cuda"] == torch.version.cuda
