"""The jit code of the fused cross entropy (nsa.attention.kernels.cross_entropy.host, whose docstring gives the
layout and the formulas): one program per row of logits, two passes over the row, no tensor-core products (a
memory-bound pass: the head's matmuls stay cuBLAS's)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _ce_rows_kernel(LOGITS, TARGETS, LOSS, V, stride_row, ignore_index,
                    BLOCK_V: tl.constexpr, WITH_GRAD: tl.constexpr):
    """LOSS[r] = logsumexp(LOGITS[r]) - LOGITS[r, t] for t = TARGETS[r] (0 where t is ignore_index, NaN where t is
    outside [0, V)); WITH_GRAD: LOGITS[r] is overwritten with softmax(LOGITS[r]) - onehot(t) (0 for an ignored
    row), in LOGITS' dtype. All arithmetic in fp32."""
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    t = tl.load(TARGETS + row)
    counted = t != ignore_index
    inside = (t >= 0) & (t < V)
    cols = tl.arange(0, BLOCK_V)
    # pass 1: the row's log-sum-exp, online over blocks of BLOCK_V columns (max, then the rescaled sum)
    m = float("-inf")
    s = 0.0
    for start in range(0, V, BLOCK_V):
        c = start + cols
        x = tl.load(base + c, mask=c < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    picked = tl.load(base + t, mask=counted & inside, other=0.0).to(tl.float32)
    loss = tl.where(counted, tl.where(inside, lse - picked, float("nan")), 0.0)
    tl.store(LOSS + row, loss)
    if WITH_GRAD:
        # pass 2: d loss / d logits = softmax - onehot(t), zero for an ignored row
        keep = tl.where(counted, 1.0, 0.0)
        for start in range(0, V, BLOCK_V):
            c = start + cols
            x = tl.load(base + c, mask=c < V, other=float("-inf")).to(tl.float32)
            g = (tl.exp(x - lse) - tl.where(c == t, 1.0, 0.0)) * keep
            tl.store(base + c, g.to(LOGITS.dtype.element_ty), mask=c < V)
