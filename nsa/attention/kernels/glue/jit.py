"""The jit code of the layer's fused glue (nsa.attention.kernels.glue.host, whose docstring gives the layouts and
the formulas): projection split + RoPE + gate-MLP activation, compression pooling, RoPE of compressed keys, and
the gate + branch combine, each forward and backward. No tensor-core products: these kernels are memory-bound
element-wise passes, one launch where aten needed ten or more ops.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotate(x1, x2, pos, inv_freq, SIGN: tl.constexpr):
    """Rotate-half RoPE of the halves x1, x2 [rows, d/2] (fp32) at positions pos [rows] (fp32); SIGN = -1 is the
    inverse rotation (the backward). Angles pos * inv_freq in fp32, as nsa.attention.rope."""
    ang = pos[:, None] * inv_freq[None, :]
    c = tl.cos(ang)
    s = tl.sin(ang) * SIGN
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _copied_segment(seg, gi, off_v, G, D_K: tl.constexpr, D_V: tl.constexpr):
    """(first column in Y, width) of KV group gi's head in copied segment seg: 0 v_sel, 1 v_win, 2 k_raw, 3 v_raw.
    Y's columns after the rotated heads (from off_v): v_sel [G * D_V], v_win [G * D_V], k_raw [G * D_K],
    v_raw [G * D_V], then the gate MLP's hidden layer."""
    if seg == 0:
        col = off_v + gi * D_V
        width = gi * 0 + D_V
    elif seg == 1:
        col = off_v + G * D_V + gi * D_V
        width = gi * 0 + D_V
    elif seg == 2:
        col = off_v + 2 * G * D_V + gi * D_K
        width = gi * 0 + D_K
    else:
        col = off_v + 2 * G * D_V + G * D_K + gi * D_V
        width = gi * 0 + D_V
    return col, width


