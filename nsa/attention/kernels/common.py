"""What the kernel ops of nsa.attention.kernels share: whether Triton's interpreter runs them, the shapes the Triton
kernels are built for, one launch-configuration type, LOG2E, the PyTorch path's chunk size, the tl.dot precision and
the build of the selected branch's index."""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from nsa.config import INDEX_BUILD_CHOICES

# Head widths the Triton kernels are built for (the range kernels' tiles; the others take more), and the most
# heads a KV group may have (a range-kernel query tile holds every head of its tokens).
TRITON_HEAD_DIMS = (32, 64, 128)
TRITON_MAX_HEADS_PER_GROUP = 32
# The most stride-d chunks a compression block and a selection block may share, min(l/d, l_sel/d): the selection
# kernels' overlap weights (Eq. 9) are dot operands, exact up to 256 in bf16 (selection/host.py).
TRITON_MAX_OVERLAP = 256
# What the Triton kernels compute in: bf16, fp16 or fp32 on a GPU (fp32 statistics; float64 would come back at fp32
# precision); under the interpreter fp32 or fp16 (it multiplies bf16 dot operands as raw integers: garbage).
TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TRITON_INTERPRETER_DTYPES = (torch.float16, torch.float32)

class LaunchConfig(NamedTuple):
    """A Triton kernel's launch configuration: its tile and its launch options (each op's host.py picks them;
    benchmarks/tune_kernels.py times alternatives). Unpacks as (block_m, block_n, num_warps, num_stages)."""

    block_m: int  # rows of a program's tile: tokens x heads of a group (range), (query, head) pairs (selected)
    block_n: int  # keys of a key tile
    num_warps: int
    num_stages: int = 2


# log2(e): the kernels take exp2 of scores scaled by it (and log-sum-exps come back through it)
LOG2E = 1.4426950408889634

# Score entries per chunk of the PyTorch path's chunked kernels (selected_attn/naive.py, selection/naive.py; 4M fp32
# = 16 MB): large enough for GEMM efficiency, small enough to stay in the allocator's reusable heap instead of fresh
# memory mappings. Read at each call (common.SCORE_CHUNK), so a test may shrink it.
SCORE_CHUNK = 1 << 22


# The TRITON_INTERPRET values Triton reads as on (triton.knobs' env_bool, case-insensitive, not stripped)
TRITON_INTERPRET_ON = ("1", "true", "yes", "on", "y")


def interpreting() -> bool:
    """Triton's interpreter is on (TRITON_INTERPRET=1): kernels run on CPU tensors, slowly, for testing.

    Read as Triton reads it (triton.knobs' env_bool: TRITON_INTERPRET_ON, any case, not stripped; its @triton.jit
    picks the interpreter by it), so that no value it reads as off ("2", " 1") lets a Triton choice on CPU through to
    a kernel compiled for a GPU. From the environment, never through triton.knobs: this runs inside code that
    torch.compile traces (the index build's choice), and Dynamo cannot trace the C getter behind the knobs."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in TRITON_INTERPRET_ON


def dot_precision(dtype: torch.dtype) -> str:
    """The input precision of the range and selected kernels' tl.dot for operands of `dtype`, passed to them as
    the constexpr DOT_PREC (each tl.dot's input_precision; Triton's `default_dot_input_precision` launch option does
    not reach tl.dot, which picks TF32 itself when given no precision).

    Triton multiplies fp32 operands in TF32 unless told otherwise (10 mantissa bits, ~1e-3 relative error), which
    would make the fp32 layer no more accurate than its bf16 one. fp32 therefore follows PyTorch's fp32 matmul
    setting, as FlexAttention does: IEEE fp32 products ("ieee": CUDA cores, no tensor cores) under the default
    precision "highest", TF32 ("tf32") once the user allows it (`torch.set_float32_matmul_precision("high")`). The
    IEEE kernels use the bf16 tile sizes and spill registers, up to 40 KB a thread at d = 128 (the AOT compile):
    fp32 is for checking, bf16 for speed.
    bf16 and fp16 operands always take the tensor cores: "tf32" is Triton's default, so their kernels are unchanged.
    """
    if dtype != torch.float32:
        return "tf32"
    setting = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
    ieee = setting == "ieee" if setting != "none" else torch.get_float32_matmul_precision() == "highest"
    return "ieee" if ieee else "tf32"


def index_build(build: str = "auto") -> str:
    """The build of the selected branch's inverted index that runs for `build` (NSAConfig.index_build), "torch" or
    "triton": "auto" is "triton", except under Triton's interpreter, where it is "torch" (its tl.sort is slow)."""
    if build not in INDEX_BUILD_CHOICES:
        raise ValueError(f"index_build must be one of {', '.join(INDEX_BUILD_CHOICES)}, got {build!r}")
    if build == "auto":
        return "torch" if interpreting() else "triton"
    return build
