"""DDP and FSDP2 through torchrun (2 ranks, gloo) against an independent single-process reference loop."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import yaml

from train_checks import check_counts_equal_model, check_summary_against_csv, check_timeline
from train_utils import TINY, final_params, heartbeats, read_csv, run

STEPS, BATCH, ACCUM = 3, 2, 2


def _config(tmp_path, **train):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"lr_schedule": "constant", "warmup_steps": 0, "steps": STEPS, "batch_size": BATCH,
                         "accum": ACCUM, "save_every": 1000, **train})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, raw


def _reference(raw, world=2):
    """Plain loop: one process, one batch holding every rank's micro-batches, torch's own AdamW."""
    from nsa.training.config import DataConfig
    from nsa.training.data import build_source
    from nsa.model import ModelConfig, NSAModel

    tc = raw["train"]
    torch.manual_seed(tc["seed"])
    model = NSAModel(ModelConfig.from_flat(raw["model"]))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=tc["lr"], betas=(0.9, 0.95), eps=1e-8)
    sources = [build_source(DataConfig(**raw["data"]), vocab_size=raw["model"]["vocab_size"], seq_len=tc["seq_len"],
                            batch_size=tc["batch_size"], rank=r, world_size=world, seed=tc["seed"])
               for r in range(world)]
    losses = []
    for _ in range(tc["steps"]):
        batches = [s.next_batch() for s in sources for _ in range(tc["accum"])]
        inputs = torch.cat([b[0] for b in batches])
        targets = torch.cat([b[1] for b in batches])
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    cfg, raw = _config(tmp)
    code, out = run(tmp / "out", "--ddp", "1", nproc=2, config=cfg)
    assert code == 0, out[-3000:]
    return tmp / "out", raw, out


def test_ddp_equals_single_process_reference_on_the_same_global_batch(ddp_run):
    out_dir, raw, _ = ddp_run
    ref_state, ref_losses = _reference(raw)
    got = final_params(out_dir)
    assert set(got) == set(ref_state)
    for name, value in ref_state.items():
        torch.testing.assert_close(got[name], value, atol=2e-5, rtol=1e-4, msg=name)
    rows = read_csv(out_dir / "training.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert [float(r["loss"]) for r in rows] == pytest.approx(ref_losses, rel=1e-5)
    # and the weights really moved: the reference is not just the initial state
    from nsa.model import ModelConfig, NSAModel
    torch.manual_seed(raw["train"]["seed"])
    init = NSAModel(ModelConfig.from_flat(raw["model"])).state_dict()
    assert max((init[k] - ref_state[k]).abs().max().item() for k in init) > 1e-3


def test_ddp_ranks_hold_identical_parameters_and_write_complete_outputs(ddp_run):
    out_dir, raw, out = ddp_run
    done = [heartbeats(out_dir, r)[-1] for r in (0, 1)]
    assert [d["msg"] for d in done] == ["done", "done"]
    assert done[0]["params_sha256"] and done[0]["params_sha256"] == done[1]["params_sha256"]
    for r in (0, 1):
        steps = [h["step"] for h in heartbeats(out_dir, r) if h["msg"] == "step"]
        assert steps == list(range(1, STEPS + 1)), f"rank {r} heartbeats: {steps}"
        assert heartbeats(out_dir, r)[0]["msg"] == "boot"
    header = (out_dir / "training.csv").read_text().splitlines()[0].split(",")
    assert header[:8] == ["step", "loss", "lr", "toks_per_s", "step_time_s", "grad_norm", "mem_alloc_gb",
                          "mem_reserved_gb"]
    for row in read_csv(out_dir / "training.csv"):
        assert all(math.isfinite(float(row[c])) for c in header), row
        assert float(row["toks_per_s"]) == pytest.approx(
            2 * BATCH * ACCUM * raw["train"]["seq_len"] / float(row["step_time_s"]), rel=1e-3)
    env = json.loads((out_dir / "env.json").read_text())
    assert env["world_size"] == 2 and env["parallel"] == "ddp"
    assert env["config"]["train"]["accum"] == ACCUM and env["torch"] == torch.__version__
    status = json.loads((out_dir / "status.json").read_text())
    assert status["status"] == "completed" and status["step"] == STEPS


def test_ddp_summary_timeline_and_counted_bytes(ddp_run):
    """summary.json consistent with training.csv; every rank's start-up milestones; the gradient all-reduce
    counted at DDP's comm hook equal to the byte model (one 25 MB bucket; accumulation 2 under no_sync)."""
    out_dir, raw, out = ddp_run
    check_summary_against_csv(out_dir, world_size=2, batch=BATCH, accum=ACCUM, seq_len=raw["train"]["seq_len"])
    summary = check_counts_equal_model(out_dir, raw, "ddp", bucket_cap_mb=25)
    from nsa.model import ModelConfig, NSAModel
    n_params = NSAModel(ModelConfig.from_flat(raw["model"])).num_params()
    assert summary["comm"]["per_step"] == [{"kind": "all_reduce", "calls": 1, "bytes": 4 * n_params,
                                            "sizes": [4 * n_params]}]
    check_timeline(out_dir, world_size=2)
    assert "Training Summary" in out


