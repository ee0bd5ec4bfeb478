"""The NSA attention layer and its parts.

    layer.py        NSAAttention: projections, the three branches, gates, the per-token oracle and decode step
    dense.py        DenseAttention: the dense twin (causal SDPA, same widths), the baseline NSA is compared with
    selection.py    block importance (Eq. 9, 10), top-n_sel with forced blocks, token ranges
    compression.py  phi: compressed keys/values of each block
    geometry.py     which compression/selection blocks exist and which a query sees; decode reads (Table 4)
    rope.py         rotary position embedding
    cache.py        the decode caches (NSACache; DenseCache, every key and value, for the dense twin)
    cost_model.py   what one layer's kernels must do at a shape (FLOPs, exponentials, minimal bytes) and their
                    floor on a device: the roofline
    kernels/        the batched prefill path: the PyTorch reference (CPU and CUDA) and the Triton kernels
"""

from nsa.attention.dense import DenseAttention
from nsa.attention.layer import BRANCHES, NSAAttention, NSAProjections

__all__ = ["BRANCHES", "DenseAttention", "NSAAttention", "NSAProjections"]
