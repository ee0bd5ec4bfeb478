"""geometry.mean_reads in closed form against the per-position count it replaces: the sum over every position t of
decode_reads(t) and num_cmp_blocks(t) (the paper's Table 4 count, one query at a time), for geometries NSAConfig
accepts, sequence lengths on and around every block boundary, and one long enough that the loop was the problem."""

from __future__ import annotations

import random

import pytest

from nsa.attention.geometry import decode_reads, mean_reads, num_cmp_blocks
from nsa_test_utils import make_cfg


def _loop(cfg, s):
    return (sum(decode_reads(t, cfg) for t in range(1, s + 1)) / s,
            sum(num_cmp_blocks(t, cfg.l, cfg.d) for t in range(1, s + 1)) / s)


def _geometries(n, seed=0):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        d = rng.choice([1, 2, 4, 8, 16])
        l = d * rng.choice([1, 2, 3, 4])
        l_sel = rng.choice([1, d, l, 2 * l, 64])
        over = dict(l=l, d=d, l_sel=l_sel, n_sel=rng.randint(3, 20), w=rng.choice([1, 3, 16, 64, 512]))
        try:
            out.append(make_cfg(**over))
        except ValueError:
            continue
    return out


@pytest.mark.parametrize("cfg", _geometries(40), ids=lambda c: f"l{c.l}-d{c.d}-ls{c.l_sel}-n{c.n_sel}-w{c.w}")
def test_mean_reads_is_the_per_position_count(cfg):
    mean_reads.cache_clear()
    edges = {cfg.l, cfg.d, cfg.l_sel, cfg.w, cfg.n_sel * cfg.l_sel, 2 * cfg.n_sel * cfg.l_sel + 1}
    lengths = sorted({max(1, e + k) for e in edges for k in (-1, 0, 1)} | {1, 2, 97, 1000})
    for s in lengths:
        assert mean_reads(cfg, s) == _loop(cfg, s), s  # the same integer sums: exactly equal


def test_a_million_tokens_is_counted_without_visiting_each():
    cfg = make_cfg(l=32, d=16, l_sel=64, n_sel=16, w=512)
    s = 1 << 20
    reads, cmp_reads = mean_reads(cfg, s)
    # by hand, at large s nearly every position reads (t - 32) / 16 + 1 compressed keys, 16 x 64 selected
    # (15 full blocks + its own partial), 512 window: check against the closed sums written out term by term
    n = s - 32 + 1
    cmp_sum = n + 16 * (n // 16) * (n // 16 - 1) // 2 + (n // 16) * (n % 16)
    sel_sum = 1024 * 1025 // 2 + (s - 1024) * 15 * 64 + (s // 64 - 1024 // 64) * 64 * 65 // 2
    win_sum = 512 * 513 // 2 + (s - 512) * 512
    assert cmp_reads == cmp_sum / s
    assert reads == (cmp_sum + sel_sum + win_sum) / s
