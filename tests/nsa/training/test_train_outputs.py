"""Single-process trainer runs in this process (no torchrun): learning, outputs, observability toggles."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
import yaml

from train_utils import TINY, heartbeats, read_csv

from nsa.model import NSAModel
from nsa.training import checkpoint, optim, trainer
from nsa.training import cli as train
from nsa.training.config import ConfigError, UsageError, load_config
from nsa.training.optim import fused_adamw_unsupported
from nsa.training.trainer import parallel_mode


def _run(tmp_path, *flags, **train_cfg):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update(train_cfg)
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    code = train.main(["--config", str(cfg), "--out-dir", str(out), *flags])
    return code, out


def test_loss_falls_well_below_uniform_on_synthetic_data_and_outputs_are_complete(tmp_path):
    code, out = _run(tmp_path, "--eval-every", "30")  # the tiny config's 60 steps
    assert code == 0
    rows = read_csv(out / "training.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 61))
    losses = [float(r["loss"]) for r in rows]
    uniform = math.log(256)
    assert losses[0] == pytest.approx(uniform, abs=0.3)  # starts near ln(vocab)
    assert sum(losses[-5:]) / 5 < 0.75 * uniform, losses[-5:]
    val = read_csv(out / "val.csv")
    assert [int(r["step"]) for r in val] == [30, 60]
    assert float(val[1]["val_loss"]) < float(val[0]["val_loss"]) < uniform
    assert float(val[1]["val_ppl"]) == pytest.approx(math.exp(float(val[1]["val_loss"])), rel=1e-4)
    lrs = [float(r["lr"]) for r in rows]
    assert lrs[9] == pytest.approx(3e-3) and lrs[0] == pytest.approx(3e-4) and lrs[-1] < lrs[10]  # warmup, decay
    beats = heartbeats(out, 0)
    assert beats[0]["msg"] == "boot" and beats[-1]["msg"] == "done"
    step_beats = [b for b in beats if b["msg"] == "step"]
    assert len(step_beats) == 60 and all(b["rank"] == 0 and b["pid"] > 0 for b in step_beats)
    stats = [b for b in step_beats if "gate_cmp" in b]
    assert stats and all(0 < b["gate_sel"] < 1 for b in stats)
    env = json.loads((out / "env.json").read_text())
    for key in ("python", "torch", "cuda", "nccl", "devices", "world_size", "config", "config_path", "git_sha",
                "env", "n_params", "flops_per_token"):
        assert key in env, key
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["eval_every"] == 30
    assert list((out / "tb").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert not list(out.glob("stackdump_*.txt")), "stack dump files written without SIGUSR1"


def test_toggles_disable_tensorboard_and_aux_stats(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    monkeypatch.setenv("NSA_DISABLE_AUX_STATS", "1")
    code, out = _run(tmp_path, "--steps", "3", "--log-every", "1")
    assert code == 0
    assert not (out / "tb").exists()
    assert not any("gate_cmp" in b for b in heartbeats(out, 0))


def test_gate_statistics_at_every_logged_step_the_last_included(tmp_path, monkeypatch):
    """Steps 1, 3 (log_every) and 5 (the last) are logged; each logged step's heartbeat carries the gates' means
    (the last one had none: its statistics were collected only at multiples of log_every and step 1)."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "5", "--log-every", "3")
    assert code == 0
    assert [b["step"] for b in heartbeats(out, 0) if "gate_cmp" in b] == [1, 3, 5]


def test_nvtx_ranges_appear_in_the_profiler_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_NVTX", "1")
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "3", "--profile-steps", "1", profile_start=2)
    assert code == 0
    traces = list((out / "profile").glob("trace_rank0_*.json"))
    assert traces
    names = {e.get("name") for e in json.loads(traces[0].read_text())["traceEvents"]}
    for span in ("nsa.step", "nsa.cmp", "nsa.sel", "nsa.win", "nsa.sel.importance", "nsa.sel.topk",
                 "nsa.sel.ranges_v2"):
        assert span in names, span


def test_nvtx_off_leaves_no_ranges(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "3", "--profile-steps", "1", profile_start=2)
    assert code == 0
    names = {e.get("name") for e in json.loads(next((out / "profile").glob("*.json")).read_text())["traceEvents"]}
    assert "nsa.sel.ranges_v2" not in names and "nsa.cmp" not in names


