"""nsa.attention.cost_model at the shapes tests/nsa/attention/test_cost_model.py does not reach: lengths that are no
multiple of the stride, the blocks or the window, lengths shorter than each of them (S = 1 included), more n_sel
than blocks, one head per group and all heads in one group, d_k != d_v, batch > 1; the range kernels' launches where
no compression block has ended; and the names torch gives its small in-place sorts in a profile."""

from __future__ import annotations

import pytest
import torch

from nsa.attention import cost_model as cm
from nsa.attention.geometry import num_cmp_blocks, num_sel_blocks
from nsa.attention.kernels.range_attn import naive as range_naive
from nsa.attention.kernels.selected_attn import naive as selected_naive
from nsa.attention.kernels.selection import naive as selection_naive
from nsa.attention.selection import choose_blocks, selection_ranges_v2
from nsa.config import NSAConfig


def _eye(b: int, g: int, n: int) -> torch.Tensor:
    return torch.eye(n).expand(b, g, n, n)


def _masks_pairs(cfg: NSAConfig, s: int, b: int) -> dict[str, torch.Tensor | int]:
    """Keys each (sequence, head, query) attends per branch, [B, H, S], from the naive.py masks: with q = k = 0 every
    visible key has the same weight and v = identity puts key j's weight in output column j. Also the chosen
    (query, block) entries and the (query, group, compressed key) importance entries, counted."""
    torch.manual_seed(0)
    h, g, dk = cfg.n_heads, cfg.n_kv_groups, cfg.d_k
    q = torch.zeros(b, h, s, dk)
    n_cmp = num_cmp_blocks(s, cfg.l, cfg.d)
    cmp = range_naive.compressed_attention(q, torch.zeros(b, g, n_cmp, dk), _eye(b, g, n_cmp), cfg.l, cfg.d)
    win = range_naive.window_attention(q, torch.zeros(b, g, s, dk), _eye(b, g, s), cfg.w)
    positions = torch.arange(s)
    blocks = choose_blocks(torch.rand(b, g, s, num_sel_blocks(s, cfg.l_sel)), positions, cfg.n_sel, cfg.l_sel)
    ranges = selection_ranges_v2(blocks, positions, cfg.l_sel)
    sel = selected_naive.selected_attention(q, torch.zeros(b, g, s, dk), _eye(b, g, s), ranges, cfg.l_sel)
    scored = 0
    for _, p in selection_naive.cmp_group_probabilities(q, torch.zeros(b, g, n_cmp, dk), cfg.l, cfg.d, 0):
        scored += int((p > 0).sum())
    return {"cmp": (cmp > 0).sum(-1), "win": (win > 0).sum(-1), "sel": (sel > 0).sum(-1),
            "blocks": int((blocks >= 0).sum()), "scored": scored}


# (heads, groups, d_k, d_v, l, d, l_sel, n_sel, w): one head per group with a window shorter than the stride; all
# heads in one group with n_sel above every length's block count; blocks longer than the selection blocks
SHAPES = {
    "hpg1": (4, 4, 8, 4, 8, 4, 8, 3, 3),
    "one_group": (4, 1, 4, 12, 12, 4, 12, 9, 10),
    "l_over_l_sel": (6, 2, 8, 8, 16, 8, 8, 5, 5),
}
# 1; below d, l, l_sel and w; just past l; no multiple of d, l, l_sel or w
LENGTHS = (1, 2, 7, 13, 17, 43)


