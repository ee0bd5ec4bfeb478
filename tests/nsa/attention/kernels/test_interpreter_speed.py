"""tests/nsa/interpreter_speed.py (the four interpreter settings every interpreted kernel test runs under,
tests/nsa/conftest.py): an int32 product that overflows wraps as numpy's int32 does with the overflow check on or
off (its assertion fires only in the interpreter's debug mode, where it stops the kernel); with one patch per launch
a kernel calling @triton.jit helpers (its own and triton.language.standard's) computes what it computes with the
interpreter's own patching, leaves triton.language as that does, and patches the language fewer times; every numpy
dtype answered from the cache is the interpreter's own; the numpy xor reductions and segmented counts give what the
interpreter's loop gives, in a kernel too, and every other combine still runs the loop; all four settings are on for
this session."""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

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

    @triton.jit
    def _sort_and_count(X, S, R, BLOCK: tl.constexpr):
        """The index build's two combines in one kernel: tl.sort (its xor reductions) and the segmented count."""
        from nsa.attention.kernels.selected_attn.index import _run_count

        i = tl.arange(0, BLOCK)
        srt = tl.sort(tl.load(X + i))
        _, rank = tl.associative_scan((srt, tl.full([BLOCK], 1, tl.int32)), 0, _run_count)
        tl.store(S + i, srt)
        tl.store(R + i, rank)

    @triton.jit
    def _max_abs(a, b):
        return tl.maximum(tl.abs(a), tl.abs(b))

    @triton.jit
    def _reduce_max_abs(X, Y, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y, tl.reduce(tl.load(X + i), 0, _max_abs))


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


def _combines():
    speed = _speed()
    if not speed.vectorized_combines_supported():
        pytest.skip("this triton's interpreter has no generic_reduce / generic_scan")
    assert getattr(_interp.ReduceOps.generic_reduce, "_vectorized", False), "the session runs with the numpy combines"
    return _interp.ReduceOps.generic_reduce, _interp.ScanOps.generic_scan


@contextlib.contextmanager
def _language_patched():
    """triton.language as a launch patches it (the combine functions' operators and tl.where need it), outside one."""
    from nsa.attention.kernels.selected_attn.index import _run_count

    scopes = [_interp._patch_lang(fn) for fn in (_run_count.fn, tl.standard._xor_combine.fn)]
    try:
        yield
    finally:
        for scope in reversed(scopes):
            scope.restore()


def _block(data: np.ndarray, dtype):
    return _interp.ReduceOps(0, None, False).to_tensor(data, dtype)


def _same(a, b):
    """Two interpreter tensors: the same type, and the same data bit for bit (shape and numpy dtype included)."""
    assert a.type == b.type and a.handle.data.dtype == b.handle.data.dtype
    assert a.handle.data.shape == b.handle.data.shape
    assert a.handle.data.tobytes() == b.handle.data.tobytes()


def test_the_numpy_xor_reduction_is_the_interpreters_own():
    """Integers of every width, signed and not, over blocks of one to six dimensions (tl.sort's hypercube of 2s
    among them), along every axis, with and without keep_dims."""
    fast, _ = _combines()
    rng = np.random.default_rng(0)
    dtypes = [(tl.int8, np.int8), (tl.uint8, np.uint8), (tl.int16, np.int16), (tl.int32, np.int32),
              (tl.uint32, np.uint32), (tl.int64, np.int64)]
    for shape in [(16,), (4, 8), (2, 4, 8), (2,) * 6]:
        for tt, nt in dtypes:
            info = np.iinfo(nt)
            data = rng.integers(info.min, info.max, size=shape, dtype=nt, endpoint=True)
            for axis in range(len(shape)):
                for keep in (False, True):
                    op = _interp.ReduceOps(axis, tl.standard._xor_combine, keep)
                    with _language_patched():
                        got, want = fast(op, (_block(data, tt),)), fast.original(op, (_block(data, tt),))
                    assert len(got) == len(want) == 1
                    _same(got[0], want[0])
                    expected = np.bitwise_xor.reduce(data, axis=axis, keepdims=keep)
                    assert got[0].handle.data.reshape(expected.shape).tolist() == expected.tolist()


