"""An address check for Triton's interpreter: every load, store and atomic a kernel makes, where its mask is true,
must fall inside the storage of one of that launch's tensor arguments.

On a GPU compute-sanitizer's memcheck finds a kernel's out-of-bounds accesses. Through the interpreter (CPU, the
tests without a GPU) the kernel dereferences raw host addresses: an access outside its tensors reads or corrupts
whatever the heap holds there, so a wrong mask or offset shows, if at all, as a wrong value or as a crash of the
process much later ("corrupted size vs. prev_size", "free(): invalid size"), far from its cause. With the check
installed the access itself raises OutOfBounds naming the kernel's source line, the access kind, the offending
addresses and the launch's tensors (shape, dtype, storage span).

What it sees: accesses outside every argument's whole storage (what memcheck sees too; it cannot tell a read of
another view of the same storage from a read of the view passed, nor races). Its cost is a few numpy compares per
access: about 3% of an interpreted layer forward+backward.

Used by: tests/nsa/conftest.py, for the whole session wherever the kernels run through the interpreter, so every
kernel test checks its addresses (NSA_TEST_NO_BOUNDS=1 turns it off, to tell a fault of the check from one of a
kernel); `python -m nsa.attention.kernels.qualify --device cpu --check-addresses` (under TRITON_INTERPRET=1), every
kernel at a chosen shape. It patches the interpreter's builder (create_masked_load / create_masked_store /
create_atomic_rmw / create_atomic_cas) and GridExecutor._init_args_hst, which records the launch's storages:
`supported()` says whether this triton has them.
"""

from __future__ import annotations

import os
import traceback
from contextlib import contextmanager

try:
    import numpy as np  # the interpreter's own dependency
    import triton.runtime.interpreter as _interp
except ImportError:  # no triton: nothing to check
    _interp = None
# the triton package's directory: its frames are skipped when naming the kernel's line
_TRITON_DIR = os.path.dirname(os.path.dirname(_interp.__file__)) + os.sep if _interp is not None else "?"

_PATCHED = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")


class OutOfBounds(RuntimeError):
    """A kernel access outside the storages of its launch's tensor arguments."""


class _State:
    ranges: list[tuple[int, int, str]] = []  # (first byte, end byte, what) of the current launch's storages
    saved: dict | None = None


def supported() -> bool:
    """Whether this triton's interpreter has what the check patches (False without triton)."""
    return (_interp is not None and hasattr(_interp, "GridExecutor")
            and hasattr(_interp.GridExecutor, "_init_args_hst")
            and all(hasattr(_interp.InterpreterBuilder, name) for name in _PATCHED))


def _describe(t) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def _kernel_line() -> str:
    """The innermost frame of the interpreted kernel's own source (nsa/attention/kernels or a test's kernel)."""
    frames = [f for f in traceback.extract_stack()
              if not f.filename.startswith(_TRITON_DIR) and f.filename != __file__]
    f = frames[-1] if frames else None
    return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}: {(f.line or '').strip()}" if f else "?"


def _check(kind: str, ptrs, mask, size: int) -> None:
    p = np.asarray(ptrs)
    if p.size == 0:
        return
    p = p.astype(np.uint64, copy=False)
    m = np.broadcast_to(np.asarray(mask, dtype=bool), p.shape) if mask is not None else None
    sel = p[m] if m is not None else p.ravel()
    if sel.size == 0:
        return
    ok = np.zeros(sel.shape, dtype=bool)
    for start, end, _ in _State.ranges:
        ok |= (sel >= start) & (sel + np.uint64(size) <= end)
    if ok.all():
        return
    bad = sel[~ok]
    spans = "; ".join(f"{what} at [{start:#x}, {end:#x})" for start, end, what in _State.ranges)
    raise OutOfBounds(f"{kind} of {bad.size} element(s) of {size} bytes outside every tensor argument at "
                      f"{_kernel_line()} (first {int(bad[0]):#x}; nearest tensors: {spans})")


def _install() -> None:
    B, G = _interp.InterpreterBuilder, _interp.GridExecutor
    saved = {name: getattr(B, name) for name in _PATCHED}
    saved["_init_args_hst"] = G._init_args_hst
    _State.saved = saved

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = saved["_init_args_hst"](self, args_dev, kwargs)
        ranges = []
        for a in list(args_hst) + list(kwargs_hst.values()):
            for t in (a if isinstance(a, tuple) else (a,)):
                if hasattr(t, "untyped_storage"):
                    st = t.untyped_storage()
                    ranges.append((st.data_ptr(), st.data_ptr() + st.nbytes(), _describe(t)))
        _State.ranges = ranges
        return args_hst, kwargs_hst

    # the leading arguments only: the cache / eviction arguments after them differ between triton versions
    def masked_load(self, ptrs, mask, *rest, **kwargs):
        _check("load", ptrs.data, mask.data, _interp._get_np_dtype(ptrs.get_element_ty()).itemsize)
        return saved["create_masked_load"](self, ptrs, mask, *rest, **kwargs)

    def masked_store(self, ptrs, value, mask, *rest, **kwargs):
        _check("store", ptrs.data, mask.data, value.data.dtype.itemsize)
        return saved["create_masked_store"](self, ptrs, value, mask, *rest, **kwargs)

    def atomic_rmw(self, rmw_op, ptr, val, mask, *rest, **kwargs):
        _check("atomic", ptr.data, mask.data, val.data.dtype.itemsize)
        return saved["create_atomic_rmw"](self, rmw_op, ptr, val, mask, *rest, **kwargs)

    def atomic_cas(self, ptr, cmp, val, *rest, **kwargs):
        _check("atomic_cas", ptr.data, None, val.data.dtype.itemsize)
        return saved["create_atomic_cas"](self, ptr, cmp, val, *rest, **kwargs)

    G._init_args_hst = init_args
    B.create_masked_load, B.create_masked_store = masked_load, masked_store
    B.create_atomic_rmw, B.create_atomic_cas = atomic_rmw, atomic_cas


def _uninstall() -> None:
    saved, _State.saved = _State.saved, None
    _interp.GridExecutor._init_args_hst = saved.pop("_init_args_hst")
    for name, fn in saved.items():
        setattr(_interp.InterpreterBuilder, name, fn)
    _State.ranges = []


def installed() -> bool:
    return _State.saved is not None


@contextmanager
def checking():
    """The check installed for the block (a no-op where it already is, or where triton lacks what it patches)."""
    if installed() or not supported():
        yield
        return
    _install()
    try:
        yield
    finally:
        _uninstall()
