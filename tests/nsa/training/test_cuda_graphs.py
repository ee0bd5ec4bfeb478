"""train.cuda_graphs (nsa.training.graphs): the whole train step captured in CUDA graphs.

On CPU the capture is mocked (graph_fakes.FakeCapture: capture runs the step's Python once, replay runs it again)
and everything around it is checked: the warm-up, the static buffers, one replay of each graph per step, the
capturable optimizer, the state put back after the warm-up (a mocked run equals the eager run), the refusals,
and that the eager step still equals a plain PyTorch training loop. The GPU tests capture for real and compare
with the eager run; they skip without CUDA.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import yaml

from graph_fakes import FakeCapture, install
from train_utils import REPO, TINY, clean_env, heartbeats, read_csv

from nsa.model import NSAModel, lm_loss
from nsa.training import cli as train
from nsa.training import graphs
from nsa.training.comm_count import CommCounter
from nsa.training.config import ConfigError, UsageError, config_from_dict
from nsa.training.data import build_source
from nsa.training.optim import build_adamw, make_capturable, set_lr

STEPS = 3
SHAPE = {"seq_len": 128, "batch_size": 2, "accum": 2}  # 4 selection blocks of 32, n_sel 4: every branch runs


def _config(tmp_path, name="cfg.yaml", model=None, **train_cfg) -> str:
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"device": "auto", "log_every": 1, **train_cfg})
    raw["model"].update(model or {})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _run(tmp_path, name, *flags, **train_cfg):
    out = tmp_path / name
    code = train.main(["--config", _config(tmp_path, f"{name}.yaml", **{**SHAPE, **train_cfg}), "--out-dir",
                       str(out), "--steps", str(STEPS), *flags])
    return code, out


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory):
    """One eager run (no --cuda-graphs) of the tiny model, shared by the tests that compare with it."""
    import os

    saved = os.environ.get("NSA_TB_DISABLE")
    os.environ["NSA_TB_DISABLE"] = "1"
    try:
        code, out = _run(tmp_path_factory.mktemp("eager"), "eager")
    finally:
        os.environ.pop("NSA_TB_DISABLE") if saved is None else os.environ.__setitem__("NSA_TB_DISABLE", saved)
    assert code == 0
    return out


@pytest.fixture
def fake_capture(monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    install(monkeypatch.setattr)
    return FakeCapture


# ---------------------------------------------------------------------- the trainer with the capture mocked
def _spy_on_the_trainer(monkeypatch) -> dict:
    """Record what the trainer's graphed step does: per micro-step (reads a static buffer?, inside the side
    stream?, its inputs), the batches the data source handed out, and the Trainer itself."""
    from nsa.training import trainer as trainer_mod

    seen = {"micro": [], "handed": [], "trainer": None}
    micro_step, real_build = trainer_mod.Trainer._micro_step, trainer_mod.build_source

    def micro_spy(self, inputs, targets, last, loss_factor=None):
        seen["trainer"] = self
        static = {b.data_ptr() for b in self.graphed.inputs}
        seen["micro"].append((inputs.data_ptr() in static, FakeCapture.instances[-1].in_side_stream, inputs.clone()))
        return micro_step(self, inputs, targets, last, loss_factor)

    def build(*args, **kwargs):
        source = real_build(*args, **kwargs)
        next_batch = source.next_batch

        def spied():
            batch = next_batch()
            seen["handed"].append(batch[0].clone())
            return batch

        source.next_batch = spied
        return source

    monkeypatch.setattr(trainer_mod.Trainer, "_micro_step", micro_spy)
    monkeypatch.setattr(trainer_mod, "build_source", build)
    return seen


def test_mocked_capture_equals_the_eager_run(tmp_path, eager_run, fake_capture, monkeypatch):
    seen = _spy_on_the_trainer(monkeypatch)
    code, graphed = _run(tmp_path, "graphed", "--cuda-graphs")
    assert code == 0
    rows_e, rows_g = read_csv(eager_run / "training.csv"), read_csv(graphed / "training.csv")
    assert list(rows_g[0]) == list(rows_e[0])  # the same columns
    assert [int(r["step"]) for r in rows_g] == list(range(1, STEPS + 1))
    for e, g in zip(rows_e, rows_g):
        # the same data, weights and updates: the warm-up left no trace (capturable AdamW rounds its bias
        # corrections in fp32 on the device, hence approx)
        for key in ("loss", "grad_norm", "lr"):
            assert float(g[key]) == pytest.approx(float(e[key]), rel=1e-5, abs=1e-7), (key, e["step"])
        assert float(g["mem_alloc_gb"]) >= 0 and float(g["toks_per_s"]) > 0
    assert float(rows_g[-1]["loss"]) < float(rows_g[0]["loss"])  # it learns

    # warm-up: WARMUP_STEPS steps of `accum` micro-steps on the side stream, over the zeroed static buffers
    accum, warm = SHAPE["accum"], graphs.WARMUP_STEPS
    micro = seen["micro"]
    assert all(static for static, _, _ in micro)  # the model only ever reads the static buffers
    assert [side for _, side, _ in micro[:warm * accum]] == [True] * (warm * accum)
    assert not any(side for _, side, _ in micro[warm * accum:])
    assert all(not x.any() for _, _, x in micro[:warm * accum])  # zeros: the warm-up takes no data
    # then the capture (one step's Python), then one replay per step, each over the source's batches (copy_)
    replayed = [x for _, _, x in micro[(warm + 1) * accum:]]
    assert len(replayed) == STEPS * accum == len(seen["handed"])
    # (on a GPU machine the run is on CUDA and the spy keeps the source's CPU batches: compare on the CPU)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(replayed, seen["handed"]))
    events = fake_capture.events
    assert events[:2] == [("side_stream", "enter"), ("side_stream", "exit")]
    assert [e for e in events if e[0] == "capture"] == [("capture", "step"), ("capture", "optimizer")]
    assert [e for e in events if e[0] == "replay"] == [("replay", "step"), ("replay", "optimizer")] * STEPS

    # the optimizer is capturable, its lr a tensor the schedule filled in place
    optimizer = seen["trainer"].optimizer
    assert all(g["capturable"] for g in optimizer.param_groups)
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dim() == 0 and float(lr) == pytest.approx(float(rows_g[-1]["lr"]))

    # the records say graphs were on
    env = json.loads((graphed / "env.json").read_text())
    assert env["cuda_graphs"] == {"enabled": True, "warmup_steps": warm, "graphs": ["step", "optimizer"],
                                  "static_inputs": [accum, SHAPE["batch_size"], SHAPE["seq_len"]],
                                  "record_stats": True}
    assert env["config"]["train"]["cuda_graphs"] is True
    assert json.loads((eager_run / "env.json").read_text())["cuda_graphs"] == {"enabled": False}
    beats = heartbeats(graphed, 0)
    captured = [b for b in beats if b["msg"] == "cuda_graphs"]
    assert len(captured) == 1 and captured[0]["warmup_steps"] == warm
    steps = [b for b in beats if b["msg"] == "step"]
    assert len(steps) == STEPS and all("gate_cmp" in b for b in steps)  # layer stats still logged
    assert beats[-1]["msg"] == "done"


def test_nan_fault_under_graphs_stops_without_stepping(tmp_path, fake_capture, monkeypatch):
    monkeypatch.setenv("NSA_FAULT", "nan@2")
    code, out = _run(tmp_path, "graphed", "--cuda-graphs", accum=1)
    assert code == 3  # EXIT_NONFINITE
    assert [int(r["step"]) for r in read_csv(out / "training.csv")] == [1]
    replays = [e for e in fake_capture.events if e[0] == "replay"]
    assert replays == [("replay", "step"), ("replay", "optimizer"), ("replay", "step")]  # step 2 never applied


# ---------------------------------------------------------------------- GraphedStep itself
def _tiny_step(accum=2, counter=None, warmup=3):
    torch.manual_seed(0)
    emb = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    opt = build_adamw(emb, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), fused=False)
    make_capturable(opt)
    calls = []

    def micro_step(inputs, targets, last, loss_factor):
        calls.append((inputs.data_ptr(), last))
        loss = lm_loss(emb(inputs), targets) * loss_factor
        (loss / accum).backward()
        return loss.detach()

    def grad_norm():
        return torch.nn.utils.clip_grad_norm_(emb.parameters(), 1.0)

    cap = FakeCapture(torch.device("cpu"))
    step = graphs.GraphedStep(capture=cap, micro_step=micro_step, grad_norm=grad_norm,
                              set_record_stats=lambda on: None, optimizer=opt, params=list(emb.parameters()),
                              accum=accum, batch_size=2, seq_len=5, device=torch.device("cpu"), record_stats=False,
                              warmup_steps=warmup, counter=counter)
    return emb, opt, step, calls


def test_capture_puts_weights_and_optimizer_state_back(fake_capture):
    emb, opt, step, calls = _tiny_step()
    before = [p.detach().clone() for p in emb.parameters()]
    info = step.capture()
    assert info["warmup_steps"] == 3
    assert len(calls) == (3 + 1) * 2  # 3 warm-up steps + the capture, 2 micro-batches each
    assert all(torch.equal(a, b) for a, b in zip(before, emb.parameters()))
    for p in emb.parameters():  # AdamW's fresh state: step 0, zero moments, allocated (the graph reads it)
        state = opt.state[p]
        assert float(state["step"]) == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()


def test_replay_equals_plain_steps_and_rejects_wrong_shapes(fake_capture):
    emb, opt, step, _ = _tiny_step()
    ref = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    ref.load_state_dict(emb.state_dict())
    ref_opt = make_capturable(build_adamw(ref, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), fused=False))
    step.capture()
    gen = torch.Generator().manual_seed(1)
    for i in range(3):
        batches = [(torch.randint(0, 16, (2, 5), generator=gen), torch.randint(0, 16, (2, 5), generator=gen))
                   for _ in range(2)]
        set_lr(opt, 1e-2 / (i + 1))
        set_lr(ref_opt, 1e-2 / (i + 1))
        loss_sum, norm = step.step(batches)
        step.optimizer_step()
        ref_opt.zero_grad()
        total = 0.0
        for x, y in batches:
            loss = lm_loss(ref(x), y)
            (loss / 2).backward()
            total += float(loss.detach())
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        assert float(loss_sum) == pytest.approx(total, rel=1e-6)
        assert float(norm) == pytest.approx(float(ref_norm), rel=1e-6)
        assert torch.equal(step.inputs[1], batches[1][0]) and torch.equal(step.targets[0], batches[0][1])
    for a, b in zip(emb.parameters(), ref.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match=r"\[batch_size, seq_len\] = \[2, 5\]"):
        step.step([(torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long))] * 2)
    with pytest.raises(ValueError, match="expected 2 micro-batches"):
        step.step([(torch.zeros(2, 5, dtype=torch.long),) * 2])
    _, _, fresh, _ = _tiny_step()
    with pytest.raises(RuntimeError, match="before capture"):
        fresh.step([])


def test_nan_factor_and_counted_collectives(fake_capture):
    counter = CommCounter(measure_time=False)
    emb, opt, step, _ = _tiny_step(counter=counter)
    real_body = step._step_body

    def body_with_hook():  # as DDP's comm hook tells the counter of a bucket all-reduce
        real_body()
        counter.issue("all_reduce", 4096)

    step._step_body = body_with_hook
    info = step.capture()
    assert info["comm_calls_per_step"] == 1 and counter.total["model"] == {}  # the capture itself is not counted
    batch = [(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long))] * 2
    for nan in (False, True, False):
        counter.begin_step()
        loss_sum, _ = step.step(batch, nan=nan)
        record = counter.end_step()
        assert math.isnan(float(loss_sum)) == nan
        assert record["model"]["all_reduce"] == {"calls": 1, "bytes": 4096, "sizes": [4096]}  # counted per replay


def test_make_capturable_is_idempotent_and_set_lr_fills_in_place():
    model = nn.Linear(3, 3)
    opt = build_adamw(model, lr=0.5, weight_decay=0.0, betas=(0.9, 0.95), fused=False)
    set_lr(opt, 0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]  # eager: a plain float, as before
    make_capturable(opt)
    tensors = [g["lr"] for g in opt.param_groups]
    assert all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and float(t) == 0.25 for t in tensors)
    assert tensors[0] is not tensors[1] and all(g["capturable"] for g in opt.param_groups)
    make_capturable(opt)
    assert [g["lr"] for g in opt.param_groups] == tensors and all(a is b for a, b in
                                                                   zip(tensors, [g["lr"] for g in opt.param_groups]))
    set_lr(opt, 0.125)
    assert all(g["lr"] is t and float(t) == 0.125 for g, t in zip(opt.param_groups, tensors))
    opt.state[model.weight]["step"] = torch.tensor(4.0, dtype=torch.float64)  # as loaded from an eager checkpoint
    make_capturable(opt)
    assert opt.state[model.weight]["step"].dtype == torch.float32 and float(opt.state[model.weight]["step"]) == 4


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize("key, value, message", [
    ("parallel", "fsdp", "cannot be combined with FSDP2"),
    ("precision", "fp16", "cannot be combined with precision fp16"),
    ("device", "cpu", "needs a CUDA device, but train.device is 'cpu'"),
])
def test_config_refuses_what_cannot_be_captured(key, value, message):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"device": "auto", "cuda_graphs": True, key: value})
    with pytest.raises(ConfigError, match=message) as err:
        config_from_dict(raw, "run.yaml")
    assert str(err.value).startswith("run.yaml: section 'train': train.cuda_graphs")
    raw["train"]["cuda_graphs"] = False
    config_from_dict(raw, "run.yaml")  # fine without graphs


def test_config_takes_compile_with_graphs():
    """--compile with --cuda-graphs: the compiled model is captured after its warm-up (bench_train's
    compile+graphs mode); the config keeps both, and graphs' other refusals still apply."""
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"device": "auto", "cuda_graphs": True, "compile": True})
    cfg = config_from_dict(raw, "run.yaml")
    assert cfg.train.cuda_graphs and cfg.train.compile
    raw["train"]["precision"] = "fp16"
    with pytest.raises(ConfigError, match="cannot be combined with precision fp16"):
        config_from_dict(raw, "run.yaml")