def test_a_resumed_run_profiles_into_its_own_trace_named_by_the_training_step(tmp_path, monkeypatch):
    """The profiler traces the step after profile_start of each process: the first process training step 2, the
    resumed one (from step 3) step 5. Each trace is named by the training step it ends at; before, the resumed
    process's trace was named by its own step count (step2) and replaced the first process's."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "3", "--profile-steps", "1", profile_start=1, save_every=3)
    assert code == 0
    assert sorted(p.name for p in (out / "profile").glob("trace_rank0_*.json")) == ["trace_rank0_step2.json"]
    code = train.main(["--config", str(tmp_path / "cfg.yaml"), "--out-dir", str(out), "--resume", "--steps", "6",
                       "--profile-steps", "1"])
    assert code == 0
    assert sorted(p.name for p in (out / "profile").glob("trace_rank0_*.json")) == [
        "trace_rank0_step2.json", "trace_rank0_step5.json"]


@pytest.mark.parametrize("toggle, backend", [(None, "flash"), ("NSA_SDPA_NO_FLASH", "math"),
                                             ("NSA_SDPA_FLASH_ONLY", "flash")])
def test_sdpa_audit_records_the_backend_of_each_call_site(tmp_path, monkeypatch, toggle, backend):
    monkeypatch.setenv("NSA_SDPA_AUDIT", "1")
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    if toggle:
        monkeypatch.setenv(toggle, "1")
    code, out = _run(tmp_path, "--steps", "2")
    assert code == 0
    audit = json.loads((out / "sdpa_audit.json").read_text())
    assert {r["site"] for r in audit["by_site"]} == {"cmp", "win"}
    assert audit["backends"] == [backend]
    # 2 layers x 2 steps x (cmp + window chunks): every call counted
    assert audit["calls"] >= 2 * 2 * 2


def test_sequential_prefill_toggle_reaches_the_model(tmp_path, monkeypatch):
    """NSA_PREFILL_BATCHED=0 runs the per-token path; it trains to the same loss as batched (fp32)."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, batched = _run(tmp_path / "a", "--steps", "2", "--seq-len", "64", "--batch-size", "1")
    monkeypatch.setenv("NSA_PREFILL_BATCHED", "0")
    code2, seq = _run(tmp_path / "b", "--steps", "2", "--seq-len", "64", "--batch-size", "1")
    assert code == code2 == 0
    la = [float(r["loss"]) for r in read_csv(batched / "training.csv")]
    lb = [float(r["loss"]) for r in read_csv(seq / "training.csv")]
    assert la == pytest.approx(lb, rel=1e-5)
    assert json.loads((seq / "env.json").read_text())["env"]["NSA_PREFILL_BATCHED"] == "0"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU trainer interprets the kernel only where no GPU is (the "
                                                      "interpreter is chosen at import); tests/nsa/test_loss.py runs "
                                                      "it on the GPU")
def test_fused_loss_toggle_reaches_the_trainer(tmp_path, monkeypatch, capsys):
    """NSA_LOSS=fused trains through the fused loss's Triton kernel (interpreted on CPU) to the reference's losses
    (fp32), eager and compiled; where Triton cannot run the trainer refuses it at start-up, naming why."""
    from nsa.attention.kernels.cross_entropy import host

    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    flags = ("--steps", "2", "--seq-len", "64", "--batch-size", "1")
    code, ref = _run(tmp_path / "a", *flags)
    calls = []
    real = host.cross_entropy_rows
    monkeypatch.setattr(host, "cross_entropy_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("NSA_LOSS", "fused")
    code2, fused = _run(tmp_path / "b", *flags)
    assert code == code2 == 0 and len(calls) == 2  # one chunk a step
    la = [float(r["loss"]) for r in read_csv(ref / "training.csv")]
    lb = [float(r["loss"]) for r in read_csv(fused / "training.csv")]
    assert la == pytest.approx(lb, rel=1e-5)
    code4, compiled = _run(tmp_path / "d", *flags, "--compile", "--compile-backend", "aot_eager")
    assert code4 == 0 and len(calls) == 4  # the compiled model runs the kernel (an opaque op in its graph)
    assert [float(r["loss"]) for r in read_csv(compiled / "training.csv")] == pytest.approx(lb, rel=1e-5)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU without the interpreter: the kernel cannot run
    code3, _ = _run(tmp_path / "c", *flags)
    assert code3 == trainer.EXIT_USAGE
    assert "the fused loss (NSA_LOSS / model.loss 'fused') cannot run: no CUDA device" in capsys.readouterr().err


def test_notes_for_toggles_this_machine_cannot_honour(tmp_path, monkeypatch):
    """NSA_DDP_COMPRESS needs DDP; NSA_OPT_FUSED where torch has no fused AdamW for the parameters (simulated: this
    torch has one for CPU) is reported and the optimizer runs unfused."""
    monkeypatch.setattr(optim, "fused_adamw_unsupported", lambda params: "torch 0.0 has no fused AdamW for cpu")
    monkeypatch.setenv("NSA_OPT_FUSED", "1")
    monkeypatch.setenv("NSA_DDP_COMPRESS", "bf16")
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "1", "--seq-len", "64", "--batch-size", "1")
    assert code == 0
    notes = json.loads((out / "status.json").read_text())["notes"]
    assert any("NSA_OPT_FUSED=1 is ignored: torch 0.0 has no fused AdamW for cpu" in n for n in notes), notes
    assert any("NSA_DDP_COMPRESS=bf16 is ignored" in n for n in notes)
    assert json.loads((out / "env.json").read_text())["optimizer"] == {"name": "AdamW", "fused": False}


