"""The Triton block selection (nsa.attention.kernels.selection.host) against the reference paths.

Two references: the float64 importance of tests/nsa/reference.py (explicit overlap counting, a softmax over the
visible blocks per query, the group's heads summed) with its block-choice checker, and the layer's PyTorch path
(kernels.selection.naive.cmp_group_probabilities, selection.importance_from_cmp, choose_blocks). A choice may differ
from a reference only where the swapped blocks' reference importances differ by less than a measured near-tie
tolerance: 3 x the largest difference between the kernels' importance (block_importance, the tile both paths
use) and that reference's on the same inputs (2 x is where summation order can flip a choice). Structure (count,
forced blocks, ascending order, -1 padding) must match exactly. On CPU the kernels run in Triton's interpreter in
fp32; on CUDA in bf16 and in fp32 (the kernels' Q K^T then at input_precision "ieee", the PyTorch path with TF32
off). The fused method runs on a GPU only when asked for (triton_test_utils.FUSED_SELECTION_ENV).
"""

import importlib.util
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import reference as R
from triton_test_utils import (KERNEL_DEVICE, ON_GPU, RUN_FUSED_SELECTION, SELECTION_METHODS, compile_env,
                               fused_selection, needs_triton, uniform_registers_read_before_written)

pytestmark = needs_triton

DTYPE = torch.bfloat16 if ON_GPU else torch.float32
# the dtypes the selection is checked at: the model's (bf16) on a GPU and fp32 (Q K^T at input_precision "ieee")
DTYPES = [torch.bfloat16, torch.float32] if ON_GPU else [torch.float32]
# importance against float64 and the layer path: fp32 throughout (the fp16 hi/lo splits keep ~2^-22)
IMPORTANCE_TOL = dict(atol=1e-4, rtol=1e-4) if ON_GPU else dict(atol=2e-6, rtol=2e-6)
# the methods a test loops over in this process (the fused one on a GPU only when asked for)
METHODS = ("fused", "tiled") if RUN_FUSED_SELECTION else ("tiled",)


def _ts():
    from nsa.attention.kernels.selection import host as triton_selection
    return triton_selection


def _inputs(b, g, hpg, s, d_k, l, d, seed=0, scale=2.0, dtype=DTYPE):
    """q as a transposed [B, S, H, d_k] view (the layer's layout), k_cmp, and lse_cmp from float64 (-inf: none)."""
    gen = torch.Generator().manual_seed(seed)
    n_cmp = R.num_cmp_blocks(s, l, d)
    q = (torch.randn(b, s, g * hpg, d_k, generator=gen) * scale).to(dtype).to(KERNEL_DEVICE).transpose(1, 2)
    k = torch.randn(b, g, n_cmp, d_k, generator=gen).to(dtype).to(KERNEL_DEVICE)
    return q, k, _lse(q, k, l, d)


def _lse(q, k, l, d):
    h, s, d_k = q.shape[1:]
    n_cmp = k.shape[2]
    scores = q.double() @ R.expand_groups(k.double(), h).transpose(-1, -2) / math.sqrt(d_k)
    visible = R.cmp_visible_mask(s, n_cmp, l, d, device=q.device)
    return scores.masked_fill(~visible, float("-inf")).logsumexp(-1).float()


def _cfg(l, d, l_sel, n_sel):
    return SimpleNamespace(l=l, d=d, l_sel=l_sel, n_sel=n_sel)