def test_the_numpy_segmented_count_is_the_interpreters_own():
    """_run_count's scan over sorted keys with ones (the index build's use), unsorted keys with runs, a single
    element, and counts near int32's limits (the loop's additions wrap; so do the cumulative sums)."""
    from nsa.attention.kernels.selected_attn.index import _run_count

    _, fast = _combines()
    rng = np.random.default_rng(1)
    cases = [(np.sort(rng.integers(0, 9, 64)).astype(np.int32), np.ones(64, np.int32)),
             (rng.integers(0, 3, 32).astype(np.int32), rng.integers(-5, 6, 32).astype(np.int32)),
             (np.array([7], np.int32), np.array([3], np.int32)),
             (np.repeat(np.array([1, 2, 2, 5], np.int32), 8),
              rng.integers(2**30, 2**31 - 1, 32).astype(np.int32))]
    for keys, counts in cases:
        op = _interp.ScanOps(0, _run_count, False)
        args = (_block(keys, tl.int32), _block(counts, tl.int32))
        with _language_patched():
            got, want = fast(op, args), fast.original(op, args)
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            _same(g, w)
    # the index build's rank: 1, 2, ... within each run of equal sorted keys
    keys = np.array([0, 0, 0, 3, 4, 4, 9, 9], np.int32)
    ranks = fast(_interp.ScanOps(0, _run_count, False), (_block(keys, tl.int32), _block(np.ones(8, np.int32),
                                                                                      tl.int32)))[1]
    assert ranks.handle.data.tolist() == [1, 2, 3, 1, 1, 2, 1, 2]


def test_a_kernel_sorts_and_counts_the_same_with_the_numpy_combines_and_other_combines_run_the_loop():
    """_sort_and_count (tl.sort of 64 keys with repeats, then the segmented count) with the numpy combines and with
    the interpreter's loops: the same output bit for bit, and numpy's sort with ranks from 1 in each run. A
    reduction with another combine of its own (_max_abs) still goes through the interpreter's loop."""
    fast_reduce, fast_scan = _combines()
    x = torch.randint(-20, 20, (64,), dtype=torch.int32, generator=torch.Generator().manual_seed(2))

    def run():
        s, r = torch.empty_like(x), torch.empty_like(x)
        _sort_and_count[(1,)](x, s, r, BLOCK=64)
        return s, r

    xor = tl.standard._xor_combine
    xors = []

    def counting_xor(a, b, _fn=xor.fn):
        xors.append(1)
        return _fn(a, b)

    with mock.patch.object(xor, "fn", counting_xor):
        fast_out = run()
        assert not xors, "the numpy xor calls no combine"
        with mock.patch.object(_interp.ReduceOps, "generic_reduce", fast_reduce.original), \
                mock.patch.object(_interp.ScanOps, "generic_scan", fast_scan.original):
            loop_out = run()
        assert len(xors) > 64  # the loop: 32 per reduction over 64 elements, 21 reductions in a sort of 64
    assert all(torch.equal(a, b) for a, b in zip(fast_out, loop_out))
    srt = np.sort(x.numpy())
    assert fast_out[0].tolist() == srt.tolist()
    assert fast_out[1].tolist() == [int(np.sum(srt[:i + 1] == v)) for i, v in enumerate(srt)]
    calls = []
    combine = _max_abs.fn

    def counting(a, b):
        calls.append(1)
        return combine(a, b)

    y = torch.empty(1)
    values = torch.tensor([0.5, -3.0, 2.0, 1.0])
    with mock.patch.object(_max_abs, "fn", counting):
        _reduce_max_abs[(1,)](values, y, BLOCK=4)
    assert len(calls) == 3 and y.item() == 3.0  # the loop: one combine per element after the first


def test_the_settings_are_on_for_this_session():
    """(NSA_TEST_OVERFLOW_CHECK=1 keeps the overflow check on.)"""
    _speed()
    assert _interp.interpreter_builder.options.sanitize_overflow == bool(toggles.parse("NSA_TEST_OVERFLOW_CHECK"))
    assert getattr(_interp._patch_lang, "_one_patch", False)
    assert getattr(_interp._get_np_dtype, "_cached", False) or not interpreter_speed.cached_np_dtypes_supported()
    assert (getattr(_interp.ScanOps.generic_scan, "_vectorized", False)
            or not interpreter_speed.vectorized_combines_supported())


if __name__ == "__main__":  # the probe of the one-patch test, in a process of its own
    print(json.dumps(_probe(sys.argv[1])))
