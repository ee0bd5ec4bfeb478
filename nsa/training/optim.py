"""AdamW with the usual decay split, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (dim >= 2: projections, embeddings, head); none on norms, biases, vectors."""
    decay, no_decay = [], []
    seen = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                fused: bool) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=1e-8,
                             fused=True if fused else None)


def lr_at(step: int, *, lr: float, warmup_steps: int, schedule: str, decay_steps: int,
          min_lr_ratio: float) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warmup over warmup_steps, then cosine from lr
    down to min_lr_ratio * lr over decay_steps (constant at the floor afterwards), or constant."""
    if warmup_steps > 0 and step <= warmup_steps:
        return lr * step / warmup_steps
    if schedule == "constant":
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, decay_steps))
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