@pytest.mark.parametrize("flags, message", [
    (["--cuda-graphs", "--fsdp"], "cannot be combined with FSDP2"),
    (["--cuda-graphs", "--device", "cpu"], "needs a CUDA device, but train.device is 'cpu'"),
    pytest.param(["--cuda-graphs"], "needs a CUDA device, but this run is on cpu",  # device auto, and no GPU
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")),
])
def test_command_line_refusals_are_one_line(tmp_path, capsys, flags, message):
    code = train.main(["--config", _config(tmp_path), "--out-dir", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_attention_paths_that_sync_the_host_are_refused():
    cuda = torch.device("cuda", 0)
    for kernel in ("triton", "sdpa"):
        graphs.check_supported(cuda, kernel)
    for kernel in ("torch", "sequential"):
        with pytest.raises(UsageError, match=f"the '{kernel}' path here .* cannot be captured"):
            graphs.check_supported(cuda, kernel)
    with pytest.raises(UsageError, match="needs a CUDA device"):
        graphs.check_supported(torch.device("cpu"), "triton")


# ---------------------------------------------------------------------- the eager step is unchanged
def test_eager_trainer_equals_a_plain_training_loop(tmp_path, eager_run):
    """Without the flag the trainer's step is the textbook one: the same losses as a plain loop over the same
    model, data, AdamW, schedule and clipping, written here from the parts."""
    out = eager_run
    cfg = train.load_config(_config(tmp_path, "ref.yaml", **SHAPE))
    tc = cfg.train
    torch.manual_seed(tc.seed)
    model = NSAModel(cfg.model)
    opt = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.01},
                             {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                            lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=1e-8)
    source = build_source(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=tc.seq_len, batch_size=tc.batch_size,
                          rank=0, world_size=1, seed=tc.seed)
    rows = read_csv(out / "training.csv")
    for step in range(1, STEPS + 1):
        lr = tc.lr * step / tc.warmup_steps  # still in the linear warm-up
        for group in opt.param_groups:
            group["lr"] = lr
        total = 0.0
        for _ in range(tc.accum):
            x, y = source.next_batch()
            loss = nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
            (loss / tc.accum).backward()
            total += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad()
        row = rows[step - 1]
        assert float(row["loss"]) == pytest.approx(total / tc.accum, rel=1e-6)
        assert float(row["grad_norm"]) == pytest.approx(float(norm), rel=1e-5)
        assert float(row["lr"]) == pytest.approx(lr, rel=1e-12)
    source.close()


# ---------------------------------------------------------------------- DDP (2 ranks, gloo) with the capture mocked
def test_ddp_mocked_capture_equals_eager_ddp(tmp_path):
    import subprocess
    import sys

    from train_utils import free_port

    def launch(name, *flags):
        out = tmp_path / name
        # 2 MiB of embeddings and 1 MiB buckets: DDP's first iteration (one bucket) and the later ones (several)
        # all-reduce other sizes, so the byte model must know which the first counted step is
        config = _config(tmp_path, model={"vocab_size": 4096})
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={free_port()}",
                str(REPO / "tests" / "nsa" / "training" / "graph_fakes.py"), "--config", config,
                "--out-dir", str(out), "--steps", "2", "--seq-len", "64", "--batch-size", "2", "--ddp", "1", *flags]
        # two ranks on CPU (gloo) even where a GPU is present: two NCCL ranks cannot share one GPU
        proc = subprocess.run(argv, cwd=REPO, env=clean_env({"NSA_TB_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "",
                                                             "NSA_DDP_BUCKET_MB": "1"}),
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return out

    eager, graphed = launch("eager"), launch("graphed", "--cuda-graphs")
    rows_e, rows_g = read_csv(eager / "training.csv"), read_csv(graphed / "training.csv")
    assert len(rows_g) == 2
    for e, g in zip(rows_e, rows_g):
        assert float(g["loss"]) == pytest.approx(float(e["loss"]), rel=1e-5)
        assert float(g["grad_norm"]) == pytest.approx(float(e["grad_norm"]), rel=1e-5)
        # DDP's bucket all-reduces, issued by its hook only while capturing, counted at every replay
        assert int(g["comm_bytes"]) == int(e["comm_bytes"]) > 0
    env = json.loads((graphed / "env.json").read_text())
    assert env["parallel"] == "ddp" and env["cuda_graphs"]["warmup_steps"] == graphs.DDP_WARMUP_STEPS
    # the byte model against the counted bytes: under graphs the first counted step is a replay, after the warm-up
    # rebuilt DDP's buckets (it said DIFFERS, predicting the first iteration's single bucket)
    for out in (eager, graphed):
        summary = json.loads((out / "summary.json").read_text())
        assert len(summary["comm"]["first_step"]) > 0 and summary["comm_model_matches"] is True, out.name
    first = json.loads((eager / "summary.json").read_text())["comm"]["first_step"]
    assert first != json.loads((graphed / "summary.json").read_text())["comm"]["first_step"]


# ---------------------------------------------------------------------- real capture on a GPU
GPU_MODEL = {"dim": 128, "n_heads": 4, "n_kv_groups": 2, "d_k": 32, "d_v": 32, "vocab_size": 512}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (captures a real CUDA graph)")
@pytest.mark.parametrize("attention", ["nsa", "dense"])
@pytest.mark.parametrize("precision, rel", [("fp32", 1e-4), ("bf16", 2e-2)])
def test_gpu_capture_matches_eager(tmp_path, monkeypatch, attention, precision, rel):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    runs = {}
    for name, flags in (("eager", []), ("graphed", ["--cuda-graphs"])):
        out = tmp_path / name
        cfg = tmp_path / f"{name}.yaml"
        raw = yaml.safe_load(TINY.read_text())
        raw["model"].update(GPU_MODEL)
        raw["train"].update({"device": "cuda", "log_every": 1, "accum": 2, "precision": precision})
        cfg.write_text(yaml.safe_dump(raw))
        code = train.main(["--config", str(cfg), "--out-dir", str(out), "--steps", "4", "--attention", attention,
                           *flags])
        assert code == 0
        runs[name] = read_csv(out / "training.csv")
    env = json.loads((tmp_path / "graphed" / "env.json").read_text())
    assert env["cuda_graphs"]["enabled"] and env["attention_kernel"] == ("triton" if attention == "nsa" else "sdpa")
    assert env["index_build"] == ("triton" if attention == "nsa" else None)  # "auto" on a GPU
    for e, g in zip(runs["eager"], runs["graphed"]):
        assert math.isfinite(float(g["loss"]))
        assert float(g["loss"]) == pytest.approx(float(e["loss"]), rel=rel), e["step"]
        assert float(g["grad_norm"]) == pytest.approx(float(e["grad_norm"]), rel=10 * rel), e["step"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (captures a real CUDA graph)")
@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_gpu_capture_of_the_compiled_model_matches_it_eager(tmp_path, monkeypatch, attention):
    """--compile --cuda-graphs: the compiled model, captured after its warm-up, trains as the compiled model does
    without graphs (fp32: the same kernels, replayed)."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    runs = {}
    for name, flags in (("compiled", ["--compile"]), ("graphed", ["--compile", "--cuda-graphs"])):
        out = tmp_path / name
        cfg = tmp_path / f"{name}.yaml"
        raw = yaml.safe_load(TINY.read_text())
        raw["model"].update(GPU_MODEL)
        raw["train"].update({"device": "cuda", "log_every": 1, "accum": 2, "precision": "fp32"})
        cfg.write_text(yaml.safe_dump(raw))
        assert train.main(["--config", str(cfg), "--out-dir", str(out), "--steps", "4", "--attention", attention,
                           *flags]) == 0
        runs[name] = read_csv(out / "training.csv")
    env = json.loads((tmp_path / "graphed" / "env.json").read_text())
    assert env["cuda_graphs"]["enabled"]
    assert len(runs["graphed"]) == len(runs["compiled"]) == 4
    for e, g in zip(runs["compiled"], runs["graphed"]):
        assert float(g["loss"]) == pytest.approx(float(e["loss"]), rel=1e-4), e["step"]
        assert float(g["grad_norm"]) == pytest.approx(float(e["grad_norm"]), rel=1e-3), e["step"]