def test_activation_checkpointing_under_ddp_gives_the_same_training(ddp_run, tmp_path):
    out_dir, raw, _ = ddp_run
    cfg, _ = _config(tmp_path)
    code, out = run(tmp_path / "ac", "--ddp", "1", "--activation-checkpointing", "1", nproc=2, config=cfg)
    assert code == 0, out[-3000:]
    env = json.loads((tmp_path / "ac" / "env.json").read_text())
    assert env["config"]["model"]["activation_checkpointing"] is True
    plain, ckpt = final_params(out_dir), final_params(tmp_path / "ac")
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=1e-6, msg=name)


def test_fsdp2_matches_ddp(ddp_run, tmp_path):
    out_dir, raw, _ = ddp_run
    cfg, _ = _config(tmp_path)
    code, out = run(tmp_path / "fsdp", "--fsdp", nproc=2, config=cfg)
    assert code == 0, out[-3000:]
    assert "[fsdp]" in out
    ddp, fsdp = final_params(out_dir), final_params(tmp_path / "fsdp")
    assert set(ddp) == set(fsdp)
    for name in ddp:
        torch.testing.assert_close(fsdp[name], ddp[name], atol=2e-5, rtol=1e-4, msg=name)
    # full shard: all-gathers in forward and backward, reduce-scatters, counted at the collectives = the byte model
    summary = check_counts_equal_model(tmp_path / "fsdp", raw, "fsdp", reshard_after_forward=True)
    assert summary["fsdp_reshard"] is True
    assert summary["comm"]["per_step"][0]["calls"] == ACCUM * (3 + 2)  # (root + 2 blocks) forward, 2 blocks backward


def test_runbook_baseline_toggles_with_bf16_compression(tmp_path):
    """The runbook's baseline command line (tiny config), every toggle it sets, compression on."""
    cfg, raw = _config(tmp_path, steps=2)
    env = {"NSA_PREFILL_BATCHED": "1", "NSA_SEL_RANGES_V2": "1", "NSA_DDP_COMPRESS": "bf16",
           "NSA_DDP_BUCKET_MB": "50", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "CONFIG": str(cfg)}
    code, out = run(tmp_path / "rb", "--dataset", "synthetic", "--ddp", "1", "--steps", "2", nproc=2, env=env,
                    config=None)
    assert code == 0, out[-3000:]
    assert "[ddp] gradient compression enabled: bf16" in out
    assert "bucket_cap_mb 50" in out
    recorded = json.loads((tmp_path / "rb" / "env.json").read_text())
    assert recorded["env"]["NCCL_ALGO"] == "Ring" and recorded["env"]["NSA_DDP_COMPRESS"] == "bf16"
    assert recorded["config_path"] == str(cfg)
    rows = read_csv(tmp_path / "rb" / "training.csv")
    assert len(rows) == 2 and all(math.isfinite(float(r["loss"])) for r in rows)
    # compression halves the bytes the hook sends: bf16 buckets, counted = the byte model
    summary = check_counts_equal_model(tmp_path / "rb", raw, "ddp", bucket_cap_mb=50, compress="bf16")
    from nsa.model import ModelConfig, NSAModel
    n_params = NSAModel(ModelConfig.from_flat(raw["model"])).num_params()
    assert summary["comm"]["per_step"][0]["bytes"] == 2 * n_params


def test_ddp_stop_and_resume_restores_every_ranks_data_position(ddp_run, tmp_path):
    """Crash both ranks at step 3 after a step-2 checkpoint, resume: the same weights as the uninterrupted run."""
    out_dir, raw, _ = ddp_run
    cfg, _ = _config(tmp_path, save_every=2)
    code, out = run(tmp_path / "cut", "--ddp", "1", nproc=2, config=cfg, env={"NSA_FAULT": "crash@3"})
    assert code != 0
    code, out = run(tmp_path / "cut", "--ddp", "1", "--resume", nproc=2, config=cfg)
    assert code == 0, out[-3000:]
    assert "step_00000002" in out
    full, resumed = final_params(out_dir), final_params(tmp_path / "cut")
    for name in full:
        assert torch.equal(resumed[name], full[name]), name


def test_a_rank_file_only_one_rank_cannot_read_stops_every_rank_naming_it(ddp_run, tmp_path):
    """rank1.pt of the checkpoint is missing: rank 1 cannot resume, and rank 0, which reads its own files, stops too,
    with rank 1's reason in status.json and its heartbeat (not a broken connection at its next collective)."""
    out_dir, _, _ = ddp_run
    cut = tmp_path / "cut"
    shutil.copytree(out_dir, cut)
    ckpt = cut / "checkpoints" / f"step_{STEPS:08d}"
    (ckpt / "rank1.pt").unlink()
    cfg, _ = _config(tmp_path)
    code, out = run(cut, "--ddp", "1", "--resume", "--steps", str(STEPS + 1), nproc=2, config=cfg)
    assert code != 0
    assert f"{ckpt}: rank1.pt is missing" in out, out[-3000:]
    status = json.loads((cut / "status.json").read_text())
    assert status["status"] == "crashed" and status["phase"] == "start-up", status
    assert "CheckpointError" in status["reason"] and "rank1.pt is missing" in status["reason"], status["reason"]
    for rank in (0, 1):
        last = heartbeats(cut, rank)[-1]
        assert last["msg"] == "error" and "rank1.pt is missing" in last["error"], (rank, last)
    assert [int(r["step"]) for r in read_csv(cut / "training.csv")] == list(range(1, STEPS + 1))  # kept as it was
