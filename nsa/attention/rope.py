"""Rotary position embedding (rotate-half convention) at explicit positions.

Two implementations of the same rotation, chosen by NSAConfig.rope (NSA_ROPE, read once at start-up):

    reference  `apply_rope`: the formula as written (cat of the rotated half, fp32 multiplies, a cast; float64
               angles and multiplies for a float64 x, so a float64 layer is a float64 reference); the float64
               reference of the tests is this formula
    fused      `rope(..., impl="fused")` here: torch ops on the two halves in x's dtype with cos/sin cached per
               shape, device and dtype; the layers call `nsa.attention.kernels.rotary`, which on CUDA takes the
               Triton path's fused kernel instead (glue rope_add: one read and one write of x, angles in fp32,
               backward the rotation by -angle); both with no host synchronisation (torch.compile, CUDA graphs)

"auto" is the reference until an alternated GPU A/B shows the fused one faster (`resolve_rope`).
"""

from __future__ import annotations

import torch

from nsa.config import resolve_auto

ROPE_IMPLS = ("reference", "fused")  # what NSAConfig.rope ("auto" | one of these) resolves to
# what "auto" runs: the fused RoPE becomes it on CUDA once an alternated GPU A/B shows it faster on its own (not
# measured alone yet: reports/gpu/2026-11-28-h200)
QUALIFIED_ROPE = "reference"


def inv_frequencies(width: int, theta: float, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The rotation frequencies 1 / theta^(2j / width), j < width / 2, in `dtype` (fp32; float64 for a float64 x):
    the angle of position p is p * this."""
    return 1.0 / (theta ** (torch.arange(0, width, 2, device=device, dtype=dtype) / width))


def rope_angles(positions: torch.Tensor, width: int, theta: float,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [len(positions), width] for integer positions, computed in `dtype` (fp32, or float64 for a
    float64 x)."""
    angles = positions.to(dtype).unsqueeze(-1) * inv_frequencies(width, theta, positions.device, dtype)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate x [..., S, width] so that row s carries position positions[s] (the reference implementation): angles
    and multiplies in fp32, or in float64 for a float64 x (never below x's own precision), then a cast to x's dtype."""
    wide = torch.promote_types(x.dtype, torch.float32)
    cos, sin = rope_angles(positions, x.shape[-1], theta, wide)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.to(wide) * cos + rotated.to(wide) * sin).to(x.dtype)


def resolve_rope(choice: str) -> str:
    """The implementation NSAConfig.rope `choice` runs: auto is QUALIFIED_ROPE."""
    return resolve_auto("rope", choice, ROPE_IMPLS, QUALIFIED_ROPE)


def rope(x: torch.Tensor, theta: float, impl: str = "reference", start: int = 0, step: int = 1) -> torch.Tensor:
    """Rotate x [..., S, width] so that row s carries position start + step * s, by implementation `impl`
    (NSAConfig.rope: auto | reference | fused), with torch ops (nsa.attention.kernels.rotary adds the Triton kernel
    on CUDA)."""
    impl = resolve_rope(impl)
    s, width = x.shape[-2], x.shape[-1]
    if impl == "reference":
        return apply_rope(x, torch.arange(start, start + step * s, step, device=x.device), theta)
    cos, sin = _cos_sin(s, width, float(theta), start, step, x.device, x.dtype)
    half = width // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


_COS_SIN: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_COS_SIN_MAX = 64  # distinct (S, width, theta, start, step, device, dtype) kept; more are computed per call
# only tables that start at position 0 (a forward's, met again every step) are kept: a decode step's starts at its
# own position, met once, and kept they filled the table in 64 steps, after which nothing was cached


def _cos_sin(s: int, width: int, theta: float, start: int, step: int, device: torch.device,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [S, width / 2] of the angles (start + step * s) * inv_freq (fp32; float64 for float64), in `dtype`.
    Cached when `start` is 0 (a forward's table, the same every step; a decode step's, at its own position, is met
    once), except while torch.compile traces (it fuses them) or a CUDA graph captures (a tensor made there belongs
    to the graph's pool) or under inference mode: those compute them without storing."""
    key = (s, width, theta, start, step, str(device), dtype)
    hit = _COS_SIN.get(key)
    if hit is not None and not torch.compiler.is_compiling():
        return hit
    with torch.no_grad():
        wide = torch.promote_types(dtype, torch.float32)  # fp32 angles, as the reference (float64 for float64)
        pos = torch.arange(s, device=device, dtype=wide) * step + start
        inv_freq = 1.0 / (theta ** (torch.arange(0, width, 2, device=device, dtype=wide) / width))
        angles = pos.unsqueeze(-1) * inv_freq
        pair = (angles.cos().to(dtype), angles.sin().to(dtype))
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    # an inference-mode tensor could not be saved for a later backward
    if (start == 0 and not capturing and not torch.compiler.is_compiling() and not torch.is_inference_mode_enabled()
            and len(_COS_SIN) < _COS_SIN_MAX):
        _COS_SIN[key] = pair
    return pair
