"""nsa.training.optim against independent references: the learning rate of every step against figures worked out by
hand from the README's formula (linear warmup to lr, then a cosine to min_lr_ratio * lr over decay_steps, by default
the rest of the run, so that its last step is at the floor); the weight-decay split of the NSA model against its
parameters' names (decay on matrices: projections, embeddings, the compression MLPs and their position tables,
the gate MLP, the head; none on norms and biases); build_adamw (plain, foreach, fused) against torch's AdamW
configured by hand in float64, the gradients clipped before the update."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn as nn

from nsa.model import NSAModel
from nsa.training.config import load_config
from nsa.training.optim import build_adamw, decay_length, lr_at, make_capturable, param_groups, set_lr
from train_utils import TINY


def schedule(steps, warmup, decay_steps=None, ratio=0.0, lr=1.0, kind="cosine"):
    """The trainer's call: lr_at with the cosine's length from decay_length."""
    return [lr_at(s, lr=lr, warmup_steps=warmup, schedule=kind,
                  decay_steps=decay_length(decay_steps, steps, warmup), min_lr_ratio=ratio) for s in steps_of(steps)]


def steps_of(steps):
    return range(1, steps + 1) if isinstance(steps, int) else steps


# ---------------------------------------------------------------------- the schedule, hand-computed figures
C = (1 + math.cos(math.pi / 4)) / 2  # 0.853553...: a quarter of the way down the cosine; 1 - C three quarters


def test_warmup_then_cosine_to_a_zero_floor_at_every_step():
    # lr 1, 2 warmup steps, 6 steps: the cosine spans steps 3..6 (4 steps), its last at the floor
    assert schedule(6, 2) == pytest.approx([0.5, 1.0, C, 0.5, 1 - C, 0.0], abs=1e-15)


def test_the_floor_is_min_lr_ratio_of_lr_and_the_cosine_spans_lr_to_it():
    # lr 2e-3, floor 0.1: 2e-4 + 1.8e-3 * (cosine share)
    lr, floor = 2e-3, 2e-4
    expected = [lr / 2, lr, floor + 1.8e-3 * C, floor + 1.8e-3 * 0.5, floor + 1.8e-3 * (1 - C), floor]
    assert schedule(6, 2, ratio=0.1, lr=lr) == pytest.approx(expected, rel=1e-13)


def test_first_and_last_warmup_steps():
    lrs = schedule(20, 8, ratio=0.1, lr=3e-4)
    assert lrs[0] == pytest.approx(3e-4 / 8, rel=1e-15)  # step 1 already learns
    assert lrs[7] == pytest.approx(3e-4, rel=1e-15)  # the last warmup step is at the peak
    assert lrs[19] == pytest.approx(3e-5, rel=1e-15)  # the run's last step at the floor


def test_steps_past_the_end_stay_at_the_floor():
    kw = dict(lr=1.0, warmup_steps=2, schedule="cosine", decay_steps=decay_length(None, 6, 2), min_lr_ratio=0.25)
    assert [lr_at(s, **kw) for s in (6, 7, 100, 10**9)] == pytest.approx([0.25] * 4, abs=1e-15)


def test_decay_steps_set_shorter_than_the_run_then_the_floor():
    # cosine over 2 steps after 2 warmup steps, a 7-step run: steps 5..7 at the floor
    assert schedule(7, 2, decay_steps=2, ratio=0.1) == pytest.approx([0.5, 1, 0.55, 0.1, 0.1, 0.1, 0.1], abs=1e-15)


def test_decay_steps_longer_than_the_run_ends_above_the_floor():
    # cosine over 8 steps, the run stops after 4 of them: at its middle, 0.5
    assert schedule(4, 0, decay_steps=8)[-1] == pytest.approx(0.5, abs=1e-15)


def test_no_warmup():
    # 4 steps, no warmup: the cosine's first step is already a quarter of the way down
    assert schedule(4, 0) == pytest.approx([C, 0.5, 1 - C, 0.0], abs=1e-15)


def test_warmup_as_long_as_or_longer_than_the_run():
    assert schedule(4, 4) == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=1e-15)
    assert schedule(3, 6) == pytest.approx([1 / 6, 2 / 6, 3 / 6], abs=1e-15)  # ends mid-warmup


def test_a_one_step_run():
    assert schedule(1, 0, ratio=0.1) == pytest.approx([0.1], abs=1e-15)  # its last step: the floor
    assert schedule(1, 1, ratio=0.1) == pytest.approx([1.0], abs=1e-15)  # its last warmup step: the peak


def test_constant_schedule_after_its_warmup():
    assert schedule(5, 2, ratio=0.1, kind="constant") == pytest.approx([0.5, 1, 1, 1, 1], abs=1e-15)
    assert schedule(3, 0, ratio=0.1, kind="constant") == [1.0, 1.0, 1.0]


def test_the_schedule_never_rises_after_the_warmup_and_never_leaves_floor_to_peak():
    lrs = schedule(257, 17, ratio=0.1, lr=3e-4)
    assert all(a <= b for a, b in zip(lrs[:17], lrs[1:17]))
    assert all(a >= b for a, b in zip(lrs[16:], lrs[17:]))
    assert all(3e-5 * (1 - 1e-12) <= x <= 3e-4 * (1 + 1e-12) for x in lrs[16:])


# ---------------------------------------------------------------------- which parameters decay
def _tiny_model(**overrides):
    torch.manual_seed(0)
    return NSAModel(dataclasses.replace(load_config(TINY).model, **overrides))


def _decays_by_name(name: str) -> bool:
    """The documented split by what a parameter is: norms and biases not, every weight matrix and table yes."""
    module = name.rsplit(".", 2)[-2]  # the module holding it: attn_norm, mlp_norm, norm, q_proj, gate.0's "0", ...
    return not (name.endswith(".bias") or "norm" in module)


def _split(model, groups):
    names = {id(p): n for n, p in model.named_parameters()}
    return ([names[id(p)] for p in groups[0]["params"]], [names[id(p)] for p in groups[1]["params"]])


def test_the_nsa_model_decays_its_matrices_and_tables_not_its_norms_and_biases():
    model = _tiny_model()
    groups = param_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    decay, no_decay = _split(model, groups)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(decay + no_decay) == sorted(names) and len(set(decay + no_decay)) == len(names)  # each once
    assert sorted(decay) == sorted(n for n in names if _decays_by_name(n))
    # the kinds the split must get right, by name
    for needed in ("tok_emb.weight", "head.weight", "blocks.0.attn.gate.0.weight", "blocks.0.attn.phi_k.pos",
                   "blocks.0.attn.phi_k.fc1.weight", "blocks.0.attn.q_proj.weight", "blocks.0.mlp.w_down.weight"):
        assert needed in decay, needed
    for needed in ("norm.weight", "blocks.0.attn_norm.weight", "blocks.0.mlp_norm.weight",
                   "blocks.0.attn.gate.0.bias", "blocks.0.attn.phi_v.fc2.bias"):
        assert needed in no_decay, needed


def test_tied_embeddings_are_one_decayed_parameter_and_frozen_parameters_are_left_out():
    model = _tiny_model(tie_embeddings=True)
    assert model.head.weight is model.tok_emb.weight
    model.blocks[0].attn_norm.weight.requires_grad_(False)
    model.blocks[1].attn.q_proj.weight.requires_grad_(False)
    decay, no_decay = _split(model, param_groups(model, 0.1))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]  # named_parameters: a tie once
    assert sorted(decay + no_decay) == sorted(trainable) and len(decay + no_decay) == len(trainable)
    assert "blocks.0.attn_norm.weight" not in no_decay and "blocks.1.attn.q_proj.weight" not in decay
    assert decay.count("tok_emb.weight") == 1


# ---------------------------------------------------------------------- build_adamw against torch's AdamW
LR, WD, BETAS, CLIP, STEPS = 0.03, 0.2, (0.8, 0.9), 0.05, 4
X = torch.randn(5, 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def _small():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3)).double()


def _lr(step):
    return lr_at(step, lr=LR, warmup_steps=1, schedule="cosine", decay_steps=STEPS - 1, min_lr_ratio=0.1)


def _run(model, optimizer, clip):
    norms = []
    for step in range(1, STEPS + 1):
        set_lr(optimizer, _lr(step))
        ((model(X) - 1) ** 2).mean().backward()
        norms.append(float(clip(model)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return norms


def _clip_by_hand(model):
    """Global L2 norm over every gradient; scaled by CLIP / (norm + 1e-6) where that is below 1 (torch's rule)."""
    grads = [p.grad for p in model.parameters()]
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    coef = CLIP / (norm + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return norm


@pytest.mark.parametrize("fused, foreach", [(False, False), (False, True), (True, None)],
                         ids=["plain", "foreach", "fused"])
def test_build_adamw_steps_as_torchs_adamw_configured_by_hand_float64(fused, foreach):
    ref = _small()
    ref_opt = torch.optim.AdamW(
        [{"params": [ref[0].weight, ref[3].weight], "weight_decay": WD},
         {"params": [ref[0].bias, ref[1].weight, ref[1].bias, ref[3].bias], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=1e-8, foreach=False)
    ref_norms = _run(ref, ref_opt, _clip_by_hand)
    model = _small()
    optimizer = build_adamw(model, lr=LR, weight_decay=WD, betas=BETAS, fused=fused)
    for group in optimizer.param_groups:
        group["foreach"] = foreach
    norms = _run(model, optimizer, lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP))
    assert norms == pytest.approx(ref_norms, rel=1e-12)
    assert all(n > CLIP for n in ref_norms)  # clipping acted at every step
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-12, atol=1e-14)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(optimizer.state[q][key], ref_opt.state[p][key], rtol=1e-12, atol=1e-16)
        assert float(optimizer.state[q]["step"]) == STEPS


# ---------------------------------------------------------------------- make_capturable
def test_make_capturable_takes_an_adamw_with_an_empty_group():
    """A model without vectors (no biases, no norms) leaves build_adamw's decay-free group empty."""
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 2, bias=False))
    optimizer = build_adamw(model, lr=LR, weight_decay=WD, betas=BETAS, fused=False)
    assert [len(g["params"]) for g in optimizer.param_groups] == [2, 0]
    make_capturable(optimizer)  # raised IndexError on the empty group
    assert all(g["capturable"] for g in optimizer.param_groups)
    decayed = optimizer.param_groups[0]["lr"]
    assert isinstance(decayed, torch.Tensor) and decayed.dtype == torch.float32 and decayed.dim() == 0
    set_lr(optimizer, 0.5)
    assert float(decayed) == 0.5
