"""benchmarks/bench_ops.py's counter for the op-count and kernel tests: the module loaded once from its file, and the aten ops
and Triton launches of one call counted, or of one call under each value of a launch choice."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from benchmark_scripts import load


def bench_ops():
    """benchmarks/bench_ops.py as a module (benchmark_scripts.load: loaded once)."""
    return load("bench_ops")


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
