"""Batched-prefill kernels of the three branches, and the choice between the two implementations.

One package per kernel op, each with its PyTorch path (naive.py: runs on CPU and CUDA, the CPU path and the
reference its Triton kernels are tested against), the Triton host side (host.py: launch configurations, custom
ops) and the Triton kernels (jit.py):

    range_attn/     the compressed and sliding-window branches (each query attends a contiguous range of keys)
    selected_attn/  the selected branch (block-sparse attention over the chosen blocks); index.py: the inverted
                    index's Triton build (NSAConfig.index_build: the default on a GPU)
    selection/      block importance (Eq. 9, 10) and top-n_sel selection
    glue/           the Triton path's glue (head split + RoPE + gate activation of the one packed projection,
                    compression pooling, compressed-key RoPE, gate + branch combine); no naive.py: the layer's
                    PyTorch path is its reference
    cross_entropy/  not attention: the language model's cross entropy over a chunk of logits, each row's loss and
                    its logit gradient in place (nsa.loss's "fused" loss, whose PyTorch chunked path is its
                    reference); here because it shares the kernels' ahead-of-time compile and interpreter checks
Beside them:
    backend.py      the branch pipeline's backends: one interface (compressed, select, selected, window) over
                    the PyTorch path and the Triton path, so that the layer writes the pipeline once
    common.py       what the ops share: interpreting(), the head widths and heads per group the Triton kernels are
                    built for, LOG2E, the PyTorch path's chunk size, one launch-configuration type, the tl.dot
                    precision and the index build
    flex.py         the three branches through PyTorch's FlexAttention (a peer path for bench_attention; not
                    a kernel choice)
    triton_ops.py   the five host.py modules imported together (triton_modules() loads it on first use)
    aot.py          ahead-of-time compilation of every Triton kernel for sm_80 / sm_90 (no GPU needed)
    qualify.py      every Triton kernel forward and backward once at one shape: what runbooks/gpu_kernels.yaml
                    runs under compute-sanitizer (python -m nsa.attention.kernels.qualify --help)
    interpreter_check.py  the address check of Triton's interpreter: every masked access a kernel makes must fall
                    inside one of its launch's tensors (the CPU tests' stand-in for compute-sanitizer's memcheck)

`resolve(choice, device, cfg, dtype)` turns the configured kernel (NSAConfig.kernel, NSA_KERNEL: auto | torch |
triton) into the path a forward on `device` takes for the layer's shape and compute dtype. "triton" where Triton
cannot run is an error, never a silent fallback.
"""

from __future__ import annotations

import functools
import importlib.util
from types import SimpleNamespace

import torch

from nsa.attention.kernels.common import (TRITON_DTYPES, TRITON_HEAD_DIMS, TRITON_INTERPRETER_DTYPES,
                                          TRITON_MAX_HEADS_PER_GROUP, TRITON_MAX_OVERLAP, index_build, interpreting)
from nsa.attention.kernels.range_attn.naive import compressed_attention, window_attention
from nsa.attention.kernels.selected_attn.naive import prepare_compile, selected_attention
from nsa.attention.kernels.selection.naive import cmp_group_probabilities
from nsa.attention.rope import resolve_rope, rope

