"""A stand-in for compute-sanitizer, shared by the sanitizer kind's tests (test_gpu_kernels, test_launch_jobs).

It runs the program after its options and exits with the program's exit code; a case with `--seq-len 2048` gets
one memcheck error, and one with `--seq-len 999` is attached to nothing, as the real one when the program starts
too slowly (it then exits 1 without running the program)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPT = """#!{python}
import subprocess, sys
args = sys.argv[1:]
i = 0
while args[i].startswith("--"):
    i += 2
print("========= COMPUTE-SANITIZER", flush=True)
if "999" in args[i:]:
    print("========= Error: No attachable process found. compute-sanitizer timed-out.")
    print("========= Default timeout can be adjusted with --launch-timeout. Awaiting target completion.")
    sys.exit(1)
code = subprocess.call(args[i:])
if "2048" in args[i:]:
    print("========= Invalid __global__ read of size 4 bytes")
    print("=========     at fake_topk_kernel+0x4c80 in fake_selection.py:223")
    print("=========     by thread (0,0,0) in block (60,0,0)")
    print("=========     Address 0x7f00 is out of bounds")
    print("=========     Saved host backtrace up to driver entry point")
    print("=========")
    print("========= ERROR SUMMARY: 1 error")
else:
    print("========= ERROR SUMMARY: 0 errors")
sys.exit(code)
"""


def install(directory: Path) -> Path:
    """The fake as `directory`/compute-sanitizer, executable."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "compute-sanitizer"
    fake.write_text(SCRIPT.format(python=sys.executable))
    fake.chmod(0o755)
    return fake


def path_without_real_sanitizer() -> str:
    """PATH without the directories that hold a real compute-sanitizer."""
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / "compute-sanitizer").exists())
