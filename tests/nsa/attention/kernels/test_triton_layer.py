"""The whole NSAAttention layer on the Triton path against the PyTorch path (NSA_KERNEL=triton vs torch).

Without a GPU the Triton kernels run through the interpreter on CPU tensors (TRITON_INTERPRET=1, set by
tests/nsa/conftest.py), fp32, small S; with a GPU the same comparisons run natively in bf16. Numerics are judged
against a float64 copy of the layer (the PyTorch path, same weights and inputs) by the rule of
triton_test_utils.assert_within_torch_error: the Triton path's error at most twice the PyTorch path's own error at
the same dtype plus 1e-3 of the reference's magnitude, per tensor (on CPU, fp32, also elementwise against the
PyTorch path). The whole-layer comparison on a GPU takes only configurations where every started block is kept
(a rounding difference could otherwise flip a near-tie of the top-k); the per-branch comparison feeds every path
the same selected blocks. Also: no host synchronisation and no data-dependent Python loop on the GPU path
(operator counts under torch.profiler do not grow with S; on CUDA a forward+backward runs under
torch.cuda.set_sync_debug_mode("error") and is captured in a CUDA graph), and the model compiles with
torch.compile.
"""

from __future__ import annotations

import pytest
import torch

from nsa.config import ModelConfig
from nsa.model import NSAModel
from nsa_test_utils import assert_nontrivial, make_attn, make_cfg, rand_x, randomize_params, variant
from triton_test_utils import KERNEL_DEVICE, ON_GPU, assert_within_torch_error, needs_triton

pytestmark = needs_triton

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
# CPU only (fp32 both sides): the Triton path elementwise against the PyTorch path, besides the rule
CPU_TOL = dict(atol=2e-5, rtol=2e-4)

# (heads, groups, d_k, d_v, NSA block sizes, S): every head-per-group count the kernels tile differently, S not a
# multiple of any block, S shorter than one selection block, selection active (S > n_sel * l_sel) and a window
# shorter than S. On a GPU only the covering cases (n_sel * l_sel >= S: every started block is kept) are compared
# in bf16, where a rounding difference could otherwise flip a near-tie in the top-k.
CASES = {
    "hpg2_g2_d32": (4, 2, 32, 32, dict(l=8, d=4, l_sel=16, n_sel=4, w=32), 100),
    "hpg6_g2_d32": (12, 2, 32, 32, dict(l=16, d=8, l_sel=16, n_sel=5, w=48), 150),
    "hpg1_g4_d64": (4, 4, 64, 32, dict(l=8, d=4, l_sel=16, n_sel=3, w=16), 61),
    "hpg3_g1_short": (3, 1, 32, 32, dict(l=8, d=4, l_sel=32, n_sel=4, w=16), 27),
    "hpg8_g1_cover": (8, 1, 32, 64, dict(l=8, d=8, l_sel=16, n_sel=8, w=64), 120),
}
GPU_CASES = {"hpg8_g1_cover", "hpg3_g1_short"}


def _pair(name):
    h, g, d_k, d_v, blocks, s = CASES[name]
    cfg = make_cfg(dim=64, n_heads=h, n_kv_groups=g, d_k=d_k, d_v=d_v, kernel="torch", **blocks)
    torch_path = make_attn(cfg, seed=1).to(device=KERNEL_DEVICE, dtype=DTYPE)
    triton_path = variant(torch_path, kernel="triton")
    x = rand_x(2, s, cfg.dim, seed=2, dtype=DTYPE, device=KERNEL_DEVICE)
    return cfg, torch_path, triton_path, x


def _float64(torch_path):
    """The PyTorch path in float64 with the same (already rounded) weights: the reference."""
    return variant(torch_path).to(torch.float64)


def _forward_backward(module, x, upstream):
    xi = x.clone().requires_grad_(True)
    module.zero_grad(set_to_none=True)
    y = module(xi)
    (y.double() * upstream).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    return y.detach(), xi.grad.detach(), grads


