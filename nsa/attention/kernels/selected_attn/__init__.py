"""The selected branch: block-sparse attention of each query over its chosen key blocks.

    naive.py   the PyTorch path (CPU and CUDA), the reference the Triton kernels are tested against
    host.py    the Triton path's host side: the inverted index of the chosen blocks (its torch build), launch
               configurations, the custom ops nsa::selected_attention_fwd / _bwd
    jit.py     its Triton kernels (KV-block-outer and query-outer forward, backward)
    index.py   the inverted index's Triton build, a counting sort (host side and kernels), equal to the torch one

Importing this package imports none of them: host.py and index.py need triton.
"""
