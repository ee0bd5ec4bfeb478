"""A checkpoint written by a run under CUDA graphs (its AdamW made capturable: each group's learning rate a 0-d
tensor) and resumed by an eager run (--cuda-graphs off): the resumed AdamW steps with this run's implementation
and continues the uninterrupted float64 AdamW. On CUDA torch's AdamW defaults to foreach=True, which refuses a
tensor learning rate without capturable=True; the test asks for foreach=True on the CPU to take the same path."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from nsa.training import checkpoint
from nsa.training.distributed import DistInfo
from nsa.training.optim import build_adamw, keep_settings, make_capturable, set_lr

LR, WD, BETAS, STEPS, SAVED = 0.05, 0.1, (0.9, 0.95), 5, 2
INFO = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
X = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3)).double()


def _lr(step):
    return LR / step  # any schedule: set before every step, as the trainer does


def _train(model, optimizer, first, last):
    for step in range(first, last + 1):
        set_lr(optimizer, _lr(step))
        (model(X) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _reference():
    """torch's AdamW configured by hand (matrices decayed, the rest not), uninterrupted, single-tensor."""
    model = _model()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=1e-8, foreach=False)
    _train(model, opt, 1, STEPS)
    return model


def test_a_checkpoint_of_a_capturable_adamw_resumes_in_an_eager_foreach_adamw(tmp_path):
    graphed = _model()
    graphed_opt = build_adamw(graphed, lr=LR, weight_decay=WD, betas=BETAS, fused=False)
    _train(graphed, graphed_opt, 1, SAVED)
    make_capturable(graphed_opt)  # what a --cuda-graphs run's optimizer is when it saves
    assert all(isinstance(g["lr"], torch.Tensor) for g in graphed_opt.param_groups)
    # its step counts go back to the host for this CPU stand-in (a CPU AdamW cannot step capturable)
    checkpoint.save(tmp_path, SAVED, graphed, graphed_opt, INFO, data_state={}, scaler=None, parallel="none", keep=1)

    resumed = _model()
    resumed_opt = build_adamw(resumed, lr=LR, weight_decay=WD, betas=BETAS, fused=False)
    for group in resumed_opt.param_groups:
        group["foreach"] = True  # torch's choice on CUDA
    with keep_settings(resumed_opt) as changed:
        step, _ = checkpoint.load(checkpoint.latest_checkpoint(tmp_path), resumed, resumed_opt, INFO, scaler=None)
    assert step == SAVED and changed == []
    for group in resumed_opt.param_groups:
        assert group["foreach"] is True and group["capturable"] is False
        assert float(group["lr"]) == pytest.approx(_lr(SAVED), rel=1e-7)  # the checkpoint's value (fp32)
    _train(resumed, resumed_opt, SAVED + 1, STEPS)  # raised: lr as a Tensor is not supported for foreach=True
    assert not any(isinstance(group["lr"], torch.Tensor) for group in resumed_opt.param_groups)  # a number
    for p, q in zip(_reference().parameters(), resumed.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-12, atol=1e-14)


def test_a_capturable_adamw_keeps_its_learning_rate_tensor_through_a_load():
    """The other way round: this run's AdamW already capturable (its learning rate a tensor, which a captured graph
    reads) keeps that very tensor through a load of an eager AdamW's state, filled with the loaded value."""
    eager = _model()
    eager_opt = build_adamw(eager, lr=LR, weight_decay=WD, betas=BETAS, fused=False)
    _train(eager, eager_opt, 1, SAVED)
    resumed = _model()
    resumed_opt = make_capturable(build_adamw(resumed, lr=LR, weight_decay=WD, betas=BETAS, fused=False))
    tensors = [g["lr"] for g in resumed_opt.param_groups]
    with keep_settings(resumed_opt):
        resumed_opt.load_state_dict(eager_opt.state_dict())
    for group, tensor in zip(resumed_opt.param_groups, tensors):
        assert group["lr"] is tensor and float(tensor) == pytest.approx(_lr(SAVED), rel=1e-7)
        assert group["capturable"] is True