def _layer_importance(q, k, l, d, l_sel):
    """The layer's PyTorch path (Eq. 10 then Eq. 9) for every query (rows t < l - 1 see no block: 0)."""
    from nsa.attention.kernels import cmp_group_probabilities
    from nsa.attention.selection import importance_from_cmp

    b, g, s = q.shape[0], k.shape[1], q.shape[2]
    n_blocks = -(-s // l_sel)
    imp = torch.zeros(b, g, s, n_blocks, device=q.device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products where fp32 is meant
    try:
        if k.shape[2]:
            for start, probs in cmp_group_probabilities(q.float(), k.float(), l, d, 0):
                imp[:, :, start: start + probs.shape[2]] = importance_from_cmp(probs, n_blocks, l, d, l_sel)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return imp


# (B, G, hpg, S, d_k, l, d, l_sel, n_sel): every value of each axis at least once
CASES = [
    (1, 2, 6, 256, 64, 32, 16, 64, 3),   # the model's geometry and hpg; S = 4 selection blocks > n_sel
    (2, 1, 1, 200, 32, 8, 4, 16, 4),     # hpg 1 (no head sum), B = 2, S not a multiple of l_sel
    (1, 4, 3, 150, 32, 16, 8, 16, 5),    # G = 4, hpg 3, l = l_sel
    (1, 1, 16, 130, 128, 16, 4, 8, 3),   # hpg 16, d_k 128 (BC 32), l_sel < l, S not a multiple of d
    (1, 2, 8, 97, 64, 8, 8, 8, 6),       # l = d = l_sel: every weight 1, one compressed block per selection block
    (1, 1, 6, 20, 32, 32, 4, 4, 3),      # S < l: no compressed block at all, yet 5 blocks > n_sel (ties at 0)
    (1, 2, 3, 40, 64, 8, 4, 16, 4),      # S < n_sel * l_sel: every started block kept, importance irrelevant
    (1, 1, 1, 7, 16, 8, 4, 16, 3),       # S shorter than one selection block and than l
    (1, 2, 6, 256, 48, 12, 4, 8, 16),    # l/d = 3, n_sel = 16 (the fused kernel's widest list), d_k 48 padded
    (1, 1, 2, 256, 32, 16, 8, 64, 3),    # l_sel / d = 8: the widest compressed tile (BC 128)
]


def _case_id(c):
    return "B{}G{}hpg{}S{}dk{}l{}d{}ls{}n{}".format(*c)


SLOW_CASES = [(1, (1, 2, 4)[i % 3], hpg, (256, 130, 77)[i % 3], d_k, l, d, l_sel, n_sel)
              for i, (hpg, d_k, (l, d, l_sel, n_sel)) in enumerate(
                  (hpg, d_k, geo) for hpg in (1, 3, 6, 8, 16) for d_k in (32, 64, 128)
                  for geo in ((32, 16, 64, 3), (8, 4, 16, 5), (16, 8, 8, 16)))]


def _check_importance(case, dtype=DTYPE):
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = case
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, dtype=dtype)
    imp = _ts().block_importance(q, k, lse, l, d, l_sel)
    assert imp.shape == (b, g, s, -(-s // l_sel)) and imp.dtype == torch.float32
    ref = R.selection_importance(q, k, _cfg(l, d, l_sel, n_sel))
    tol = IMPORTANCE_TOL
    torch.testing.assert_close(imp.double(), ref, **tol)
    torch.testing.assert_close(imp, _layer_importance(q, k, l, d, l_sel), **tol)
    # a window of rows is the same rows of the whole (tiled differently: summation order only)
    lo, hi = s // 3, min(s, s // 3 + 17)
    torch.testing.assert_close(_ts().block_importance(q, k, lse, l, d, l_sel, start=lo, stop=hi), imp[:, :, lo:hi],
                               **tol)


def _near_tie_tolerance(importance, reference):
    """3 x the largest difference between the kernels' importance and a reference's (a choice can flip where two
    blocks' reference importances differ by less than 2 x that); exact ties still go to the lower index."""
    return 3.0 * (importance.double() - reference.double()).abs().max().item() if importance.numel() else 0.0


def _check_selection(case, method, dtype=DTYPE):
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = case
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, dtype=dtype)
    blocks = _ts().select_blocks(q, k, lse, l, d, l_sel, n_sel, method=method)
    assert blocks.shape == (b, g, s, n_sel) and blocks.dtype == torch.long
    cfg = _cfg(l, d, l_sel, n_sel)
    importance = _ts().block_importance(q, k, lse, l, d, l_sel)
    for name, ref in (("float64", R.selection_importance(q, k, cfg)),
                      ("layer path", _layer_importance(q, k, l, d, l_sel))):
        tol = _near_tie_tolerance(importance, ref)
        # the measured error itself within the importance test's bound (a broken tile cannot widen the ties)
        bound = IMPORTANCE_TOL["atol"] + IMPORTANCE_TOL["rtol"] * ref.abs().max().item()
        assert tol <= 3 * bound, f"{name}: importance differs by {tol / 3:.3g} > {bound:.3g}"
        problems = R.selection_discrepancies(blocks, ref, cfg, tol)
        assert not problems, f"{name} (near-tie tolerance {tol:.3g}):\n" + "\n".join(problems[:10])
    return blocks


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_importance_matches_float64_and_layer_path(case, dtype):
    _check_importance(case, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", SELECTION_METHODS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_selection_matches_reference_up_to_near_ties(case, method, dtype):
    _check_selection(case, method, dtype)


@pytest.mark.slow
@fused_selection
@pytest.mark.parametrize("case", SLOW_CASES, ids=_case_id)
def test_full_grid(case):
    _check_importance(case)
    fused = _check_selection(case, "fused")
    tiled = _check_selection(case, "tiled")
    assert (fused != tiled).float().mean() < 0.05  # the two paths share the importance tile


def test_selection_is_not_trivial():
    """The random inputs make importance matter: the block lists differ across queries."""
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = CASES[8]
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d)
    blocks = _ts().select_blocks(q, k, lse, l, d, l_sel, n_sel)[:, :, -64:]
    assert len({tuple(r) for r in blocks.reshape(-1, n_sel).tolist()}) > 10


@pytest.mark.parametrize("method", SELECTION_METHODS)
def test_exact_ties_go_to_the_lower_index(method):
    """lse = +inf makes every probability exactly 0: all blocks tie, so the choice is the forced blocks and then
    the lowest indices, exactly choose_blocks' answer, for every query."""
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = 1, 2, 3, 150, 32, 8, 4, 8, 5
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d)
    blocks = _ts().select_blocks(q, k, torch.full_like(lse, float("inf")), l, d, l_sel, n_sel, method=method)
    zeros = torch.zeros(b, g, s, -(-s // l_sel), device=q.device)
    assert torch.equal(blocks, R.reference_selected_blocks(q, k, _cfg(l, d, l_sel, n_sel), importance=zeros))


def test_one_dominant_block_is_always_chosen():
    """Compressed block 9 outscores every other by far (other probabilities underflow to exactly 0): every query
    that sees it keeps the selection blocks it overlaps, the rest of the list going to the lowest indices."""
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = 1, 1, 2, 160, 16, 8, 4, 8, 4
    n_cmp = R.num_cmp_blocks(s, l, d)
    q = torch.zeros(b, g * hpg, s, d_k)
    q[..., 0] = 30.0
    k = torch.zeros(b, g, n_cmp, d_k)
    k[:, :, 9, 0] = 30.0  # block 9 covers tokens 36..43: selection blocks 4 and 5, seen from t = 43
    q, k = q.to(DTYPE).to(KERNEL_DEVICE), k.to(DTYPE).to(KERNEL_DEVICE)
    lse = _lse(q, k, l, d)
    cfg = _cfg(l, d, l_sel, n_sel)
    expect = R.reference_selected_blocks(q, k, cfg)
    for method in METHODS:
        got = _ts().select_blocks(q, k, lse, l, d, l_sel, n_sel, method=method)
        assert torch.equal(got, expect), method
    assert (expect[0, 0, 100] == torch.tensor([0, 4, 11, 12], device=expect.device)).all()


def test_tiled_path_in_several_chunks(monkeypatch):
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = CASES[8]
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d)
    whole = _ts().select_blocks(q, k, lse, l, d, l_sel, n_sel, method="tiled")
    monkeypatch.setattr(_ts(), "IMP_CHUNK_ELEMS", 2 * 32 * 37)  # 37 rows of 2 groups x 32 blocks per chunk
    assert torch.equal(_ts().select_blocks(q, k, lse, l, d, l_sel, n_sel, method="tiled"), whole)


def test_layouts_do_not_matter():
    """A contiguous q, a q with its own strides everywhere, and lse as a strided view all give the same blocks."""
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = CASES[2]
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d)
    base = _ts().select_blocks(q, k, lse, l, d, l_sel, n_sel)
    lse_view = lse.new_zeros(b, s, g * hpg).transpose(1, 2)
    lse_view.copy_(lse)
    n_cmp = k.shape[2]
    k_view = k.new_zeros(b, n_cmp, g, d_k).transpose(1, 2)
    k_view.copy_(k)
    for qq, kk, ll in ((q.contiguous(), k, lse), (q, k_view, lse_view)):
        assert torch.equal(_ts().select_blocks(qq, kk, ll, l, d, l_sel, n_sel), base)
    assert n_cmp > 0


def test_method_choice_and_argument_checks():
    """The tiled path is the default at every n_sel (the fused kernel faulted on an H100); the fused one stays
    callable up to FUSED_MAX_N_SEL and refuses more."""
    ts = _ts()
    assert [ts.select_method(n) for n in (1, 16, 17)] == ["tiled"] * 3
    q, k, lse = _inputs(1, 1, 2, 64, 16, 8, 4)
    assert ts.select_blocks(q, k, lse, 8, 4, 8, 17).shape[-1] == 17
    assert ts.FUSED_MAX_N_SEL == 16
    with pytest.raises(ValueError, match="at most 16"):
        ts.select_blocks(q, k, lse, 8, 4, 8, 17, method="fused")
    with pytest.raises(ValueError, match="lse_cmp"):
        ts.select_blocks(q, k, lse[:, :, :-1], 8, 4, 8, 4)
    with pytest.raises(ValueError, match="k_cmp holds"):
        ts.select_blocks(q, k[:, :, :-1], lse, 8, 4, 8, 4)
    with pytest.raises(ValueError, match="must divide"):
        ts.select_blocks(q, k, lse, 8, 3, 8, 4)
    with pytest.raises(ValueError, match="dtype"):
        ts.select_blocks(q, k.half(), lse, 8, 4, 8, 4)
    with pytest.raises(ValueError, match="fp32"):
        ts.select_blocks(q, k, lse.double(), 8, 4, 8, 4)


def test_no_gradient_and_inputs_requiring_grad():
    q, k, lse = _inputs(1, 2, 3, 80, 16, 8, 4)
    q.requires_grad_(True)
    blocks = _ts().select_blocks(q, k, lse, 8, 4, 8, 4)
    assert not blocks.requires_grad and blocks.dtype == torch.long


def test_block_config_tiles_cover_every_overlapping_key():
    """For each geometry, the BC keys of a tile hold every compressed block overlapping its BJ selection blocks."""
    ts = _ts()
    for l, d, l_sel in ((32, 16, 64), (8, 4, 16), (16, 4, 8), (8, 8, 8), (64, 16, 256), (512, 16, 16)):
        for (hpg, d_k), fused in itertools.product(((1, 32), (2, 64), (3, 32), (6, 64), (16, 128)), (False, True)):
            cfg = ts.block_config(hpg, d_k, l, d, l_sel, fused=fused)
            # the importance kernel never takes the 64-row, 4-warp tiling (wrong bf16 results on a GPU)
            assert fused or (cfg["BM"] >= 128 and cfg["num_warps"] == 8)
            a, b = l_sel // d, l // d
            assert 1 <= cfg["BJ"] <= cfg["K"] == 16
            assert cfg["BJ"] * a + b - 1 <= cfg["BC"]  # first key j0*a - (b-1), last (j0+BJ)*a - 1
            assert cfg["BT_PAD"] >= (cfg["BM"] // hpg if cfg["HEAD_SUM"] else cfg["BM"]) >= 1
            for name in ("BM", "BT_PAD", "D_PAD", "BC"):
                assert cfg[name] & (cfg[name] - 1) == 0 and cfg[name] >= 16


def test_torch_compile_sees_one_opaque_op():
    ts = _ts()
    q, k, lse = _inputs(1, 2, 3, 100, 16, 8, 4)

    def f(q, k, lse):
        return ts.select_blocks(q, k, lse, 8, 4, 8, 4) + 1

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, k, lse), f(q, k, lse))


