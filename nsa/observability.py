"""Observability hooks inside the attention layer: named ranges (NVTX) and the SDPA backend audit.

Both are off by default and cost one attribute check per call when off. The trainer switches them on once at
start-up from NSA_NVTX / NSA_SDPA_AUDIT (see nsa.toggles); library users can call `configure` directly.

- `span(name)`: a named range around a piece of the layer ("nsa.cmp", "nsa.sel", "nsa.win",
  "nsa.sel.importance", "nsa.sel.topk", "nsa.sel.ranges_v2" / "nsa.sel.ranges_v1"). When enabled it is a
  torch.profiler `record_function` range (visible in profiler traces on every device) and, on CUDA, an NVTX
  range (visible in Nsight Systems).
- `SdpaAudit`: records which scaled_dot_product_attention backend (flash, efficient, cudnn, math) served each
  call site, by watching the aten operator SDPA dispatches to. Counts per (site, backend, device, dtype).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from typing import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

# aten operator -> backend name; a call that dispatches none of these ran the math (composite) path.
SDPA_BACKEND_OPS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "fused",
}


class _State:
    nvtx: bool = False
    audit: "SdpaAudit | None" = None


_state = _State()


def configure(*, nvtx: bool | None = None, audit: "SdpaAudit | None | bool" = False) -> None:
    """Switch named ranges on/off (nvtx) and install (an SdpaAudit) or remove (None) the SDPA audit.

    Arguments left at their defaults (nvtx=None, audit=False) leave that setting unchanged.
    """
    if nvtx is not None:
        _state.nvtx = bool(nvtx)
    if audit is not False:
        _state.audit = audit


class _Span:
    __slots__ = ("name", "rf", "cuda")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.rf = torch.autograd.profiler.record_function(self.name)
        self.rf.__enter__()
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.nvtx.range_push(self.name)
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.nvtx.range_pop()
        self.rf.__exit__(*exc)
        return False


_NULL = contextlib.nullcontext()


def span(name: str):
    """A named range when spans are enabled, else a shared no-op context."""
    return _Span(name) if _state.nvtx else _NULL


class _OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.backend = "math"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        backend = SDPA_BACKEND_OPS.get(name)
        if backend is not None:
            self.backend = backend
        return func(*args, **(kwargs or {}))


class SdpaAudit:
    """Counts SDPA calls per (site, backend, device, dtype); thread-safe; `summary()` is JSON-ready."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: Counter = Counter()

    def record(self, site: str, backend: str, q: torch.Tensor) -> None:
        key = (site, backend, q.device.type, str(q.dtype).replace("torch.", ""))
        with self._lock:
            self.counts[key] += 1

    def summary(self) -> dict:
        with self._lock:
            rows = [{"site": s, "backend": b, "device": d, "dtype": t, "calls": n}
                    for (s, b, d, t), n in sorted(self.counts.items())]
        backends = sorted({r["backend"] for r in rows})
        return {"calls": sum(r["calls"] for r in rows), "backends": backends, "by_site": rows}


def audited_sdpa(site: str, fn: Callable[..., torch.Tensor], q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """fn(q, *args, **kwargs), recording its SDPA backend under `site` when an audit is installed."""
    audit = _state.audit
    if audit is None:
        return fn(q, *args, **kwargs)
    with _OpRecorder() as rec:
        out = fn(q, *args, **kwargs)
    audit.record(site, rec.backend, q)
    return out


def sdpa_backends(flash_only: bool, no_flash: bool):
    """Context restricting SDPA backends per NSA_SDPA_FLASH_ONLY / NSA_SDPA_NO_FLASH (no-op when neither)."""
    if flash_only:
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    if no_flash:
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH])
    return contextlib.nullcontext()
