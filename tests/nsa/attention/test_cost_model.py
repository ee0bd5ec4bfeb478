"""nsa.attention.cost_model: its counts against counts it did not produce (the PyTorch path's own masks, the
geometry's reads, nsa.model's FLOP count), the device peaks it is used with, and a profile's floor arithmetic."""

from __future__ import annotations

import pytest
import torch

from nsa.attention import cost_model as cm
from nsa.attention.geometry import decode_reads, mean_reads, num_cmp_blocks, num_sel_blocks
from nsa.attention.kernels.range_attn import naive as range_naive
from nsa.attention.kernels.selected_attn import naive as selected_naive
from nsa.attention.kernels.selection import naive as selection_naive
from nsa.attention.selection import choose_blocks, selection_ranges_v2
from nsa.config import ModelConfig, NSAConfig
from nsa.model import flops_per_token
from nsa.training.metrics import roofline_peaks

# small, with every regime: S > w, more blocks than n_sel, S not a multiple of l_sel, d < l
CFG = NSAConfig(dim=16, n_heads=2, n_kv_groups=1, d_k=8, d_v=8, l=8, d=4, l_sel=16, n_sel=4, w=24)
S = 150


def _visited(out: torch.Tensor) -> torch.Tensor:
    """Keys each query attended: with q = k = 0 every visible key gets the same weight and v = identity makes
    output column j that weight for key j, so the nonzero columns of a row are its visible keys. [S] per head 0."""
    return (out[0, 0] > 0).sum(-1)


def _identity(n: int) -> torch.Tensor:
    return torch.eye(n).view(1, 1, n, n)


@pytest.fixture(scope="module")
def counted() -> dict[str, torch.Tensor]:
    """Keys per query in each branch, counted from the PyTorch path's masks (naive.py of each op)."""
    torch.manual_seed(0)
    h, g, dk = CFG.n_heads, CFG.n_kv_groups, CFG.d_k
    q = torch.zeros(1, h, S, dk)
    n_cmp = num_cmp_blocks(S, CFG.l, CFG.d)
    cmp = range_naive.compressed_attention(q, torch.zeros(1, g, n_cmp, dk), _identity(n_cmp), CFG.l, CFG.d)
    win = range_naive.window_attention(q, torch.zeros(1, g, S, dk), _identity(S), CFG.w)
    positions = torch.arange(S)
    blocks = choose_blocks(torch.rand(1, g, S, num_sel_blocks(S, CFG.l_sel)), positions, CFG.n_sel, CFG.l_sel)
    ranges = selection_ranges_v2(blocks, positions, CFG.l_sel)
    sel = selected_naive.selected_attention(q, torch.zeros(1, g, S, dk), _identity(S), ranges, CFG.l_sel)
    # the importance: head-summed compressed probabilities, nonzero where a compressed key was scored
    probs = torch.zeros(S, n_cmp)
    for start, p in selection_naive.cmp_group_probabilities(q, torch.zeros(1, g, n_cmp, dk), CFG.l, CFG.d, 0):
        probs[start:start + p.shape[2], :p.shape[3]] = p[0, 0]
    return {"cmp": _visited(cmp), "win": _visited(win), "sel": _visited(sel),
            "importance": (probs > 0).sum(-1), "blocks": (blocks >= 0).sum()}


def test_each_branch_visits_the_pairs_the_model_counts(counted):
    per_query = [cm.keys_visited(CFG, t) for t in range(S)]
    for branch in ("cmp", "sel", "win"):
        assert counted[branch].tolist() == [c[branch] for c in per_query], branch
    assert {b: int(counted[b].sum()) for b in ("cmp", "sel", "win")} == cm.branch_pairs(CFG, S)
    assert int(counted["blocks"]) == cm.block_pairs(CFG, S)


def test_kernel_counts_rest_on_the_masks_pairs(counted):
    b, h = 3, CFG.n_heads
    costs = cm.kernel_costs(CFG, S, b)
    cmp, sel, win = (int(counted[k].sum()) * b * h for k in ("cmp", "sel", "win"))
    assert costs["range_fwd"].flops == 2 * (CFG.d_k + CFG.d_v) * (cmp + win)
    assert costs["range_fwd"].exps == cmp + win
    assert costs["selection_importance"].exps == int(counted["importance"].sum()) * b * h
    assert costs["selection_importance"].flops == 2 * CFG.d_k * cmp
    assert costs["sel_fwd_kv_out"].flops == 2 * (CFG.d_k + CFG.d_v) * sel
    assert costs["sel_bwd_kv"].flops == 2.5 * costs["sel_fwd_query"].flops  # FlashAttention's convention
    assert costs["range_bwd_dq"].flops + costs["range_bwd_dkdv"].flops == 3.5 * costs["range_fwd"].flops
    dense = cm.dense_costs(CFG, S, b)
    assert dense["dense_fwd"].exps == b * h * S * (S + 1) // 2


