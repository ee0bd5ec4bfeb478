"""The FlexAttention branches (nsa.attention.kernels.flex) against the PyTorch reference path and an independent
dense float64 reference (tests/nsa/reference.py), outputs and gradients, at tiny shapes.

PyTorch's FlexAttention refuses backward on CPU at its entry point (flex_attention's device check); the autograd
implementation underneath is device-agnostic. The gradient tests lift that one check (the `cpu_backward` fixture)
so that the masks' gradients are checked on CPU; the CUDA test runs the compiled kernels unmodified.
Eager flex (CPU) evaluates the mask_mod at every (query, key) pair and ignores which tiles a block mask skips; the
selected branch's hand-built block mask is therefore checked on its own, tile by tile.
"""

import shutil

import pytest
import torch
from reference import masked_attention
from triton_test_utils import assert_within_torch_error

from nsa.attention.geometry import num_cmp_blocks
from nsa.attention.kernels import flex
from nsa.attention import kernels as torch_path  # the PyTorch reference path
from nsa.attention.selection import choose_blocks, selection_ranges_v2

flex_api = pytest.importorskip("torch.nn.attention.flex_attention", reason="this torch has no FlexAttention")

pytestmark = [
    pytest.mark.skipif(flex.unavailable(torch.device("cpu"), needs_grad=False) is not None,
                       reason=f"FlexAttention unavailable: {flex.unavailable(torch.device('cpu'), False)}"),
    # eager flex on CPU (the tests' tiny shapes) is what the warning is about; CUDA runs compile it
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

B, H, G, D_K, D_V = 2, 4, 2, 32, 16  # flex on CUDA needs head widths >= 16
L, D, L_SEL, N_SEL = 8, 4, 8, 3


@pytest.fixture
def cpu_backward(monkeypatch):
    """Let flex_attention run its (device-agnostic) autograd implementation on CPU."""
    module = flex_api
    if not hasattr(module, "_validate_device"):
        pytest.skip("this torch has no flex_attention._validate_device to lift; CPU gradients not checked")
    original = module._validate_device

    def validate_without_grad(q, k, v):
        original(q.detach(), k.detach(), v.detach())

    monkeypatch.setattr(module, "_validate_device", validate_without_grad)


def _inputs(s, n_kv, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, s, D_K, generator=gen, dtype=dtype).to(device)
    k = torch.randn(B, G, n_kv, D_K, generator=gen, dtype=dtype).to(device)
    v = torch.randn(B, G, n_kv, D_V, generator=gen, dtype=dtype).to(device)
    return q, k, v


def _grouped(*tensors):
    return [t.repeat_interleave(H // t.shape[1], dim=1) for t in tensors]


def _blocks(s, seed=1, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    n_blocks = -(-s // L_SEL)
    return choose_blocks(torch.rand(B, G, s, n_blocks, generator=gen), torch.arange(s), N_SEL, L_SEL).to(device)


def _case(branch, s, w, device="cpu"):
    """(flex function, reference-path function, dense mask [B or 1, G or 1, S, T], number of keys) of a branch."""
    t = torch.arange(s, device=device).view(s, 1)
    if branch == "cmp":
        n_cmp = num_cmp_blocks(s, L, D)
        i = torch.arange(n_cmp, device=device).view(1, n_cmp)
        return (lambda q, k, v: flex.compressed_attention(q, k, v, L, D),
                lambda q, k, v: torch_path.compressed_attention(q, k, v, L, D), i * D + L - 1 <= t, n_cmp)
    if branch == "win":
        j = torch.arange(s, device=device).view(1, s)
        return (lambda q, k, v: flex.window_attention(q, k, v, w),
                lambda q, k, v: torch_path.window_attention(q, k, v, w), (j <= t) & (t - j < w), s)
    blocks = _blocks(s, device=device)
    ranges = selection_ranges_v2(blocks, torch.arange(s, device=device), L_SEL)
    key_block = torch.arange(s, device=device) // L_SEL
    listed = (blocks.unsqueeze(-1) == key_block).any(dim=-2)  # [B, G, S, S]
    return (lambda q, k, v: flex.selected_attention(q, k, v, blocks, L_SEL),
            lambda q, k, v: torch_path.selected_attention(q, k, v, ranges, L_SEL),
            listed & (torch.arange(s, device=device).view(1, s) <= t), s)


def _dense(q, k, v, mask):
    return masked_attention(q, *_grouped(k, v), mask.expand(B, G, *mask.shape[-2:]).repeat_interleave(H // G, 1),
                            out_dtype=torch.float64)


CASES = [("cmp", 40, 0), ("cmp", 5, 0), ("win", 40, 8), ("win", 20, 64), ("sel", 40, 0)]


@pytest.mark.parametrize("branch,s,w", CASES)
def test_outputs_match_reference_path_and_dense(branch, s, w):
    fn, ref_fn, mask, n_kv = _case(branch, s, w)
    q, k, v = _inputs(s, n_kv)
    with torch.no_grad():
        out, ref = fn(q, k, v), ref_fn(q, k, v)
    assert out.shape == ref.shape == (B, H, s, D_V)
    torch.testing.assert_close(out.double(), _dense(q, k, v, mask), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    if branch == "cmp":  # queries before the first block's end see nothing: exactly 0, as on the reference path
        assert out[:, :, :L - 1].abs().max().item() == 0.0


@pytest.mark.parametrize("branch,s,w", [c for c in CASES if c[1] > L])
def test_gradients_match_reference_path_and_dense(cpu_backward, branch, s, w):
    fn, ref_fn, mask, n_kv = _case(branch, s, w)
    q, k, v = _inputs(s, n_kv)
    grad_out = torch.randn(B, H, s, D_V, generator=torch.Generator().manual_seed(2))

    def grads(f, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(f(*leaves), leaves, grad_out.to(dtype))

    got, ref = grads(fn, torch.float32), grads(ref_fn, torch.float32)
    dense = grads(lambda *a: _dense(*a, mask), torch.float64)
    for name, a, r, d64 in zip("qkv", got, ref, dense):
        torch.testing.assert_close(a.double(), d64, atol=1e-5, rtol=1e-4,
                                   msg=lambda m, name=name: f"d{name} vs float64: {m}")
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-4,
                                   msg=lambda m, name=name: f"d{name} vs the reference path: {m}")
    if branch == "cmp":  # rows that see no block pass no gradient
        assert got[0][:, :, :L - 1].abs().max().item() == 0.0


def test_cpu_backward_is_reported_unavailable():
    reason = flex.unavailable(torch.device("cpu"), needs_grad=True)
    assert reason is not None and "no backward on CPU" in reason
    assert flex.unavailable(torch.device("cpu"), needs_grad=False) is None


def test_selection_table_and_shape_check():
    blocks = torch.tensor([[[[0, 2, -1], [-1, -1, 1]]]])  # [1, 1, 2, 3]
    table = flex.selection_table(blocks, 3)
    assert table.tolist() == [[[[True, False, True], [False, True, False]]]]
    q, k, v = _inputs(16, 16)
    with pytest.raises(ValueError, match=r"blocks must be \[B, G, S, n_sel\]"):
        flex.selected_attention(q, k, v, blocks, L_SEL)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the compiled flex kernels)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("branch,s,w", [("cmp", 300, 0), ("win", 300, 64), ("sel", 300, 0)])
def test_cuda_compiled_against_float64(branch, s, w, dtype):
    """The compiled kernels, outputs and gradients, by the kernel tests' numerics rule against float64 (the PyTorch
    reference path's own error at the same dtype sets the scale)."""
    fn, ref_fn, mask, n_kv = _case(branch, s, w, device="cuda")
    q, k, v = _inputs(s, n_kv, device="cuda")
    grad_out = torch.randn(B, H, s, D_V, device="cuda")

    def run(f, dt):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        out = f(*leaves)
        return (out, *torch.autograd.grad(out, leaves, grad_out.to(dt)))

    got, ref, exact = run(fn, dtype), run(ref_fn, dtype), run(lambda *a: _dense(*a, mask), torch.float64)
    for name, a, r, e in zip(("out", "dq", "dk", "dv"), got, ref, exact):
        assert_within_torch_error(f"{branch} {name}", a, e, r)


def test_layer_branches_match_the_pytorch_path():
    """flex.branches on a layer's own projections and selection = the layer's PyTorch-path branch outputs."""
    from nsa.attention import NSAAttention
    from nsa.config import NSAConfig

    cfg = NSAConfig(dim=32, n_heads=H, n_kv_groups=G, d_k=D_K, d_v=D_V, l=L, d=D, l_sel=L_SEL, n_sel=N_SEL, w=16,
                    kernel="torch")
    layer = NSAAttention(cfg)
    x = torch.randn(B, 70, cfg.dim)
    with torch.no_grad():
        got = flex.branches(layer.project(x), layer.selected_blocks(x), cfg)
        want = layer.branch_outputs(x)
    for name in ("cmp", "sel", "win"):
        torch.testing.assert_close(got[name], want[name], atol=2e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_selected_block_mask_covers_every_visible_pair_and_skips_tiles():
    """Every visible (query, key) pair lies in a visited tile, and tiles no query of a tile selected are skipped."""
    s, l_sel = 3 * flex.BLOCK + 5, 32
    blocks = choose_blocks(torch.rand(1, 2, s, -(-s // l_sel), generator=torch.Generator().manual_seed(3)),
                           torch.arange(s), 3, l_sel)
    table = flex.selection_table(blocks, -(-s // l_sel))
    mask = flex.selected_block_mask(table, 2, l_sel, lambda b, h, q, kv: q >= kv)
    dense = mask.to_dense().bool()  # [1, H=4, tiles, tiles]
    t, key = torch.arange(s).view(s, 1), torch.arange(s).view(1, s)
    needed = table[..., torch.arange(s) // l_sel] & (key <= t)  # [1, G, S, S]: key visible to query
    tiles = torch.zeros(1, 2, dense.shape[-2], dense.shape[-1], dtype=torch.bool)
    for qt in range(tiles.shape[2]):
        for kt in range(tiles.shape[3]):
            tiles[0, :, qt, kt] = needed[0, :, qt * flex.BLOCK:(qt + 1) * flex.BLOCK,
                                         kt * flex.BLOCK:(kt + 1) * flex.BLOCK].flatten(1).any(-1)
    assert torch.equal(dense, tiles.repeat_interleave(2, dim=1))  # exactly the tiles holding a visible pair
    assert not dense.all()  # the selection skips tiles (here: blocks no query of a tile chose)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler (g++ / c++) on PATH")
def test_compiled_kernel_honours_the_selected_block_mask():
    """The compiled flex kernel visits only the block mask's tiles: with the hand-built mask it matches the reference
    path; with the diagonal tiles dropped it does not. It runs where the product does: CUDA's Triton kernel when a
    GPU is present (the CPU kernel of torch 2.11's inductor does not compile this mask: `cur_kvSplitSize7` undeclared,
    the first GPU run of gpu_kernels.yaml), inductor's CPU kernel otherwise."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tol = {"atol": 1e-4, "rtol": 1e-4} if device == "cuda" else {"atol": 2e-6, "rtol": 1e-5}  # fp32, IEEE dots
    s, l_sel, hpg = 2 * flex.BLOCK + 8, 32, H // G
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, n, s, D_K, generator=gen) for n in (H, G, G))
    blocks = choose_blocks(torch.rand(1, G, s, -(-s // l_sel), generator=gen), torch.arange(s), 3, l_sel)
    ref = torch_path.selected_attention(q, k, v, selection_ranges_v2(blocks, torch.arange(s), l_sel), l_sel)
    q, k, v, ref = (x.to(device) for x in (q, k, v, ref))
    table = flex.selection_table(blocks, -(-s // l_sel)).to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        return table[b, h // hpg, q_idx, kv_idx // l_sel] & (kv_idx <= q_idx)

    compiled = torch.compile(flex_api.flex_attention)
    block_mask = flex.selected_block_mask(table, hpg, l_sel, mask_mod)
    out = compiled(q, k, v, block_mask=block_mask, enable_gqa=True)
    torch.testing.assert_close(out, ref, **tol)

    visit = block_mask.to_dense().bool()
    visit[..., torch.arange(visit.shape[-1]), torch.arange(visit.shape[-1])] = False
    dropped = flex_api.BlockMask.from_kv_blocks(
        visit.sum(-1, dtype=torch.int32), torch.argsort((~visit).int(), dim=-1, stable=True).int(),
        BLOCK_SIZE=flex.BLOCK, mask_mod=mask_mod, seq_lengths=(s, s))
    assert (compiled(q, k, v, block_mask=dropped, enable_gqa=True) - ref).abs().max() > 0.1
