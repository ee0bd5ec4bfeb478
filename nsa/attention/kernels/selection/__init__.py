"""The block selection: each query group's importance of every selection block (paper Eq. 9, 10) and its top n_sel.

    naive.py   the PyTorch path's importance (the compressed attention probabilities, in query chunks); with
               nsa.attention.selection's importance_from_cmp and choose_blocks, the reference of the Triton path
    host.py    the Triton path's host side: tile configurations, the tiled and fused methods (the tiled one with
               either top-n_sel choice of nsa.attention.selection.TOPK_CHOICE), the custom op nsa::select_blocks
    jit.py     its Triton kernels (importance, its packed-key twin, fused top-k) and the row sort they share

Importing this package imports neither host.py nor jit.py: they need triton.
"""
