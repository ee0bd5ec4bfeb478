"""Rotary position embedding (rotate-half convention) at explicit positions."""

from __future__ import annotations

import torch


def inv_frequencies(width: int, theta: float, device=None) -> torch.Tensor:
    """The rotation frequencies 1 / theta^(2j / width), j < width / 2, fp32 (the angle of position p is p * this)."""
    return 1.0 / (theta ** (torch.arange(0, width, 2, device=device, dtype=torch.float32) / width))


def rope_angles(positions: torch.Tensor, width: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [len(positions), width] for integer positions (computed in fp32)."""
    inv_freq = inv_frequencies(width, theta, positions.device)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate x [..., S, width] so that row s carries position positions[s]."""
    cos, sin = rope_angles(positions, x.shape[-1], theta)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)
