"""nsa.training.optim: the warmup + cosine learning-rate schedule (lr_at) and AdamW's decay split; its AdamW with the
schedule and clipping against a float64 AdamW written out by hand, and across a checkpoint mid-schedule."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from nsa.training import checkpoint
from nsa.training.distributed import DistInfo
from nsa.training.optim import build_adamw, keep_settings, lr_at, param_groups, set_lr

LR = 3e-4


def cosine(step, warmup=10, decay=100, floor=0.1):
    return lr_at(step, lr=LR, warmup_steps=warmup, schedule="cosine", decay_steps=decay, min_lr_ratio=floor)


def test_warmup_is_linear_from_lr_over_warmup_to_lr():
    assert [cosine(s) for s in (1, 5, 10)] == pytest.approx([LR / 10, LR / 2, LR])
    assert cosine(1) > 0  # the first step already learns (1-based steps)


def test_cosine_runs_from_lr_to_the_floor_over_decay_steps_then_stays():
    assert cosine(10) == pytest.approx(LR)
    assert cosine(10 + 50) == pytest.approx(LR * 0.1 + (LR - LR * 0.1) * 0.5)  # half way: the mean of both ends
    assert cosine(10 + 100) == pytest.approx(LR * 0.1)
    assert cosine(10 + 1000) == pytest.approx(LR * 0.1)  # constant at the floor afterwards
    values = [cosine(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # never rises after warmup


def test_cosine_matches_the_closed_form():
    for step in (11, 37, 80):
        progress = (step - 10) / 100
        expected = LR * 0.1 + (LR - LR * 0.1) * 0.5 * (1 + math.cos(math.pi * progress))
        assert cosine(step) == pytest.approx(expected, rel=1e-12)


def test_constant_schedule_and_no_warmup():
    kw = dict(lr=LR, warmup_steps=0, schedule="constant", decay_steps=100, min_lr_ratio=0.1)
    assert [lr_at(s, **kw) for s in (1, 50, 10_000)] == [LR, LR, LR]
    assert lr_at(3, **{**kw, "warmup_steps": 4}) == pytest.approx(LR * 3 / 4)  # warmup applies to constant too
    assert cosine(1, warmup=0) == pytest.approx(LR * 0.1 + (LR - LR * 0.1) * 0.5 * (1 + math.cos(math.pi / 100)))


def test_zero_decay_steps_goes_straight_to_the_floor():
    assert cosine(11, decay=0) == pytest.approx(LR * 0.1)


def test_weight_decay_on_matrices_only():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {p.dim() for p in decay["params"]} == {2} and {p.dim() for p in no_decay["params"]} == {1}
    assert len(decay["params"]) == 2 and len(no_decay["params"]) == 3  # linear bias, norm weight and bias
    opt = build_adamw(model, lr=LR, weight_decay=0.1, betas=(0.9, 0.95), fused=False)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.95)


def test_a_shared_parameter_is_counted_once():
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied input/output embeddings
    decay, _ = param_groups(nn.ModuleList([emb, head]), 0.1)
    assert len(decay["params"]) == 1


# ---------------------------------------------------------------------- AdamW against a float64 AdamW by hand
VOCAB, STEPS, WARMUP, CLIP, WD, BETAS = 11, 6, 2, 0.3, 0.1, (0.9, 0.95)
X = torch.randint(0, VOCAB, (4, 7), generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, VOCAB, (4, 7), generator=torch.Generator().manual_seed(2))


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 6), nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, VOCAB)).to(dtype)


def _lr(step):
    return lr_at(step, lr=0.05, warmup_steps=WARMUP, schedule="cosine", decay_steps=STEPS - WARMUP, min_lr_ratio=0.1)


def _loss(model):
    return nn.functional.cross_entropy(model(X).reshape(-1, VOCAB), Y.reshape(-1))


def _train(model, optimizer, first, last):
    """The trainer's step order: schedule, forward and backward, clip (the norm before clipping), optimizer step."""
    norms = []
    for step in range(first, last + 1):
        set_lr(optimizer, _lr(step))
        _loss(model).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return norms


