"""A step whose gradient is infinite is never applied: AdamW's parameters, moments and step counts stay as they were
before it (README: "the optimizer step was skipped"). fp32: the run stops at that step (exit 3, status nonfinite)
with nothing of the step applied, no NaN written into a parameter or a moment. fp16: the GradScaler skips that one
step (parameters, moments and AdamW's step count as before it), halves its scale (torch's documented backoff 0.5
from the initial 2**16) and the run goes on: the next step is applied. Single process, the tiny model, in process;
the infinite gradient comes from the second micro-batch of step 2 (the loss itself stays finite)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import torch

TINY = Path(__file__).resolve().parents[3] / "configs" / "tiny_cpu.yaml"
BAD_STEP, ACCUM = 2, 2


class _InfGrad(torch.autograd.Function):
    """Identity forward (the loss stays finite), infinite gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * math.inf


def _clean(monkeypatch):
    for name in [k for k in os.environ if k.startswith(("NSA_", "CONFIG"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("NSA_TB_DISABLE", "1")


def _run(tmp_path, precision: str, steps: int):
    """Train `steps` steps with an infinite gradient in step BAD_STEP's last micro-batch. Returns (exit code, the
    trainer, {step: (parameters, optimizer state) as the step began}, (parameters, optimizer state) at the end)."""
    from nsa.toggles import Toggles
    from nsa.training import distributed, trainer
    from nsa.training.config import apply_overrides, load_config

    out = tmp_path / precision
    cfg = apply_overrides(load_config(TINY), {
        "train.precision": precision, "train.out_dir": str(out), "train.seq_len": 32, "train.batch_size": 1,
        "train.accum": ACCUM, "train.steps": steps, "train.warmup_steps": 0, "train.save_every": 1000,
        "train.log_every": 1000})
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    tr = trainer.Trainer(cfg, str(TINY), info, Toggles.read(), False, ["nsa-train"])

    def snapshot():
        params = {n: p.detach().clone() for n, p in tr.net.named_parameters()}
        names = {id(p): n for n, p in tr.net.named_parameters()}
        state = {names[id(p)]: {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)}
                 for p, s in tr.optimizer.state.items()}
        return params, state

    began, now, micro = {}, {"step": 0}, {"n": 0}
    train_step, loss_fn = tr.train_step, tr._loss

    def counted_step(step, record_stats):
        began[step] = snapshot()
        now["step"], micro["n"] = step, 0
        return train_step(step, record_stats)

    def loss(inputs, targets):
        micro["n"] += 1
        value = loss_fn(inputs, targets)
        return _InfGrad.apply(value) if now["step"] == BAD_STEP and micro["n"] == ACCUM else value

    tr.train_step, tr._loss = counted_step, loss
    code = tr.run()
    return code, tr, began, snapshot(), out


def _same(a, b) -> bool:
    params_a, state_a = a
    params_b, state_b = b
    return (params_a.keys() == params_b.keys() and all(torch.equal(params_a[n], params_b[n]) for n in params_a)
            and state_a.keys() == state_b.keys()
            and all(state_a[n].keys() == state_b[n].keys() and all(torch.equal(state_a[n][k], state_b[n][k])
                                                                   for k in state_a[n]) for n in state_a))


def _finite(snap) -> bool:
    params, state = snap
    return (all(bool(torch.isfinite(p).all()) for p in params.values())
            and all(bool(torch.isfinite(v).all()) for s in state.values() for v in s.values()))


def test_fp32_an_infinite_gradient_stops_the_run_with_nothing_of_that_step_applied(tmp_path, monkeypatch):
    from nsa.training import trainer

    _clean(monkeypatch)
    code, tr, began, end, out = _run(tmp_path, "fp32", steps=3)
    assert code == trainer.EXIT_NONFINITE
    assert json.loads((out / "status.json").read_text())["status"] == "nonfinite"
    assert sorted(began) == [1, BAD_STEP]  # stopped at the bad step
    assert _finite(end)
    assert _same(end, began[BAD_STEP])  # parameters, moments and step counts: as after step 1
    assert {float(s["step"]) for s in end[1].values()} == {1.0}
    assert not _same(began[1], began[BAD_STEP])  # step 1 itself was applied


def test_fp16_the_grad_scaler_skips_only_the_infinite_step_and_halves_its_scale(tmp_path, monkeypatch):
    from nsa.training import trainer

    _clean(monkeypatch)
    code, tr, began, end, out = _run(tmp_path, "fp16", steps=3)
    assert code == trainer.EXIT_OK
    assert sorted(began) == [1, 2, 3]
    assert _finite(end)
    assert _same(began[BAD_STEP + 1], began[BAD_STEP])  # step 2: nothing applied
    assert not _same(end, began[BAD_STEP + 1])  # step 3 applied
    assert {float(s["step"]) for s in end[1].values()} == {2.0}  # AdamW stepped twice in three steps
    assert tr.scaler.get_scale() == 2.0 ** 16 * 0.5
    with open(out / "training.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert not math.isfinite(float(rows[1]["grad_norm"])) and math.isfinite(float(rows[2]["grad_norm"]))
