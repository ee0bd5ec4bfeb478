"""The dense twin (model.attention: dense) and the kernel choice (NSAConfig.kernel / NSA_KERNEL).

The dense twin is what every NSA figure is compared with, so it is checked against the independent masked
reference (tests/nsa/reference.py), its FLOPs against a count from the built model, and the trainer's record of
which attention and kernels ran.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import reference as R
from nsa.attention import DenseAttention
from nsa.attention.kernels import KernelUnavailable, resolve, triton_status
from nsa.attention.rope import apply_rope
from nsa.config import ModelConfig, NSAConfig
from nsa.model import NSAModel, flops_per_token
from nsa.toggles import Toggles
from nsa_test_utils import randomize_params

REPO = Path(__file__).resolve().parents[3]
TINY = dict(vocab_size=128, dim=64, n_layers=2, n_heads=4, n_kv_groups=2, d_k=16, d_v=8, l=16, d=8, l_sel=32,
            n_sel=4, w=32)


@pytest.mark.parametrize("heads,groups", [(4, 2), (4, 4), (6, 1)])
def test_dense_attention_is_causal_gqa_softmax_attention(heads, groups):
    cfg = NSAConfig(dim=48, n_heads=heads, n_kv_groups=groups, d_k=16, d_v=8)
    layer = DenseAttention(cfg)
    randomize_params(layer, seed=3)
    x = torch.randn(2, 37, 48, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(37)
    b, s = 2, 37
    q = apply_rope(layer.q_proj(x).view(b, s, heads, -1).transpose(1, 2), pos, cfg.rope_theta)
    k = apply_rope(layer.k_proj(x).view(b, s, groups, -1).transpose(1, 2), pos, cfg.rope_theta)
    v = layer.v_proj(x).view(b, s, groups, -1).transpose(1, 2)
    expected = layer.o_proj(R.ref_causal(q, k, v).transpose(1, 2).flatten(2).float())
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-4)


def test_dense_twin_model_has_the_same_shape_but_no_nsa_parts():
    nsa = NSAModel(ModelConfig.from_flat(TINY))
    dense = NSAModel(ModelConfig.from_flat({**TINY, "attention": "dense"}))
    assert isinstance(dense.blocks[0].attn, DenseAttention)
    ids = torch.randint(0, 128, (2, 40))
    assert dense(ids).shape == nsa(ids).shape == (2, 40, 128)
    names = {n for n, _ in dense.named_parameters()}
    assert not any(".phi_" in n or ".gate." in n or "k_sel" in n for n in names)
    assert dense.num_params() < nsa.num_params()
    assert dense.aux_stats() == {}


@pytest.mark.parametrize("seq_len", [1, 40, 160])
def test_dense_twin_flops_match_an_independent_count(seq_len):
    cfg = ModelConfig.from_flat({**TINY, "attention": "dense"})
    with torch.device("meta"):
        model = NSAModel(cfg)
    linear = sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    keys = sum(t + 1 for t in range(seq_len)) / seq_len  # causal: position t reads t + 1 keys
    attention = cfg.n_layers * cfg.n_heads * 2 * (cfg.nsa.d_k + cfg.nsa.d_v) * keys
    assert flops_per_token(cfg, seq_len) == pytest.approx(3.0 * (linear + attention), rel=1e-12)


def test_model_config_flat_round_trip_and_nsa_fields_live_in_nsaconfig():
    cfg = ModelConfig.from_flat({**TINY, "kernel": "torch", "attention": "dense"})
    assert cfg.nsa.kernel == "torch" and cfg.attention == "dense" and cfg.dim == 64
    assert ModelConfig.from_flat(cfg.flat()) == cfg
    assert cfg.replace(n_sel=5).nsa.n_sel == 5
    with pytest.raises(ValueError, match="unknown model key 'bogus'"):
        ModelConfig.from_flat({**TINY, "bogus": 1})
    with pytest.raises(ValueError, match="attention must be one of nsa | dense"):
        ModelConfig.from_flat({**TINY, "attention": "sparse"})
    with pytest.raises(ValueError, match="kernel must be one of auto | torch | triton"):
        NSAConfig(dim=8, n_heads=2, n_kv_groups=1, d_k=4, d_v=4, kernel="cuda")


def test_nsa_kernel_toggle_overrides_the_config_and_rejects_bad_values():
    cfg = NSAConfig(dim=8, n_heads=2, n_kv_groups=1, d_k=4, d_v=4)
    assert cfg.kernel == "auto"
    assert cfg.with_toggles(Toggles.read({"NSA_KERNEL": "torch"})).kernel == "torch"
    assert cfg.with_toggles(Toggles.read({})).kernel == "auto"
    with pytest.raises(ValueError, match="NSA_KERNEL='gpu' is invalid: expected auto | torch | triton"):
        Toggles.read({"NSA_KERNEL": "gpu"})


def test_kernel_resolution_never_falls_back_silently(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve("torch", cpu) == "torch"
    assert resolve("auto", cpu) == "torch"  # auto: triton on CUDA only
    # import the kernel modules (once per process) under the interpreter the tests run them in: first imported with
    # TRITON_INTERPRET=0, their kernels would stay bound to a GPU driver, and later interpreter tests would fail
    triton_status(cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelUnavailable, match="is 'triton' but"):
        resolve("triton", cpu)
    with pytest.raises(ValueError, match="kernel must be one of"):
        resolve("fast", cpu)


def test_the_trainer_resolves_the_kernel_for_its_compute_dtype(monkeypatch):
    """The kernel the trainer records (and refuses at start-up) is the one the layer takes at its forward, whose
    choice depends on the compute dtype: under the interpreter the Triton kernels take fp32, not bf16."""
    pytest.importorskip("triton")
    from nsa.training.trainer import attention_kernel  # the trainer module imports torch.distributed's checkpointing

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model = ModelConfig.from_flat({"vocab_size": 64, "n_layers": 1, "dim": 64, "n_heads": 4, "n_kv_groups": 2,
                                   "d_k": 32, "d_v": 32,
                                   "kernel": "triton"})
    cpu = torch.device("cpu")
    assert attention_kernel(model, cpu, torch.float32) == "triton"
    with pytest.raises(KernelUnavailable, match="bfloat16"):
        attention_kernel(model, cpu, torch.bfloat16)


def test_trainer_records_attention_and_kernel_and_rejects_triton_without_a_gpu(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("NSA_", "TRITON_"))}
    env["NSA_TB_DISABLE"] = "1"
    base = [sys.executable, "-m", "nsa.training", "--config", "configs/tiny_cpu.yaml", "--steps", "2",
            "--seq-len", "64", "--batch-size", "1"]
    for attention, kernel in (("dense", "sdpa"), ("nsa", "torch")):
        out = tmp_path / attention
        proc = subprocess.run([*base, "--attention", attention, "--out-dir", str(out)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        record = json.loads((out / "env.json").read_text())
        assert (record["attention"], record["attention_kernel"]) == (attention, kernel)
        assert record["toggles"]["kernel"] == "None"
        assert record["index_build"] is None  # the Triton path's index build: recorded where that path runs
    proc = subprocess.run([*base, "--out-dir", str(tmp_path / "t")], cwd=REPO, env={**env, "NSA_KERNEL": "triton"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "nsa-train: error: NSA_KERNEL / model.kernel is 'triton' but" in proc.stderr
    assert "Traceback" not in proc.stderr
