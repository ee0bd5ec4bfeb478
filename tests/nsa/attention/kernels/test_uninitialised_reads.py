"""No kernel of the Triton path reads memory nobody wrote: the layer's forward and backward give the same bits
whatever an uninitialised allocation holds.

Several launch choices drop a zero fill and let a kernel write every element of a torch.empty buffer instead (the
fused host glue's lse and histograms, the partial output's per-pair buffer, the topk choice's keys and rows); a
kernel that then misses an element reads what the allocator left there: on a GPU a stale value, often a plausible
one (compute-sanitizer's initcheck finds it, memcheck does not). Here every allocation without a fill (aten empty,
empty_like, empty_strided, new_empty, new_empty_strided) is poisoned through a TorchDispatchMode, once with NaN and
-7, once with 1.5 and 1,234,567 (floats, integers), and the two runs must agree bit for bit, outputs and every
gradient, and be finite. A missed element read as an index meets tests/nsa/conftest.py's address check instead.

CI runs the shipped choices and the other choices at once (the fused selection aside: it replaces the topk
choice's kernels); each choice alone (and the Triton index build, slow
under the interpreter) runs under -m slow. Through the interpreter only (on a GPU: qualify's initcheck)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nsa_test_utils import make_attn, make_cfg, rand_x, variant
from op_counting import bench_ops
from triton_test_utils import ON_GPU, needs_triton

pytestmark = [needs_triton, pytest.mark.skipif(ON_GPU, reason="through the interpreter (on a GPU: initcheck)")]

aten = torch.ops.aten
EMPTY = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.new_empty.default,
         aten.new_empty_strided.default}
POISONS = ((float("nan"), -7), (1.5, 1_234_567))


class Poisoned(TorchDispatchMode):
    """Every allocation without a fill comes back filled with `value` (floats) / `integer` (integer dtypes),
    inside the nsa:: custom ops too (their Python implementations run under the mode, as bench_ops counts them)."""

    def __init__(self, value: float, integer: int):
        super().__init__()
        self.value, self.integer, self.filled = value, integer, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "nsa":
            impl = bench_ops()._custom_impl(func)
            assert impl is not None, f"cannot descend into custom op {func}"
            with self:
                return impl(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in EMPTY and isinstance(out, torch.Tensor) and out.numel():
            if out.dtype.is_floating_point:
                out.fill_(self.value)
            elif out.dtype != torch.bool:
                out.fill_(self.integer)
            self.filled += 1
        return out


# (module, constant, value): one alternative per choice; "select_method" picks select_blocks' fused kernel
ALTERNATIVES = {
    "dkdv_bn32_w4_split": ("nsa.attention.kernels.range_attn.host", "DKDV_CHOICE", "bn32_w4_split"),
    "query_m64_bn32": ("nsa.attention.kernels.range_attn.host", "QUERY_CHOICE", "m64_bn32"),
    "range_glue_fused": ("nsa.attention.kernels.range_attn.host", "GLUE_CHOICE", "fused"),
    "dq_query": ("nsa.attention.kernels.selected_attn.host", "DQ_CHOICE", "query"),
    "out_partial": ("nsa.attention.kernels.selected_attn.host", "OUT_CHOICE", "partial"),
    "host_fused": ("nsa.attention.kernels.selected_attn.host", "HOST_CHOICE", "fused"),
    "fwd_tile_m64_w4": ("nsa.attention.kernels.selected_attn.host", "FWD_TILE_CHOICE", "m64_w4"),
    "forced_band": ("nsa.attention.kernels.selected_attn.host", "FORCED_CHOICE", "band"),
    "topk": ("nsa.attention.selection", "TOPK_CHOICE", "topk"),
    "select_fused": ("nsa.attention.kernels.selection.host", "select_method", lambda n_sel: "fused"),
}


def _choose(monkeypatch, names):
    import importlib

    for name in names:
        module, attr, value = ALTERNATIVES[name]
        monkeypatch.setattr(importlib.import_module(module), attr, value)


def _layer(index_build: str = "torch"):
    # hpg 2, d 64 (the tile choice's head dim): more blocks than n_sel, S not a multiple of l_sel, w < S
    cfg = make_cfg(dim=64, n_heads=4, n_kv_groups=2, d_k=64, d_v=64, kernel="torch", l=8, d=4, l_sel=16, n_sel=4,
                   w=32, index_build=index_build)
    return variant(make_attn(cfg, seed=3), kernel="triton"), rand_x(1, 90, cfg.dim, seed=4)


def _run(layer, x, poison):
    layer.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_(True)
    mode = Poisoned(*poison)
    with mode:
        y = layer(xi)
        y.backward(torch.linspace(-1.0, 1.0, y.numel()).view_as(y))
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    return {"y": y.detach(), "dx": xi.grad, **grads}, mode.filled


def _check_same_bits(index_build: str = "torch"):
    layer, x = _layer(index_build)
    first, filled = _run(layer, x, POISONS[0])
    second, _ = _run(layer, x, POISONS[1])
    assert filled > 10, f"only {filled} allocations poisoned: the mode did not see the kernels' buffers"
    assert first.keys() == second.keys() and len(first) > 10
    for name, got in first.items():
        assert torch.isfinite(got).all(), f"{name}: not finite (an unwritten element read?)"
        assert torch.equal(got.view(torch.int32), second[name].view(torch.int32)), (
            f"{name}: differs with the uninitialised memory's contents: a kernel reads an element nobody wrote")


def test_the_poison_reaches_the_kernels_buffers(monkeypatch):
    """The check can fail: with the selected branch's fp32 accumulators (the atomic output, dQ, dK, dV) allocated
    without their zero fill, the two poisons give other results. (Its int32 index buffers keep their fill: garbage
    there is an out-of-bounds read, which the address check stops first.)"""
    import nsa.attention.kernels.selected_attn.host as ts

    class Unfilled:  # torch, but zeros in fp32 come back unfilled
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(*args, **kwargs):
            return (torch.empty if kwargs.get("dtype") == torch.float32 else torch.zeros)(*args, **kwargs)

    layer, x = _layer()
    monkeypatch.setattr(ts, "torch", Unfilled())
    got, _ = _run(layer, x, POISONS[0])
    assert not torch.isfinite(got["y"]).all()  # NaN where the output pass added into the poison


def test_shipped_choices_read_only_what_they_wrote():
    _check_same_bits()


def test_every_other_choice_at_once_reads_only_what_it_wrote(monkeypatch):
    """All the alternatives but the fused selection, which would leave the topk choice's kernels unused (it runs
    alone under -m slow)."""
    _choose(monkeypatch, [name for name in ALTERNATIVES if name != "select_fused"])
    _check_same_bits()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALTERNATIVES))
def test_each_choice_alone_reads_only_what_it_wrote(monkeypatch, name):
    _choose(monkeypatch, [name])
    _check_same_bits()


@pytest.mark.slow
def test_the_triton_index_build_reads_only_what_it_wrote(monkeypatch):
    _choose(monkeypatch, ["host_fused"])  # its histogram rows zeroed by _index_hist, not by torch
    _check_same_bits(index_build="triton")