@triton.jit
def _prep_fwd_kernel(Y, B1, INV_FREQ, Q, KS, KW, VS, VW, KR, VR, A,
                     R, S, sy, H, G, HID, START,
                     D_K: tl.constexpr, D_V: tl.constexpr, D_MAX: tl.constexpr, BLOCK_R: tl.constexpr):
    """Program (row tile, slot). Slots [0, H + 2G): a rotated head of q / k_sel / k_win; [H + 2G, H + 6G): a copied
    head of v_sel / v_win / k_raw / v_raw; then D_MAX-column chunks of the gate MLP's hidden layer, silu(h + b1)."""
    pid_r = tl.program_id(0)
    slot = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    n_rope = H + 2 * G
    off_v = n_rope * D_K
    if slot < n_rope:
        half = tl.arange(0, D_K // 2)
        src = Y + rows[:, None] * sy + slot * D_K + half[None, :]
        x1 = tl.load(src, mask=rmask[:, None], other=0.0).to(tl.float32)
        x2 = tl.load(src + D_K // 2, mask=rmask[:, None], other=0.0).to(tl.float32)
        pos = (rows % S + START).to(tl.float32)
        o1, o2 = _rotate(x1, x2, pos, tl.load(INV_FREQ + half), 1.0)
        if slot < H:
            dst = Q + rows[:, None] * (H * D_K) + slot * D_K + half[None, :]
        elif slot < H + G:
            dst = KS + rows[:, None] * (G * D_K) + (slot - H) * D_K + half[None, :]
        else:
            dst = KW + rows[:, None] * (G * D_K) + (slot - H - G) * D_K + half[None, :]
        tl.store(dst, o1.to(Q.dtype.element_ty), mask=rmask[:, None])
        tl.store(dst + D_K // 2, o2.to(Q.dtype.element_ty), mask=rmask[:, None])
    elif slot < n_rope + 4 * G:
        k = slot - n_rope
        seg = k // G
        gi = k % G
        cols = tl.arange(0, D_MAX)
        src_col, width = _copied_segment(seg, gi, off_v, G, D_K, D_V)
        if seg == 0:
            dst = VS + rows[:, None] * (G * D_V) + gi * D_V + cols[None, :]
        elif seg == 1:
            dst = VW + rows[:, None] * (G * D_V) + gi * D_V + cols[None, :]
        elif seg == 2:
            dst = KR + rows[:, None] * (G * D_K) + gi * D_K + cols[None, :]
        else:
            dst = VR + rows[:, None] * (G * D_V) + gi * D_V + cols[None, :]
        m = rmask[:, None] & (cols[None, :] < width)
        x = tl.load(Y + rows[:, None] * sy + src_col + cols[None, :], mask=m, other=0.0)
        tl.store(dst, x.to(VS.dtype.element_ty), mask=m)
    else:
        cols = (slot - n_rope - 4 * G) * D_MAX + tl.arange(0, D_MAX)
        cm = cols < HID
        m = rmask[:, None] & cm[None, :]
        off_gate = off_v + 3 * G * D_V + G * D_K
        z = tl.load(Y + rows[:, None] * sy + off_gate + cols[None, :], mask=m, other=0.0).to(tl.float32)
        z += tl.load(B1 + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
        a = z * tl.sigmoid(z)
        tl.store(A + rows[:, None] * HID + cols[None, :], a.to(A.dtype.element_ty), mask=m)


@triton.jit
def _prep_bwd_kernel(DQ, DKS, DKW, DVS, DVW, DKR, DVR, DA, Y, B1, INV_FREQ, DY, DB1,
                     R, S, sy, sdy, H, G, HID, START,
                     sq_b, sq_s, sq_h, sks_b, sks_s, sks_h, skw_b, skw_s, skw_h, svs_b, svs_s, svs_h,
                     svw_b, svw_s, svw_h, skr_b, skr_s, skr_h, svr_b, svr_s, svr_h,
                     D_K: tl.constexpr, D_V: tl.constexpr, D_MAX: tl.constexpr, BLOCK_R: tl.constexpr):
    """The forward's slots in reverse: every column of dY [R, N] is written once; the gate slots also store
    per-row-tile partial sums of dh into DB1 [row tiles, HID] (fp32; summed by the host). The head gradients are
    [B, S, n, d] with any strides (b, s, head) of unit last stride, as the attention kernels return them."""
    pid_r = tl.program_id(0)
    slot = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    bi = rows // S
    si = rows % S
    n_rope = H + 2 * G
    off_v = n_rope * D_K
    if slot < n_rope:
        half = tl.arange(0, D_K // 2)
        if slot < H:
            src = DQ + (bi * sq_b + si * sq_s + slot * sq_h)[:, None] + half[None, :]
        elif slot < H + G:
            src = DKS + (bi * sks_b + si * sks_s + (slot - H) * sks_h)[:, None] + half[None, :]
        else:
            src = DKW + (bi * skw_b + si * skw_s + (slot - H - G) * skw_h)[:, None] + half[None, :]
        d1 = tl.load(src, mask=rmask[:, None], other=0.0).to(tl.float32)
        d2 = tl.load(src + D_K // 2, mask=rmask[:, None], other=0.0).to(tl.float32)
        pos = (rows % S + START).to(tl.float32)
        o1, o2 = _rotate(d1, d2, pos, tl.load(INV_FREQ + half), -1.0)
        dst = DY + rows[:, None] * sdy + slot * D_K + half[None, :]
        tl.store(dst, o1.to(DY.dtype.element_ty), mask=rmask[:, None])
        tl.store(dst + D_K // 2, o2.to(DY.dtype.element_ty), mask=rmask[:, None])
    elif slot < n_rope + 4 * G:
        k = slot - n_rope
        seg = k // G
        gi = k % G
        cols = tl.arange(0, D_MAX)
        dst_col, width = _copied_segment(seg, gi, off_v, G, D_K, D_V)
        if seg == 0:
            src = DVS + (bi * svs_b + si * svs_s + gi * svs_h)[:, None] + cols[None, :]
        elif seg == 1:
            src = DVW + (bi * svw_b + si * svw_s + gi * svw_h)[:, None] + cols[None, :]
        elif seg == 2:
            src = DKR + (bi * skr_b + si * skr_s + gi * skr_h)[:, None] + cols[None, :]
        else:
            src = DVR + (bi * svr_b + si * svr_s + gi * svr_h)[:, None] + cols[None, :]
        m = rmask[:, None] & (cols[None, :] < width)
        x = tl.load(src, mask=m, other=0.0)
        tl.store(DY + rows[:, None] * sdy + dst_col + cols[None, :], x.to(DY.dtype.element_ty), mask=m)
    else:
        cols = (slot - n_rope - 4 * G) * D_MAX + tl.arange(0, D_MAX)
        cm = cols < HID
        m = rmask[:, None] & cm[None, :]
        off_gate = off_v + 3 * G * D_V + G * D_K
        z = tl.load(Y + rows[:, None] * sy + off_gate + cols[None, :], mask=m, other=0.0).to(tl.float32)
        z += tl.load(B1 + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
        da = tl.load(DA + rows[:, None] * HID + cols[None, :], mask=m, other=0.0).to(tl.float32)
        sg = tl.sigmoid(z)
        dz = da * sg * (1.0 + z * (1.0 - sg))
        dz = tl.where(m, dz, 0.0)
        tl.store(DY + rows[:, None] * sdy + off_gate + cols[None, :], dz.to(DY.dtype.element_ty), mask=m)
        tl.store(DB1 + pid_r * HID + cols, tl.sum(dz, axis=0), mask=cm)


@triton.jit
def _cmp_pool_fwd_kernel(RAW, POS, X, MEAN, S, G, N, L, D,
                         W: tl.constexpr, BLOCK_L: tl.constexpr, WITH_X: tl.constexpr, BLOCKS: tl.constexpr):
    """Program (BLOCKS blocks from i0, b * G + g): the l tokens [i*d, i*d + l) of raw [B, S, G, W] -> MEAN
    [B, G, N, W] (their mean) and X [B*G*N, L*W] (the block plus the intra-block position embedding POS [L, W],
    flattened (j, c))."""
    bg = tl.program_id(1)
    b = bg // G
    g = bg % G
    j = tl.arange(0, BLOCK_L)
    c = tl.arange(0, W)
    jm = j < L
    if WITH_X:
        pos = tl.load(POS + j[:, None] * W + c[None, :], mask=jm[:, None], other=0.0).to(tl.float32)
    for ii in range(BLOCKS):
        i = tl.program_id(0) * BLOCKS + ii
        okj = jm & (j * 0 + i < N)
        t = i * D + j
        tile = tl.load(RAW + ((b * S + t[:, None]) * G + g) * W + c[None, :], mask=okj[:, None], other=0.0)
        tile = tile.to(tl.float32)
        mean = tl.sum(tile, axis=0) / L
        row = bg * N + i
        tl.store(MEAN + row * W + c, mean.to(MEAN.dtype.element_ty), mask=c * 0 + i < N)
        if WITH_X:
            tl.store(X + row * (L * W) + j[:, None] * W + c[None, :], (tile + pos).to(X.dtype.element_ty),
                     mask=okj[:, None])


@triton.jit
def _cmp_pool_bwd_kernel(DX, DMEAN, DRAW, S, G, N, L, D, NQ,
                         W: tl.constexpr, BLOCK_T: tl.constexpr, WITH_X: tl.constexpr):
    """Program (token tile, b * G + g): dRAW[t] = sum over the blocks i holding t (i*d <= t < i*d + l, at most
    NQ = ceil(l / d) of them) of dX[i, t - i*d] + dMEAN[i] / l; 0 for tokens in no block."""
    pid = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // G
    g = bg % G
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, W)
    tm = t < S
    acc = tl.zeros((BLOCK_T, W), dtype=tl.float32)
    for qq in range(0, NQ):
        i = t // D - qq
        j = t - i * D
        ok = tm & (i >= 0) & (i < N) & (j < L)
        row = bg * N + i
        acc += tl.load(DMEAN + row[:, None] * W + c[None, :], mask=ok[:, None], other=0.0).to(tl.float32) / L
        if WITH_X:
            acc += tl.load(DX + row[:, None] * (L * W) + j[:, None] * W + c[None, :], mask=ok[:, None],
                           other=0.0).to(tl.float32)
    tl.store(DRAW + ((b * S + t[:, None]) * G + g) * W + c[None, :], acc.to(DRAW.dtype.element_ty),
             mask=tm[:, None])


@triton.jit
def _rope_rows_kernel(A, B, OUT, INV_FREQ, R, N, P_MUL, P_ADD,
                      W: tl.constexpr, BLOCK_R: tl.constexpr, HAS_B: tl.constexpr, SIGN: tl.constexpr):
    """OUT[r] = rope(A[r] (+ B[r]), position (r % N) * P_MUL + P_ADD) over rows of width W (contiguous);
    SIGN = -1: the inverse rotation."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = rows < R
    half = tl.arange(0, W // 2)
    off = rows[:, None] * W + half[None, :]
    x1 = tl.load(A + off, mask=rm[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(A + off + W // 2, mask=rm[:, None], other=0.0).to(tl.float32)
    if HAS_B:
        x1 += tl.load(B + off, mask=rm[:, None], other=0.0).to(tl.float32)
        x2 += tl.load(B + off + W // 2, mask=rm[:, None], other=0.0).to(tl.float32)
    pos = ((rows % N) * P_MUL + P_ADD).to(tl.float32)
    o1, o2 = _rotate(x1, x2, pos, tl.load(INV_FREQ + half), SIGN)
    tl.store(OUT + off, o1.to(OUT.dtype.element_ty), mask=rm[:, None])
    tl.store(OUT + off + W // 2, o2.to(OUT.dtype.element_ty), mask=rm[:, None])


@triton.jit
def _gates(LOGITS, lrow, tm, SIGMOID: tl.constexpr):
    """(g_cmp, g_sel, g_win) [BLOCK_T] fp32 from the logits at lrow ([B, S, H, 3] offsets of the tile's tokens)."""
    z0 = tl.load(LOGITS + lrow, mask=tm, other=0.0).to(tl.float32)
    z1 = tl.load(LOGITS + lrow + 1, mask=tm, other=0.0).to(tl.float32)
    z2 = tl.load(LOGITS + lrow + 2, mask=tm, other=0.0).to(tl.float32)
    if SIGMOID:
        return tl.sigmoid(z0), tl.sigmoid(z1), tl.sigmoid(z2)
    else:
        m = tl.maximum(tl.maximum(z0, z1), z2)
        e0 = tl.exp(z0 - m)
        e1 = tl.exp(z1 - m)
        e2 = tl.exp(z2 - m)
        tot = e0 + e1 + e2
        return e0 / tot, e1 / tot, e2 / tot


@triton.jit
def _combine_fwd_kernel(LOGITS, OC, OS, OW, OUT, S, H, soc_b, soc_h, soc_s, sos_b, sos_h, sos_s, sow_b, sow_h,
                        sow_s, D_V: tl.constexpr, BLOCK_T: tl.constexpr, SIGMOID: tl.constexpr):
    """Program (token tile, b * H + h): OUT[b, t, h] = sum_c gate_c(LOGITS[b, t, h]) * O_c[b, h, t] ([B, S, H, D_V])."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, D_V)
    tm = t < S
    g0, g1, g2 = _gates(LOGITS, ((b * S + t) * H + h) * 3, tm, SIGMOID)
    oc = tl.load(OC + b * soc_b + h * soc_h + t[:, None] * soc_s + c[None, :], mask=tm[:, None], other=0.0)
    o_s = tl.load(OS + b * sos_b + h * sos_h + t[:, None] * sos_s + c[None, :], mask=tm[:, None], other=0.0)
    ow = tl.load(OW + b * sow_b + h * sow_h + t[:, None] * sow_s + c[None, :], mask=tm[:, None], other=0.0)
    out = g0[:, None] * oc.to(tl.float32) + g1[:, None] * o_s.to(tl.float32) + g2[:, None] * ow.to(tl.float32)
    tl.store(OUT + ((b * S + t[:, None]) * H + h) * D_V + c[None, :], out.to(OUT.dtype.element_ty),
             mask=tm[:, None])


@triton.jit
def _combine_bwd_kernel(DOUT, LOGITS, OC, OS, OW, DLOGITS, DOC, DOS, DOW, S, H, soc_b, soc_h, soc_s, sos_b, sos_h,
                        sos_s, sow_b, sow_h, sow_s, D_V: tl.constexpr, BLOCK_T: tl.constexpr,
                        SIGMOID: tl.constexpr):
    """dO_c = gate_c * dOUT ([B, S, H, D_V] storage); dLOGITS from dgate_c = rowsum(dOUT * O_c) through the sigmoid
    or the softmax."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, D_V)
    tm = t < S
    lrow = ((b * S + t) * H + h) * 3
    g0, g1, g2 = _gates(LOGITS, lrow, tm, SIGMOID)
    drow = ((b * S + t[:, None]) * H + h) * D_V + c[None, :]
    dout = tl.load(DOUT + drow, mask=tm[:, None], other=0.0).to(tl.float32)
    oc = tl.load(OC + b * soc_b + h * soc_h + t[:, None] * soc_s + c[None, :], mask=tm[:, None], other=0.0)
    o_s = tl.load(OS + b * sos_b + h * sos_h + t[:, None] * sos_s + c[None, :], mask=tm[:, None], other=0.0)
    ow = tl.load(OW + b * sow_b + h * sow_h + t[:, None] * sow_s + c[None, :], mask=tm[:, None], other=0.0)
    dg0 = tl.sum(dout * oc.to(tl.float32), axis=1)
    dg1 = tl.sum(dout * o_s.to(tl.float32), axis=1)
    dg2 = tl.sum(dout * ow.to(tl.float32), axis=1)
    if SIGMOID:
        dz0 = dg0 * g0 * (1.0 - g0)
        dz1 = dg1 * g1 * (1.0 - g1)
        dz2 = dg2 * g2 * (1.0 - g2)
    else:
        dot = g0 * dg0 + g1 * dg1 + g2 * dg2
        dz0 = g0 * (dg0 - dot)
        dz1 = g1 * (dg1 - dot)
        dz2 = g2 * (dg2 - dot)
    tl.store(DLOGITS + lrow, dz0.to(DLOGITS.dtype.element_ty), mask=tm)
    tl.store(DLOGITS + lrow + 1, dz1.to(DLOGITS.dtype.element_ty), mask=tm)
    tl.store(DLOGITS + lrow + 2, dz2.to(DLOGITS.dtype.element_ty), mask=tm)
    tl.store(DOC + drow, (g0[:, None] * dout).to(DOC.dtype.element_ty), mask=tm[:, None])
    tl.store(DOS + drow, (g1[:, None] * dout).to(DOS.dtype.element_ty), mask=tm[:, None])
    tl.store(DOW + drow, (g2[:, None] * dout).to(DOW.dtype.element_ty), mask=tm[:, None])
