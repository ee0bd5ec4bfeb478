"""The language model's cross entropy over a chunk of logits in one Triton kernel (nsa.loss's "fused" loss):
each row's loss and, in place, its gradient with respect to the logits.

    host.py    the host side and the custom op (nsa.loss's PyTorch chunked path is its reference)
    jit.py     its Triton kernel

Importing this package imports neither: they need triton.
"""