@pytest.mark.parametrize("name", SHAPES)
def test_branch_pairs_match_the_masks_at_edge_lengths(name):
    h, g, dk, dv, l, d, l_sel, n_sel, w = SHAPES[name]
    cfg = NSAConfig(dim=16, n_heads=h, n_kv_groups=g, d_k=dk, d_v=dv, l=l, d=d, l_sel=l_sel, n_sel=n_sel, w=w)
    b, hpg = 2, h // g
    for s in LENGTHS:
        counted = _masks_pairs(cfg, s, b)
        for branch in ("cmp", "sel", "win"):
            per_query = torch.tensor([cm.keys_visited(cfg, t)[branch] for t in range(s)])
            assert (counted[branch] == per_query).all(), (name, s, branch)
        pairs = {k: int(counted[k].sum()) for k in ("cmp", "sel", "win")}
        assert {k: v * b * h for k, v in cm.branch_pairs(cfg, s).items()} == pairs, (name, s)
        assert cm.block_pairs(cfg, s) * b * g == counted["blocks"], (name, s)
        costs = cm.kernel_costs(cfg, s, b)
        rng, sel = pairs["cmp"] + pairs["win"], pairs["sel"]
        # products per pair, each named by its inner dimension: forward S = QK^T (d_k), O = PV (d_v); the FA2 split
        # backward dQ: S, dP = dO V^T (d_v), dQ = dS K (d_k); dK/dV: S, dV = P^T dO (d_v), dP, dK = dS^T Q (d_k);
        # the one-kernel backward: S, dV, dP, dQ, dK
        fwd, bwd_dq, bwd_dkdv = (dk, dv), (dk, dv, dk), (dk, dv, dv, dk)
        bwd_one = (dk, dv, dv, dk, dk)
        assert costs["range_fwd"] == cm.Cost(2 * sum(fwd) * rng, rng, costs["range_fwd"].bytes)
        assert (costs["range_bwd_dq"].flops, costs["range_bwd_dkdv"].flops) == (2 * sum(bwd_dq) * rng,
                                                                                2 * sum(bwd_dkdv) * rng)
        assert (costs["sel_fwd_kv_out"].flops, costs["sel_fwd_kv_out"].exps) == (2 * sum(fwd) * sel, sel)
        assert (costs["sel_bwd_kv"].flops, costs["sel_bwd_kv"].exps) == (2 * sum(bwd_one) * sel, sel)
        assert costs["selection_importance"].exps == counted["scored"] * hpg, (name, s)
        assert all(c.flops >= 0 and c.exps >= 0 and c.bytes > 0 for c in costs.values()), (name, s)


def _range_bytes(b: int, h: int, g: int, dk: int, dv: int, keys: dict[str, int], elem: int = 2) -> dict[str, int]:
    """Compulsory bytes of the range kernels, one launch per branch in `keys` (branch -> its key count): each
    launch reads q, writes o and its fp32 lse (forward); reads q, O, dO and lse, writes dQ and delta (dQ); reads q,
    dO, lse and delta, reads K, V and writes dK, dV (dK/dV)."""
    q, o, stat = b * h * dk * elem, b * h * dv * elem, b * h * 4  # per query position
    out = {"fwd": 0, "dq": 0, "dkdv": 0}
    for s_q, n_keys in keys.values():
        kv = b * g * n_keys * (dk + dv) * elem
        out["fwd"] += s_q * (q + o + stat) + kv
        out["dq"] += s_q * (2 * q + 2 * o + 2 * stat) + kv
        out["dkdv"] += s_q * (q + o + 2 * stat) + 2 * kv
    return out


