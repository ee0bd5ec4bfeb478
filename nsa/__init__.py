"""nsa: Native Sparse Attention (Yuan et al., 2025) for PyTorch, an NSA language model, and its trainer (nsa.train)."""

from nsa.attention import NSAAttention, NSAProjections
from nsa.attention.cache import NSACache
from nsa.config import NSAConfig
from nsa.attention.geometry import decode_reads
from nsa.model import ModelConfig, NSAModel, flops_per_token

__all__ = ["ModelConfig", "NSAAttention", "NSACache", "NSAConfig", "NSAModel", "NSAProjections", "decode_reads",
           "flops_per_token"]
