"""AdamW with the usual decay split, the warmup + cosine learning-rate schedule, and the learning rate set in a way
a CUDA graph can replay (set_lr, make_capturable)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn

try:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices as _fused_devices
except ImportError:  # torch before 2.2: fused AdamW existed for CUDA only
    _fused_devices = None


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


def fused_adamw_unsupported(params: list[torch.Tensor]) -> str | None:
    """Why this torch cannot run a fused AdamW step over `params`, or None where it can. torch checks the same
    (device type and floating dtype) only at the first step; asking here turns that failure into one message."""
    devices = _fused_devices() if _fused_devices is not None else ["cuda"]
    for p in params:
        if p.device.type not in devices:
            return (f"torch {torch.__version__} has no fused AdamW for {p.device.type} "
                    f"(it has one for {', '.join(devices)})")
        if not torch.is_floating_point(p):
            return f"fused AdamW needs floating-point parameters, not {p.dtype}"
    return None


# The devices where unset NSA_OPT_FUSED takes torch's fused AdamW (one kernel per step over all parameters): none
# yet. CUDA joins once an alternated GPU A/B shows it faster; the one GPU pair so far (H200, 125M dense twin with
# CUDA graphs, reports/gpu/2026-11-28-h200) had it at 0.97x the foreach AdamW's tokens/s: not shown faster.
FUSED_BY_DEFAULT_ON: tuple[str, ...] = ()


def use_fused_adamw(choice: bool | None, params: list[torch.Tensor]) -> tuple[bool, str | None]:
    """(fused, why it was refused): NSA_OPT_FUSED 1 asks for the fused AdamW (refused, with the reason, where this
    torch has none for the parameters), 0 for the unfused one, and unset (None) takes the fused one on the devices
    of FUSED_BY_DEFAULT_ON where this torch has it, silently the unfused one otherwise."""
    if choice is False:
        return False, None
    why = fused_adamw_unsupported(params)
    if choice is None:
        return why is None and bool(params) and all(p.device.type in FUSED_BY_DEFAULT_ON for p in params), None
    return why is None, why


def build_adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                fused: bool) -> torch.optim.AdamW:
    """AdamW over param_groups; fused=True asks for torch's fused kernel (check fused_adamw_unsupported first)."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=1e-8,
                             fused=True if fused else None)


# The settings of an AdamW group that a resumed run takes from its own config and toggles, not from the checkpoint
# (whose param_groups torch's load_state_dict would otherwise restore whole): the hyperparameters, said when they
# changed, and the implementation (NSA_OPT_FUSED: fused / foreach), set silently. The learning rate is not among
# them: the schedule sets it before every step. Its kind is this run's, though (keep_settings): a checkpoint of a
# capturable AdamW (a CUDA graphs run) holds each group's learning rate as a tensor, which torch's foreach AdamW,
# the eager default on CUDA, refuses at its first step.
HYPERPARAMETERS = ("weight_decay", "betas", "eps")
IMPLEMENTATION = ("fused", "foreach", "capturable")


@contextlib.contextmanager
def keep_settings(optimizer: torch.optim.Optimizer):
    """Around a load of `optimizer`'s state (nsa.training.checkpoint.load): afterwards each group has this run's
    HYPERPARAMETERS and IMPLEMENTATION again, its step counts where that implementation keeps them (on the
    parameter's device for fused or capturable AdamW, else on the host), and its learning rate the checkpoint's
    value in this run's kind: a number, or this run's own tensor filled in place (make_capturable). Yields a list
    that holds, after the block, one line per hyperparameter that differed from the checkpoint's
    ("weight_decay 0.5 (the checkpoint's: 0.01)")."""
    keys = HYPERPARAMETERS + IMPLEMENTATION
    mine = [{k: group[k] for k in keys if k in group} for group in optimizer.param_groups]
    my_lrs = [group.get("lr") for group in optimizer.param_groups]
    changed: list[str] = []
    yield changed
    if len(mine) != len(optimizer.param_groups):
        return  # not this run's groups: the load itself fails on that (checkpoint.load names it)
    for group, my_lr in zip(optimizer.param_groups, my_lrs):
        lr = group.get("lr")
        if isinstance(my_lr, torch.Tensor):
            if lr is not my_lr:
                with torch.no_grad():
                    my_lr.fill_(float(lr))
                group["lr"] = my_lr
        elif isinstance(lr, torch.Tensor):
            group["lr"] = float(lr)
    for i, (group, settings) in enumerate(zip(optimizer.param_groups, mine)):
        for key, value in settings.items():
            before = group.get(key)
            same = (tuple(before) == tuple(value) if key == "betas" and before is not None else before == value)
            if key in HYPERPARAMETERS and not same:
                changed.append(f"group {i} {key} {_plain(value)} (the checkpoint's: {_plain(before)})")
            group[key] = value
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[p]["step"] = step.to(device=p.device if on_device else "cpu", dtype=torch.float32)


def _plain(value):
    return list(value) if isinstance(value, (tuple, list)) else value


def make_capturable(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Turn an AdamW (built by build_adamw, possibly loaded from a checkpoint) into one whose step can be captured in
    a CUDA graph (nsa.training.graphs): torch's capturable=True (step counts and bias corrections on the device, no
    host sync) and each group's learning rate a 0-d fp32 tensor on the parameters' device, which set_lr fills in
    place, so a replayed step reads the schedule's current value. Idempotent; state loaded with its step counts on
    the host (an eager run's checkpoint) is moved to the device."""
    optimizer.defaults["capturable"] = True
    for group in optimizer.param_groups:
        group["capturable"] = True
        if not group["params"]:  # an empty group (a model without vectors: no decay-free parameters) steps nothing
            continue
        device = group["params"][0].device
        lr = group["lr"]
        if not (isinstance(lr, torch.Tensor) and lr.device == device and lr.dtype == torch.float32 and lr.dim() == 0):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and (step.device != p.device or step.dtype != torch.float32):
                optimizer.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)
    return optimizer


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate = lr: assigned, or filled in place where it is a tensor (make_capturable)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def decay_length(decay_steps: int | None, steps: int, warmup_steps: int) -> int:
    """How many steps the cosine takes after the warmup: `decay_steps` where set, else the rest of the run
    (steps - warmup_steps, at least 1), so that the run's last step is at the floor."""
    return decay_steps if decay_steps is not None else max(1, steps - warmup_steps)


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