def test_unset_opt_fused_takes_the_fused_adamw_only_where_it_is_the_default(monkeypatch):
    """NSA_OPT_FUSED unset: the fused AdamW on the devices of FUSED_BY_DEFAULT_ON (none until a GPU A/B qualifies
    it on CUDA) where torch has it, without a message where it has not; 0 is always unfused; 1 where torch has none
    is refused with the reason."""
    params = [torch.zeros(2, 2, requires_grad=True)]
    assert optim.use_fused_adamw(None, params) == (False, None)  # CPU: unfused unless asked
    assert optim.use_fused_adamw(False, params) == (False, None)
    assert optim.use_fused_adamw(True, params) == (fused_adamw_unsupported(params) is None,
                                                   fused_adamw_unsupported(params))
    monkeypatch.setattr(optim, "FUSED_BY_DEFAULT_ON", ("cpu",))  # as CUDA parameters will be once qualified
    assert optim.use_fused_adamw(None, params) == (fused_adamw_unsupported(params) is None, None)
    monkeypatch.setattr(optim, "fused_adamw_unsupported", lambda ps: "no fused AdamW here")
    assert optim.use_fused_adamw(None, params) == (False, None)  # silently unfused
    assert optim.use_fused_adamw(True, params) == (False, "no fused AdamW here")


