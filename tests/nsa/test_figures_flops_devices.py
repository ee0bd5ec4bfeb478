"""MFU's two inputs against counts made here by hand: the device a name is looked up as (its peaks, the data-sheet
figures nsa.devices cites) and the FLOPs a token costs (every matmul, and each NSA branch's keys counted position
by position from the branches' definitions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from nsa.config import ModelConfig
from nsa.devices import link_gbps
from nsa.model import NSAModel, flops_per_token
from nsa.training import metrics

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny_cpu.yaml"
M7C = REPO / "configs" / "m7c_125m_1xh100.yaml"
CUDA = torch.device("cuda")


# ---------------------------------------------------------------------------------------------- devices by name
def _peaks(monkeypatch, name: str) -> tuple:
    monkeypatch.setattr(metrics, "device_name", lambda device: name)
    roof = metrics.roofline_peaks(name)
    return (metrics.peak_flops(CUDA, "bf16"), metrics.peak_flops(CUDA, "fp32"),
            None if roof is None else roof.bytes)


@pytest.mark.parametrize("name, bf16, fp32, hbm", [
    # torch.cuda.get_device_name strings; dense bf16 and fp32 TFLOP/s, HBM TB/s (None: not listed, "peak unknown")
    ("NVIDIA H100 80GB HBM3", 989.4, 66.9, 3.35),
    ("NVIDIA H100 PCIe", 756.0, 51.0, 2.0),  # not the SXM part's 989.4 and 3.35
    ("NVIDIA H100 NVL", 835.5, 60.0, 3.9),
    ("NVIDIA H200", 989.4, 66.9, 4.8),
    ("NVIDIA GH200 480GB", 989.4, 66.9, 4.9),  # known, and not read as an H200 (4.8)
    ("NVIDIA A100-SXM4-80GB", 312.0, 19.5, 2.039),
    ("NVIDIA A100-PCIE-40GB", 312.0, 19.5, 1.555),
    ("NVIDIA A100 80GB PCIe", 312.0, 19.5, 1.935),  # the PCIe part's HBM, not the SXM part's 2.039
    ("NVIDIA L40S", 362.1, 91.6, None),
])
def test_real_device_names_get_their_own_parts_peaks(monkeypatch, name, bf16, fp32, hbm):
    got_bf16, got_fp32, got_hbm = _peaks(monkeypatch, name)
    assert got_bf16 == pytest.approx(bf16 * 1e12) and got_fp32 == pytest.approx(fp32 * 1e12)
    assert got_hbm == (None if hbm is None else pytest.approx(hbm * 1e12))


@pytest.mark.parametrize("name", [
    "NVIDIA GB200",  # Grace Blackwell's GPU (its own power limit and clock): not the listed B200
    "Tesla V100S-PCIE-32GB",  # the V100S, a faster part than the listed V100
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a MIG slice: 14 of the A100's 108 SMs, not its 312 TFLOP/s
    "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
])
def test_another_part_or_a_slice_of_a_listed_one_is_unknown(monkeypatch, name):
    """A listed model name inside a longer word is another part, a MIG instance a slice of the part: its peak is
    unknown (no MFU, no roofline, no link ceiling of its own), never the listed part's number (the B200's 2,250
    TFLOP/s, the V100's 125, the whole A100's 312)."""
    assert _peaks(monkeypatch, name) == (None, None, None)
    assert link_gbps(name) is None


# ---------------------------------------------------------------------------------------------- FLOPs per token
def _cfg(path: Path, **changes) -> ModelConfig:
    return ModelConfig.from_flat({**yaml.safe_load(path.read_text())["model"], **changes})


def _hand_flops(cfg: ModelConfig, s: int) -> float:
    """Training FLOPs per token counted here: 3 x (forward matmuls + attention) + the forward-only importance.

    Matmuls, 2 FLOPs a weight a token: q (dim x H d_k), o (H d_v x dim), SwiGLU (3 x dim x hidden), the head
    (dim x vocab, once whether tied or not; the embedding is a lookup); the dense twin one K/V projection pair
    (dim x G (d_k + d_v)), NSA three (cmp, sel, win) and its gate MLP (dim x dim/4, dim/4 x 3H). The compression
    MLP (fc1 l*width x 2 width, fc2 2 width x width, per group, for keys and values) runs once per compression block.
    Attention, 2 (d_k + d_v) FLOPs a key read, a head: at position t (0-based) the dense twin reads the t + 1 keys of
    its causal mask; NSA reads the compression blocks [i d, i d + l) that have ended (i d + l - 1 <= t), the tokens
    <= t of its n_sel selected blocks (every started block while at most n_sel have started; else the current block
    up to t and n_sel - 1 whole blocks) and the last min(w, t + 1) tokens; the importance scores read every
    visible compressed key once more, forward only (2 d_k a key, a head)."""
    a, dim, h, g = cfg.nsa, cfg.dim, cfg.n_heads, cfg.n_kv_groups
    qo_mlp = dim * h * a.d_k + h * a.d_v * dim + 3 * dim * cfg.hidden
    head = dim * cfg.vocab_size
    if cfg.attention == "dense":
        keys = sum(t + 1 for t in range(s))
        return 3 * (2 * (cfg.n_layers * (qo_mlp + dim * g * (a.d_k + a.d_v)) + head)
                    + cfg.n_layers * h * 2 * (a.d_k + a.d_v) * keys / s)
    gate = dim // 4 if dim // 4 >= 16 else 16
    layer = qo_mlp + 3 * dim * g * (a.d_k + a.d_v) + dim * gate + gate * 3 * h
    blocks = 0
    while blocks * a.d + a.l <= s:  # compression blocks of the whole sequence
        blocks += 1
    mlp = g * sum(a.l * wd * 2 * wd + 2 * wd * wd for wd in (a.d_k, a.d_v)) if a.phi == "mlp" else 0
    cmp = sel = win = 0
    for t in range(s):
        cmp += sum(1 for i in range(blocks) if i * a.d + a.l - 1 <= t)
        started = t // a.l_sel + 1
        sel += t + 1 if started <= a.n_sel else (a.n_sel - 1) * a.l_sel + t % a.l_sel + 1
        win += min(a.w, t + 1)
    forward = 2 * (cfg.n_layers * layer + head) + 2 * cfg.n_layers * mlp * blocks / s
    attention = cfg.n_layers * h * 2 * (a.d_k + a.d_v) * (cmp + sel + win) / s
    return 3 * (forward + attention) + cfg.n_layers * h * 2 * a.d_k * cmp / s


@pytest.mark.parametrize("path, seq_len", [(M7C, 2048), (M7C, 700), (TINY, 256), (TINY, 40), (TINY, 10)])
@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_flops_per_token_against_a_count_by_hand(path, seq_len, attention):
    cfg = _cfg(path, attention=attention)
    assert flops_per_token(cfg, seq_len) == pytest.approx(_hand_flops(cfg, seq_len), rel=1e-12)


def test_m7c_figures_worked_out():
    """The m7c shape at 2,048 tokens, by hand: dim 768, 12 layers, 12 heads, 2 KV groups, d_k = d_v = 64, hidden
    64 * ceil(8 * 768 / 3 / 64) = 2,048, vocab 50,304, gate hidden 192.
    Dense twin: per layer 768*768 + 768*768 + 3*768*2048 + 768*2*128 = 6,094,848 weights; head 38,633,472;
    matmuls 2 * (12 * 6,094,848 + 38,633,472) = 223,543,296; causal attention (t + 1 keys at t, a mean of 2,049 / 2)
    12 * 12 * 2 * 128 * 2,049 / 2 = 37,767,168; x 3 = 783,931,392."""
    dense = _cfg(M7C, attention="dense")
    per_layer = 768 * 768 + 768 * 768 + 3 * 768 * 2048 + 768 * 2 * 128
    assert per_layer == 6_094_848
    matmuls = 2 * (12 * per_layer + 768 * 50304)
    assert matmuls == 223_543_296
    attention = 12 * 12 * 2 * 128 * 2049 / 2
    assert attention == 37_767_168
    assert flops_per_token(dense, 2048) == 783_931_392
    # NSA: the window reads min(512, t + 1) keys: (512 * 513 / 2 + 1536 * 512) / 2048 = 448.125 a token; the
    # compressed branch sum over t of ((t - 31) // 16 + 1) for t >= 31 (127 blocks): 2,017 positions, floors
    # summing to 16 * 126 * 125 / 2 + 126 = 126,126: 128,143 -> 62.5698 a token
    nsa = _cfg(M7C)
    win = (512 * 513 / 2 + 1536 * 512) / 2048
    assert win == 448.125
    cmp = sum((t - 31) // 16 + 1 for t in range(31, 2048))
    assert cmp == 128_143
    assert flops_per_token(nsa, 2048) == pytest.approx(_hand_flops(nsa, 2048))


def test_tied_head_is_one_parameter_tensor_and_its_matmul_is_counted_either_way():
    tied, untied = _cfg(TINY, tie_embeddings=True), _cfg(TINY, tie_embeddings=False)
    torch.manual_seed(0)
    n_tied, n_untied = NSAModel(tied).num_params(), NSAModel(untied).num_params()
    assert n_untied - n_tied == tied.vocab_size * tied.dim  # the shared weight once in N
    # the head's matmul (2 * dim * vocab a token, x 3) is in both counts; the embedding lookup in neither
    assert flops_per_token(tied, 256) == flops_per_token(untied, 256) == pytest.approx(_hand_flops(tied, 256))
    assert flops_per_token(tied, 256) - flops_per_token(_cfg(TINY, vocab_size=128), 256) == \
        pytest.approx(3 * 2 * tied.dim * (256 - 128))


# ---------------------------------------------------------------------------------------------- bytes communicated
# The m7c model's parameters by hand: embedding 50,304 x 768 = 38,633,472 (the head shares it: once), final norm 768;
# a block: two norms 2 x 768, q and o 2 x 768 x 768, k/v of three branches 6 x 768 x 128, the gate 768 x 192 + 192 +
# 192 x 36 + 36 = 154,596, two compressors (keys, values) of pos 32 x 64 + fc1 2,048 x 128 + 128 + fc2 128 x 64 + 64
# = 272,576 each, SwiGLU 3 x 768 x 2,048.
M7C_BLOCK = 2 * 768 + 2 * 768 * 768 + 6 * 768 * 128 + 154_596 + 2 * 272_576 + 3 * 768 * 2048
M7C_ROOT = 50304 * 768 + 768
M7C_PARAMS = M7C_ROOT + 12 * M7C_BLOCK


def _m7c_specs():
    from nsa.training.comm_model import param_specs

    with pytest.MonkeyPatch.context() as mp:  # shapes only: the 125M parameters left uninitialized
        for module in (torch.nn.Linear, torch.nn.Embedding, NSAModel):
            mp.setattr(module, "reset_parameters", lambda self: None)
        net = NSAModel(_cfg(M7C))
    return param_specs(net)


def test_m7c_parameter_count_by_hand():
    assert M7C_BLOCK == 7_189_348 and M7C_PARAMS == 124_906_416
    assert sum(s.numel for s in _m7c_specs()) == M7C_PARAMS


def test_ddp_and_fsdp2_bytes_per_step_of_m7c_by_hand():
    """fp32 parameters (4 bytes). DDP: every gradient all-reduced once a step whatever the accumulation (the other
    micro-batches under no_sync), 2 bytes an element with bf16 compression. FSDP2, 8 ranks, 4 micro-batches: each unit
    (the root and 12 blocks) gathered in every micro-batch's forward, each block again in its backward (full shard),
    one reduce-scatter a unit a step; shards of ceil(dim0 / 8) rows: the gate's 36 x 192 weight and 36 bias pad to 40
    rows (4 x 192 + 4 elements a block), every other dim0 (768, 50,304, 192, 128, 64, 32, 2,048) divides by 8."""
    from nsa.training.comm_model import comm_model

    specs = _m7c_specs()
    for accum in (1, 4):
        ddp = comm_model(specs, "ddp", world_size=8, accum=accum, bucket_cap_mb=25)
        assert ddp.per_step["all_reduce"]["bytes"] == 4 * M7C_PARAMS
        # buckets of >= 25 MiB but the last: at most ceil(bytes / 25 MiB) of them
        assert ddp.per_step["all_reduce"]["calls"] <= -(-4 * M7C_PARAMS // (25 * 1024 * 1024))
        bf16 = comm_model(specs, "ddp", world_size=8, accum=accum, bucket_cap_mb=25, compress="bf16")
        assert bf16.per_step["all_reduce"]["bytes"] == 2 * M7C_PARAMS
    block = 4 * (M7C_BLOCK + 4 * 192 + 4)
    root = 4 * M7C_ROOT
    fsdp = comm_model(specs, "fsdp", world_size=8, accum=4)
    assert fsdp.per_step["all_gather"]["calls"] == 4 * (13 + 12)
    assert fsdp.per_step["all_gather"]["bytes"] == 4 * (root + 12 * block + 12 * block)
    assert fsdp.per_step["reduce_scatter"] == {"calls": 13, "bytes": root + 12 * block,
                                               "sizes": [block] * 12 + [root]}
    no_reshard = comm_model(specs, "fsdp", world_size=8, accum=4, reshard_after_forward=False)
    assert no_reshard.per_step["all_gather"]["bytes"] == 4 * (root + 12 * block)
    assert no_reshard.per_step["reduce_scatter"] == fsdp.per_step["reduce_scatter"]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_bus_factors_are_the_ring_algorithms_traffic_per_rank(n):
    """A ring all-reduce of S bytes over n ranks is a reduce-scatter then an all-gather, each of n - 1 steps of S / n
    bytes a rank: a rank sends 2 (n - 1) / n x S, so busbw = algbw x 2 (n - 1) / n; an all-gather or reduce-scatter
    (S the whole buffer) sends (n - 1) / n x S; a broadcast's pipeline sends S (nccl-tests' conventions)."""
    from validation.analysis.collectives import bandwidth_row, bus_factor

    sent_all_reduce = 2 * (n - 1) * (1 / n)
    assert bus_factor("all_reduce", n) == pytest.approx(sent_all_reduce)
    assert bus_factor("all_gather", n) == bus_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
    assert bus_factor("broadcast", n) == 1.0
    row = bandwidth_row("all_reduce", n, 10 ** 9, 0.5)  # 1 GB in 0.5 s: algbw 2 GB/s
    assert row["algbw_gbps"] == pytest.approx(2.0) and row["busbw_gbps"] == pytest.approx(2.0 * sent_all_reduce)