def test_geometry_reads_are_the_sum_of_the_branches():
    for t in (0, 7, 8, 15, 23, 24, 63, 64, 65, 100, S - 1):
        assert sum(cm.keys_visited(CFG, t).values()) == decode_reads(t + 1, CFG), t
    for s in (1, 10, 64, S, 1000):
        reads, cmp_reads = mean_reads(CFG, s)
        pairs = cm.branch_pairs(CFG, s)
        assert sum(pairs.values()) == pytest.approx(reads * s)
        assert pairs["cmp"] == pytest.approx(cmp_reads * s)
        assert pairs == {k: sum(cm.keys_visited(CFG, t)[k] for t in range(s)) for k in pairs}
        assert cm.block_pairs(CFG, s) == sum(min(CFG.n_sel, t // CFG.l_sel + 1) for t in range(s))
        assert cm.started_blocks(CFG, s) == sum(t // CFG.l_sel + 1 for t in range(s))


def test_the_model_flop_count_has_the_same_attention_term():
    # phi "avg": no compression MLP, so between two lengths only the attention terms of flops_per_token change
    nsa = NSAConfig(dim=64, n_heads=4, n_kv_groups=2, d_k=16, d_v=16, l=8, d=4, l_sel=16, n_sel=4, w=32, phi="avg")
    model = ModelConfig(vocab_size=100, n_layers=3, nsa=nsa)
    a, b = cm.attention_flops_per_token(nsa, 500), cm.attention_flops_per_token(nsa, 120)
    expected = 3 * (3 * (a["attention"] - b["attention"]) + a["importance"] - b["importance"])
    assert flops_per_token(model, 500) - flops_per_token(model, 120) == pytest.approx(expected)


def test_the_model_flop_count_has_the_cost_models_attention_term_at_the_m7c_shape():
    """configs/m7c_125m_1xh100.yaml's model (12 layers, 12 heads, 2 groups, d 64, l 32, stride 16, l' 64, n 16,
    w 512): between two lengths flops_per_token changes by its attention terms alone once the compression MLP is
    taken out (phi "avg"; phi does not change which keys are read), and those equal the cost model's, x 3 for
    training (forward + backward) and the importance once (forward only), per layer."""
    from dataclasses import replace
    from pathlib import Path

    from nsa.training.config import load_config

    model = load_config(Path(__file__).resolve().parents[3] / "configs" / "m7c_125m_1xh100.yaml").model
    assert (model.n_layers, model.n_heads, model.nsa.l, model.nsa.d, model.nsa.l_sel, model.nsa.n_sel,
            model.nsa.w) == (12, 12, 32, 16, 64, 16, 512)
    avg = replace(model, nsa=replace(model.nsa, phi="avg"))
    for s1, s2 in ((2048, 65536), (4096, 32768)):
        a, b = cm.attention_flops_per_token(avg.nsa, s2), cm.attention_flops_per_token(avg.nsa, s1)
        expected = avg.n_layers * (3 * (a["attention"] - b["attention"]) + a["importance"] - b["importance"])
        assert flops_per_token(avg, s2) - flops_per_token(avg, s1) == pytest.approx(expected, rel=1e-9)


def test_device_peaks_by_name():
    h100 = roofline_peaks("NVIDIA H100 80GB HBM3")
    assert h100.flops == pytest.approx(989.4e12)  # dense bf16, not the 2:4 sparse 1,979
    assert h100.bytes == pytest.approx(3.35e12)
    assert h100.exps == pytest.approx(3.9e12, rel=0.02)
    pcie = roofline_peaks("NVIDIA H100 PCIe")  # PCIe is matched before the SXM part's "H100"
    assert (pcie.flops, pcie.bytes) == (pytest.approx(756e12), pytest.approx(2.0e12))
    assert roofline_peaks("NVIDIA H200").bytes == pytest.approx(4.8e12)
    assert roofline_peaks("NVIDIA A100-SXM4-40GB").bytes == pytest.approx(1.555e12)
    assert roofline_peaks("NVIDIA A100-SXM4-80GB").bytes == pytest.approx(2.039e12)
    assert roofline_peaks("NVIDIA H100 80GB HBM3", "fp32").flops == pytest.approx(66.9e12)
    assert roofline_peaks("Some Future GPU") is None  # peak unknown
    assert roofline_peaks("NVIDIA L4") is None  # listed for MFU, but without bandwidth and exp figures


def test_floor_is_the_slowest_resource():
    peaks = cm.Peaks(flops=100e12, exps=1e12, bytes=2e12)
    cost = cm.Cost(flops=1e12, exps=5e9, bytes=4e9)  # 10 ms, 5 ms, 2 ms
    assert cost.floor_s(peaks) == pytest.approx(0.010)
    assert cost.bound(peaks) == "flops"
    assert (cost + cm.Cost(exps=10e9)).bound(peaks) == "exps"


def test_efficiency_sums_floors_over_kernels_of_at_least_one_percent():
    rows = [{"ms": 10.0, "floor_ms": 5.0}, {"ms": 4.0, "floor_ms": None},  # glue: no floor, its time counts
            {"ms": 1.0, "floor_ms": 1.0}, {"ms": 0.1, "floor_ms": 0.1}]  # 0.1 of 15.1 ms: under 1%, left out
    got = cm.efficiency(rows)
    assert got["kernels"] == 3
    assert got["ms"] == pytest.approx(15.0)
    assert got["efficiency"] == pytest.approx(6.0 / 15.0)
    assert cm.efficiency([])["efficiency"] is None


def test_profile_kernel_names_map_to_families():
    names = {
        "_range_fwd_kernel": "range_fwd", "_range_bwd_dq_kernel": "range_bwd_dq",
        "_range_bwd_dkdv_kernel": "range_bwd_dkdv", "_sel_fwd_kv_stats": "sel_fwd_kv_stats",
        "_sel_fwd_kv_out": "sel_fwd_kv_out", "_sel_bwd_kv": "sel_bwd_kv", "_sel_bwd_delta": "sel_bwd_delta",
        "_blocksel_importance_kernel": "selection_importance", "_combine_bwd_kernel": "combine_bwd",
        "void at::native::radixSortKVInPlace<2, -1, 32, 32, float, long, unsigned int>(at::cuda::detail::Tensor":
            "selection_sort",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda": "glue",
        "_prep_bwd_kernel": "glue",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4": "dense_fwd",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd": "dense_bwd",
    }
    for name, fam in names.items():
        assert cm.family(name) == fam, name
    assert set(cm.FAMILY_PASS) == set(cm.all_costs(CFG, S, 1))


def test_the_launch_choices_kernels_map_to_their_families():
    """The selected branch's launch choices (selected_attn.host DQ_CHOICES "query", OUT_CHOICES "partial"): their
    kernels by name, and _sel_bwd_kv as dK/dV only in a profile where _sel_bwd_dq_query computes dQ."""
    new = {"_sel_bwd_dq_query": "sel_bwd_dq_query", "_sel_fwd_kv_part": "sel_fwd_kv_part",
           "_sel_fwd_reduce": "sel_fwd_reduce", "_sel_fwd_lse": "sel_fwd_lse",
           "_sel_bwd_delta_zero": "sel_bwd_delta_zero", "_sel_band_rest": "sel_band_rest",
           "_sel_band_merge": "sel_band_merge", "_sel_cast": "sel_cast"}
    for name, fam in new.items():
        assert cm.family(name) == fam, name
    from nsa.attention.kernels.selected_attn import jit
    for name in new:  # the names a profiler shows are the jit functions' names
        assert getattr(jit, name).fn.__name__ == name
    atomic = cm.families(["_sel_bwd_delta", "_sel_bwd_kv", "_sel_fwd_kv_out"])
    assert atomic == {"_sel_bwd_delta": "sel_bwd_delta", "_sel_bwd_kv": "sel_bwd_kv",
                      "_sel_fwd_kv_out": "sel_fwd_kv_out"}
    query = cm.families(["_sel_bwd_delta", "_sel_bwd_kv", "_sel_bwd_dq_query", "_sel_fwd_kv_part", "_sel_fwd_reduce"])
    assert query == {"_sel_bwd_delta": "sel_bwd_delta", "_sel_bwd_kv": "sel_bwd_kv_dkdv",
                     "_sel_bwd_dq_query": "sel_bwd_dq_query", "_sel_fwd_kv_part": "sel_fwd_kv_part",
                     "_sel_fwd_reduce": "sel_fwd_reduce"}
    assert {cm.FAMILY_PASS[f] for f in query.values()} == {cm.FWD, cm.BWD}
    assert cm.FAMILY_PASS["sel_bwd_dq_query"] == cm.FAMILY_PASS["sel_bwd_kv_dkdv"] == cm.BWD
    assert cm.FAMILY_PASS["sel_fwd_kv_part"] == cm.FAMILY_PASS["sel_fwd_reduce"] == cm.FWD
    # the fused host glue: memory-bound, its delta writes what _sel_bwd_delta writes and the zeroed fp32 buffers
    costs = cm.kernel_costs(CFG, S, 2)
    assert costs["sel_fwd_lse"].flops == costs["sel_bwd_delta_zero"].exps == 0
    assert costs["sel_bwd_delta_zero"].bytes > costs["sel_bwd_delta"].bytes
    assert (cm.FAMILY_PASS["sel_fwd_lse"], cm.FAMILY_PASS["sel_bwd_delta_zero"]) == (cm.FWD, cm.BWD)
    # its cast of the backward's fp32 dQ, dK, dV: read in fp32, written in the element size, bytes only
    grads = 2 * S * (CFG.n_heads * CFG.d_k + CFG.n_kv_groups * (CFG.d_k + CFG.d_v))
    assert costs["sel_cast"] == cm.Cost(0, 0, grads * (4 + 2)) and cm.FAMILY_PASS["sel_cast"] == cm.BWD
    # the range backward's fused glue: dK/dV of both branches (window: S keys, cmp: its blocks), fp32 in, bf16 out
    keys = 2 * CFG.n_kv_groups * (S + cm.num_cmp_blocks(S, CFG.l, CFG.d)) * (CFG.d_k + CFG.d_v)
    assert cm.family("_range_dkdv_sum") == "range_dkdv_sum" and cm.FAMILY_PASS["range_dkdv_sum"] == cm.BWD
    assert costs["range_dkdv_sum"] == cm.Cost(0, 0, keys * (4 + 2))
    # the band forced choice's glue: bytes only, the merge reading two fp32 outputs and writing one
    assert costs["sel_band_rest"].flops == costs["sel_band_merge"].exps == 0
    assert costs["sel_band_merge"].bytes > 2 * 2 * S * CFG.n_heads * CFG.d_v * 4
    assert cm.FAMILY_PASS["sel_band_rest"] == cm.FAMILY_PASS["sel_band_merge"] == cm.FWD


def test_the_topk_choices_kernels_map_to_their_families():
    """The tiled selection's "topk" choice (nsa.attention.selection.TOPK_CHOICES): its two Triton kernels and
    torch.topk's radix select kernels by name; the keys kernel does the importance kernel's products with an int64
    key per (query, group, block) element, the select and finish read and write the kept keys (fewer than n_sel
    where fewer blocks exist)."""
    from nsa.attention.kernels.selection import jit

    names = {"_blocksel_keys_kernel": "selection_keys", "_blocksel_finish_kernel": "selection_finish",
             "void at::native::sbtopk::gatherTopK<long, unsigned int, 2, false>(at::cuda::detail::TensorInfo":
                 "selection_select",
             "void at::native::mbtopk::radixFindKthValues<long, unsigned int, 2>(at::cuda::detail::TensorInfo":
                 "selection_select"}
    for name, fam in names.items():
        assert cm.family(name) == fam and cm.FAMILY_PASS[fam] == cm.FWD, name
    for name in ("_blocksel_keys_kernel", "_blocksel_finish_kernel"):  # the jit functions' names, as profiled
        assert getattr(jit, name).fn.__name__ == name
    for s in (S, 40):  # 10 selection blocks > n_sel, and 3 < n_sel
        costs, b = cm.kernel_costs(CFG, s, 2), 2
        rows, n_blocks = b * CFG.n_kv_groups * s, num_sel_blocks(s, CFG.l_sel)
        kept = min(CFG.n_sel, n_blocks)
        imp, keys = costs["selection_importance"], costs["selection_keys"]
        assert (keys.flops, keys.exps) == (imp.flops, imp.exps) and keys.flops > 0
        assert keys.bytes - (imp.bytes - b * CFG.n_kv_groups * cm.started_blocks(CFG, s) * cm.FP32) == (
            rows * n_blocks * 8)
        assert costs["selection_select"] == cm.Cost(0, 0, rows * (n_blocks + 2 * kept) * 8)
        assert costs["selection_finish"] == cm.Cost(0, 0, rows * (kept + CFG.n_sel) * 8)


@pytest.mark.parametrize("shape", ["small", "m7c"])
def test_split_families_add_up_to_the_unsplit_ones(shape):
    """The partial output's two kernels do the atomic output's products and exps; the query dQ choice's two
    kernels do the fused backward's plus S and dP recomputed (2 (d_k + d_v) FLOPs and one exp per pair), and their
    bytes trade the fp32 dQ buffer for a dQ store in q's dtype and a second read of q, K, V, dO, lse and delta."""
    cfg, s, b = (CFG, S, 3) if shape == "small" else (NSAConfig(dim=768, n_heads=12, n_kv_groups=2, d_k=64, d_v=64),
                                                      65536, 1)
    costs = cm.kernel_costs(cfg, s, b)
    sel = cm.branch_pairs(cfg, s)["sel"] * b * cfg.n_heads
    dk, dv, h, g, hpg = cfg.d_k, cfg.d_v, cfg.n_heads, cfg.n_kv_groups, cfg.n_heads // cfg.n_kv_groups
    part, red, out = costs["sel_fwd_kv_part"], costs["sel_fwd_reduce"], costs["sel_fwd_kv_out"]
    assert (part.flops + red.flops, part.exps + red.exps) == (out.flops, out.exps)
    assert red.flops == red.exps == 0
    pair_buf = cm.block_pairs(cfg, s) * b * g * hpg * dv * cm.FP32  # [pairs, hpg, d_v] fp32: written, read back
    o, o32 = b * s * h * dv * 2, b * s * h * dv * cm.FP32
    assert part.bytes + red.bytes == out.bytes - o32 + 2 * pair_buf + o
    dq, kv, fused = costs["sel_bwd_dq_query"], costs["sel_bwd_kv_dkdv"], costs["sel_bwd_kv"]
    assert dq.flops == 2 * (2 * dk + dv) * sel and kv.flops == 2 * (2 * dk + 2 * dv) * sel
    assert dq.flops + kv.flops == fused.flops + 2 * (dk + dv) * sel
    assert dq.exps + kv.exps == fused.exps + sel
    q, k_tok, v_tok = b * s * h * dk * 2, b * g * s * dk * 2, b * g * s * dv * 2
    stat, dq32 = b * h * s * cm.FP32, b * s * h * dk * cm.FP32
    assert dq.bytes + kv.bytes == fused.bytes - dq32 + (2 * q + k_tok + v_tok + o + 2 * stat)
    assert kv.bytes == fused.bytes - dq32
    if shape == "m7c":  # the layer's floor stays the shipped kernels'
        assert "sel_bwd_kv" in cm.LAYER_FAMILIES[cm.BWD] and "sel_fwd_kv_out" in cm.LAYER_FAMILIES[cm.FWD]


def test_m7c_floors_near_the_issues_estimates():
    # H100 SXM, bf16, S 65,536, B 1: the estimates of issue 31 (ms)
    m7c = NSAConfig(dim=768, n_heads=12, n_kv_groups=2, d_k=64, d_v=64)
    peaks = roofline_peaks("NVIDIA H100 80GB HBM3")
    costs = cm.all_costs(m7c, 65536, 1)
    for fam, ms in {"range_bwd_dkdv": 1.04, "sel_bwd_kv": 0.50, "selection_importance": 0.41,
                    "selection_sort": 0.64, "sel_fwd_kv_out": 0.20, "range_bwd_dq": 0.78, "range_fwd": 0.52}.items():
        assert costs[fam].floor_s(peaks) * 1e3 == pytest.approx(ms, rel=0.05), fam
    nsa, dense = cm.layer_floor_s(costs, peaks), cm.layer_floor_s(costs, peaks, cm.DENSE_FAMILIES)
    assert nsa["fwd"] * 1e3 == pytest.approx(1.4, rel=0.1) and nsa["bwd"] * 1e3 == pytest.approx(2.3, rel=0.1)
    assert dense["fwd"] / nsa["fwd"] == pytest.approx(4.9, rel=0.1)
    assert dense["total"] / nsa["total"] == pytest.approx(6.4, rel=0.1)