__all__ = ["KernelUnavailable", "cmp_group_probabilities", "compressed_attention", "compute_dtype", "index_build",
           "prepare_compile", "resolve", "selected_attention",
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
    """The Triton kernel modules, as one namespace (glue, range, selected, selection: the layer's; cross_entropy:
    nsa.loss's), loaded on first use; ImportError without triton."""
    # triton is optional (a CPU install may lack it): its kernel modules load only when the Triton path runs
    from nsa.attention.kernels import triton_ops

    return SimpleNamespace(glue=triton_ops.glue, range=triton_ops.range_attn, selected=triton_ops.selected_attn,
                           selection=triton_ops.selection, cross_entropy=triton_ops.cross_entropy)


def triton_unsupported(cfg) -> str | None:
    """None when the Triton kernels are built for this NSAConfig's shape, else what is not (one line)."""
    for name in ("d_k", "d_v"):
        if getattr(cfg, name) not in TRITON_HEAD_DIMS:
            return (f"{name}={getattr(cfg, name)} is not a head width the Triton kernels are built for "
                    f"({', '.join(map(str, TRITON_HEAD_DIMS))})")
    if cfg.heads_per_group > TRITON_MAX_HEADS_PER_GROUP:
        return f"{cfg.heads_per_group} heads per KV group exceed the Triton kernels' {TRITON_MAX_HEADS_PER_GROUP}"
    overlap = min(cfg.l // cfg.d, cfg.l_sel // cfg.d)
    if overlap > TRITON_MAX_OVERLAP:
        return (f"min(l/d, l_sel/d) = min({cfg.l}/{cfg.d}, {cfg.l_sel}/{cfg.d}) = {overlap} exceeds the Triton "
                f"selection's {TRITON_MAX_OVERLAP} (its overlap weights are exact up to {TRITON_MAX_OVERLAP})")
    return None


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a layer's matmuls compute in for input x: autocast's where it applies (floating x below float64),
    else x's."""
    kind = x.device.type
    if x.dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


def triton_status(device, cfg=None, dtype=None) -> str | None:
    """None when the Triton kernels can run on `device` (for NSAConfig `cfg` and compute dtype `dtype`, if given),
    else the reason."""
    problem = _triton_importable()
    if problem:
        return problem
    if not (device.type == "cuda" or (device.type == "cpu" and interpreting())):
        return (f"no CUDA device (tensors are on {device.type}); the Triton kernels need a GPU, or "
                "TRITON_INTERPRET=1 for the interpreter on CPU")
    if dtype is not None:
        # the interpreter computes in fp32 whatever the device (it runs CUDA tensors on host copies too)
        interpreted = interpreting()
        dtypes = TRITON_INTERPRETER_DTYPES if interpreted else TRITON_DTYPES
        if dtype not in dtypes:
            where = " under the interpreter" if interpreted else ""
            return (f"the Triton kernels compute in {', '.join(str(d).removeprefix('torch.') for d in dtypes)}"
                    f"{where}, not {str(dtype).removeprefix('torch.')}")
    return triton_unsupported(cfg) if cfg is not None else None


def rotary(x, theta: float, impl: str = "reference", start: int = 0, step: int = 1):
    """RoPE of x [..., S, width] at positions start + step * s by NSAConfig.rope `impl`: the fused one on CUDA is the
    Triton path's kernel (glue rope_add) where it is built for the width, else nsa.attention.rope.rope."""
    if resolve_rope(impl) == "fused" and x.device.type == "cuda" and x.shape[-1] in TRITON_HEAD_DIMS \
            and triton_status(x.device) is None:
        return triton_modules().glue.rope_add(x, None, x.shape[-2], step, start, float(theta))
    return rope(x, theta, impl, start=start, step=step)


def resolve(choice: str, device, cfg=None, dtype=None) -> str:
    """"torch" or "triton": the path a batched forward on `device` takes for the configured kernel `choice`.

    auto: triton on CUDA when the kernels import and are built for the layer's shape (NSAConfig `cfg`, if given)
    and compute dtype (`dtype`, if given: compute_dtype of the input), else torch. triton: triton, or
    KernelUnavailable naming why it cannot run. torch: torch.
    """
    if choice == "torch":
        return "torch"
    if choice == "auto":
        return "triton" if device.type == "cuda" and triton_status(device, cfg, dtype) is None else "torch"
    if choice == "triton":
        problem = triton_status(device, cfg, dtype)
        if problem:
            raise KernelUnavailable(f"NSA_KERNEL / model.kernel is 'triton' but {problem}")
        return "triton"
    raise ValueError(f"kernel must be one of auto | torch | triton, got {choice!r}")