def test_fused_adamw_runs_on_cpu_and_takes_the_same_first_step_as_unfused(tmp_path, monkeypatch):
    """NSA_OPT_FUSED=1 on CPU: torch's fused AdamW is really used (env.json, no 'ignored' note) and its first update
    equals the unfused one within fp32 rounding."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    params = {}
    for fused in ("0", "1"):
        monkeypatch.setenv("NSA_OPT_FUSED", fused)
        code, out = _run(tmp_path / fused, "--steps", "1", "--save-every", "1", "--seq-len", "64",
                         "--batch-size", "1")
        assert code == 0
        assert json.loads((out / "env.json").read_text())["optimizer"] == {"name": "AdamW", "fused": fused == "1"}
        notes = json.loads((out / "status.json").read_text())["notes"]
        assert not [n for n in notes if "NSA_OPT_FUSED" in n]
        found = checkpoint.latest_checkpoint(out)
        params[fused] = torch.load(found / "model_optim.pt", map_location="cpu", weights_only=False)["model"]
    cfg = load_config(tmp_path / "1" / "cfg.yaml")
    torch.manual_seed(cfg.train.seed)  # the trainer's initial weights
    initial = NSAModel(cfg.model).state_dict()
    moved = 0
    for name, before in initial.items():
        unfused, fused = params["0"][name] - before, params["1"][name] - before
        torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-7, msg=f"{name}: fused update differs")
        moved += int(unfused.abs().max() > 0)
    assert moved > len(initial) // 2  # a real step: most tensors changed


def test_fused_adamw_support_check():
    assert fused_adamw_unsupported([torch.zeros(2, requires_grad=True)]) is None  # this torch fuses on CPU
    assert "floating-point" in fused_adamw_unsupported([torch.zeros(2, dtype=torch.int64)])
    assert "no fused AdamW for meta" in fused_adamw_unsupported([torch.zeros(2, device="meta")])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_with_fp32_master_weights(tmp_path, monkeypatch, precision):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    # (small: fp16 matmuls are emulated, slowly, on CPUs without fp16 units)
    code, out = _run(tmp_path, "--steps", "3", "--precision", precision, "--seq-len", "64", "--batch-size", "1")
    assert code == 0
    losses = [float(r["loss"]) for r in read_csv(out / "training.csv")]
    assert all(math.isfinite(x) for x in losses)
    import torch
    from nsa.training.checkpoint import latest_checkpoint
    state = torch.load(latest_checkpoint(out) / "model_optim.pt", weights_only=False)
    assert all(v.dtype == torch.float32 for v in state["model"].values())
    assert (state["scaler"] is not None) == (precision == "fp16")


def test_text_dataset_trains_from_local_files(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    (corpus / "b.jsonl").write_text("\n".join(json.dumps({"text": f"line {i}: naïve café"}) for i in range(100)))
    code, out = _run(tmp_path, "--dataset", "text", "--data-path", str(corpus), "--steps", "3",
                     "--seq-len", "64", "--batch-size", "2")
    assert code == 0
    assert len(read_csv(out / "training.csv")) == 3
    assert json.loads((out / "env.json").read_text())["config"]["data"]["path"] == str(corpus)


def test_parallel_mode_and_config_resolution(tmp_path, monkeypatch):
    assert parallel_mode("auto", 1) == "none" and parallel_mode("auto", 2) == "ddp"
    assert parallel_mode("fsdp", 2) == "fsdp" and parallel_mode("ddp", 1) == "none"
    with pytest.raises(UsageError, match="--ddp 1 or --fsdp"):
        parallel_mode("none", 2)
    parser = train.build_parser()
    monkeypatch.chdir(tmp_path)  # no configs/ here: no default config
    with pytest.raises(ConfigError, match="pass --config PATH or set CONFIG"):
        train.resolve_config(parser.parse_args([]), environ={})
    cfg, path = train.resolve_config(parser.parse_args(["--steps", "7", "--fsdp"]), environ={"CONFIG": str(TINY)})
    assert path == str(TINY) and cfg.train.steps == 7 and cfg.train.parallel == "fsdp"
    with pytest.raises(UsageError, match="exclusive"):
        train.resolve_config(parser.parse_args(["--fsdp", "--ddp", "1", "--config", str(TINY)]))


@pytest.mark.parametrize("backend", [
    # Dynamo's graphs of the model and AOTAutograd's forward and backward, run by eager kernels: the tracing, in
    # seconds; inductor's CPU code generation (C++, not the GPU's Triton) takes a minute or more on a fresh machine
    "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compile_trains_like_eager(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, eager = _run(tmp_path / "eager", "--steps", "3", "--seq-len", "128")
    code2, compiled = _run(tmp_path / "compiled", "--steps", "3", "--seq-len", "128", "--compile",
                           "--compile-backend", backend)
    assert code == code2 == 0
    notes = " ".join(json.loads((compiled / "status.json").read_text())["notes"])
    assert f"torch.compile enabled, backend {backend}" in notes
    la = [float(r["loss"]) for r in read_csv(eager / "training.csv")]
    lb = [float(r["loss"]) for r in read_csv(compiled / "training.csv")]
    assert lb == pytest.approx(la, rel=1e-4)


def test_a_compile_backend_without_compile_is_named_as_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "1", "--seq-len", "128", "--compile-backend", "aot_eager")
    assert code == 0
    notes = " ".join(json.loads((out / "status.json").read_text())["notes"])
    assert "train.compile_backend=aot_eager is ignored" in notes and "torch.compile enabled" not in notes


def test_a_data_path_with_synthetic_data_is_named_as_ignored(tmp_path, monkeypatch):
    """--data-path without --dataset text trained on synthetic data without a word; the run says the path is
    ignored."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text " * 200)
    code, out = _run(tmp_path / "run", "--steps", "1", "--seq-len", "128", "--data-path", str(corpus))
    assert code == 0
    notes = " ".join(json.loads((out / "status.json").read_text())["notes"])
    assert f"data.path={corpus} is ignored: data.dataset is synthetic" in notes


def test_a_fresh_run_archives_the_previous_runs_files(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "3")
    code2, out = _run(tmp_path, "--steps", "2")
    assert code == code2 == 0
    archives = list((out / "previous_runs").iterdir())
    assert len(archives) == 1
    old = archives[0]
    assert len(read_csv(old / "training.csv")) == 3 and (old / "checkpoints" / "step_00000003").is_dir()
    assert len(read_csv(out / "training.csv")) == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]
    assert [b["msg"] for b in heartbeats(out, 0)][0] == "boot"
    assert sum(b["msg"] == "boot" for b in heartbeats(out, 0)) == 1


def test_nsa_train_watchdog_subcommand(tmp_path, capsys):
    assert train.main(["watchdog", "--dir", str(tmp_path / "missing"), "--once"]) == 2
    assert "nsa-train watchdog: error" in capsys.readouterr().err
    (tmp_path / "heartbeat_rank0.jsonl").write_text(json.dumps(
        {"ts": 1.0, "rank": 0, "pid": 1, "host": "elsewhere", "step": 4, "msg": "step"}) + "\n")
    assert train.main(["watchdog", "--dir", str(tmp_path), "--once", "--stall-after", "60", "--halt", "0"]) == 1
    assert not (tmp_path / ".HALT").exists()
