"""Batched-prefill kernels of the three branches.

reference.py is the PyTorch path: vectorized, runs on CPU and CUDA, and is the reference the Triton kernels are
tested against.
"""

from nsa.attention.kernels.reference import (cmp_group_probabilities, compressed_attention, selected_attention,
                                             window_attention)

__all__ = ["cmp_group_probabilities", "compressed_attention", "selected_attention", "window_attention"]