@pytest.mark.parametrize("s", [1, 20, 31, 32, 33])
def test_range_bytes_count_only_the_launches_that_run(s):
    """Below l no compression block has ended and range_attn.host skips the cmp launch (zero output, -inf lse
    filled by torch): the range families then move only the window launch's bytes. m7c's widths (12 heads, 2
    groups, d 64, l 32, stride 16), batch 3."""
    cfg = NSAConfig(dim=768, n_heads=12, n_kv_groups=2, d_k=64, d_v=64)
    b = 3
    keys = {"win": (s, s)}
    if s >= cfg.l:
        keys["cmp"] = (s, (s - cfg.l) // cfg.d + 1)
    want = _range_bytes(b, 12, 2, 64, 64, keys)
    costs = cm.kernel_costs(cfg, s, b)
    got = {"fwd": costs["range_fwd"].bytes, "dq": costs["range_bwd_dq"].bytes, "dkdv": costs["range_bwd_dkdv"].bytes}
    assert got == want
    if s == 20:  # by hand: q = o = 3 * 20 * 12 * 64 * 2 = 92,160, lse 2,880, window K and V 2 * 3 * 2 * 20 * 64 * 2
        assert got["fwd"] == 92_160 + 92_160 + 2_880 + 30_720


def test_the_host_skips_the_cmp_launch_without_compression_blocks(monkeypatch):
    """What the count above rests on: range_attn.host launches no kernel for a branch without keys (cmp below l),
    and one forward, one dQ and one dK/dV kernel for a branch with keys."""
    from nsa.attention.kernels.range_attn import host

    launched = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(self.name)

    for name in ("_range_fwd_kernel", "_range_bwd_dq_kernel", "_range_bwd_dkdv_kernel"):
        monkeypatch.setattr(host, name, Recorder(name))
    b, h, g, s, dk = 1, 4, 2, 20, 32
    q, do = torch.zeros(b, h, s, dk), torch.zeros(b, h, s, dk)
    for n_keys, mode, p0, p1, expect in ((0, host.COMPRESSED, 32, 16, []),
                                         (s, host.WINDOW, 8, 0, ["_range_fwd_kernel", "_range_bwd_dq_kernel",
                                                                 "_range_bwd_dkdv_kernel"])):
        launched.clear()
        k = torch.zeros(b, g, n_keys, dk)
        o, lse = host._forward(q, k, k, mode, p0, p1)
        host._backward(do, q, k, k, lse, o, None, mode, p0, p1)
        assert sorted(launched) == sorted(expect), mode


def test_torch_small_sorts_map_to_the_sort_families():
    """choose_blocks sorts its n_sel kept indices (int64, unstable, 16 columns at the m7c shape): torch runs rows of
    at most 32 through its bitonic in-place sort, and rows of at most 128 through the warp merge sort where it is
    built with it (aten's sortKeyValueInplace), not the radix sort: the kernel names carry the same key and value
    types."""
    names = {
        "void at::native::bitonicSortKVInPlace<-2, -1, 16, 16, long, long, at::native::LTOp<long, true>, unsigned "
        "int>(at::cuda::detail::TensorInfo<long, unsigned int>, unsigned int": "selection_sort_blocks",
        "void at::native::warpMergeSortKVInPlace<-2, -1, 128, 16, float, long, at::native::GTOp<float, true>, "
        "unsigned int>(at::cuda::detail::TensorInfo<float, unsigned int>": "selection_sort",
        "void at::native::radixSortKVInPlace<2, -1, 32, 32, float, long, unsigned int>(at::cuda::detail::Tensor":
            "selection_sort",
        "void at::native::radixSortKVInPlace<-2, -1, 16, 2, long, long, unsigned int>(at::cuda::detail::Tensor":
            "selection_sort_blocks",
        # another sort's key type stays glue
        "void at::native::bitonicSortKVInPlace<-2, -1, 16, 16, int, long, at::native::LTOp<int, true>, unsigned int>":
            "glue",
    }
    for name, fam in names.items():
        assert cm.family(name) == fam, name
    assert cm.FAMILY_PASS["selection_sort_blocks"] == cm.FWD


def test_every_triton_marker_is_a_jit_kernel_of_the_op_packages():
    """Each Triton kernel the families name (the markers starting with "_") is a @triton.jit function of an op
    package's jit.py under that name: the name a profiler shows, so profile_layer pairs its time with a floor."""
    from nsa.attention.kernels.glue import jit as glue_jit
    from nsa.attention.kernels.range_attn import jit as range_jit
    from nsa.attention.kernels.selected_attn import jit as selected_jit
    from nsa.attention.kernels.selection import jit as selection_jit

    kernels = {}
    for module in (glue_jit, range_jit, selected_jit, selection_jit):
        for attr, obj in vars(module).items():
            fn = getattr(obj, "fn", None)
            if callable(fn) and getattr(fn, "__module__", None) == module.__name__:
                kernels[fn.__name__] = attr
    markers = [marker for marker, _ in cm.KERNEL_FAMILIES if marker.startswith("_")]
    assert len(markers) >= 20
    for marker in markers:
        assert marker in kernels, marker
        assert cm.family(marker) != "glue"
