"""The jit code of range attention (nsa.attention.kernels.range_attn.host, whose docstring explains the modes,
the key ranges and the tiling rules these kernels rest on): the forward kernel, the dq and dk/dv backward kernels
and their jit helpers. The host side (configs, launches, custom ops, the public API) is in host.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.attention.kernels.common import LOG2E

_LOG2E = tl.constexpr(LOG2E)  # the kernels' copy (jit code reads only constexpr globals)
# Every [rows, d] pointer tile is written tl.multiple_of(ptrs, [1, 16]) at its load or store (rows start 16-byte
# aligned, see host._aligned and host.py's docstring); a jit helper would receive the pointers as
# arguments, which carry no hint.


@triton.jit
def _ranges(t, T, MODE, P0, P1):
    """(pre, lo, hi) for token(s) t: keys [0, pre) and [lo, hi) are visible (pre <= lo; pre = 0 unless MODE 2).
    MODE is a runtime argument (a uniform branch), so one compiled kernel serves every mode."""
    if MODE == 0:
        lo = tl.maximum(t - P0 + 1, 0)
        hi = tl.minimum(t + 1, T)
        pre = lo * 0
    elif MODE == 1:
        lo = t * 0
        # floor((t + 1 - l) / d) + 1 = (t + 1 - l + d) // d when the numerator is >= 0; when it is negative, no
        # block has ended, and the clamp at 0 holds whether // truncates or floors.
        hi = tl.minimum(tl.maximum((t + 1 - P0 + P1) // P1, 0), T)
        pre = lo
    else:
        lo = tl.maximum((t // P0 - 1) * P0, 0)
        hi = tl.minimum(t + 1, T)
        pre = tl.minimum(lo, P1)
    return pre, lo, hi


@triton.jit
def _mask_params(MODE, P0, P1):
    """Scalars of _key_bounds for this mode: (c1, c0, win, blk, sink)."""
    big = P0 * 0 + (1 << 30)
    none = P0 * 0 + (1 << 28)  # a block length no key reaches: k // none = 0
    one = P0 * 0 + 1
    zero = P0 * 0
    if MODE == 0:
        c1, c0, win, blk, sink = one, zero, P0 + zero, none, zero
    elif MODE == 1:
        c1, c0, win, blk, sink = P1 + zero, P0 - 1, big, none, zero
    else:
        c1, c0, win, blk, sink = one, zero, big, P0 + zero, P1 + zero
    return c1, c0, win, blk, sink


@triton.jit
def _key_bounds(kn, T, c1, c0, win, blk, sink):
    """Key kn is visible exactly to the tokens t in [lo_k, hi_k): every mode's visibility is an interval in t for a
    fixed key, so one branch-free test, lo_k <= t < hi_k, serves all modes, from two key vectors and the token:
      window:      [k, k + w)
      compressed:  [k*d + l - 1, inf)                      (block k has ended)
      band:        [k, (k // l_sel + 2) * l_sel)           (k >= (t // l_sel - 1) * l_sel)
                   [k, inf) for a sink key (k < sink)      (band, then the sink from block 2 on)
    Keys >= T get an empty interval. (A branch per mode over a 2-d mask cost ~70 registers on sm_80, and range
    bounds per token would keep three row vectors live, 16 registers each a thread in the key-major dK/dV tiles.)"""
    lo_k = tl.where(kn < T, kn * c1 + c0, 1 << 30)
    hi_k = tl.minimum(kn + win, (kn // blk + 2) * blk)
    hi_k = tl.where(kn < sink, kn + win, hi_k)
    return lo_k, hi_k


@triton.jit
def _segment(idx, a_lo, a_n, b_lo, b_n, c_lo):
    """Element idx of the concatenation [a_lo, a_lo + a_n) ++ [b_lo, b_lo + b_n) ++ [c_lo, ...)."""
    return tl.where(idx < a_n, a_lo + idx, tl.where(idx < a_n + b_n, b_lo + idx - a_n, c_lo + idx - a_n - b_n))


@triton.jit
def _key_tiles(lo_a, lo_b, hi_a, hi_b, BLOCK_N: tl.constexpr):
    """Key tiles of a query tile whose first/last tokens have ranges [lo_a, hi_a) / [lo_b, hi_b):
    (any_lo, full_lo, full_hi, any_hi): [any_lo, any_hi) intersect some row's range, [full_lo, full_hi) every row's."""
    any_lo = lo_a // BLOCK_N
    any_hi = tl.maximum(tl.cdiv(hi_b, BLOCK_N), any_lo)
    full_lo = tl.minimum(tl.maximum(tl.cdiv(lo_b, BLOCK_N), any_lo), any_hi)
    full_hi = tl.minimum(tl.maximum(hi_a // BLOCK_N, full_lo), any_hi)
    return any_lo, full_lo, full_hi, any_hi


@triton.jit
def _query_tile(T, S, HPG, MODE, P0, P1, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A query-tile-outer program's tile: (tok, head_r, row_ok, masked key-tile segments
    (a_lo, a_n, b_lo, b_n, c_lo, n_masked), unmasked key tiles [u_lo, u_lo + n_unmasked))."""
    TM = BLOCK_M // HPG
    pid = tl.program_id(0)
    if MODE == 1:
        pid = tl.num_programs(0) - 1 - pid  # later query tiles see more blocks: start them first
    t0 = pid * TM
    offs_r = tl.arange(0, BLOCK_M)
    tok = t0 + offs_r // HPG
    head_r = offs_r % HPG
    row_ok = (offs_r < TM * HPG) & (tok < S)
    t_last = tl.minimum(t0 + TM, S) - 1
    pre_a, lo_a, hi_a = _ranges(t0, T, MODE, P0, P1)
    pre_b, lo_b, hi_b = _ranges(t_last, T, MODE, P0, P1)
    a0, f0, f1, a1 = _key_tiles(lo_a, lo_b, hi_a, hi_b, BLOCK_N)
    # sink tiles below the band (those inside it are covered by the band's tiles and mask); none unless MODE 2
    n_pre = tl.minimum(tl.cdiv(pre_b, BLOCK_N), a0)
    # masked: [0, n_pre) ++ [a0, f0) ++ [f1, a1); unmasked: [f0, f1)
    return tok, head_r, row_ok, a0 * 0, n_pre, a0, f0 - a0, f1, n_pre + (f0 - a0) + (a1 - f1), f0, f1 - f0


@triton.jit
def _fwd_loop(acc, m_i, l_i, q, K_g, V_g, sks, svs, T, c1, c0, win, blk, sink, qk_scale, offs_n, offs_dk, offs_dv,
              tok, a_lo, a_n, b_lo, b_n, c_lo, n_tiles, MASKED: tl.constexpr, BLOCK_N: tl.constexpr,
              DOT_PREC: tl.constexpr):
    for idx in range(0, n_tiles):
        n0 = _segment(idx, a_lo, a_n, b_lo, b_n, c_lo) * BLOCK_N
        kn = n0 + offs_n
        if MASKED:
            k_ptrs = tl.multiple_of(K_g + kn[:, None] * sks + offs_dk[None, :], [1, 16])
            k = tl.load(k_ptrs, mask=(kn < T)[:, None], other=0.0)
        else:
            k = tl.load(tl.multiple_of(K_g + kn[:, None] * sks + offs_dk[None, :], [1, 16]))
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        if MASKED:
            lo_k, hi_k = _key_bounds(kn, T, c1, c0, win, blk, sink)
            vis = (lo_k[None, :] <= tok[:, None]) & (tok[:, None] < hi_k[None, :])
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet: p = 0, no NaN
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v_ptrs = tl.multiple_of(V_g + kn[:, None] * svs + offs_dv[None, :], [1, 16])
            v = tl.load(v_ptrs, mask=(kn < T)[:, None], other=0.0)
        else:
            v = tl.load(tl.multiple_of(V_g + kn[:, None] * svs + offs_dv[None, :], [1, 16]))
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _range_fwd_kernel(Q, K, V, O, LSE,
                      sqb, sqh, sqs, skb, skg, sks, svb, svg, svs, sob, soh, sos,
                      H, G, HPG, S, T, MODE, P0, P1, qk_scale,
                      D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      DOT_PREC: tl.constexpr):
    (tok, head_r, row_ok, a_lo, a_n, b_lo, b_n, c_lo, n_masked, u_lo,
     n_unmasked) = _query_tile(T, S, HPG, MODE, P0, P1, BLOCK_M, BLOCK_N)
    c1, c0, win, blk, sink = _mask_params(MODE, P0, P1)
    bg = tl.program_id(1)
    g = bg % G
    b = (bg // G).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, D_K)
    offs_dv = tl.arange(0, D_V)
    head = g * HPG + head_r
    q_ptrs = tl.multiple_of(Q + b * sqb + head[:, None] * sqh + tok[:, None] * sqs + offs_dk[None, :], [1, 16])
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    K_g = K + b * skb + g * skg
    V_g = V + b * svb + g * svg

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_V], tl.float32)
    acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q, K_g, V_g, sks, svs, T, c1, c0, win, blk, sink, qk_scale,
                              offs_n, offs_dk, offs_dv, tok, a_lo, a_n, b_lo, b_n, c_lo, n_masked, True, BLOCK_N,
                              DOT_PREC)
    acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q, K_g, V_g, sks, svs, T, c1, c0, win, blk, sink, qk_scale,
                              offs_n, offs_dk, offs_dv, tok, u_lo, n_unmasked, 0, 0, 0, n_unmasked, False,
                              BLOCK_N, DOT_PREC)

    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) / _LOG2E, float("-inf"))
    out_ptrs = tl.multiple_of(O + b * sob + head[:, None] * soh + tok[:, None] * sos + offs_dv[None, :], [1, 16])
    tl.store(out_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + b * H * S + head * S + tok, lse, mask=row_ok)


