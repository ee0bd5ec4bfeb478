"""The scripts of benchmarks/ as modules, for the tests that call their functions: each loaded once from its file
(they are scripts, not a package), with benchmarks/ first on sys.path while it loads, as when it runs as a script
(bench_selection imports bench_attention's shapes)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@functools.cache
def load(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module; FileNotFoundError naming it when there is none."""
    path = BENCHMARKS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
