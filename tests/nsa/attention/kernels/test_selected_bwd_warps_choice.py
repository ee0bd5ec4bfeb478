"""The selected backward's warps choices (nsa.attention.kernels.selected_attn.host.BWD_WARPS_CHOICES): "shipped",
_sel_bwd_kv on _config's 8 warps, beside "w4", the same tiles on 4 warps (d = 64, hpg <= 16). Every choice's dq, dk,
dv, with either dQ choice, against an independent float64 dense reference with an explicit mask (the keys p <= t of
the listed blocks, a repeated block counted twice, a block past the query masked whole), and the launch each choice
makes.

Without a GPU the kernels run in Triton's interpreter (fp32; it ignores num_warps, so there the numerics check the
launch path and the launch test checks the warps); with one, natively in bf16, where the warps change the compiled
code, each tensor judged by triton_test_utils.assert_within_torch_error with the reference evaluated in bf16 as the
scale of the rule. reports/aot/triton-3.6.md and triton-3.9.md hold the ahead-of-time registers (sel_bwd_kv[...,
warps=4]).
"""


import pytest
import torch

from triton_test_utils import CHOICE_DTYPE as DTYPE, HAVE_TRITON, needs_triton
from triton_test_utils import assert_choice_close as _close, choice_inputs as _inputs, choice_blocks as _blocks
from triton_test_utils import listed_reference

if HAVE_TRITON:
    from nsa.attention.kernels.selected_attn import host as ts

pytestmark = [needs_triton, pytest.mark.filterwarnings("ignore:divide by zero encountered in log2")]



@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    ts.BWD_WARPS_CHOICE = "auto"
    ts.DQ_CHOICE = "auto"


# (b, h, g, s, d, l_sel, n_sel, seed, edits): d = 64 (the choice's head dim); edits put a repeated block and a block
# past the query into some queries' lists; hpg 3 and the model's 6
HPG3 = (1, 3, 1, 40, 64, 16, 4, 0, ((36, 3, 2), (20, 3, 2), (9, 2, 0)))
HPG6 = (1, 12, 2, 70, 64, 16, 3, 5, ((12, 2, 0),))
MODEL64 = (1, 12, 2, 300, 64, 64, 4, 7, ((100, 3, 0), (70, 3, 1)))
CASES = [pytest.param(*HPG3, "atomic", id="hpg3-S40-dup-past-atomic"),
         pytest.param(*HPG3, "query", id="hpg3-S40-dup-past-query"),
         pytest.param(*HPG6, "atomic", id="hpg6-G2-S70-dup0-atomic"),
         pytest.param(*HPG6, "query", id="hpg6-G2-S70-dup0-query", marks=pytest.mark.slow),  # 7 s interpreted
         # the model's l_sel 64: the 64 keys of a block are the products' M, one m64 wgmma warpgroup at 4 warps (at
         # l_sel 16-32 no wgmma is compiled with either warps), where w4 differs from the shipped code on a GPU
         pytest.param(*MODEL64, "atomic", id="hpg6-ls64-S300-atomic", marks=pytest.mark.slow),
         pytest.param(*MODEL64, "query", id="hpg6-ls64-S300-query", marks=pytest.mark.slow)]


@pytest.mark.parametrize("b,h,g,s,d,l_sel,n_sel,seed,edits,dq_choice", CASES)
def test_each_warps_choice_matches_float64(b, h, g, s, d, l_sel, n_sel, seed, edits, dq_choice):
    q, k, v, do = _inputs(b, h, g, s, d, seed)
    blocks = _blocks(b, g, s, l_sel, n_sel, seed + 1, edits)
    refs = {}
    for dtype in (torch.float64, DTYPE):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = listed_reference(*leaves, blocks, l_sel, dtype)
        refs[dtype] = torch.autograd.grad(out, leaves, do.to(dtype))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = ts.selected_attention(*leaves, blocks, l_sel, loop="kv", bwd_tiles=2)
    ts.DQ_CHOICE = dq_choice
    for choice in ("shipped", "w4"):
        ts.BWD_WARPS_CHOICE = choice
        got = torch.autograd.grad(out, leaves, do, retain_graph=True)
        for name, x, want, low in zip(("dq", "dk", "dv"), got, refs[torch.float64], refs[DTYPE]):
            assert x.shape == want.shape and x.dtype == DTYPE
            _close(f"{choice}, {dq_choice}: {name}", x, want, low)


class _Recorder:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, kwargs))


@pytest.mark.parametrize("d,hpg,choice,warps", [(64, 6, "shipped", 8), (64, 6, "w4", 4), (64, 16, "w4", 4),
                                                (32, 6, "w4", 8), (64, 32, "w4", 8), (128, 6, "w4", 8)])
def test_the_choice_sets_the_backward_kernels_warps_where_it_applies(monkeypatch, d, hpg, choice, warps):
    """4 warps at d = 64 and hpg <= 16 only (the shapes compiled ahead of time); elsewhere _config's."""
    calls = []
    for name in ("_sel_bwd_delta", "_sel_bwd_kv"):
        monkeypatch.setattr(ts, name, _Recorder(name, calls))
    ts.BWD_WARPS_CHOICE = choice
    b, g, s, l_sel = 1, 1, 32, 8
    h = g * hpg
    q, k, v, do = (torch.randn(b, s, n, d).transpose(1, 2) for n in (h, g, g, h))
    blocks = _blocks(b, g, s, l_sel, 3, 0).cpu()
    lse = torch.zeros(b, g, s, hpg)
    _, _, pair_t, tiles = ts._build_index(blocks.to(torch.int32).contiguous(), l_sel, max(32, hpg), hpg, "torch")
    ts._bwd_op(do, q, k, v, do, lse, pair_t, tiles, l_sel, 2, blocks)
    kw = dict(calls)["_sel_bwd_kv"]
    assert kw["num_warps"] == warps
    assert (kw["BLOCK_R"], kw["BLOCK_N"]) == (ts._config("bwd", hpg, d, d).block_m, ts._block_n(l_sel, 64 if d <= 64
                                                                                                 else 32))


def test_auto_is_the_qualified_choice_and_an_unknown_name_is_refused():
    assert ts.QUALIFIED_BWD_WARPS == "shipped" and ts.bwd_warps_choice() == "shipped"
    ts.BWD_WARPS_CHOICE = "w8"
    with pytest.raises(ValueError, match="BWD_WARPS_CHOICE must be one of auto | shipped | w4, got 'w8'"):
        ts.bwd_warps_choice()