def _judge(what, got, ref, torch_out):
    assert_within_torch_error(what, got, ref, torch_out)
    if not ON_GPU:
        torch.testing.assert_close(got, torch_out, **CPU_TOL, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", [n for n in CASES if not ON_GPU or n in GPU_CASES])
def test_triton_layer_matches_torch_layer_outputs_and_every_gradient(name):
    cfg, torch_path, triton_path, x = _pair(name)
    reference = _float64(torch_path)
    with torch.no_grad():
        blocks = reference.selected_blocks(x.double())
        assert torch.equal(torch_path.selected_blocks(x), blocks)
        assert torch.equal(triton_path.selected_blocks(x), blocks)
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(KERNEL_DEVICE)
    y64, gx64, g64 = _forward_backward(reference, x.double(), upstream)
    y0, gx0, g0 = _forward_backward(torch_path, x, upstream)
    y1, gx1, g1 = _forward_backward(triton_path, x, upstream)
    assert_nontrivial(y0, "output")
    _judge("output", y1, y64, y0)
    _judge("grad x", gx1, gx64, gx0)
    assert g1.keys() == g0.keys() == g64.keys()
    for key in g0:
        _judge(f"grad {key}", g1[key], g64[key], g0[key])


def test_each_branch_of_the_triton_path_matches_the_torch_path(monkeypatch):
    """Every path gets the same selected blocks (the float64 reference's), so a near-tie of the top-k cannot look
    like a difference of the branches; the selection itself is test_triton_selection's subject."""
    from nsa.attention.kernels.selection import host as triton_selection

    cfg, torch_path, triton_path, x = _pair("hpg2_g2_d32")
    reference = _float64(torch_path)
    with torch.no_grad():
        blocks = reference.selected_blocks(x.double())
        assert (blocks[:, :, -1] >= 0).all() and cfg.n_sel * cfg.l_sel < x.shape[1]  # selection is active
        for module in (reference, torch_path):
            monkeypatch.setattr(module, "_select_batched", lambda q, k_cmp, s: blocks)
        monkeypatch.setattr(triton_selection, "select_blocks", lambda *args, **kwargs: blocks)
        ref, a, b = reference.branch_outputs(x.double()), torch_path.branch_outputs(x), triton_path.branch_outputs(x)
    for branch in ("cmp", "sel", "win"):
        assert_nontrivial(a[branch], branch)
        _judge(branch, b[branch], ref[branch], a[branch])


def test_shapes_the_kernels_are_not_built_for_are_an_error_on_triton_and_torch_on_auto():
    from nsa.attention.kernels import KernelUnavailable, resolve

    cfg = make_cfg(dim=64, n_heads=4, n_kv_groups=2, d_k=16, d_v=16, kernel="triton")
    module = make_attn(cfg, seed=1).to(device=KERNEL_DEVICE, dtype=DTYPE)
    with pytest.raises(KernelUnavailable, match="d_k=16 is not a head width the Triton kernels are built for"):
        module(rand_x(1, 40, cfg.dim, dtype=DTYPE, device=KERNEL_DEVICE))
    assert resolve("auto", torch.device("cuda"), cfg) == "torch"  # auto falls back, and env.json says which ran
    wide = make_cfg(dim=64, n_heads=64, n_kv_groups=1, d_k=32, d_v=32)
    with pytest.raises(KernelUnavailable, match="64 heads per KV group exceed"):
        resolve("triton", KERNEL_DEVICE, wide)


def _op_counts(module, s):
    """{operator: calls} of one forward+backward, counting the operators the layer and autograd call (an aten
    operator inside another one is that operator's implementation, which may differ with size: zeros() fills
    small tensors but takes already-zeroed memory for large ones)."""
    x = rand_x(1, s, module.cfg.dim, seed=5, dtype=DTYPE, device=KERNEL_DEVICE).requires_grad_(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        module(x).float().sum().backward()
    counts, every = {}, {}
    for event in prof.events():
        every[event.name] = every.get(event.name, 0) + 1
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith(("aten::", "nsa::")):
            parent = parent.cpu_parent
        if parent is None and event.name.startswith(("aten::", "nsa::")):
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts, every


def test_no_host_sync_op_and_no_data_dependent_loop_on_the_triton_path():
    """Operator calls of one forward+backward are the same at S=192 and S=320 (6 and 10 selection blocks, 4 selected);
    no nonzero / item / sync."""
    cfg = make_cfg(dim=64, n_heads=4, n_kv_groups=2, d_k=32, d_v=32, l=16, d=8, l_sel=32, n_sel=4, w=64,
                   kernel="triton")
    module = make_attn(cfg, seed=1).to(device=KERNEL_DEVICE, dtype=DTYPE)
    for s in (192, 320):  # first calls build caches (kernels, overlap tables): not part of a step's work
        module(rand_x(1, s, cfg.dim, dtype=DTYPE, device=KERNEL_DEVICE)).sum().backward()
    (short, every_short), (long, every_long) = _op_counts(module, 192), _op_counts(module, 320)
    for every in (every_short, every_long):
        for forbidden in ("aten::nonzero", "aten::item", "aten::_local_scalar_dense"):
            assert forbidden not in every, f"{forbidden} called {every.get(forbidden)} times"
    assert sum(short.values()) > 50 and "nsa::selected_attention_fwd" in short  # the count sees the layer
    assert long == short


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_forward_backward_has_no_host_sync_and_replays_in_a_cuda_graph():
    cfg = make_cfg(dim=256, n_heads=12, n_kv_groups=2, d_k=64, d_v=64, l=32, d=16, l_sel=64, n_sel=16, w=512,
                   kernel="triton")
    module = make_attn(cfg, seed=1).to(device="cuda", dtype=torch.bfloat16)
    x = rand_x(2, 2048, cfg.dim, seed=2, dtype=torch.bfloat16, device="cuda").requires_grad_(True)
    upstream = torch.randn(x.shape, device="cuda")

    def step():
        (module(x).float() * upstream).sum().backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: kernels compiled, allocator primed
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()  # any host synchronisation raises here
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    for p in [x, *module.parameters()]:
        p.grad = None
    step()
    eager = [x.grad.clone()] + [p.grad.clone() for p in module.parameters()]
    for p in [x, *module.parameters()]:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    replayed = [x.grad] + [p.grad for p in module.parameters()]
    for a, b in zip(replayed, eager):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)


@pytest.mark.slow
@pytest.mark.skipif(not ON_GPU, reason="the compiled model runs the kernels natively on a GPU (slow via the "
                                       "interpreter)")
def test_model_compiles_with_the_triton_kernels_and_matches_eager():
    flat = dict(vocab_size=128, dim=128, n_layers=2, n_heads=6, n_kv_groups=2, d_k=32, d_v=32, l=16, d=8,
                l_sel=32, n_sel=4, w=64, kernel="triton")
    torch.manual_seed(0)
    model = NSAModel(ModelConfig.from_flat(flat))
    randomize_params(model, seed=4)
    model = model.to(device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (2, 256), device="cuda")
    compiled = torch.compile(model)
    torch.testing.assert_close(compiled(ids).float(), model(ids).float(), atol=5e-2, rtol=5e-2)
    compiled(ids).float().square().mean().backward()
