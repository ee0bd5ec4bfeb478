"""benchmarks/bench_ops.py's counter for the op-count and kernel tests: the module loaded once from its file, and the aten ops
and Triton launches of one call counted, or of one call under each value of a launch choice."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any, Callable, Iterable


@functools.cache
def bench_ops():
    """benchmarks/bench_ops.py as a module (it is a script, not a package)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ops.py"
    spec = importlib.util.spec_from_file_location("bench_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count(call: Callable[[], Any]):
    """The OpCounter of one `call()`: its aten ops (inside nsa:: custom ops too) and its Triton launches."""
    bench = bench_ops()
    counter = bench.OpCounter()
    with bench.counting_triton_launches(counter), counter:
        call()
    return counter


def count_choices(module: Any, setting: str, choices: Iterable[str], call: Callable[[], Any]) -> dict[str, Any]:
    """{choice: the OpCounter of `call()` with module.<setting> = choice}; the setting is put back after."""
    before = getattr(module, setting)
    try:
        out = {}
        for choice in choices:
            setattr(module, setting, choice)
            out[choice] = count(call)
        return out
    finally:
        setattr(module, setting, before)
