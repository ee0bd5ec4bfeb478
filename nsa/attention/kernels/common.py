"""What every kernel module of nsa.attention.kernels shares: whether Triton's interpreter runs them, and the shapes
the Triton kernels are built for."""

from __future__ import annotations

import os

# Head widths the Triton kernels are built for (the range kernels' tiles; the others take more), and the most
# heads a KV group may have (a range-kernel query tile holds every head of its tokens).
TRITON_HEAD_DIMS = (32, 64, 128)
TRITON_MAX_HEADS_PER_GROUP = 32

# log2(e): the kernels take exp2 of scores scaled by it (and log-sum-exps come back through it)
LOG2E = 1.4426950408889634


def interpreting() -> bool:
    """Triton's interpreter is on (TRITON_INTERPRET=1): kernels run on CPU tensors, slowly, for testing."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no", "off")
