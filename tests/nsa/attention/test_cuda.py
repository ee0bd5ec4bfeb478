"""CUDA variants: batched vs sequential parity and dense equivalence, fp32 and bf16.

Skipped cleanly when no CUDA device is available.
"""

import pytest
import torch

import reference as R
from nsa import observability
from nsa.attention.kernels.range_attn import naive
from nsa_test_utils import assert_close, assert_nontrivial, make_attn, make_cfg, rand_x, variant

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# fp32 on GPU may use TF32 in matmuls unless disabled; the reference runs in float64.
TOL = {torch.float32: dict(atol=2e-4, rtol=2e-3), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}

# general: selection active (S > n_sel*l_sel), S > w.  covering: n_sel*l_sel >= S so a
# bf16 rounding difference cannot flip a top-k choice between two paths.
CFGS = {
    "general": (dict(l=8, d=4, l_sel=8, n_sel=4, w=16), 50),
    "covering": (dict(l=8, d=4, l_sel=16, n_sel=3, w=16), 40),
}


@pytest.fixture(autouse=True)
def _no_tf32():
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _build(scenario, dtype, **extra):
    over, s = CFGS[scenario]
    torch.manual_seed(0)
    cfg = make_cfg(**over, **extra)
    attn = make_attn(cfg, seed=1).to(device="cuda", dtype=dtype)
    x = rand_x(2, s, cfg.dim, seed=2, dtype=dtype, device="cuda")
    return cfg, attn, x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_batched_equals_sequential(dtype):
    scenario = "general" if dtype == torch.float32 else "covering"
    cfg, attn, x = _build(scenario, dtype, prefill="batched")
    seq = variant(attn, prefill="sequential")
    r = torch.randn_like(x)
    outs = []
    for m in (attn, seq):
        xi = x.clone().requires_grad_(True)
        m.zero_grad(set_to_none=True)
        y = m(xi)
        (y.float() * r.float()).sum().backward()
        outs.append((y.detach(), xi.grad.clone(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (y0, gx0, g0), (y1, gx1, g1) = outs
    assert torch.isfinite(y0.float()).all()
    assert_close(y1, y0, "cuda forward sequential vs batched", **TOL[dtype])
    assert_close(gx1, gx0, "cuda input grad sequential vs batched", **TOL[dtype])
    assert g0.keys() == g1.keys()
    for n in g0:
        scale = max(g0[n].float().abs().max().item(), 1.0)
        assert_close(g1[n], g0[n], f"cuda grad {n}", atol=TOL[dtype]["atol"] * scale, rtol=TOL[dtype]["rtol"])


@pytest.mark.parametrize("prefill", ["batched", "sequential"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_dense_equivalence(prefill, dtype):
    cfg, attn, x = _build("general", dtype, prefill=prefill)
    with torch.no_grad():
        p = attn.project(x)
        br = attn.branch_outputs(x)
        blocks = attn.selected_blocks(x)
        y = attn(x)
    assert y.dtype == dtype
    ref_cmp = R.ref_compressed(p.q, p.k_cmp, p.v_cmp, cfg.l, cfg.d)
    ref_win = R.ref_window(p.q, p.k_win, p.v_win, cfg.w)
    ref_sel = R.ref_selected(p.q, p.k_sel, p.v_sel, blocks, cfg.l_sel)
    assert_nontrivial(ref_sel, "selected reference")
    assert_close(br["cmp"], ref_cmp, "cuda compressed branch", **TOL[dtype])
    assert torch.all(br["cmp"][:, :, : cfg.l - 1] == 0)
    assert_close(br["win"], ref_win, "cuda window branch", **TOL[dtype])
    assert_close(br["sel"], ref_sel, "cuda selected branch", **TOL[dtype])
    o = R.combine_gated(p.gates.double(), ref_cmp.double(), ref_sel.double(), ref_win.double())
    bias = attn.o_proj.bias.double() if attn.o_proj.bias is not None else 0.0
    y_ref = o @ attn.o_proj.weight.double().T + bias
    assert_close(y, y_ref, "cuda full output", **TOL[dtype])
    # selection on the device agrees with the independent reference (fp32 only:
    # bf16 rounding of q/k makes near-ties too common for an exact check)
    if dtype == torch.float32:
        imp = R.selection_importance(p.q, p.k_cmp, cfg)
        problems = R.selection_discrepancies(blocks, imp, cfg, tol=1e-3)
        assert not problems, "\n".join(problems[:10])


def test_the_window_branch_on_cuda_runs_no_math_kernel():
    """The SDPA audit as h100_single's sdpa_audit step records it: the window branch's masked chunks (S > w), bf16,
    12 query heads over 2 kv heads, on a fused kernel (the math kernel took them before kv heads were repeated)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 12, 1024, 64, generator=gen).cuda().bfloat16()
    k, v = (torch.randn(1, 2, 1024, 64, generator=gen).cuda().bfloat16() for _ in range(2))
    audit = observability.SdpaAudit()
    observability.configure(audit=audit)
    try:
        naive.window_attention(q, k, v, 256)
    finally:
        observability.configure(audit=None)
    rows = audit.summary()["by_site"]
    assert rows and all(r["backend"] != "math" for r in rows), rows
