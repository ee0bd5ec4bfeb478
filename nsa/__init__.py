"""nsa: Native Sparse Attention (Yuan et al., 2025) for PyTorch, and (next) the model and trainer built on it."""

from nsa.attention import NSAAttention, NSAProjections
from nsa.cache import NSACache
from nsa.config import NSAConfig
from nsa.geometry import decode_reads

__all__ = ["NSAAttention", "NSACache", "NSAConfig", "NSAProjections", "decode_reads"]
