"""Token-by-token decode against batched prefill, and KV read accounting."""

import pytest
import torch

import reference as R
from nsa import NSAConfig, decode_reads
from nsa_test_utils import assert_close, assert_nontrivial, make_attn, make_cfg, rand_x

DECODE_CASES = [
    # S > w, S > n_sel * l_sel, B > 1
    pytest.param(dict(l=8, d=4, l_sel=16, n_sel=4, w=16, n_heads=6, d_k=12, d_v=6), 2, 85, id="lsel16-H6-dk12-dv6-S85"),
    pytest.param(dict(l=8, d=4, l_sel=8, n_sel=4, w=20, phi="avg", gate="softmax", n_kv_groups=1), 3, 50, id="lsel8-avg-softmax-G1-S50"),
    pytest.param(dict(l=16, d=8, l_sel=8, n_sel=4, w=12, n_kv_groups=4), 2, 45, id="l16-lsel8-G=H-S45"),
]


@pytest.mark.parametrize("over,b,s", DECODE_CASES)
def test_decode_matches_prefill_and_counts_reads(over, b, s):
    torch.manual_seed(0)
    cfg = make_cfg(**over)
    assert s > cfg.w and s > cfg.n_sel * cfg.l_sel
    attn = make_attn(cfg, seed=1)
    x = rand_x(b, s, cfg.dim, seed=2)
    with torch.no_grad():
        y_ref = attn(x)
        blocks = attn.selected_blocks(x)
        cache = attn.new_cache(b)
        assert cache.length == 0
        outs = []
        for k in range(s):
            yk = attn.decode_step(x[:, k : k + 1], cache)
            assert yk.shape == (b, 1, cfg.dim)
            assert cache.length == k + 1
            outs.append(yk)
    y_dec = torch.cat(outs, dim=1)
    assert_nontrivial(y_ref, "prefill output")
    for k in range(s):
        assert_close(y_dec[:, k], y_ref[:, k], f"decode step {k} vs batched prefill position {k}")
    assert len(cache.reads) == s
    assert all(isinstance(r, int) for r in cache.reads), [type(r) for r in cache.reads[:3]]
    reads = [int(r) for r in cache.reads]
    expected = [R.ref_decode_reads(k + 1, cfg.l, cfg.d, cfg.l_sel, cfg.n_sel, cfg.w) for k in range(s)]
    assert reads == expected, "cache.reads differ from the spec formula"
    assert [decode_reads(k + 1, cfg) for k in range(s)] == expected
    # the same number counted from the blocks prefill chose for that query
    for k in range(s):
        for bb in range(b):
            for g in range(cfg.n_kv_groups):
                row = blocks[bb, g, k].tolist()
                assert R.counted_decode_reads(k + 1, row, cfg.l, cfg.d, cfg.l_sel, cfg.w) == expected[k]


def test_two_caches_are_independent():
    """Two caches are independent: interleaving steps on two caches changes nothing."""
    torch.manual_seed(0)
    cfg = make_cfg()
    attn = make_attn(cfg, seed=1)
    xa = rand_x(1, 30, cfg.dim, seed=2)
    xb = rand_x(1, 30, cfg.dim, seed=3)
    with torch.no_grad():
        ya, yb = attn(xa), attn(xb)
        ca, cb = attn.new_cache(1), attn.new_cache(1)
        for k in range(30):
            oa = attn.decode_step(xa[:, k : k + 1], ca)
            ob = attn.decode_step(xb[:, k : k + 1], cb)
            assert_close(oa[:, 0], ya[:, k], f"cache a step {k}")
            assert_close(ob[:, 0], yb[:, k], f"cache b step {k}")


PAPER = dict(l=32, d=16, l_sel=64, n_sel=16, w=512)


@pytest.mark.parametrize("ctx,ratio", [(8192, 4.0), (16384, 6.4), (32768, 9.1), (65536, 11.6)])
def test_paper_speedup_table(ctx, ratio):
    cfg = NSAConfig(dim=64, n_heads=4, n_kv_groups=1, d_k=16, d_v=16, **PAPER)
    n = decode_reads(ctx, cfg)
    assert n == R.ref_decode_reads(ctx, **PAPER)
    assert round(ctx / n, 1) == ratio


@pytest.mark.parametrize(
    "blocks",
    [dict(l=32, d=16, l_sel=64, n_sel=16, w=512), dict(l=8, d=4, l_sel=16, n_sel=3, w=16), dict(l=16, d=8, l_sel=8, n_sel=4, w=12)],
)
def test_decode_reads_formula_over_many_contexts(blocks):
    cfg = NSAConfig(dim=64, n_heads=4, n_kv_groups=2, d_k=16, d_v=16, **blocks)
    for ctx in list(range(1, 300)) + [1023, 1024, 1025, 4096, 4097, 10000]:
        assert decode_reads(ctx, cfg) == R.ref_decode_reads(ctx, **blocks), ctx
    # with everything fitting (n_sel*l_sel >= ctx, w >= ctx) reads = n_cmp + 2*ctx
    assert decode_reads(1, cfg) == 2
