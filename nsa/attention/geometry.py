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
    FLOP model's (nsa.model) and the activation-memory model's (nsa.training.comm_model) count."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    total = sum(decode_reads(t, a) for t in range(1, seq_len + 1))
    cmp_total = sum(num_cmp_blocks(t, a.l, a.d) for t in range(1, seq_len + 1))
    return total / seq_len, cmp_total / seq_len
