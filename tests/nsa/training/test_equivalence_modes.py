"""The same global batch trained three ways (2 ranks, gloo): one process with accumulation 2, DDP and FSDP2 with
accumulation 1, with clipping active (max norm 0.05 against norms near 2); and resumes across the parallel modes.

The `text` dataset shards windows round-robin over ranks, so each step of all three runs holds the same 4 windows
(one process: windows {0,1} then {2,3}; rank 0 {0,2}, rank 1 {1,3}): the mean loss, the gradient and its GLOBAL norm
are the same up to fp32 summation order. Tolerances: loss and norm 1e-6 relative (measured: 1e-7), parameters and
AdamW moments 1e-6 absolute after 4 steps at lr 3e-3 (measured: 1.2e-7); a resume across modes continues within the
same bound (measured: 1.5e-8).
"""

from __future__ import annotations

import random
import shutil

import pytest
import torch
import yaml

from train_utils import TINY, flat_items, heartbeats, run

from nsa.training.checkpoint import latest_checkpoint, list_checkpoints

pytestmark = pytest.mark.slow  # six 2-rank and single runs of the tiny model (about 30 s on 2 cores)

STEPS, MAX_NORM = 4, 0.05


def _state(out_dir) -> dict:
    blob = torch.load(latest_checkpoint(out_dir) / "model_optim.pt", map_location="cpu", weights_only=False)
    return dict(flat_items({"model": blob["model"], "optimizer": blob["optimizer"]["state"]}))


def _assert_states_close(got: dict, want: dict, atol: float) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(got[key], value, atol=atol, rtol=0, msg=key)
        else:
            assert got[key] == value, key


def _steps(out_dir) -> list[dict]:
    return [h for h in heartbeats(out_dir, 0) if h["msg"] == "step"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("modes")
    words = ["sparse", "native", "attention", "token", "block", "window", "select", "compress", "gate", "head"]
    rng = random.Random(0)
    corpus = tmp / "corpus.txt"
    corpus.write_text(" ".join(rng.choice(words) for _ in range(3000)))
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"steps": STEPS, "seq_len": 128, "batch_size": 2, "accum": 1, "lr_schedule": "constant",
                         "warmup_steps": 0, "grad_clip": MAX_NORM, "save_every": 2, "keep_checkpoints": 5})
    raw["data"] = {"dataset": "text", "path": str(corpus)}
    cfg = tmp / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    env = {"NSA_TB_DISABLE": "1"}
    out = {}
    for name, flags, nproc in (("single", ("--accum", "2"), 1), ("ddp", ("--ddp", "1"), 2), ("fsdp", ("--fsdp",), 2)):
        out[name] = tmp / name
        code, log = run(out[name], *flags, nproc=nproc, config=cfg, env=env)
        assert code == 0, log[-3000:]
    return out, cfg, env


def test_one_process_ddp_and_fsdp2_train_the_same_global_batch_alike(runs):
    out, _, _ = runs
    ref = _steps(out["single"])
    assert [h["step"] for h in ref] == list(range(1, STEPS + 1))
    assert all(h["grad_norm"] > 10 * MAX_NORM for h in ref)  # clipping active at every step
    for mode in ("ddp", "fsdp"):
        got = _steps(out[mode])
        assert [h["loss"] for h in got] == pytest.approx([h["loss"] for h in ref], rel=1e-6), mode
        # the norm before clipping is the global one (not a rank's shard or a rank's local gradient)
        assert [h["grad_norm"] for h in got] == pytest.approx([h["grad_norm"] for h in ref], rel=1e-6), mode
        _assert_states_close(_state(out[mode]), _state(out["single"]), atol=1e-6)


@pytest.mark.parametrize("first, then", [("ddp", "fsdp"), ("fsdp", "ddp")])
def test_a_resume_in_the_other_parallel_mode_continues_the_run(runs, tmp_path, first, then):
    out, cfg, env = runs
    cut = tmp_path / "cut"
    shutil.copytree(out[first], cut)
    for ckpt in list_checkpoints(cut):
        if ckpt.name != "step_00000002":
            shutil.rmtree(ckpt)
    code, log = run(cut, "--ddp", "1", "--resume", nproc=2, config=cfg, env=env) if then == "ddp" else \
        run(cut, "--fsdp", "--resume", nproc=2, config=cfg, env=env)
    assert code == 0, log[-3000:]
    assert "step_00000002" in log
    resumed = [h for h in _steps(cut) if h["step"] > 2]
    full = [h for h in _steps(out[first]) if h["step"] > 2]
    assert [h["loss"] for h in resumed][-2:] == pytest.approx([h["loss"] for h in full], rel=1e-6)
    _assert_states_close(_state(cut), _state(out[first]), atol=1e-6)