@triton.jit
def _dq_loop(dq, q, do, lse2, delta, K_g, V_g, sks, svs, T, c1, c0, win, blk, sink, qk_scale, offs_n, offs_dk,
             offs_dv, tok, a_lo, a_n, b_lo, b_n, c_lo, n_tiles, MASKED: tl.constexpr, BLOCK_N: tl.constexpr,
             DOT_PREC: tl.constexpr):
    for idx in range(0, n_tiles):
        n0 = _segment(idx, a_lo, a_n, b_lo, b_n, c_lo) * BLOCK_N
        kn = n0 + offs_n
        if MASKED:
            k_ptrs = tl.multiple_of(K_g + kn[:, None] * sks + offs_dk[None, :], [1, 16])
            k = tl.load(k_ptrs, mask=(kn < T)[:, None], other=0.0)
            v_ptrs = tl.multiple_of(V_g + kn[:, None] * svs + offs_dv[None, :], [1, 16])
            v = tl.load(v_ptrs, mask=(kn < T)[:, None], other=0.0)
        else:
            k = tl.load(tl.multiple_of(K_g + kn[:, None] * sks + offs_dk[None, :], [1, 16]))
            v = tl.load(tl.multiple_of(V_g + kn[:, None] * svs + offs_dv[None, :], [1, 16]))
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        p = tl.exp2(s - lse2[:, None])
        if MASKED:
            lo_k, hi_k = _key_bounds(kn, T, c1, c0, win, blk, sink)
            vis = (lo_k[None, :] <= tok[:, None]) & (tok[:, None] < hi_k[None, :])
            p = tl.where(vis, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _range_bwd_dq_kernel(Q, K, V, O, DO, LSE, DELTA, DQ,
                         sqb, sqh, sqs, skb, skg, sks, svb, svg, svs, sob, soh, sos, sdob, sdoh, sdos,
                         sdqb, sdqh, sdqs,
                         H, G, HPG, S, T, MODE, P0, P1, qk_scale, sm_scale, COMPUTE_DELTA,
                         D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         DOT_PREC: tl.constexpr):
    """dQ of a query tile; with COMPUTE_DELTA it also writes delta = rowsum(dO * O) (else it reads DELTA)."""
    (tok, head_r, row_ok, a_lo, a_n, b_lo, b_n, c_lo, n_masked, u_lo,
     n_unmasked) = _query_tile(T, S, HPG, MODE, P0, P1, BLOCK_M, BLOCK_N)
    c1, c0, win, blk, sink = _mask_params(MODE, P0, P1)
    bg = tl.program_id(1)
    g = bg % G
    b = (bg // G).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, D_K)
    offs_dv = tl.arange(0, D_V)
    head = g * HPG + head_r
    q_ptrs = tl.multiple_of(Q + b * sqb + head[:, None] * sqh + tok[:, None] * sqs + offs_dk[None, :], [1, 16])
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    do_ptrs = tl.multiple_of(DO + b * sdob + head[:, None] * sdoh + tok[:, None] * sdos + offs_dv[None, :], [1, 16])
    do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
    stat = head * S + tok
    LSE = LSE + b * H * S
    DELTA = DELTA + b * H * S
    lse = tl.load(LSE + stat, mask=row_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * _LOG2E)  # rows that see nothing: p = 0
    if COMPUTE_DELTA != 0:
        o_ptrs = tl.multiple_of(O + b * sob + head[:, None] * soh + tok[:, None] * sos + offs_dv[None, :], [1, 16])
        o = tl.load(o_ptrs, mask=row_ok[:, None], other=0.0)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
        tl.store(DELTA + stat, delta, mask=row_ok)
    else:
        delta = tl.load(DELTA + stat, mask=row_ok, other=0.0)
    K_g = K + b * skb + g * skg
    V_g = V + b * svb + g * svg

    dq = tl.zeros([BLOCK_M, D_K], tl.float32)
    dq = _dq_loop(dq, q, do, lse2, delta, K_g, V_g, sks, svs, T, c1, c0, win, blk, sink, qk_scale,
                  offs_n, offs_dk, offs_dv, tok, a_lo, a_n, b_lo, b_n, c_lo, n_masked, True, BLOCK_N, DOT_PREC)
    dq = _dq_loop(dq, q, do, lse2, delta, K_g, V_g, sks, svs, T, c1, c0, win, blk, sink, qk_scale,
                  offs_n, offs_dk, offs_dv, tok, u_lo, n_unmasked, 0, 0, 0, n_unmasked, False, BLOCK_N,
                  DOT_PREC)
    dq = dq * sm_scale
    tl.store(tl.multiple_of(DQ + b * sdqb + head[:, None] * sdqh + tok[:, None] * sdqs + offs_dk[None, :], [1, 16]),
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _dkdv_loop(dk, dv, k, v, Q_b, DO_b, LSE, DELTA, stat_b, head, tok_r, rows, TM, sqh, sqs, sdoh, sdos, S, T,
               qk_scale, lo_k, hi_k, offs_dk, offs_dv, a_lo, a_n, b_lo, n_tiles,
               MASKED: tl.constexpr, DOT_PREC: tl.constexpr):
    for idx in range(0, n_tiles):
        i = tl.where(idx < a_n, a_lo + idx, b_lo + idx - a_n)
        tok = i * TM + tok_r
        row_ok = rows & (tok < S)
        q_ptrs = tl.multiple_of(Q_b + head[:, None] * sqh + tok[:, None] * sqs + offs_dk[None, :], [1, 16])
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
        do_ptrs = tl.multiple_of(DO_b + head[:, None] * sdoh + tok[:, None] * sdos + offs_dv[None, :], [1, 16])
        do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
        lse = tl.load(LSE + stat_b + tok, mask=row_ok, other=float("inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * _LOG2E)
        delta = tl.load(DELTA + stat_b + tok, mask=row_ok, other=0.0)
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * qk_scale  # [BLOCK_N keys, BLOCK_M rows]
        p_t = tl.exp2(s_t - lse2[None, :])
        if MASKED:
            vis = (lo_k[:, None] <= tok[None, :]) & (tok[None, :] < hi_k[:, None])
            p_t = tl.where(vis, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _key_tile_tokens(n0, S, T, MODE, P0, P1, BLOCK_N: tl.constexpr):
    """The tokens that see some key of the tile [n0, n0 + BLOCK_N), [tok_lo, tok_hi), and those that see all of its
    BLOCK_N keys, [full_lo, full_hi) (empty when the tile passes T): the mode's formulas inverted, token-exact.
    Token t sees key k iff lo(t) <= k < hi(t) or k < pre(t); with n1 = min(n0 + BLOCK_N, T), t sees some key of the
    tile iff hi(t) > n0 and lo(t) < n1 (or pre(t) > n0), and all of them iff lo(t) <= n0 and hi(t) >= n0 + BLOCK_N
    (or pre(t) >= n0 + BLOCK_N)."""
    n1 = tl.minimum(n0 + BLOCK_N, T)
    if MODE == 0:  # t in [k, k + w)
        tok_lo = n0
        tok_hi = n1 + P0 - 1
        full_lo = n0 + BLOCK_N - 1
        full_hi = n0 + P0
    elif MODE == 1:  # t >= k*d + l - 1
        tok_lo = n0 * P1 + P0 - 1
        tok_hi = S
        full_lo = tl.where(n0 + BLOCK_N <= T, (n0 + BLOCK_N - 1) * P1 + P0 - 1, S)
        full_hi = S
    else:  # t in [k, (k // l_sel + 2) * l_sel)
        tok_lo = n0
        tok_hi = (tl.cdiv(n1, P0) + 1) * P0
        full_lo = n0 + BLOCK_N - 1
        full_hi = (n0 // P0 + 2) * P0
        # The sink adds the tokens of selection blocks >= 2 ([2*l_sel, S)) when n0 < sink, and they see the whole
        # tile when n0 + BLOCK_N <= sink; both sets start where the band's end (sink = l_sel), so the unions stay
        # intervals.
        if n0 < P1:
            tok_hi = S
        if n0 + BLOCK_N <= P1:
            full_hi = S
    tok_hi = tl.minimum(tok_hi, S)
    tok_lo = tl.minimum(tok_lo, tok_hi)
    full_hi = tl.minimum(full_hi, S)
    full_lo = tl.minimum(full_lo, full_hi)
    return tok_lo, full_lo, full_hi, tok_hi


@triton.jit
def _range_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                           sqb, sqh, sqs, skb, skg, sks, svb, svg, svs, sdob, sdoh, sdos,
                           sdk_split, sdkb, sdkg, sdkt, sdv_split, sdvb, sdvg, sdvt,
                           H, G, HPG, S, T, MODE, P0, P1, qk_scale, sm_scale,
                           D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           DOT_PREC: tl.constexpr):
    """dK, dV of one key tile (BLOCK_N keys of one group), summed over the query tiles of split program_id(2)."""
    TM = BLOCK_M // HPG
    pid = tl.program_id(0)
    bg = tl.program_id(1)
    split = tl.program_id(2)
    n_split = tl.num_programs(2)
    g = bg % G
    b = (bg // G).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, D_K)
    offs_dv = tl.arange(0, D_V)
    n0 = pid * BLOCK_N
    kn = n0 + offs_n
    k_in = kn < T
    k_ptrs = tl.multiple_of(K + b * skb + g * skg + kn[:, None] * sks + offs_dk[None, :], [1, 16])
    k = tl.load(k_ptrs, mask=k_in[:, None], other=0.0)
    v_ptrs = tl.multiple_of(V + b * svb + g * svg + kn[:, None] * svs + offs_dv[None, :], [1, 16])
    v = tl.load(v_ptrs, mask=k_in[:, None], other=0.0)
    head = g * HPG + offs_r % HPG
    tok_r = offs_r // HPG
    rows = offs_r < TM * HPG
    stat_b = head * S  # int32 row offsets into LSE, DELTA of batch b (scalar 64-bit bases)

    c1, c0, win, blk, sink = _mask_params(MODE, P0, P1)
    lo_k, hi_k = _key_bounds(kn, T, c1, c0, win, blk, sink)

    tok_lo, full_lo, full_hi, tok_hi = _key_tile_tokens(n0, S, T, MODE, P0, P1, BLOCK_N)
    # query tiles meeting [tok_lo, tok_hi); this split's contiguous share of them; the share's tiles wholly inside
    # [full_lo, full_hi) run unmasked
    i_lo = tok_lo // TM
    i_hi = tl.maximum(tl.cdiv(tok_hi, TM), i_lo)
    chunk = tl.cdiv(i_hi - i_lo, n_split)
    c_lo = tl.minimum(i_lo + split * chunk, i_hi)
    c_hi = tl.minimum(c_lo + chunk, i_hi)
    f_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo, TM), c_lo), c_hi)
    f_hi = tl.minimum(tl.maximum(full_hi // TM, f_lo), c_hi)

    Q_b = Q + b * sqb
    DO_b = DO + b * sdob
    LSE_b = LSE + b * H * S
    DELTA_b = DELTA + b * H * S
    dk = tl.zeros([BLOCK_N, D_K], tl.float32)
    dv = tl.zeros([BLOCK_N, D_V], tl.float32)
    dk, dv = _dkdv_loop(dk, dv, k, v, Q_b, DO_b, LSE_b, DELTA_b, stat_b, head, tok_r, rows, TM, sqh, sqs, sdoh, sdos,
                        S, T, qk_scale, lo_k, hi_k, offs_dk, offs_dv, c_lo, f_lo - c_lo, f_hi,
                        (f_lo - c_lo) + (c_hi - f_hi), True, DOT_PREC)
    dk, dv = _dkdv_loop(dk, dv, k, v, Q_b, DO_b, LSE_b, DELTA_b, stat_b, head, tok_r, rows, TM, sqh, sqs, sdoh, sdos,
                        S, T, qk_scale, lo_k, hi_k, offs_dk, offs_dv, f_lo, f_hi - f_lo, 0,
                        f_hi - f_lo, False, DOT_PREC)
    dk = dk * sm_scale
    DK_t = DK + split * sdk_split + b * sdkb + g * sdkg
    DV_t = DV + split * sdv_split + b * sdvb + g * sdvg
    dk_ptrs = tl.multiple_of(DK_t + kn[:, None] * sdkt + offs_dk[None, :], [1, 16])
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=k_in[:, None])
    dv_ptrs = tl.multiple_of(DV_t + kn[:, None] * sdvt + offs_dv[None, :], [1, 16])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=k_in[:, None])


# ------------------------------------------------------------------------------------------------ glue
@triton.jit
def _store_cast(Y, i, x, m, BF16_RNE: tl.constexpr):
    """Store fp32 x at Y + i (mask m) in Y's dtype. BF16_RNE: Y is the int16 view of a bf16 buffer and the rounding
    is written out (round to nearest even on the bits, NaN -> 0x7FC0), as torch's CPU cast does it, so that Triton's
    interpreter (whose own bf16 cast does not round to nearest) gives torch's bits too; on a GPU it is the same
    rounding as cvt.rn.bf16.f32. Otherwise Triton's cast to Y's dtype (a plain store for fp32)."""
    if BF16_RNE:
        u = x.to(tl.uint32, bitcast=True)
        r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        tl.store(Y + i, tl.where(x != x, 0x7FC0, r).to(tl.int16), mask=m)
    else:
        tl.store(Y + i, x.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _sum_split(P, Y, i, N, NSPLIT, m, BF16_RNE: tl.constexpr):
    """Y[i] = sum over the NSPLIT rows of P [NSPLIT, N] at i, in split order in fp32, stored by _store_cast."""
    acc = tl.load(P + i, mask=m, other=0.0)
    off = i  # int64: NSPLIT * N may pass 2**31
    for _ in range(1, NSPLIT):
        off += N
        acc += tl.load(P + off, mask=m, other=0.0)
    _store_cast(Y, i, acc, m, BF16_RNE)


@triton.jit
def _range_dkdv_sum(DKP, DVP, DK, DV, NK, NV, NSPLIT, BLOCK: tl.constexpr, BF16_RNE: tl.constexpr):
    """dK and dV of one range backward from their fp32 partials (host.GLUE_CHOICES "fused"): DKP [NSPLIT, NK] and
    DVP [NSPLIT, NV] (the dK/dV kernel's query-range chunks) summed in split order in fp32 and stored once in DK's /
    DV's dtype (_store_cast), in place of torch's sum(0) and cast of each: grid (blocks of the larger, 2),
    program_id(1) picks dK or dV."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if tl.program_id(1) == 0:
        _sum_split(DKP, DK, i, NK, NSPLIT, i < NK, BF16_RNE)
    else:
        _sum_split(DVP, DV, i, NV, NSPLIT, i < NV, BF16_RNE)
