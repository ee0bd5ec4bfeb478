"""Block geometry shared by every path: which blocks exist and which a query may see.

Positions are 0-based. Compression block i covers tokens [i*d, i*d + l) and is visible to query t iff it has
ended, i*d + l - 1 <= t. Selection block j covers [j*l_sel, (j+1)*l_sel) and is a candidate for query t iff it has
started, j <= t // l_sel.
"""

from __future__ import annotations

from functools import lru_cache

from nsa.config import NSAConfig


def num_cmp_blocks(length: int, l: int, d: int) -> int:
    """Complete compression blocks in a sequence of `length` tokens (= blocks visible to the last token)."""
    return (length - l) // d + 1 if length >= l else 0


def num_sel_blocks(length: int, l_sel: int) -> int:
    """Selection blocks that hold at least one of `length` tokens."""
    return -(-length // l_sel)


def decode_reads(context_len: int, cfg: NSAConfig) -> int:
    """KV tokens one decode step reads per sequence and KV group at this context length (the paper's Table 4).

    (visible compressed blocks) + (tokens in the n_sel chosen selection blocks) + (window tokens). The selected
    term is n_sel * l_sel capped by what exists: all tokens while at most n_sel blocks exist, else n_sel - 1 full
    blocks plus the current, possibly partial, block.
    """
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    n_cmp = num_cmp_blocks(context_len, cfg.l, cfg.d)
    n_blocks = num_sel_blocks(context_len, cfg.l_sel)
    if n_blocks <= cfg.n_sel:
        selected = context_len
    else:
        selected = (cfg.n_sel - 1) * cfg.l_sel + (context_len - (n_blocks - 1) * cfg.l_sel)
    return n_cmp + selected + min(cfg.w, context_len)


@lru_cache(maxsize=64)
def mean_reads(a: NSAConfig, seq_len: int) -> tuple[float, float]:
    """Mean over the positions of a sequence of seq_len tokens of (keys read per head, compressed keys read): the
    FLOP model's (nsa.model) and the kernel cost model's (nsa.attention.cost_model) count."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    cmp_total = _sum_cmp_blocks(seq_len, a.l, a.d)
    total = cmp_total + _sum_selected(seq_len, a.n_sel, a.l_sel) + _sum_window(seq_len, a.w)
    return total / seq_len, cmp_total / seq_len


# Closed forms of the sums over t = 1..S of decode_reads' three terms (integers: the same sums as a loop over every
# position, in constant time: a start-up's FLOP count at a million tokens took seconds in that loop).
def _sum_floor(count: int, d: int) -> int:
    """sum of u // d for u = 0 .. count - 1."""
    q, r = divmod(count, d)
    return d * q * (q - 1) // 2 + q * r


def _sum_cmp_blocks(s: int, l: int, d: int) -> int:
    """sum of num_cmp_blocks(t, l, d) for t = 1..s: (t - l) // d + 1 from t = l on."""
    count = s - l + 1  # the t >= l
    return 0 if count <= 0 else count + _sum_floor(count, d)


def _sum_in_block(m: int, l_sel: int) -> int:
    """sum of ((t - 1) % l_sel) + 1 (a token's place in its selection block, from 1) for t = 1..m."""
    q, r = divmod(m, l_sel)
    return q * l_sel * (l_sel + 1) // 2 + r * (r + 1) // 2


def _sum_selected(s: int, n_sel: int, l_sel: int) -> int:
    """sum of decode_reads' selected term for t = 1..s: t while at most n_sel blocks exist (t <= n_sel * l_sel),
    then n_sel - 1 full blocks plus the current block's tokens."""
    all_of = min(s, n_sel * l_sel)
    out = all_of * (all_of + 1) // 2
    if s > all_of:
        out += (s - all_of) * (n_sel - 1) * l_sel + _sum_in_block(s, l_sel) - _sum_in_block(all_of, l_sel)
    return out


def _sum_window(s: int, w: int) -> int:
    """sum of min(w, t) for t = 1..s."""
    k = min(s, w)
    return k * (k + 1) // 2 + (s - k) * w
