"""NSA geometries at the corners of what NSAConfig accepts: each one either computes the float64 reference's function
(test_layer_vs_float64_reference.reference, written from the paper's definitions) on every path that takes it, or
is refused before any kernel runs with a reason naming the setting.

Corners: d_k != d_v both ways, a selection block shorter than a compression block (l_sel = d < l), stride 1 with
lengths that are not powers of two, l_sel = 1, the fewest selected blocks (n_sel = 3: the forced ones only) and
more than exist, heads per group not a power of two, a window shorter than a selection block. Paths: the PyTorch
path in float64 (forward and every gradient, the chosen blocks), the decode cache from empty, and the Triton path
(fp32, through the interpreter on CPU). Refused: shapes the Triton selection's overlap weights cannot hold, and
compute dtypes the Triton kernels do not compute in (float64 anywhere; bf16 under the interpreter).
"""

from __future__ import annotations

import copy

import pytest
import torch

from nsa.attention import kernels
from nsa.attention.kernels import KernelUnavailable
from nsa_test_utils import make_attn, make_cfg
from test_layer_vs_float64_reference import FP32, TIGHT, _compare, _inputs, _rel, reference
from triton_test_utils import ON_GPU, needs_triton

# (config overrides on l=8, d=4, l_sel=8, n_sel=4, w=16, H=4, G=2, d_k=d_v=8; B; S)
CORNERS = [
    pytest.param(dict(d_k=8, d_v=16), 2, 37, id="dk<dv"),
    pytest.param(dict(d_k=16, d_v=4, gate="softmax", phi="avg"), 2, 29, id="dk>dv-softmax-avg"),
    pytest.param(dict(l=8, d=4, l_sel=4, n_sel=5, w=5), 2, 40, id="l_sel=d<l"),
    pytest.param(dict(l=3, d=1, l_sel=5, n_sel=4, w=4, n_heads=6, n_kv_groups=2), 2, 30, id="d1-l3-l_sel5-hpg3"),
    pytest.param(dict(l=2, d=1, l_sel=1, n_sel=5, w=3), 1, 17, id="l_sel1"),
    pytest.param(dict(l=12, d=6, l_sel=18, n_sel=3, w=10, n_heads=3, n_kv_groups=1), 2, 60, id="n_sel3-hpg3"),
]


@pytest.mark.parametrize("over,b,s", CORNERS)
def test_torch_path_in_float64_equals_the_reference_at_geometry_corners(over, b, s):
    attn = make_attn(make_cfg(**over), seed=1).double()
    x, upstream = _inputs(b, s, attn.cfg.dim, seed=s)
    _compare(attn, x, upstream, TIGHT)


@pytest.mark.parametrize("over,b,s", [CORNERS[1], CORNERS[3], CORNERS[4]])
def test_decode_from_an_empty_cache_equals_the_reference_at_geometry_corners(over, b, s):
    attn = make_attn(make_cfg(**over), seed=1).double()
    x, _ = _inputs(b, s, attn.cfg.dim, seed=s)
    with torch.no_grad():
        want, _ = reference(copy.deepcopy(attn), x)
        cache = attn.new_cache(b)
        got = torch.cat([attn.decode_step(x[:, t: t + 1], cache) for t in range(s)], 1)
    assert _rel(got, want) < TIGHT, f"decode: relative error {_rel(got, want):.3g}"


# Triton path: d_k, d_v in TRITON_HEAD_DIMS, heads per group <= TRITON_MAX_HEADS_PER_GROUP
TRITON_KW = dict(dim=32, n_heads=2, n_kv_groups=1, d_k=32, d_v=32, kernel="triton")
TRITON_CORNERS = [
    pytest.param(dict(d_v=64, n_heads=3, l=3, d=1, l_sel=5, n_sel=4, w=4), 1, 23, id="dk32-dv64-hpg3-d1-l_sel5"),
    pytest.param(dict(d_k=64, l=16, d=4, l_sel=4, n_sel=3, w=3), 1, 30, id="dk64-dv32-l_sel<l-n_sel3"),
]
TRITON_SLOW = [
    pytest.param(dict(l=2, d=1, l_sel=2, n_sel=4, w=3), 1, 64, id="selection-over-3-tiles"),
    pytest.param(dict(l=4, d=1, l_sel=20, n_sel=4, w=3), 1, 84, id="one-selection-block-a-tile"),
    pytest.param(dict(n_heads=32, l=4, d=2, l_sel=4, n_sel=4), 1, 12, id="hpg32"),
    pytest.param(dict(n_heads=34, n_kv_groups=2, l=4, d=2, l_sel=4), 1, 24, id="hpg17"),
    pytest.param(dict(d_k=128, d_v=64, l=2, d=1, l_sel=1, n_sel=5, w=3), 1, 20, id="dk128-l_sel1"),
    pytest.param(dict(l=32, d=8, l_sel=32), 2, 20, id="S<l"),
    pytest.param(dict(n_sel=100, l=4, d=2, l_sel=4, index_build="triton"), 1, 20, id="n_sel100-index-triton"),
]


