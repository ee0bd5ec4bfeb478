"""The Triton path's glue around the three branches: the packed projection's head split, RoPE and gate activation,
the compression pooling, the compressed keys' RoPE, and the gate + branch combine.

    host.py    the host side and the custom ops (the layer's PyTorch path is their reference)
    jit.py     its Triton kernels

Importing this package imports neither: they need triton.
"""