def _by_hand():
    """AdamW as torch documents it, in float64: decoupled decay lr * wd * p on matrices only, bias-corrected moments,
    eps outside the square root; gradients clipped to a global norm CLIP (coefficient CLIP / (norm + 1e-6))."""
    model = _model(torch.float64)
    params = list(model.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    norms = []
    for step in range(1, STEPS + 1):
        model.zero_grad()
        _loss(model).backward()
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params))
        norms.append(norm)
        coef, lr = min(1.0, CLIP / (norm + 1e-6)), _lr(step)
        with torch.no_grad():
            for p, (m, v) in zip(params, moments):
                g = p.grad * coef
                p.mul_(1 - lr * (WD if p.dim() >= 2 else 0.0))
                m.mul_(BETAS[0]).add_((1 - BETAS[0]) * g)
                v.mul_(BETAS[1]).add_((1 - BETAS[1]) * g * g)
                p.sub_(lr * (m / (1 - BETAS[0] ** step)) / ((v / (1 - BETAS[1] ** step)).sqrt() + 1e-8))
    return params, moments, norms


@pytest.mark.parametrize("fused, foreach", [(False, False), (False, True), (True, None)],
                         ids=["plain", "foreach", "fused"])
def test_adamw_with_schedule_and_clipping_matches_a_float64_adamw_by_hand(fused, foreach):
    model = _model()
    optimizer = build_adamw(model, lr=0.05, weight_decay=WD, betas=BETAS, fused=fused)
    for group in optimizer.param_groups:
        group["foreach"] = foreach
    norms = _train(model, optimizer, 1, STEPS)
    ref_params, ref_moments, ref_norms = _by_hand()
    assert norms == pytest.approx(ref_norms, rel=1e-5)
    assert all(n > CLIP for n in ref_norms)  # clipping acted at every step
    for p, ref, (m, v) in zip(model.parameters(), ref_params, ref_moments):
        state = optimizer.state[p]
        assert float(state["step"]) == STEPS
        torch.testing.assert_close(p.detach().double(), ref.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state["exp_avg"].double(), m, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(state["exp_avg_sq"].double(), v, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("fused_before, fused_after", [(False, False), (False, True), (True, False)])
def test_a_resume_mid_schedule_continues_the_uninterrupted_adamw(tmp_path, fused_before, fused_after):
    """Saved after step 3 (nsa.training.checkpoint), loaded into a fresh model and AdamW with this run's settings
    (keep_settings; fused or not as NSA_OPT_FUSED says now), trained on to step 6: the uninterrupted run's
    parameters, moments and step counts."""
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    full = _model()
    full_opt = build_adamw(full, lr=0.05, weight_decay=WD, betas=BETAS, fused=fused_before)
    _train(full, full_opt, 1, STEPS)
    first = _model()
    first_opt = build_adamw(first, lr=0.05, weight_decay=WD, betas=BETAS, fused=fused_before)
    _train(first, first_opt, 1, 3)
    checkpoint.save(tmp_path, 3, first, first_opt, info, data_state={}, scaler=None, parallel="none", keep=1)
    resumed = _model()
    resumed_opt = build_adamw(resumed, lr=0.05, weight_decay=WD, betas=BETAS, fused=fused_after)
    with keep_settings(resumed_opt) as changed:
        step, _ = checkpoint.load(checkpoint.latest_checkpoint(tmp_path), resumed, resumed_opt, info, scaler=None)
    assert step == 3 and changed == []
    assert bool(resumed_opt.param_groups[0].get("fused")) == fused_after
    _train(resumed, resumed_opt, step + 1, STEPS)
    exact = fused_before == fused_after  # the other implementation rounds differently
    for p, q in zip(full.parameters(), resumed.parameters()):
        a, b = full_opt.state[p], resumed_opt.state[q]
        assert float(b["step"]) == STEPS
        for x, y in ((p, q), (a["exp_avg"], b["exp_avg"]), (a["exp_avg_sq"], b["exp_avg_sq"])):
            if exact:
                assert torch.equal(x.detach(), y.detach())
            else:
                torch.testing.assert_close(y.detach(), x.detach(), rtol=1e-5, atol=1e-7)