def test_operator_calls_do_not_depend_on_sequence_length():
    """No host synchronisation: the same operator calls at S = 256 and S = 1024, and none that reads a value back."""
    from torch.profiler import ProfilerActivity, profile

    ts = _ts()

    def ops(s, method):
        q, k, lse = _inputs(1, 1, 2, s, 16, 16, 8)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            ts.select_blocks(q, k, lse, 16, 8, 64, 3, method=method)
        return sorted((e.key, e.count) for e in prof.key_averages() if e.key.startswith("aten::"))

    for method in METHODS:
        short, long = ops(256, method), ops(1024, method)
        assert short == long, method
        names = {name for name, _ in long}
        assert not names & {"aten::nonzero", "aten::item", "aten::_local_scalar_dense"}, names


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("method", SELECTION_METHODS)
def test_cuda_graph_capture_without_sync(method):
    ts = _ts()
    b, g, hpg, s, d_k, l, d, l_sel, n_sel = 2, 2, 6, 2048, 64, 32, 16, 64, 16
    q, k, lse = _inputs(b, g, hpg, s, d_k, l, d, seed=1)
    ts.select_blocks(q, k, lse, l, d, l_sel, n_sel, method=method)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            out = ts.select_blocks(q, k, lse, l, d, l_sel, n_sel, method=method)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    q2, k2, lse2 = _inputs(b, g, hpg, s, d_k, l, d, seed=2)
    q.copy_(q2)
    k.copy_(k2)
    lse.copy_(lse2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ts.select_blocks(q, k, lse, l, d, l_sel, n_sel, method=method))


