"""nsa.training.optim: the warmup + cosine learning-rate schedule (lr_at) and AdamW's decay split."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from nsa.training.optim import build_adamw, lr_at, param_groups

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
