"""The compressed and sliding-window branches: attention of each query over a contiguous range of keys.

    naive.py   the PyTorch path (CPU and CUDA), the reference the Triton kernels are tested against
    host.py    the Triton path's host side: launch configurations, the custom ops nsa::range_attention(_bwd)
    jit.py     its Triton kernels (forward, dQ, dK/dV)

Importing this package imports neither: host.py needs triton.
"""