_SASS_SCRIPT = r"""
import json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from nsa.attention.kernels.selection import host as ts
# the model's geometry, each kernel, bf16 (the fused kernel's fault; fp16 compiles to the same schedule); integer
# arguments that are multiples of 16 at S = 2,048 specialised as the JIT does
nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
if not os.path.exists(nvdisasm):
    print(json.dumps({"triton": triton.__version__, "missing": nvdisasm}))
    sys.exit(0)
divisible = set("S d_k l d l_sel n_sel sqb sqh sqs skb skg skn slb slh sob sog sot".split())
out = {}
# every branch of block_config at the model's d_k: hpg 1 (no head sum), 2-3, >= 4
# (the loop of the importance choice "rows" runs at hpg 1 and >= 4 only: at 2-3 its code reads a descriptor register
# before writing it under triton 3.6, and the host launches the one-tile kernels there)
for kernel, hpg in [(k, h) for k in ("sel", "imp", "keys", "rows", "rows_keys") for h in (1, 2, 3, 6)
                    if k not in ("rows", "rows_keys") or h in (1, 6)]:
    dtype = "bf16"
    cfg = ts.block_config(hpg, 64, 32, 16, 64, fused=kernel == "sel")
    sig, consts = ts._aot_signature(kernel, dtype, cfg)
    fn = {"sel": ts._blocksel_topk_kernel, "imp": ts._blocksel_importance_kernel,
          "keys": ts._blocksel_keys_kernel, "rows": ts._blocksel_rows_kernel,
          "rows_keys": ts._blocksel_rows_kernel}[kernel]
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t != "constexpr" and (t.startswith("*") or n in divisible)}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    out[f"{fn.__name__}[{dtype},hpg={hpg}" + (",KEYS]" if kernel == "rows_keys" else "]")] = sass
print(json.dumps({"triton": triton.__version__, "sass": out}))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
def test_compiled_selection_kernels_read_no_uniform_register_before_writing_it():
    """The cause of the fused kernel's H100 fault, checked without a GPU: compiled for sm_90 by this triton and
    its ptxas, no uniform register (wgmma descriptors, addresses, bounds) is read before it is written. Under
    triton 3.6 (ptxas 12.8) the kernel as it faulted read three of the four wgmma descriptors of P @ W from an
    unwritten register pair (the fault's address, +0x4c80, is the third of them); the loop-invariant overlap tile
    W it now computes before its loop compiles without. The importance choice's loop (_blocksel_rows_kernel) builds
    W before its loop the same way."""
    env = compile_env(str(Path(__file__).resolve().parents[4]))
    proc = subprocess.run([sys.executable, "-c", _SASS_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "missing" in result:
        pytest.skip(f"triton {result['triton']} ships no nvdisasm ({result['missing']})")
    assert len(result["sass"]) == 16  # fused, importance and keys at hpg 1, 2, 3, 6; rows (both outputs) at 1, 6
    for name, sass in result["sass"].items():
        assert "HGMMA" in sass, f"{name}: no wgmma in the sm_90 code (the check would be vacuous)"
        problems = uniform_registers_read_before_written(sass)
        assert not problems, f"{name} under triton {result['triton']}: " + "; ".join(problems)


def test_uniform_register_check_finds_a_read_before_write():
    """The SASS check on hand-written code: the faulting pattern, a 64-bit write, a wgmma's ignored A slot."""
    bad = ("        /*1bc0*/                   UIADD3 UR34, UP0, UR34, 0x20, URZ ;\n"
           "        /*1c00*/                   HGMMA.64x16x16.F32 R24, R36, gdesc[UR32].tnspB, R24 ;\n")
    assert [p.split(" (")[0] for p in uniform_registers_read_before_written(bad)] == [
        "UR34 read at 0x1bc0", "UR35 read at 0x1c00"]  # the wgmma reads B's descriptor, UR34 and UR35
    good = ("        /*0010*/                   ULDC.64 UR32, c[0x0][0x230] ;\n"
            "        /*0020*/                   S2UR UR6, SR_CgaCtaId ;\n"
            "        /*0030*/                   UIADD3 UR34, UR6, 0x20, URZ ;\n"
            "        /*0040*/                   UMOV UR35, 0xc0000010 ;\n"
            "        /*0050*/                   IMAD R2, R2, UR33, R3 ;\n"
            "        /*0060*/                   HGMMA.64x16x16.F32 R24, R36, gdesc[UR32].tnspB, R24 ;\n"
            "        /*0070*/                   @P0 BRA `(.L_x_1) ;\n")
    assert uniform_registers_read_before_written(good) == []
    # a wide multiply writes both halves of its pair: reading the high half after it is no fault
    wide = ("        /*0460*/                   UIMAD.WIDE.U32 UR8, UR4, 0x40, URZ ;\n"
            "        /*04c0*/                   UIADD3 UR9, UR9, UR5, URZ ;\n")
    assert uniform_registers_read_before_written(wide) == [
        "UR4 read at 0x0460 (UIMAD.WIDE.U32 UR8, UR4, 0x40, URZ) before any write",
        "UR5 read at 0x04c0 (UIADD3 UR9, UR9, UR5, URZ) before any write"]
