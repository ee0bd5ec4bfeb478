"""nsa: Native Sparse Attention (Yuan et al., 2025) for PyTorch, an NSA language model, and its trainer (nsa.training).

    attention/        the NSA layer (and its dense twin), selection, compression, decode caches, kernels
    model.py          NSAModel, the LLaMA-style language model (training forward; prefill, decode_step, generate),
                      and its cost model (flops_per_token)
    loss.py           the language model's cross entropy fused with its head (chunked; the Triton "fused" loss)
    config.py         NSAConfig, ModelConfig
    toggles.py        every NSA_* environment toggle
    observability.py  named ranges (NVTX) and the SDPA backend audit inside the layer
    training/         the trainer (nsa-train)

The names below are loaded on first use, so `import nsa` (and the torch-free modules nsa.config, nsa.toggles,
nsa.training.config) does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "NSAAttention": "nsa.attention.layer", "NSAProjections": "nsa.attention.layer",
    "DenseAttention": "nsa.attention.dense", "NSACache": "nsa.attention.cache", "DenseCache": "nsa.attention.cache",
    "NSAConfig": "nsa.config",
    "ModelConfig": "nsa.config", "decode_reads": "nsa.attention.geometry", "NSAModel": "nsa.model",
    "flops_per_token": "nsa.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'nsa' has no attribute {name!r}")
