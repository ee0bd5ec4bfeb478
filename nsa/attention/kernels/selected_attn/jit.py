"""The jit code of the selected branch (nsa.attention.kernels.selected_attn.host, whose docstring explains the two
loop orders, the tile table and the launch configurations): the forward kernels of both loop orders and the
backward kernels. The host side (index, configs, launches, custom ops, the public API) is in host.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.attention.kernels.range_attn.jit import _store_cast


# ------------------------------------------------------------------------------------------------ kernels
# BLOCKS (the block lists) may be int32 or int64 (choose_blocks' own dtype, which the "fused" host choice hands over
# without a copy): every kernel converts a loaded index to int32 at once (a no-op for int32), so the rest of its code
# is the same for both. Offsets inside one (sequence, group) or (sequence, head) slice are int32 (the wrapper checks
# that every tensor has fewer than 2**31 elements); the per-sequence base offsets are int64. d_k and d_v are powers
# of two >= 16, so feature columns need no mask.
@triton.jit
def _tile_rows(PAIR_T, pos0, remaining, HPG: tl.constexpr, BLOCK_R: tl.constexpr):
    """Rows of one tile: (local query index, query t, head within the group, valid) of its BLOCK_R rows."""
    r = tl.arange(0, BLOCK_R)
    qi = r // HPG
    hh = r % HPG
    valid = (qi < BLOCK_R // HPG) & (qi < remaining)
    t = tl.load(PAIR_T + pos0 + qi, mask=valid, other=0)
    return qi, t, hh, valid


@triton.jit
def _tile_key(TILES, n_tiles, pid, G, NB):
    """Where tile `pid` of the tile table lies: (its first pair's position, b*G + g, key block j, b, g)."""
    key = tl.load(TILES + pid)
    pos0 = tl.load(TILES + n_tiles + pid)
    bg = key // NB
    j = key - bg * NB
    b = bg // G
    g = bg - b * G
    return pos0, bg, j, b, g


@triton.jit
def _tile_pv(Q, K, V, LSE, PAIR_T, pos0, count, bg, j, b, g,
             sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s, S, qk_scale,
             L_SEL: tl.constexpr, HPG: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
             D_K: tl.constexpr, D_V: tl.constexpr, DOT_PREC: tl.constexpr):
    """A tile's p V over key block j (p normalised by the final lse) in fp32: (local query index, query t, head h,
    head within the group, valid, p V) of its BLOCK_R rows; _sel_fwd_kv_out adds it into O32, _sel_fwd_kv_part
    stores it per pair."""
    qi, t, hh, valid = _tile_rows(PAIR_T, pos0, count, HPG, BLOCK_R)
    h = g * HPG + hh
    offs_dk = tl.arange(0, D_K)
    offs_dv = tl.arange(0, D_V)
    q_rows = t * sq_s + h * sq_h
    q = tl.load(Q + b.to(tl.int64) * sq_b + q_rows[:, None] + offs_dk[None, :], mask=valid[:, None], other=0.0)
    lse = tl.load(LSE + (bg * S + t).to(tl.int64) * HPG + hh, mask=valid, other=0.0)
    k_base = K + b.to(tl.int64) * sk_b + g * sk_g
    v_base = V + b.to(tl.int64) * sv_b + g * sv_g
    acc = tl.zeros([BLOCK_R, D_V], tl.float32)
    for n0 in range(0, L_SEL, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kpos = j * L_SEL + offs_n
        kmask = (offs_n < L_SEL) & (kpos < S)
        k = tl.load(k_base + kpos[:, None] * sk_s + offs_dk[None, :], mask=kmask[:, None], other=0.0)
        v = tl.load(v_base + kpos[:, None] * sv_s + offs_dv[None, :], mask=kmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        allowed = valid[:, None] & kmask[None, :] & (kpos[None, :] <= t[:, None])
        p = tl.exp2(tl.where(allowed, s - lse[:, None], float("-inf")))
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return qi, t, h, hh, valid, acc


@triton.jit
def _sel_fwd_kv_stats(Q, K, PART, ORDER, PAIR_T, TILES, n_tiles,
                      sq_b, sq_h, sq_s, sk_b, sk_g, sk_s,
                      S, G, NB, qk_scale,
                      L_SEL: tl.constexpr, HPG: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                      D_K: tl.constexpr, DOT_PREC: tl.constexpr):
    pid = tl.program_id(0)
    count = tl.load(TILES + 2 * n_tiles + pid)
    if count > 0:
        pos0, bg, j, b, g = _tile_key(TILES, n_tiles, pid, G, NB)
        qi, t, hh, valid = _tile_rows(PAIR_T, pos0, count, HPG, BLOCK_R)
        offs_d = tl.arange(0, D_K)
        q_rows = t * sq_s + (g * HPG + hh) * sq_h
        q = tl.load(Q + b.to(tl.int64) * sq_b + q_rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        k_base = K + b.to(tl.int64) * sk_b + g * sk_g
        m_i = tl.full([BLOCK_R], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        for n0 in range(0, L_SEL, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            kpos = j * L_SEL + offs_n
            kmask = (offs_n < L_SEL) & (kpos < S)
            k = tl.load(k_base + kpos[:, None] * sk_s + offs_d[None, :], mask=kmask[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
            allowed = valid[:, None] & kmask[None, :] & (kpos[None, :] <= t[:, None])
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
            m_i = m_new
        flat = tl.load(ORDER + pos0 + qi, mask=valid, other=0)  # ((b*G + g)*S + t)*n_sel + slot
        tl.store(PART + flat.to(tl.int64) * HPG + hh, m_i + tl.log2(tl.where(valid, l_i, 1.0)), mask=valid)


@triton.jit
def _sel_fwd_kv_out(Q, K, V, LSE, O32, PAIR_T, TILES, n_tiles,
                    sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s, so_b, so_h, so_s,
                    S, G, NB, qk_scale,
                    L_SEL: tl.constexpr, HPG: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                    D_K: tl.constexpr, D_V: tl.constexpr, DOT_PREC: tl.constexpr):
    pid = tl.program_id(0)
    count = tl.load(TILES + 2 * n_tiles + pid)
    if count > 0:
        pos0, bg, j, b, g = _tile_key(TILES, n_tiles, pid, G, NB)
        _, t, h, _, valid, acc = _tile_pv(Q, K, V, LSE, PAIR_T, pos0, count, bg, j, b, g,
                                          sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s, S, qk_scale,
                                          L_SEL, HPG, BLOCK_R, BLOCK_N, D_K, D_V, DOT_PREC)
        offs_dv = tl.arange(0, D_V)
        o_rows = t * so_s + h * so_h
        tl.atomic_add(O32 + b.to(tl.int64) * so_b + o_rows[:, None] + offs_dv[None, :], acc, mask=valid[:, None],
                      sem="relaxed")


@triton.jit
def _sel_fwd_query(Q, K, V, BLOCKS, O, LSE,
                   sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s, so_b, so_h, so_s,
                   S, G, qk_scale,
                   N_SEL: tl.constexpr, L_SEL: tl.constexpr, HPG: tl.constexpr, HPG_PAD: tl.constexpr,
                   BLOCK_N: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr, DOT_PREC: tl.constexpr):
    pid = tl.program_id(0)  # (b*G + g)*S + t
    bg = pid // S
    t = pid - bg * S
    b = bg // G
    g = bg - b * G
    hh = tl.arange(0, HPG_PAD)
    hvalid = hh < HPG
    h = g * HPG + hh
    offs_dk = tl.arange(0, D_K)
    offs_dv = tl.arange(0, D_V)
    q = tl.load(Q + b.to(tl.int64) * sq_b + t * sq_s + (h * sq_h)[:, None] + offs_dk[None, :],
                mask=hvalid[:, None], other=0.0)
    k_base = K + b.to(tl.int64) * sk_b + g * sk_g
    v_base = V + b.to(tl.int64) * sv_b + g * sv_g
    m_i = tl.full([HPG_PAD], -1.0e30, tl.float32)
    l_i = tl.zeros([HPG_PAD], tl.float32)
    acc = tl.zeros([HPG_PAD, D_V], tl.float32)
    for slot in range(N_SEL):
        j = tl.load(BLOCKS + pid.to(tl.int64) * N_SEL + slot).to(tl.int32)
        if j >= 0:
            for n0 in range(0, L_SEL, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                kpos = j * L_SEL + offs_n
                kmask = (offs_n < L_SEL) & (kpos <= t)
                k = tl.load(k_base + kpos[:, None] * sk_s + offs_dk[None, :], mask=kmask[:, None], other=0.0)
                v = tl.load(v_base + kpos[:, None] * sv_s + offs_dv[None, :], mask=kmask[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
                s = tl.where(kmask[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp2(m_i - m_new)
                p = tl.exp2(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
                m_i = m_new
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    tl.store(O + b.to(tl.int64) * so_b + t * so_s + (h * so_h)[:, None] + offs_dv[None, :],
             out.to(O.dtype.element_ty), mask=hvalid[:, None])
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(LSE + pid.to(tl.int64) * HPG + hh, lse, mask=hvalid)


@triton.jit
def _sel_bwd_delta(O, DO, DELTA, so_b, so_h, so_s, sdo_b, sdo_h, sdo_s, S, H, HPG,
                   BLOCK_T: tl.constexpr, D_V: tl.constexpr):
    """delta[b, g, t, hh] = sum_d O * dO (fp32), the softmax backward's row term."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh - b * H
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, D_V)
    tm = (t < S)[:, None]
    o = tl.load(O + b.to(tl.int64) * so_b + h * so_h + (t * so_s)[:, None] + offs_d[None, :], mask=tm, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdo_b + h * sdo_h + (t * sdo_s)[:, None] + offs_d[None, :], mask=tm,
                 other=0.0)
    g = h // HPG
    hh = h - g * HPG
    G = H // HPG
    tl.store(DELTA + ((b * G + g).to(tl.int64) * S + t) * HPG + hh,
             tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=t < S)


@triton.jit
def _sel_bwd_kv(Q, K, V, DO, LSE, DELTA, DQ, DK, DV, PAIR_T, TILES, n_tiles,
                sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s, sdo_b, sdo_h, sdo_s,
                sdq_b, sdq_h, sdq_s, sdk_b, sdk_g, sdk_s, sdv_b, sdv_g, sdv_s,
                S, G, NB, qk_scale, sm_scale,
                L_SEL: tl.constexpr, BWD_TILES: tl.constexpr, HPG: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_N: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr,
                DOT_PREC: tl.constexpr, WITH_DQ: tl.constexpr = True):
    """dK, dV (and with WITH_DQ each pair's dQ term, by fp32 atomics into DQ) of one chunk of one key block.
    WITH_DQ = False (the "query" dQ choice, host.DQ_CHOICES): dK and dV only; _sel_bwd_dq_query writes dQ and DQ
    is not touched."""
    pid = tl.program_id(0)
    count = tl.load(TILES + 2 * n_tiles + pid)
    if count > 0:
        pos0, bg, j, b, g = _tile_key(TILES, n_tiles, pid, G, NB)
        qpt = BLOCK_R // HPG
        offs_dk = tl.arange(0, D_K)
        offs_dv = tl.arange(0, D_V)
        b64 = b.to(tl.int64)
        q_base = Q + b64 * sq_b
        do_base = DO + b64 * sdo_b
        dq_base = DQ + b64 * sdq_b
        for n0 in range(0, L_SEL, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            kpos = j * L_SEL + offs_n
            kmask = (offs_n < L_SEL) & (kpos < S)
            k = tl.load(K + b64 * sk_b + g * sk_g + kpos[:, None] * sk_s + offs_dk[None, :], mask=kmask[:, None],
                        other=0.0)
            v = tl.load(V + b64 * sv_b + g * sv_g + kpos[:, None] * sv_s + offs_dv[None, :], mask=kmask[:, None],
                        other=0.0)
            dk_acc = tl.zeros([BLOCK_N, D_K], tl.float32)
            dv_acc = tl.zeros([BLOCK_N, D_V], tl.float32)
            for it in range(BWD_TILES):  # a static trip count; the chunk's last tiles may be empty
                c = it * qpt
                if c < count:
                    _, t, hh, valid = _tile_rows(PAIR_T, pos0 + c, count - c, HPG, BLOCK_R)
                    h = g * HPG + hh
                    q = tl.load(q_base + (t * sq_s + h * sq_h)[:, None] + offs_dk[None, :], mask=valid[:, None],
                                other=0.0)
                    do = tl.load(do_base + (t * sdo_s + h * sdo_h)[:, None] + offs_dv[None, :], mask=valid[:, None],
                                 other=0.0)
                    row = (bg * S + t).to(tl.int64) * HPG + hh
                    lse = tl.load(LSE + row, mask=valid, other=0.0)
                    delta = tl.load(DELTA + row, mask=valid, other=0.0)
                    # transposed products: keys are the M dimension (64 rows: wgmma), the tile's rows are N
                    s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * qk_scale
                    allowed = valid[None, :] & kmask[:, None] & (kpos[:, None] <= t[None, :])
                    p_t = tl.exp2(tl.where(allowed, s_t - lse[None, :], float("-inf")))
                    dv_acc += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PREC)
                    dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
                    ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
                    dk_acc += tl.dot(ds_t, q, input_precision=DOT_PREC)
                    if WITH_DQ:
                        dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PREC) * sm_scale
                        tl.atomic_add(dq_base + (t * sdq_s + h * sdq_h)[:, None] + offs_dk[None, :], dq,
                                      mask=valid[:, None], sem="relaxed")
            tl.atomic_add(DK + b64 * sdk_b + g * sdk_g + kpos[:, None] * sdk_s + offs_dk[None, :], dk_acc * sm_scale,
                          mask=kmask[:, None], sem="relaxed")
            tl.atomic_add(DV + b64 * sdv_b + g * sdv_g + kpos[:, None] * sdv_s + offs_dv[None, :], dv_acc,
                          mask=kmask[:, None], sem="relaxed")


@triton.jit
def _sel_bwd_dq_query(Q, K, V, DO, LSE, DELTA, BLOCKS, DQ,
                      sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s, sdo_b, sdo_h, sdo_s,
                      sdq_b, sdq_h, sdq_s,
                      S, G, qk_scale, sm_scale,
                      N_SEL: tl.constexpr, L_SEL: tl.constexpr, HPG: tl.constexpr, HPG_PAD: tl.constexpr,
                      BLOCK_N: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr, DOT_PREC: tl.constexpr):
    """dQ of one (sequence, group, query) over its listed blocks, query-outer (the "query" dQ choice): the group's
    hpg heads are the rows (padded to HPG_PAD, as _sel_fwd_query); per block p = exp2(s - lse) from the forward's
    lse, dp = dO V^T, ds = p (dp - delta), dQ += ds K in registers; one store of dQ in its dtype, no atomics (the
    program holds every term of its query's dQ). Keys p > t are masked (only the own block, or a block past the
    query, has any); a listed block is walked once per listing."""
    pid = tl.program_id(0)  # (b*G + g)*S + t
    bg = pid // S
    t = pid - bg * S
    b = bg // G
    g = bg - b * G
    hh = tl.arange(0, HPG_PAD)
    hvalid = hh < HPG
    h = g * HPG + hh
    offs_dk = tl.arange(0, D_K)
    offs_dv = tl.arange(0, D_V)
    b64 = b.to(tl.int64)
    q = tl.load(Q + b64 * sq_b + t * sq_s + (h * sq_h)[:, None] + offs_dk[None, :], mask=hvalid[:, None], other=0.0)
    do = tl.load(DO + b64 * sdo_b + t * sdo_s + (h * sdo_h)[:, None] + offs_dv[None, :], mask=hvalid[:, None],
                 other=0.0)
    row = pid.to(tl.int64) * HPG + hh
    lse = tl.load(LSE + row, mask=hvalid, other=0.0)
    delta = tl.load(DELTA + row, mask=hvalid, other=0.0)
    k_base = K + b64 * sk_b + g * sk_g
    v_base = V + b64 * sv_b + g * sv_g
    acc = tl.zeros([HPG_PAD, D_K], tl.float32)
    for slot in range(N_SEL):
        j = tl.load(BLOCKS + pid.to(tl.int64) * N_SEL + slot).to(tl.int32)
        if j >= 0:
            for n0 in range(0, L_SEL, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                kpos = j * L_SEL + offs_n
                kmask = (offs_n < L_SEL) & (kpos <= t)
                k = tl.load(k_base + kpos[:, None] * sk_s + offs_dk[None, :], mask=kmask[:, None], other=0.0)
                v = tl.load(v_base + kpos[:, None] * sv_s + offs_dv[None, :], mask=kmask[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
                allowed = hvalid[:, None] & kmask[None, :]
                p = tl.exp2(tl.where(allowed, s - lse[:, None], float("-inf")))
                dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
                ds = (p * (dp - delta[:, None])).to(k.dtype)
                acc += tl.dot(ds, k, input_precision=DOT_PREC)
    tl.store(DQ + b64 * sdq_b + t * sdq_s + (h * sdq_h)[:, None] + offs_dk[None, :],
             (acc * sm_scale).to(DQ.dtype.element_ty), mask=hvalid[:, None])


@triton.jit
def _sel_fwd_kv_part(Q, K, V, LSE, OP, ORDER, PAIR_T, TILES, n_tiles,
                     sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s,
                     S, G, NB, qk_scale,
                     L_SEL: tl.constexpr, HPG: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                     D_K: tl.constexpr, D_V: tl.constexpr, DOT_PREC: tl.constexpr):
    """_sel_fwd_kv_out's pass for the "partial" output choice (host.OUT_CHOICES): each pair's p V (p already
    normalised by the final lse) stored, not added, at the pair's place in OP [B*G*S*n_sel, HPG, D_V] fp32 (the flat
    pair index from ORDER); _sel_fwd_reduce sums a query's slots after. No atomics: a pair lies in one tile."""
    pid = tl.program_id(0)
    count = tl.load(TILES + 2 * n_tiles + pid)
    if count > 0:
        pos0, bg, j, b, g = _tile_key(TILES, n_tiles, pid, G, NB)
        qi, t, _, hh, valid, acc = _tile_pv(Q, K, V, LSE, PAIR_T, pos0, count, bg, j, b, g,
                                            sq_b, sq_h, sq_s, sk_b, sk_g, sk_s, sv_b, sv_g, sv_s, S, qk_scale,
                                            L_SEL, HPG, BLOCK_R, BLOCK_N, D_K, D_V, DOT_PREC)
        offs_dv = tl.arange(0, D_V)
        flat = tl.load(ORDER + pos0 + qi, mask=valid, other=0)  # ((b*G + g)*S + t)*n_sel + slot
        rows = (flat.to(tl.int64) * HPG + hh) * D_V
        tl.store(OP + rows[:, None] + offs_dv[None, :], acc, mask=valid[:, None])


@triton.jit
def _sel_fwd_reduce(OP, BLOCKS, O, so_b, so_h, so_s, S, G,
                    N_SEL: tl.constexpr, HPG: tl.constexpr, HPG_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                    D_V: tl.constexpr):
    """o of BLOCK_T queries of one (sequence, group) for the "partial" output choice: the sum over each query's
    non-empty slots of its pairs' partial outputs (OP, _sel_fwd_kv_part), in fp32, stored once in O's dtype; a
    query with no block gets 0. Empty slots (-1) were never written and are not read."""
    pid_t = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // G
    g = bg - b * G
    r = tl.arange(0, BLOCK_T * HPG_PAD)  # rows (query, head): query r // HPG_PAD, head r % HPG_PAD
    t = pid_t * BLOCK_T + r // HPG_PAD
    hh = r % HPG_PAD
    valid = (t < S) & (hh < HPG)
    offs_dv = tl.arange(0, D_V)
    pair0 = (bg * S + t).to(tl.int64) * N_SEL
    acc = tl.zeros([BLOCK_T * HPG_PAD, D_V], tl.float32)
    for slot in range(N_SEL):
        j = tl.load(BLOCKS + pair0 + slot, mask=valid, other=-1).to(tl.int32)
        use = valid & (j >= 0)
        rows = ((pair0 + slot) * HPG + hh) * D_V
        acc += tl.load(OP + rows[:, None] + offs_dv[None, :], mask=use[:, None], other=0.0)
    h = g * HPG + hh
    tl.store(O + b.to(tl.int64) * so_b + (t * so_s + h * so_h)[:, None] + offs_dv[None, :], acc.to(O.dtype.element_ty),
             mask=valid[:, None])


@triton.jit
def _sel_fwd_lse(PART, BLOCKS, LSE, O32, so_b, so_h, so_s, S, G,
                 N_SEL: tl.constexpr, HPG: tl.constexpr, HPG_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                 D_V: tl.constexpr, ZERO_O: tl.constexpr):
    """lse of BLOCK_T queries of one (sequence, group) for the "fused" host choice (host.HOST_CHOICES), in place of
    torch's fill of PART, logsumexp and two scalings: each (query, head) row's log2-sum-exp2 over its query's
    non-empty slots of PART (_sel_fwd_kv_stats' per-pair statistics, log2 units), -inf for a query with no block.
    Empty slots (-1) were never written and are not read, so PART needs no fill. With ZERO_O it also zeroes the
    rows' fp32 output O32, which _sel_fwd_kv_out's atomics then accumulate into (no torch.zeros)."""
    pid_t = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // G
    g = bg - b * G
    r = tl.arange(0, BLOCK_T * HPG_PAD)  # rows (query, head): query r // HPG_PAD, head r % HPG_PAD
    t = pid_t * BLOCK_T + r // HPG_PAD
    hh = r % HPG_PAD
    valid = (t < S) & (hh < HPG)
    pair0 = (bg * S + t).to(tl.int64) * N_SEL
    m = tl.full([BLOCK_T * HPG_PAD], float("-inf"), tl.float32)
    for slot in range(N_SEL):
        j = tl.load(BLOCKS + pair0 + slot, mask=valid, other=-1).to(tl.int32)
        x = tl.load(PART + (pair0 + slot) * HPG + hh, mask=valid & (j >= 0), other=float("-inf"))
        m = tl.maximum(m, x)
    finite = m > float("-inf")
    m0 = tl.where(finite, m, 0.0)
    acc = tl.zeros([BLOCK_T * HPG_PAD], tl.float32)
    for slot in range(N_SEL):
        j = tl.load(BLOCKS + pair0 + slot, mask=valid, other=-1).to(tl.int32)
        x = tl.load(PART + (pair0 + slot) * HPG + hh, mask=valid & (j >= 0), other=float("-inf"))
        acc += tl.exp2(x - m0)
    lse = tl.where(finite, m0 + tl.log2(tl.where(finite, acc, 1.0)), float("-inf"))
    tl.store(LSE + (bg * S + t).to(tl.int64) * HPG + hh, lse, mask=valid)
    if ZERO_O:
        h = g * HPG + hh
        offs_dv = tl.arange(0, D_V)
        tl.store(O32 + b.to(tl.int64) * so_b + (t * so_s + h * so_h)[:, None] + offs_dv[None, :],
                 tl.zeros([BLOCK_T * HPG_PAD, D_V], tl.float32), mask=valid[:, None])


@triton.jit
def _sel_bwd_delta_zero(O, DO, DELTA, DQ, DK, DV, so_b, so_h, so_s, sdo_b, sdo_h, sdo_s,
                        sdq_b, sdq_h, sdq_s, sdk_b, sdk_g, sdk_s, sdv_b, sdv_g, sdv_s, S, H, HPG,
                        BLOCK_T: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr, ZERO_DQ: tl.constexpr):
    """_sel_bwd_delta for the "fused" host choice (host.HOST_CHOICES): delta = rowsum(dO * O) (fp32) of BLOCK_T
    queries of one (sequence, head), and the zeros _sel_bwd_kv's fp32 atomics accumulate into, in place of
    torch.zeros: the rows' dQ (ZERO_DQ: the atomic dQ choice) and, in the group's first head's programs, the
    group's dK and dV rows."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh - b * H
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, D_V)
    tm = (t < S)[:, None]
    b64 = b.to(tl.int64)
    o = tl.load(O + b64 * so_b + h * so_h + (t * so_s)[:, None] + offs_d[None, :], mask=tm, other=0.0)
    do = tl.load(DO + b64 * sdo_b + h * sdo_h + (t * sdo_s)[:, None] + offs_d[None, :], mask=tm, other=0.0)
    g = h // HPG
    hh = h - g * HPG
    G = H // HPG
    tl.store(DELTA + ((b * G + g).to(tl.int64) * S + t) * HPG + hh,
             tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=t < S)
    offs_dk = tl.arange(0, D_K)
    if ZERO_DQ:
        tl.store(DQ + b64 * sdq_b + h * sdq_h + (t * sdq_s)[:, None] + offs_dk[None, :],
                 tl.zeros([BLOCK_T, D_K], tl.float32), mask=tm)
    if hh == 0:
        tl.store(DK + b64 * sdk_b + g * sdk_g + (t * sdk_s)[:, None] + offs_dk[None, :],
                 tl.zeros([BLOCK_T, D_K], tl.float32), mask=tm)
        tl.store(DV + b64 * sdv_b + g * sdv_g + (t * sdv_s)[:, None] + offs_d[None, :],
                 tl.zeros([BLOCK_T, D_V], tl.float32), mask=tm)


# ------------------------------------------------------------------------------------------------ forced band choice
@triton.jit
def _sel_band_rest(BLOCKS, REST, R, S,
                   L_SEL: tl.constexpr, N_SEL: tl.constexpr, N_SEL_PAD: tl.constexpr, N_REST: tl.constexpr,
                   N_REST_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    """The "band" forced choice's sparse list (host.FORCED_CHOICES): for BLOCK_T of the R = B*G*S rows of BLOCKS
    [R, N_SEL], the listed blocks that are not forced for the row's query t (block 0, t // L_SEL - 1, t // L_SEL:
    those go through the band kernel), in their listed order, packed into the first slots of REST [R, N_REST] and
    -1 after them. A kept block past slot N_REST is dropped: N_REST = min(n_sel, NB) - 3 holds every other block of
    a list that lists its forced blocks once (choose_blocks' lists), which the choice requires."""
    r = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = r < R
    cur = (r % S) // L_SEL
    c = tl.arange(0, N_SEL_PAD)
    row = r.to(tl.int64)
    blk = tl.load(BLOCKS + row[:, None] * N_SEL + c[None, :], mask=ok[:, None] & (c < N_SEL)[None, :],
                  other=-1).to(tl.int32)
    keep = (blk > 0) & (blk != cur[:, None]) & (blk != cur[:, None] - 1)
    k32 = keep.to(tl.int32)
    pos = tl.cumsum(k32, 1) - 1
    tl.store(REST + row[:, None] * N_REST + pos, blk, mask=keep & (pos < N_REST) & ok[:, None])
    count = tl.sum(k32, 1)
    cr = tl.arange(0, N_REST_PAD)
    tl.store(REST + row[:, None] * N_REST + cr[None, :], tl.full([BLOCK_T, N_REST_PAD], -1, tl.int32),
             mask=ok[:, None] & (cr[None, :] >= count[:, None]) & (cr < N_REST)[None, :])


@triton.jit
def _sel_band_merge(OB, LSEB, OS, LSES, O, LSEH, LSEG, sob_b, sob_h, sob_s, sos_b, sos_h, sos_s, so_b, so_h, so_s,
                    S, H, HPG, BLOCK_T: tl.constexpr, D_V: tl.constexpr):
    """The "band" forced choice's merge of its two parts (host.FORCED_CHOICES), BLOCK_T queries of one (sequence,
    head): the band's fp32 output OB and natural-log lse LSEB [B, H, S] (range attention, mode BAND with the
    sink), the sparse part's fp32 output OS and log2 lse LSES [B, G, S, HPG] (-inf where a query lists no
    other block; OS is 0 there). lse = log2(2^lse_band + 2^lse_sparse), O = OB 2^(lse_band - lse) + OS
    2^(lse_sparse - lse) in O's dtype; the combined lse stored in both layouts (LSEH natural [B, H, S] for the
    band's backward, LSEG log2 [B, G, S, HPG] for the sparse one). The band always holds the query's own key, so
    lse_band and lse are finite."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh - b * H
    g = h // HPG
    hh = h - g * HPG
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < S
    offs_d = tl.arange(0, D_V)
    b64 = b.to(tl.int64)
    stat_h = b64 * H * S + h * S + t
    stat_g = (b64 * H + g * HPG) * S + t * HPG + hh  # ((b*G + g)*S + t)*HPG + hh
    lb = tl.load(LSEB + stat_h, mask=tm, other=0.0) * 1.4426950408889634
    ls = tl.load(LSES + stat_g, mask=tm, other=float("-inf"))
    m = tl.maximum(lb, ls)
    lse = m + tl.log2(tl.exp2(lb - m) + tl.exp2(ls - m))
    wb = tl.exp2(lb - lse)
    ws = tl.exp2(ls - lse)
    ob = tl.load(OB + b64 * sob_b + h * sob_h + (t * sob_s)[:, None] + offs_d[None, :], mask=tm[:, None], other=0.0)
    os = tl.load(OS + b64 * sos_b + h * sos_h + (t * sos_s)[:, None] + offs_d[None, :], mask=tm[:, None], other=0.0)
    o = ob * wb[:, None] + os * ws[:, None]
    tl.store(O + b64 * so_b + h * so_h + (t * so_s)[:, None] + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=tm[:, None])
    tl.store(LSEH + stat_h, lse * 0.6931471805599453, mask=tm)
    tl.store(LSEG + stat_g, lse, mask=tm)


# ------------------------------------------------------------------------------------------------ casts
@triton.jit
def _cast_span(X, Y, N, pid, BLOCK: tl.constexpr, BF16_RNE: tl.constexpr):
    """BLOCK elements of one flat fp32 buffer X [N] cast into Y [N] (range_attn.jit._store_cast: BF16_RNE, Y the
    int16 view of a bf16 buffer, rounds to nearest even on the bits as torch does; otherwise Triton's cast)."""
    i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    _store_cast(Y, i, tl.load(X + i, mask=m, other=0.0), m, BF16_RNE)


@triton.jit
def _sel_cast(X0, Y0, N0, X1, Y1, N1, X2, Y2, N2, BLOCK: tl.constexpr, BF16_RNE: tl.constexpr):
    """Up to three dense fp32 buffers cast to the activation dtype in one launch (host.HOST_CHOICES "fused": the
    selected backward's dQ, dK and dV, in place of one aten cast each): grid (blocks of the largest, buffers),
    program_id(1) picks the buffer. Each buffer is flat: X and Y have the same strides and no gaps (host._cast_fp32
    checks it), so element i of X's memory is element i of Y's."""
    pid = tl.program_id(0)
    which = tl.program_id(1)
    if which == 0:
        _cast_span(X0, Y0, N0, pid, BLOCK, BF16_RNE)
    elif which == 1:
        _cast_span(X1, Y1, N1, pid, BLOCK, BF16_RNE)
    else:
        _cast_span(X2, Y2, N2, pid, BLOCK, BF16_RNE)
