"""tests/nsa/interpreter_speed.py (the three interpreter settings every interpreted kernel test runs under,
tests/nsa/conftest.py): an int32 product that overflows wraps as numpy's int32 does with the overflow check on or
off (its assertion fires only in the interpreter's debug mode, where it stops the kernel); with one patch per launch
a kernel calling @triton.jit helpers (its own and triton.language.standard's) computes what it computes with the
interpreter's own patching, leaves triton.language as that does, and patches the language fewer times; every numpy
dtype answered from the cache is the interpreter's own; all three settings are on for this session."""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nsa import toggles
from triton_test_utils import HAVE_TRITON, ON_GPU

pytestmark = [pytest.mark.skipif(not HAVE_TRITON, reason="needs the triton package"),
              pytest.mark.skipif(ON_GPU, reason="settings of the interpreter (not used on a GPU)")]

if HAVE_TRITON:
    import triton
    import triton.language as tl
    import triton.runtime.interpreter as _interp

    import interpreter_speed

    @triton.jit
    def _times(X, Y, F, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i) * F)  # int32 * int32: overflows for large F

    @triton.jit
    def _scaled(x, s):
        return x * s

    @triton.jit
    def _row_sums(X, Y, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        x = tl.load(X + row * BLOCK + i)
        acc = tl.zeros([BLOCK], dtype=tl.float32) + _scaled(x, 2.0)  # a helper of ours and two of triton's
        tl.store(Y + row, tl.sum(tl.sigmoid(acc), axis=0) + tl.max(acc, axis=0))


def _speed():
    if not interpreter_speed.overflow_check_supported() or not interpreter_speed.one_patch_supported():
        pytest.skip("this triton's interpreter lacks what the settings change")
    return interpreter_speed


def _times_run(factor):
    x = torch.tensor([1, 3, 70_000, -70_000], dtype=torch.int32)
    y = torch.empty_like(x)
    _times[(1,)](x, y, factor, BLOCK=4)
    return y, (x.numpy() * np.int32(factor)).astype(np.int32)  # numpy's int32 product wraps


def test_the_overflow_check_changes_no_result_and_stops_a_kernel_only_in_debug_mode(monkeypatch):
    speed = _speed()
    factor = 1_000_000  # 70,000 x 1e6 > 2**31
    results = {}
    for enabled in (False, True):
        with speed.overflow_checks(enabled):
            results[enabled], wrapped = _times_run(factor)
    assert results[False].tolist() == results[True].tolist() == wrapped.tolist()  # numpy's int32 wrap, both ways
    assert results[False].tolist()[:2] == [factor, 3 * factor] and results[False].tolist()[2] != 70_000 * factor
    # the check's assertion fires only where the interpreter's options say debug (they do not by default)
    assert _interp.interpreter_builder.options.debug is False
    monkeypatch.setattr(_interp.interpreter_builder, "options",
                        dataclasses.replace(_interp.interpreter_builder.options, debug=True))
    with speed.overflow_checks(True):
        with pytest.raises(Exception, match="overflow"):
            _times_run(factor)
        y, _ = _times_run(3)  # no overflow: no error
    assert y.tolist() == [3, 9, 210_000, -210_000]
    with speed.overflow_checks(False):
        assert _times_run(factor)[0].tolist() == wrapped.tolist()


def _language_state():
    """The attributes of triton.language, its core module, its tensor class and its math module that are triton's
    builtins (the interpreter's patching replaces builtins by wrappers)."""
    modules = {"tl": tl, "core": tl.core, "tensor": tl.tensor, "math": tl.math}
    return sorted(f"{label}.{name}" for label, m in modules.items() for name in dir(m)
                  if tl.core.is_builtin(getattr(m, name, None)))


def _probe(mode: str) -> dict:
    """In this process (fresh: no launch has patched the language yet), two launches of _row_sums with the
    interpreter's own patching or one patch per launch: the outputs, the builtins left afterwards and how many times
    a module's builtins were patched."""
    counts = [0]
    patch_builtin = _interp._patch_builtin

    def counting(pkg, builder, scope):
        counts[0] += 1
        return patch_builtin(pkg, builder, scope)

    _interp._patch_builtin = counting
    with interpreter_speed.one_patch_per_launch() if mode == "one" else contextlib.nullcontext():
        runs = [_row_sums_run() for _ in range(2)]
    x = runs[0][0]
    return {"x": x.tolist(), "y": [y.tolist() for _, y in runs], "builtins": _language_state(), "patches": counts[0]}


def _row_sums_run():
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    y = torch.empty(5)
    _row_sums[(5,)](x, y, BLOCK=8)
    return x, y


def test_one_patch_per_launch_computes_and_leaves_the_language_as_the_interpreters_own_patching():
    """Each way in a fresh process: the first launch's helpers find triton.language.core unpatched (once a helper
    of triton.language.standard has patched it, the interpreter never restores it)."""
    _speed()
    here = Path(__file__).resolve()
    path = [str(here.parents[4]), str(here.parents[2]), os.environ.get("PYTHONPATH", "")]  # the repository, tests/nsa
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    found = {}
    for mode in ("interpreter", "one"):
        proc = subprocess.run([sys.executable, str(here), mode], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[mode] = json.loads(proc.stdout.splitlines()[-1])
    one, own = found["one"], found["interpreter"]
    x = torch.tensor(one["x"])
    reference = torch.sigmoid(2 * x).sum(1) + (2 * x).max(1).values
    for y in one["y"]:
        torch.testing.assert_close(torch.tensor(y), reference)
    assert one["y"] == own["y"] and one["x"] == own["x"]
    assert one["builtins"] == own["builtins"] and "tl.load" in one["builtins"]  # the launch's restore ran
    # 2 launches of 5 programs, each calling three helpers: the interpreter patches at every call, one per launch at
    # the launch and at the first helper that sees tl.core
    assert one["patches"] < own["patches"] / 3, (one["patches"], own["patches"])


def test_the_cached_numpy_dtypes_are_the_interpreters_own():
    """Every scalar type the interpreter maps, alone, as a block's element and behind a pointer (alone and as a
    block's element), asked for twice: the cached answer is the interpreter's own; a type it has no numpy dtype for
    is refused as it refuses it."""
    speed = _speed()
    if not speed.cached_np_dtypes_supported():
        pytest.skip("this triton's interpreter has no _get_np_dtype")
    assert getattr(_interp._get_np_dtype, "_cached", False), "the session runs with the cache"
    cached, original = _interp._get_np_dtype, _interp._get_np_dtype.original
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    types = [t for s in scalars for t in (s, tl.block_type(s, [4, 2]), tl.pointer_type(s),
                                          tl.block_type(tl.pointer_type(s), [8]))]
    for _ in range(2):
        for t in types:
            assert cached(t) == original(t), t
    assert {str(cached(s)) for s in scalars} >= {"bool", "int8", "uint16", "float32", "float64"}
    assert cached(tl.pointer_type(tl.float32)) == np.dtype(np.uint64) == cached(tl.block_type(tl.pointer_type(
        tl.int8), [2]))
    with pytest.raises(KeyError):
        original(tl.void)
    with pytest.raises(KeyError):
        cached(tl.void)


def test_the_settings_are_on_for_this_session():
    """(NSA_TEST_OVERFLOW_CHECK=1 keeps the overflow check on.)"""
    _speed()
    assert _interp.interpreter_builder.options.sanitize_overflow == bool(toggles.parse("NSA_TEST_OVERFLOW_CHECK"))
    assert getattr(_interp._patch_lang, "_one_patch", False)
    assert getattr(_interp._get_np_dtype, "_cached", False) or not interpreter_speed.cached_np_dtypes_supported()


if __name__ == "__main__":  # the probe of the one-patch test, in a process of its own
    print(json.dumps(_probe(sys.argv[1])))
