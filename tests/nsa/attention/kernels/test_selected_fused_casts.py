"""The "fused" host glue choice's blocks and casts (nsa.attention.kernels.selected_attn.host.HOST_CHOICES, issue 31
item 2.6): the kernels read choose_blocks' int64 lists as they are (no int32 copy: every kernel that reads BLOCKS
converts each loaded index), and the backward's fp32 dQ, dK and dV are cast to the activation dtype by one launch
(_sel_cast through host._cast_fp32) instead of one aten cast each.

Checked here on CPU, in Triton's interpreter: _cast_fp32 gives torch's .to(bfloat16) bit for bit (round to nearest
even written out on the bits, since the interpreter's own bf16 cast does not round to nearest; infinities,
subnormals, ties, overflow to inf; NaN stays NaN, whose bits torch's own CPU casts do not agree on) and torch's
.to(float16), keeps each buffer's strides and launches nothing for a buffer already in the dtype; the int64 lists
give the int32 lists' o, dq, dk, dv bit for bit (fp32) under both dQ choices, the query-outer forward and the band
forced choice, and the Triton index build's four tensors, also with its histogram zeroed in _index_hist; the op
count drops the copy. The fused choice against float64 is test_selected_dq_choices.py's (its lists are
choose_blocks' int64 ones, so it now runs them uncopied). Not checked: the selected backward end to end in bf16 (the
interpreter runs it, but such runs abort at random with heap corruption under either host choice, so bf16 is checked
on the cast kernel alone); anything on a GPU (the cast's cvt there is the same rounding; the AOT compile is in
reports/aot/triton-<version>.md).
"""

import pytest
import torch

from triton_test_utils import HAVE_TRITON, KERNEL_DEVICE, ON_GPU, needs_triton

from nsa.attention.selection import choose_blocks
from op_counting import count_choices

if HAVE_TRITON:
    from nsa.attention.kernels.selected_attn import host as ts

pytestmark = [needs_triton, pytest.mark.filterwarnings("ignore:divide by zero encountered in log2")]


@pytest.fixture(autouse=True)
def _restore_choices():
    yield
    ts.DQ_CHOICE = ts.HOST_CHOICE = ts.FORCED_CHOICE = "auto"


def _special_values(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-140, 120, (n,), generator=gen).float())
    # exact ties in bf16 (the 16 dropped bits 0x8000) with an even and an odd kept bit, and other edge values
    ties = torch.tensor([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000, 0x00008000, 0x00018000],
                        dtype=torch.int64).to(torch.int32).view(torch.float32)
    edge = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-45, 3.4e38, -3.4e38,
                         65504.0, 65520.0, 6e-8, 1e-5])
    x[: ties.numel() + edge.numel()] = torch.cat((ties, edge))
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cast_matches_torch_bit_for_bit(dtype):
    """Three buffers of different sizes and layouts (a transposed view of [B, S, H, d] storage, as the backward's
    dQ; contiguous [B, G, S, d]) in one launch: the bits of torch's .to(dtype), the buffers' strides kept."""
    dev = KERNEL_DEVICE
    dq = _special_values(2 * 37 * 3 * 16, 0).view(2, 37, 3, 16).to(dev).transpose(1, 2)
    dk = _special_values(2 * 37 * 16, 1).view(2, 1, 37, 16).to(dev)
    dv = _special_values(5000, 2).to(dev)  # more than one program's block
    got = ts._cast_fp32((dq, dk, dv), dtype)
    for x, y in zip((dq, dk, dv), got):
        want = x.to(dtype)
        assert y.dtype == dtype and y.shape == x.shape and y.stride() == x.stride()
        # bits, NaN aside: torch's own CPU casts write NaN as 0x7FC0 (scalar) or 0xFFFF (vectorised), the kernel 0x7FC0
        assert torch.equal(y.isnan(), want.isnan())
        assert torch.equal(y[~y.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))


@pytest.mark.skipif(ON_GPU, reason="CPU tensors through the interpreter")
def test_cast_launches_once_and_passes_the_others_through(monkeypatch):
    calls = []
    real = ts._sel_cast

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append(grid)
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(ts, "_sel_cast", Recorder())
    a, b = torch.randn(4, 8, 16), torch.randn(3, 16).to(torch.bfloat16)
    ya, yb = ts._cast_fp32((a, b), torch.bfloat16)
    assert yb is b and torch.equal(ya, a.to(torch.bfloat16)) and calls == [(1, 1)]
    assert all(x is y for x, y in zip(ts._cast_fp32((a, a), torch.float32), (a, a))) and len(calls) == 1
    gappy = torch.randn(4, 32)[:, :16]  # not dense: .to() instead, the other one in one launch
    yg, ya = ts._cast_fp32((gappy, a), torch.bfloat16)
    assert torch.equal(yg, gappy.to(torch.bfloat16)) and torch.equal(ya, a.to(torch.bfloat16)) and len(calls) == 2


