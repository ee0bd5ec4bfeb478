"""Batched-prefill kernels of the three branches, and the choice between the two implementations.

    reference.py          the PyTorch path: vectorized, runs on CPU and CUDA; the reference the Triton kernels are
                          tested against, and the CPU path
    triton_range.py       Triton: compressed and sliding-window branches (each query attends a contiguous range);
                          its jit code in triton_range_kernels.py
    triton_selection.py   Triton: block importance (Eq. 9, 10) and top-n_sel selection
    triton_selected.py    Triton: the selected branch (block-sparse attention over the chosen blocks); its jit
                          code in triton_selected_kernels.py
    triton_glue.py        Triton: the layer's glue on the Triton path (head split + RoPE + gate activation of the
                          one packed projection, compression pooling, compressed-key RoPE, gate + branch combine);
                          its jit code in triton_glue_kernels.py
    triton_index.py       Triton: the selected branch's inverted index as a counting sort (NSAConfig.index_build:
                          the default on a GPU; the torch build under the interpreter, whose tl.sort is slow)
    flex.py               the three branches through PyTorch's FlexAttention (a peer path for bench_attention; not
                          a kernel choice)
    common.py             what the kernel modules share: interpreting(), the head widths and heads per group
                          the Triton kernels are built for
    aot.py                ahead-of-time compilation of every Triton kernel for sm_80 / sm_90 (no GPU needed)
    qualify.py            every Triton kernel forward and backward once at one shape: what runbooks/gpu_kernels.yaml
                          runs under compute-sanitizer (python -m nsa.attention.kernels.qualify --help)

`resolve(choice, device)` turns the configured kernel (NSAConfig.kernel, NSA_KERNEL: auto | torch | triton) into
the path a forward on `device` takes. "triton" where Triton cannot run is an error, never a silent fallback.
"""

from __future__ import annotations

import functools
import importlib.util
from types import SimpleNamespace

from nsa.attention.kernels.common import TRITON_HEAD_DIMS, TRITON_MAX_HEADS_PER_GROUP, index_build, interpreting
from nsa.attention.kernels.reference import (cmp_group_probabilities, compressed_attention, selected_attention,
                                             window_attention)

__all__ = ["KernelUnavailable", "cmp_group_probabilities", "compressed_attention", "index_build", "resolve",
           "selected_attention",
           "triton_modules", "triton_status", "triton_unsupported", "window_attention"]


class KernelUnavailable(RuntimeError):
    """NSA_KERNEL=triton (or model.kernel: triton) where the Triton kernels cannot run."""


@functools.lru_cache(maxsize=1)
def _triton_importable() -> str | None:
    """None when the Triton kernel modules import, else why not (one line)."""
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (pip install -e '.[gpu]'; CUDA builds of torch ship it)"
    try:
        triton_modules()
    except Exception as exc:  # noqa: BLE001 - any import failure means the path cannot run; say which
        return f"the Triton kernels failed to import: {type(exc).__name__}: {exc}"
    return None


def triton_modules() -> SimpleNamespace:
    """The Triton kernel modules the layer runs, as one namespace (glue, range, selected, selection), loaded on
    first use; ImportError without triton."""
    # triton is optional (a CPU install may lack it): its kernel modules load only when the Triton path runs
    from nsa.attention.kernels import triton_glue, triton_range, triton_selected, triton_selection

    return SimpleNamespace(glue=triton_glue, range=triton_range, selected=triton_selected, selection=triton_selection)


def triton_unsupported(cfg) -> str | None:
    """None when the Triton kernels are built for this NSAConfig's shape, else what is not (one line)."""
    for name in ("d_k", "d_v"):
        if getattr(cfg, name) not in TRITON_HEAD_DIMS:
            return (f"{name}={getattr(cfg, name)} is not a head width the Triton kernels are built for "
                    f"({', '.join(map(str, TRITON_HEAD_DIMS))})")
    if cfg.heads_per_group > TRITON_MAX_HEADS_PER_GROUP:
        return f"{cfg.heads_per_group} heads per KV group exceed the Triton kernels' {TRITON_MAX_HEADS_PER_GROUP}"
    return None


def triton_status(device, cfg=None) -> str | None:
    """None when the Triton kernels can run on `device` (for NSAConfig `cfg`, if given), else the reason."""
    problem = _triton_importable()
    if problem:
        return problem
    if not (device.type == "cuda" or (device.type == "cpu" and interpreting())):
        return (f"no CUDA device (tensors are on {device.type}); the Triton kernels need a GPU, or "
                "TRITON_INTERPRET=1 for the interpreter on CPU")
    return triton_unsupported(cfg) if cfg is not None else None


def resolve(choice: str, device, cfg=None) -> str:
    """"torch" or "triton": the path a batched forward on `device` takes for the configured kernel `choice`.

    auto: triton on CUDA when the kernels import and are built for the layer's shape (NSAConfig `cfg`, if given),
    else torch. triton: triton, or KernelUnavailable naming why it cannot run. torch: torch.
    """
    if choice == "torch":
        return "torch"
    if choice == "auto":
        return "triton" if device.type == "cuda" and triton_status(device, cfg) is None else "torch"
    if choice == "triton":
        problem = triton_status(device, cfg)
        if problem:
            raise KernelUnavailable(f"NSA_KERNEL / model.kernel is 'triton' but {problem}")
        return "triton"
    raise ValueError(f"kernel must be one of auto | torch | triton, got {choice!r}")
