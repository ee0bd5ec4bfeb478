"""Four settings of Triton's interpreter that make the interpreted kernel tests faster without changing what a kernel
computes or what the tests check (tests/nsa/conftest.py turns all four on for the session where the kernels run
through the interpreter).

- `overflow_checks(False)`: the interpreter computes a check of every add, sub and mul of 32-bit (and narrower)
  integers for overflow (InterpreterOptions.sanitize_overflow, on by default; a compiled kernel checks only with
  debug=True): it redoes each operation in 64 bits and compares the result with the type's range, and then asserts
  the comparison only where its options say debug, which they do not by default. So the check changes no result and
  stops nothing; it took 36% of test_triton_layer's host-sync test (70 s against 45 s alone on the slower 2-core
  machine). At the shapes the interpreter runs no offset comes near 2**31; one that did would wrap (numpy's int32)
  to an address outside the launch's tensors, which nsa.attention.kernels.interpreter_check names.
  NSA_TEST_OVERFLOW_CHECK=1 keeps it on.
- `one_patch_per_launch()`: the interpreter patches triton.language (every builtin of tl, tl.core, tl.math and
  tl.tensor, found with inspect.getmembers) at every launch and again at every call of a @triton.jit helper inside
  the kernel (tl.sum and tl.zeros are such helpers), for every program of the grid; the inner patching finds every
  builtin already patched and sets the same closures again (and is never undone: the launch's own restore puts the
  originals back). Inside a launch that patched the same modules, it is skipped.
- `cached_np_dtypes()`: the interpreter's _get_np_dtype (the numpy dtype of a triton type, asked for at nearly every
  operation) builds a dictionary of all 19 types at each call; the answer for a type name is looked up once.
- `vectorized_combines()`: a reduction or scan whose combine function the interpreter has no numpy path for runs
  element by element in Python, calling the combine function on scalar tensors (ReduceOps.generic_reduce,
  ScanOps.generic_scan). Two such functions run in the suite's kernels: triton.language.standard's xor (tl.xor_sum,
  which tl.sort's bitonic network calls at each of its compare-and-swap rounds: 66 reductions over 2,048 elements for
  one sort of 2,048) and the index build's segmented count (nsa.attention.kernels.selected_attn.index._run_count).
  Both are computed with numpy over the whole block instead: an xor is exact in any order, and the count is the
  interpreter's own sequential recurrence in integer arithmetic that wraps as the loop's does. The xor reductions were
  a fifth of test_triton_selected's profile.
"""

from __future__ import annotations

import dataclasses
import inspect
from contextlib import contextmanager
from unittest import mock

import numpy as np

try:
    import triton.language as tl
    import triton.runtime.interpreter as _interp
except ImportError:  # no triton: nothing to set
    _interp = None


def overflow_check_supported() -> bool:
    """Whether this triton's interpreter has the overflow option that overflow_checks switches."""
    builder = getattr(_interp, "interpreter_builder", None)
    return hasattr(getattr(builder, "options", None), "sanitize_overflow")


@contextmanager
def overflow_checks(enabled: bool):
    """The interpreter's integer-overflow check on or off for the block, restored after (a no-op where triton has no
    such option)."""
    if not overflow_check_supported():
        yield
        return
    builder = _interp.interpreter_builder
    with mock.patch.object(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=enabled)):
        yield


def one_patch_supported() -> bool:
    """Whether this triton's interpreter patches the language the way one_patch_per_launch expects: a module-level
    _patch_lang(fn) returning a scope, called by GridExecutor.__call__ (a launch) and InterpretedFunction.__call__ (a
    @triton.jit helper called inside the kernel)."""
    return (_interp is not None and callable(getattr(_interp, "_patch_lang", None))
            and hasattr(_interp, "_LangPatchScope") and hasattr(getattr(_interp, "GridExecutor", None), "__call__"))


class _Launch:
    running = False  # a GridExecutor call is under way
    langs: frozenset | None = None  # ids of the language modules its own patch covered


_LANGS: dict = {}  # {function: _langs(function)}: a kernel's helpers are called at every program of every launch


def _langs(fn) -> frozenset:
    """The language modules a jit function sees (those _patch_lang patches for it), found once per function."""
    found = _LANGS.get(fn)
    if found is None:
        found = _LANGS[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                       if inspect.ismodule(v) and v in (tl, tl.core))
    return found


@contextmanager
def one_patch_per_launch():
    """For the block, inside a launch, a call of _patch_lang for a function that sees no language module other than
    those the launch has patched already returns an empty scope instead of patching again; every other call patches as
    before (a helper of triton.language.standard, such as tl.sum, sees tl.core besides tl: its first call in a launch
    patches tl.core, and the launch's later calls do not).
    Restored after; a no-op where this triton's interpreter is not as expected."""
    if not one_patch_supported() or getattr(_interp._patch_lang, "_one_patch", False):
        yield
        return
    original_patch, original_call = _interp._patch_lang, _interp.GridExecutor.__call__

    def patch_lang(fn):
        if not _Launch.running:
            return original_patch(fn)
        langs = _langs(fn)
        if _Launch.langs is None:  # the launch's own patch
            _Launch.langs = langs
            return original_patch(fn)
        if langs <= _Launch.langs:
            return _interp._LangPatchScope()
        _Launch.langs |= langs  # patched now for the rest of the launch (the interpreter never restores this one)
        return original_patch(fn)

    def call(self, *args, **kwargs):
        if _Launch.running:  # not expected: a launch inside a launch patches as before
            return original_call(self, *args, **kwargs)
        _Launch.running, _Launch.langs = True, None
        try:
            return original_call(self, *args, **kwargs)
        finally:
            _Launch.running, _Launch.langs = False, None

    patch_lang._one_patch = True
    patch_lang.original, call.original = original_patch, original_call  # for the tests that compare with them
    with mock.patch.object(_interp, "_patch_lang", patch_lang), \
            mock.patch.object(_interp.GridExecutor, "__call__", call):
        yield