def _case(b, h, g, s, d, l_sel, n_sel, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d, generator=gen).transpose(1, 2).to(KERNEL_DEVICE) for n in (h, g, g))
    do = torch.randn(b, h, s, d, generator=gen).to(KERNEL_DEVICE)
    nb = -(-s // l_sel)
    blocks = choose_blocks(torch.rand(b, g, s, nb, generator=gen), torch.arange(s), n_sel, l_sel).to(KERNEL_DEVICE)
    assert blocks.dtype == torch.int64
    return q, k, v, do, blocks


def _run(q, k, v, do, blocks, l_sel, loop="kv", index_build="torch"):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = ts.selected_attention(*leaves, blocks, l_sel, loop=loop, bwd_tiles=2, index_build=index_build)
    return (o, *torch.autograd.grad(o, leaves, do))


@pytest.mark.skipif(ON_GPU, reason="fp32 interpreter comparison")
@pytest.mark.parametrize("dq,loop", [("atomic", "kv"), ("query", "kv"), ("atomic", "query")])
def test_int64_lists_give_what_the_int32_copy_gives(dq, loop):
    """The fused choice hands choose_blocks' int64 lists to the kernels; the same lists as int32 give the same o,
    dq, dk, dv (each kernel reads the same indices): bit for bit in the interpreter (the same fp32 sums in the same
    order)."""
    q, k, v, do, blocks = _case(1, 3, 1, 26, 16, 8, 3, 0)
    ts.HOST_CHOICE, ts.DQ_CHOICE = "fused", dq
    got = _run(q, k, v, do, blocks, 8, loop)
    want = _run(q, k, v, do, blocks.to(torch.int32), 8, loop)
    for name, x, w in zip(("o", "dq", "dk", "dv"), got, want):
        assert torch.equal(x, w), name


@pytest.mark.skipif(ON_GPU, reason="fp32 interpreter comparison")
def test_band_choice_reads_int64_lists():
    q, k, v, do, blocks = _case(1, 2, 1, 40, 32, 8, 4, 3)  # the band: d in 32/64/128
    ts.HOST_CHOICE, ts.FORCED_CHOICE = "fused", "band"
    got = _run(q, k, v, do, blocks, 8)
    want = _run(q, k, v, do, blocks.to(torch.int32), 8)
    for name, x, w in zip(("o", "dq", "dk", "dv"), got, want):
        assert torch.equal(x, w), name


@pytest.mark.skipif(ON_GPU, reason="interpreter comparison")
def test_triton_index_build_reads_int64_lists(monkeypatch):
    """index.build_index (the GPU's default build) on int64 lists: the int32 lists' four tensors, and the torch
    build's (chunks of 64 pairs: the interpreter's sort of 2,048 takes seconds, and the kernels' logic is the same)."""
    from nsa.attention.kernels.selected_attn import index

    monkeypatch.setattr(index, "PAIRS", 64)
    _, _, _, _, blocks = _case(1, 2, 2, 30, 16, 8, 4, 5)
    blocks = blocks.contiguous()
    got = ts._build_index(blocks, 8, 4, 8, "triton")
    want = ts._build_index(blocks.to(torch.int32), 8, 4, 8, "triton")
    torch_build = ts._build_index(blocks.to(torch.int32), 8, 4, 8, "torch")
    for x, w, t in zip(got, want, torch_build):
        assert torch.equal(x, w) and torch.equal(x, t)


@pytest.mark.skipif(ON_GPU, reason="counts under the interpreter (CPU)")
def test_fused_forward_has_no_blocks_copy():
    """benchmarks/bench_ops.py's counter: the blocks' int32 copy gone from nsa::selected_attention_fwd under "fused"
    (the Triton index build, the GPU's, has no other; bench_ops counts it)."""
    q, k, v, do, blocks = _case(1, 2, 1, 24, 16, 8, 3, 4)
    counts = count_choices(ts, "HOST_CHOICE", ts.HOST_CHOICES, lambda: _run(q, k, v, do, blocks, 8))
    inside = {host: counter.by_custom["nsa::selected_attention_fwd"] for host, counter in counts.items()}
    # the blocks' copy, and (this torch index build's) key.long() for scatter_add_, a no-op on int64 keys; the
    # build's other casts of its own results stay under both choices
    assert inside["torch"]["_to_copy"] - inside["fused"]["_to_copy"] == 2, inside



@pytest.mark.skipif(ON_GPU, reason="interpreter comparison")
def test_triton_index_build_zeroes_its_histogram_rows(monkeypatch):
    """zero_in_kernel (the fused choice's build): _index_hist zeroes its row of an unfilled (here poisoned: every
    torch.empty of the build filled with -1) histogram before its atomics, so the four tensors are the zero-filled
    build's (chunks of 64 pairs, as above: several chunks per group, several rows)."""
    from nsa.attention.kernels.selected_attn import index

    monkeypatch.setattr(index, "PAIRS", 64)
    _, _, _, _, blocks = _case(1, 1, 1, 40, 16, 8, 4, 6)
    real_empty = torch.empty

    def poisoned(*shape, **kw):
        return real_empty(*shape, **kw).fill_(-1)

    want = index.build_index(blocks.to(torch.int32), 8, 4, 8, 40, 80)
    monkeypatch.setattr(index.torch, "empty", poisoned)
    got = index.build_index(blocks, 8, 4, 8, 40, 80, zero_in_kernel=True)
    for x, w in zip(got, want):
        assert torch.equal(x, w)