@needs_triton
@pytest.mark.skipif(ON_GPU, reason="the interpreter's fp32 comparison; on a GPU test_triton_layer.py judges bf16")
@pytest.mark.parametrize("over,b,s", TRITON_CORNERS + [pytest.param(*p.values, id=p.id, marks=pytest.mark.slow)
                                                       for p in TRITON_SLOW])
def test_triton_path_is_within_fp32_rounding_of_the_reference_at_geometry_corners(over, b, s):
    attn = make_attn(make_cfg(**{**TRITON_KW, **over}), seed=1)
    x, upstream = _inputs(b, s, attn.cfg.dim, seed=s)
    _compare(attn, x, upstream, FP32)


# ----------------------------------------------------------------------------------------------- refused shapes
def kernels_device() -> torch.device:
    """Where the Triton kernels run in this session: cuda, else cpu (through the interpreter)."""
    return torch.device("cuda" if ON_GPU else "cpu")


def test_overlap_weights_beyond_the_triton_selection_are_refused_or_routed_to_torch():
    """min(l/d, l_sel/d) > 256: the Triton selection's overlap weights are not exact; "triton" names the setting
    before any kernel runs, "auto" takes the PyTorch path (which computes it)."""
    cfg = make_cfg(dim=32, n_heads=2, n_kv_groups=1, d_k=32, d_v=32, l=257, d=1, l_sel=514, n_sel=3, w=4,
                   phi="avg", kernel="triton")
    problem = kernels.triton_unsupported(cfg)
    assert problem is not None and "l/d" in problem and "257" in problem
    assert kernels.triton_unsupported(make_cfg(**{**TRITON_KW, "l": 256, "d": 1, "l_sel": 256})) is None
    if kernels.triton_status(torch.device("cuda")) is None:  # triton importable: the device type alone is checked
        assert kernels.resolve("auto", torch.device("cuda"), cfg) == "torch"
    device = kernels_device()
    if kernels.triton_status(device) is None:  # the Triton path runs here (a GPU, or the interpreter)
        attn = make_attn(cfg, seed=1).to(device)
        with pytest.raises(KernelUnavailable, match=r"min\(l/d, l_sel/d\)"):
            attn(torch.randn(1, 5, 32, device=device))


@needs_triton
def test_compute_dtypes_the_triton_kernels_do_not_take_are_refused_or_routed_to_torch(monkeypatch):
    """float64 would come back at fp32 precision from the Triton kernels, and the interpreter multiplies bf16 dot
    operands wrongly: "triton" refuses them naming the dtype, "auto" takes the PyTorch path."""
    cfg = make_cfg(**TRITON_KW)
    device = kernels_device()
    if kernels.triton_status(device) is None:  # the Triton path runs here (a GPU, or the interpreter)
        for dtype in (torch.float64,) if ON_GPU else (torch.bfloat16, torch.float64):
            attn = make_attn(cfg, seed=1).to(device=device, dtype=dtype)
            with pytest.raises(KernelUnavailable, match=f"not {str(dtype).removeprefix('torch.')}"):
                attn(torch.randn(1, 9, 32, device=device, dtype=dtype))
    cuda = torch.device("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a GPU's compiled kernels (the interpreter takes fp32/fp16 only)
    assert kernels.resolve("auto", cuda, cfg, torch.float64) == "torch"
    assert kernels.resolve("auto", cuda, cfg, torch.bfloat16) == "triton"
    with pytest.raises(KernelUnavailable, match="not float64"):
        kernels.resolve("triton", cuda, cfg, torch.float64)
    # under autocast the matmuls compute in its dtype, float64 inputs excepted
    with torch.autocast(device.type, dtype=torch.bfloat16):
        assert kernels.compute_dtype(torch.ones(1, device=device)) == torch.bfloat16
        assert kernels.compute_dtype(torch.ones(1, device=device, dtype=torch.float64)) == torch.float64
    assert kernels.compute_dtype(torch.ones(1, device=device)) == torch.float32