def cached_np_dtypes_supported() -> bool:
    """Whether this triton's interpreter has the _get_np_dtype that cached_np_dtypes caches."""
    return _interp is not None and callable(getattr(_interp, "_get_np_dtype", None))


@contextmanager
def cached_np_dtypes():
    """For the block, the interpreter's _get_np_dtype answers from a cache keyed by the scalar type's name (pointers
    and blocks of pointers: uint64, as it says; a block: its element type's); restored after, a no-op where this
    triton has no such function."""
    if not cached_np_dtypes_supported() or getattr(_interp._get_np_dtype, "_cached", False):
        yield
        return
    original = _interp._get_np_dtype
    uint64 = np.dtype(np.uint64)
    cache: dict[str, np.dtype] = {}

    def get_np_dtype(tt_dtype):
        t = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(t, tl.pointer_type):
            return uint64
        name = getattr(t, "name", None)
        found = cache.get(name) if isinstance(name, str) else None
        if found is None:
            found = original(tt_dtype)
            if isinstance(name, str):
                cache[name] = found
        return found

    get_np_dtype._cached = True
    get_np_dtype.original = original
    with mock.patch.object(_interp, "_get_np_dtype", get_np_dtype):
        yield


def vectorized_combines_supported() -> bool:
    """Whether this triton's interpreter runs custom combines through ReduceOps.generic_reduce and
    ScanOps.generic_scan, and has the xor combine that vectorized_combines replaces."""
    return (_interp is not None and callable(getattr(getattr(_interp, "ReduceOps", None), "generic_reduce", None))
            and callable(getattr(getattr(_interp, "ScanOps", None), "generic_scan", None))
            and hasattr(tl.standard, "_xor_combine"))


def _xor_reduce(data: np.ndarray, axis: int) -> np.ndarray:
    return np.bitwise_xor.reduce(data, axis=axis)


def _run_count_scan(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scan of _run_count over 1-D blocks as the interpreter's loop computes it: out[0] = (k[0], c[0]), out[i] =
    (k[i], c[i] + (out[i-1]'s key == k[i] ? out[i-1]'s count : 0)); the key carried is each element's own, so the
    count restarts wherever the key differs from the one before it. Cumulative sums in the counts' own dtype (they
    wrap as the loop's additions do; the differences undo the wrap exactly)."""
    start = np.ones(keys.shape, dtype=bool)
    start[1:] = keys[1:] != keys[:-1]
    total = np.cumsum(counts, dtype=counts.dtype)
    before = (total - counts)[np.flatnonzero(start)]  # the sum of everything before each run
    return keys.copy(), total - before[np.cumsum(start) - 1]


@contextmanager
def vectorized_combines():
    """For the block, ReduceOps.generic_reduce over tl.standard's xor along one axis, and ScanOps.generic_scan of
    _run_count over 1-D blocks (keys, counts), compute with numpy; every other reduction and scan runs the
    interpreter's loop as before. Restored after; a no-op where this triton's interpreter is not as expected."""
    if not vectorized_combines_supported() or getattr(_interp.ReduceOps.generic_reduce, "_vectorized", False):
        yield
        return
    from nsa.attention.kernels.selected_attn.index import _run_count  # the kernels, imported under the interpreter

    original_reduce, original_scan = _interp.ReduceOps.generic_reduce, _interp.ScanOps.generic_scan

    def generic_reduce(self, input):
        if (self.combine_fn is not tl.standard._xor_combine or len(input) != 1 or self.axis is None
                or not 0 <= self.axis < input[0].handle.data.ndim):
            return original_reduce(self, input)
        out = _xor_reduce(input[0].handle.data, self.axis)
        if self.keep_dims:
            out = np.expand_dims(out, self.axis)
        return [self.to_tensor(out, input[0].dtype)]

    def generic_scan(self, input):
        if self.combine_fn is not _run_count or len(input) != 2 or self.axis != 0 or input[0].handle.data.ndim != 1:
            return original_scan(self, input)
        keys, counts = _run_count_scan(input[0].handle.data, input[1].handle.data)
        return [self.to_tensor(keys, input[0].dtype), self.to_tensor(counts, input[1].dtype)]

    generic_reduce._vectorized = generic_scan._vectorized = True
    generic_reduce.original, generic_scan.original = original_reduce, original_scan
    with mock.patch.object(_interp.ReduceOps, "generic_reduce", generic_reduce), \
            mock.patch.object(_interp.ScanOps, "generic_scan", generic_scan):
        yield
