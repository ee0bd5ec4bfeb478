"""The Triton path's op modules, imported together: each op package's host.py (importing this needs triton;
nsa.attention.kernels.triton_modules() loads it on first use)."""

from nsa.attention.kernels.cross_entropy import host as cross_entropy
from nsa.attention.kernels.glue import host as glue
from nsa.attention.kernels.range_attn import host as range_attn
from nsa.attention.kernels.selected_attn import host as selected_attn
from nsa.attention.kernels.selection import host as selection

__all__ = ["cross_entropy", "glue", "range_attn", "selected_attn", "selection"]
