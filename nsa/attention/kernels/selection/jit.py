"""The jit side of the block selection (host.py): the importance kernel (the tiled path), its packed-key twin
(the tiled path's "topk" choice), the fused top-k kernel, and the bitonic row sort and importance tile they share. Read host.py's docstring for the design and the GPU
findings."""

import triton
import triton.language as tl

from nsa.attention.kernels.common import LOG2E

_LOG2E = tl.constexpr(LOG2E)  # the kernels' copy (jit code reads only constexpr globals)


# Bitonic sorting along the last dimension of a [rows, 2**LOG_N] tensor, viewed as a hypercube [2] * N_DIMS
# (tl.sort's network). A compare-and-swap finds each element's partner as (pair sum) - element, a plain sum
# reduction over one hypercube axis (wrapping integer arithmetic makes it exact for any int64), where tl.sort
# uses an xor reduction: same cost compiled, but only sum/min/max reductions are vectorised by the interpreter.
@triton.jit
def _indicator(N_DIMS: tl.constexpr, I: tl.constexpr):
    return tl.reshape(tl.arange(0, 2), [1] * (N_DIMS - I - 1) + [2] + [1] * I)

@triton.jit
def _compare_swap(h, flip, I: tl.constexpr, N_DIMS: tl.constexpr):
    y = tl.sum(h, axis=N_DIMS - 1 - I, keep_dims=True) - h
    return tl.where((h > y) != (flip ^ _indicator(N_DIMS, I)), y, h)

@triton.jit
def _merge_hypercube(h, STAGE: tl.constexpr, ORDER: tl.constexpr, N_DIMS: tl.constexpr):
    """ORDER 0: ascending, 1: descending, 2: alternating between runs of 2**STAGE."""
    if ORDER == 2:
        flip = _indicator(N_DIMS, STAGE)
    else:
        flip = ORDER
    for i in tl.static_range(STAGE):
        h = _compare_swap(h, flip, STAGE - 1 - i, N_DIMS)
    return h

@triton.jit
def _sort_rows(x, DESCENDING: tl.constexpr, LOG_N: tl.constexpr, N_DIMS: tl.constexpr):
    h = tl.reshape(x, [2] * N_DIMS)
    for i in tl.static_range(1, LOG_N + 1):
        h = _merge_hypercube(h, i, 2 if i < LOG_N else DESCENDING, N_DIMS)
    return tl.reshape(h, x.shape)

@triton.jit
def _merge_rows(x, DESCENDING: tl.constexpr, LOG_N: tl.constexpr, N_DIMS: tl.constexpr):
    """Sort rows that are bitonic sequences (one merge pass)."""
    h = tl.reshape(x, [2] * N_DIMS)
    h = _merge_hypercube(h, LOG_N, DESCENDING, N_DIMS)
    return tl.reshape(h, x.shape)

@triton.jit
def _overlap_tile(A, B_, BC: tl.constexpr, K: tl.constexpr):
    """Eq. 9's weights [BC, K] of a tile: W[c, j] = stride-d chunks shared by compressed key c0 + c and selection
    block j0 + j. With c0 = j0*A - (B_ - 1) they do not depend on j0: min(c + 1, (j + 1)*A) - max(c - B_ + 1,
    j*A), clamped at 0 (small integers, exact in fp16)."""
    c = tl.arange(0, BC)[:, None]
    j = tl.arange(0, K)[None, :]
    return tl.maximum(tl.minimum(c + 1, (j + 1) * A) - tl.maximum(c - B_ + 1, j * A), 0).to(tl.float16)

@triton.jit
def _importance_tile(q, t_row, lse2, row_ok, R, k_base, stride_kn, stride_kd, n_cmp, d_k, l, d, A, B_, j0,
                     qk_scale, hs_scale, out_scale, W, BC: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr,
                     HEAD_SUM: tl.constexpr, IEEE: tl.constexpr, W_GIVEN: tl.constexpr):
    """Importance [BT_PAD, K] of selection blocks j0 .. j0 + K - 1 for the program's tokens (Eq. 8-10).

    Reads the BC compressed keys c0 = j0*A - (B_ - 1) .. c0 + BC - 1: every key that overlaps selection blocks
    j0 .. j0 + BJ - 1 (A = l_sel/d chunks of stride d per selection block, B_ = l/d per compression block).
    Columns past BJ miss some of their keys; the callers drop them.
    """
    offs_c = j0 * A - (B_ - 1) + tl.arange(0, BC)
    offs_d = tl.arange(0, D_PAD)
    key_ok = (offs_c >= 0) & (offs_c < n_cmp)
    kt = tl.load(k_base + offs_c[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                 mask=key_ok[None, :] & (offs_d[:, None] < d_k), other=0.0)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    # compressed block i is visible to query t iff i*d + l - 1 <= t; p = exp(s * scale - lse), no second pass
    vis = (offs_c[None, :] * d + (l - 1) <= t_row[:, None]) & key_ok[None, :] & row_ok[:, None]
    # p <= 1 given a consistent lse; the clamp at 2 keeps the fp16 split below finite whatever lse_cmp holds
    p = tl.where(vis, tl.exp2(tl.minimum(s * qk_scale - lse2[:, None], 1.0)), 0.0)
    # Eq. 9: block i covers stride-d chunks [i, i + B_), selection block j covers [j*A, (j+1)*A); the weight is
    # the number of chunks they share (a small integer, exact in fp16). The tensor-core products keep ~fp32
    # accuracy by splitting their fp32 operand into fp16 hi + lo parts, scaled by powers of two so that
    # neither overflows nor falls into fp16's subnormals (p <= 1: 8192 * p <= 8192).
    if W_GIVEN:  # the caller's loop-invariant _overlap_tile (the fused kernel)
        w = W
    else:
        offs_j = j0 + tl.arange(0, K)
        w = (tl.minimum(offs_c[:, None] + B_, (offs_j[None, :] + 1) * A)
             - tl.maximum(offs_c[:, None], offs_j[None, :] * A))
        w = tl.maximum(w, 0).to(tl.float16)
    p = p * 8192.0
    p_hi = p.to(tl.float16)
    p_lo = (p - p_hi.to(tl.float32)).to(tl.float16)
    acc = tl.dot(p_hi, w)
    acc = tl.dot(p_lo, w, acc)  # [BM, K]: 8192 * per-head importance, each <= 8192 * min(A, B_)
    if HEAD_SUM:  # Eq. 10: sum the heads of each token, a dot with the 0/1 token-by-row matrix R
        acc = acc * hs_scale  # <= 2^15
        a_hi = acc.to(tl.float16)
        a_lo = (acc - a_hi.to(tl.float32)).to(tl.float16)
        imp = tl.dot(R, a_hi)
        imp = tl.dot(R, a_lo, imp) * out_scale
    else:
        imp = acc * (1.0 / 8192.0)
    return imp

@triton.jit
def _load_rows(q_ptr, lse_ptr, b, g, t0, S, hpg, bt, d_k, sqb, sqh, sqs, sqd, slb, slh, sls,
               BM: tl.constexpr, BT_PAD: tl.constexpr, D_PAD: tl.constexpr, HEAD_SUM: tl.constexpr):
    """The program's query rows (token t0 + r // hpg, head g*hpg + r % hpg), their log2-domain lse, and R."""
    rows = tl.arange(0, BM)
    tok_r = rows // hpg
    t_row = t0 + tok_r
    row_ok = (tok_r < bt) & (t_row < S)
    head = g * hpg + rows % hpg
    offs_d = tl.arange(0, D_PAD)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + head[:, None].to(tl.int64) * sqh + t_row[:, None].to(tl.int64) * sqs
                + offs_d[None, :] * sqd, mask=row_ok[:, None] & (offs_d[None, :] < d_k), other=0.0)
    lse = tl.load(lse_ptr + b.to(tl.int64) * slb + head.to(tl.int64) * slh + t_row.to(tl.int64) * sls, mask=row_ok,
                  other=0.0)
    lse2 = tl.where(row_ok & (lse > float("-inf")), lse * _LOG2E, 0.0)
    tt = tl.arange(0, BT_PAD)  # R[tt, r] = 1 where row r is a head of token tt (unused without HEAD_SUM)
    R = ((tok_r[None, :] == tt[:, None]) & row_ok[None, :]).to(tl.float16)
    return q, t_row, lse2, row_ok, R


@triton.jit
def _token_tile(G, hpg, row0, n_rows, S, BM: tl.constexpr):
    """This program's place in the tiled kernels' grid (token tiles, selection-block tiles, B*G): (its selection-block
    tile pid_j, b, g, its token tile's bt tokens, first token t0 and last token t_last, within row0 + n_rows and S)."""
    pid_t, pid_j, pid_bg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, g = pid_bg // G, pid_bg % G
    bt = BM // hpg
    t0 = row0 + pid_t * bt
    t_last = tl.minimum(t0 + bt, tl.minimum(row0 + n_rows, S)) - 1
    return pid_j, b, g, bt, t0, t_last


@triton.jit
def _blocksel_importance_kernel(q_ptr, k_ptr, lse_ptr, out_ptr, S, G, hpg, n_cmp, n_blocks, d_k, l, d, l_sel, A, B_,
                       bj, row0, n_rows, skip_n, qk_scale, hs_scale, out_scale,
                       sqb, sqh, sqs, sqd, skb, skg, skn, skd, slb, slh, sls, sob, sog, sot,
                       BM: tl.constexpr, BT_PAD: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr,
                       BC: tl.constexpr, HEAD_SUM: tl.constexpr, IEEE: tl.constexpr):
    """Tiled path: importance of queries row0 .. row0 + n_rows - 1 into a zero-filled [B, G, n_rows, n_blocks].

    Grid (token tiles, selection-block tiles, B*G). Tiles whose tokens have not started any of the blocks, or
    whose tokens have at most skip_n started blocks (all kept whatever their importance), return at once.
    """
    pid_j, b, g, bt, t0, t_last = _token_tile(G, hpg, row0, n_rows, S, BM)
    j0 = pid_j * bj
    if (j0 * l_sel > t_last) | (t_last // l_sel + 1 <= skip_n):
        return
    q, t_row, lse2, row_ok, R = _load_rows(q_ptr, lse_ptr, b, g, t0, tl.minimum(row0 + n_rows, S), hpg, bt,
                                            d_k, sqb, sqh, sqs, sqd, slb, slh, sls, BM, BT_PAD, D_PAD, HEAD_SUM)
    k_base = k_ptr + b.to(tl.int64) * skb + g.to(tl.int64) * skg
    imp = _importance_tile(q, t_row, lse2, row_ok, R, k_base, skn, skd, n_cmp, d_k, l, d, A, B_, j0, qk_scale,
                           hs_scale, out_scale, 0, BC, D_PAD, K, HEAD_SUM, IEEE, False)
    tt = tl.arange(0, BT_PAD)
    cols = tl.arange(0, K)
    t_tok = t0 + tt
    ok = ((tt < bt) & (t_tok <= t_last))[:, None] & ((cols < bj) & (j0 + cols < n_blocks))[None, :]
    base = out_ptr + b.to(tl.int64) * sob + g.to(tl.int64) * sog
    tl.store(base + (t_tok - row0)[:, None].to(tl.int64) * sot + (j0 + cols)[None, :], imp, mask=ok)

@triton.jit
def _packed_keys(imp, j, cur):
    """nsa.attention.selection.packed_keys of an importance tile [rows, K]: (monotone_int32(score) << 32) |
    (0xFFFFFFFF - j), the score +inf for the forced blocks (0, cur and cur - 1) and -inf for blocks not started
    (j > cur); j [1, K] the tile's blocks, cur [rows, 1] each row's own block."""
    # monotone int32 of the fp32 score: the bits when >= 0, bits ^ 0x7FFFFFFF when negative; -0.0 as +0.0 and
    # any NaN as the one NaN 0x7FC00000 (above +inf, as torch.sort ranks it)
    bits = tl.where(imp == 0.0, 0, imp.to(tl.int32, bitcast=True))
    bits = tl.where(imp != imp, 0x7FC00000, bits)
    mono = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    mono = tl.where((j == 0) | (j == cur) | (j == cur - 1), 0x7F800000, mono)  # forced: +inf
    mono = tl.where(j > cur, -2139095041, mono)  # not started: -inf (0xFF800000 ^ 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | (0xFFFFFFFF - j.to(tl.int64))

@triton.jit
def _blocksel_keys_kernel(q_ptr, k_ptr, lse_ptr, out_ptr, S, G, hpg, n_cmp, n_blocks, d_k, l, d, l_sel, A, B_,
                          bj, row0, n_rows, skip_n, qk_scale, hs_scale, out_scale,
                          sqb, sqh, sqs, sqd, skb, skg, skn, skd, slb, slh, sls, sob, sog, sot,
                          BM: tl.constexpr, BT_PAD: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr,
                          BC: tl.constexpr, HEAD_SUM: tl.constexpr, IEEE: tl.constexpr):
    """Tiled path, choice "topk": the importance kernel's tile written as packed int64 keys into EVERY entry of
    [B, G, n_rows, n_blocks] (no fill before it, no `where` after it): nsa.attention.selection.packed_keys of the
    importance, key = (monotone_int32(score) << 32) | (0xFFFFFFFF - j), +inf's score for the forced blocks (0,
    t // l_sel and the one before), -inf's for blocks not started. Grid and importance as
    _blocksel_importance_kernel; tiles whose tokens have not started the tile's blocks, or have at most skip_n
    started blocks (all kept whatever their importance), skip the importance and write the keys of importance 0.
    """
    pid_j, b, g, bt, t0, t_last = _token_tile(G, hpg, row0, n_rows, S, BM)
    j0 = pid_j * bj
    if (j0 * l_sel > t_last) | (t_last // l_sel + 1 <= skip_n):
        imp = tl.zeros([BT_PAD, K], tl.float32)
    else:
        q, t_row, lse2, row_ok, R = _load_rows(q_ptr, lse_ptr, b, g, t0, tl.minimum(row0 + n_rows, S), hpg, bt,
                                                d_k, sqb, sqh, sqs, sqd, slb, slh, sls, BM, BT_PAD, D_PAD, HEAD_SUM)
        k_base = k_ptr + b.to(tl.int64) * skb + g.to(tl.int64) * skg
        imp = _importance_tile(q, t_row, lse2, row_ok, R, k_base, skn, skd, n_cmp, d_k, l, d, A, B_, j0, qk_scale,
                               hs_scale, out_scale, 0, BC, D_PAD, K, HEAD_SUM, IEEE, False)
    tt = tl.arange(0, BT_PAD)
    cols = tl.arange(0, K)
    t_tok = t0 + tt
    j = (j0 + cols)[None, :]
    cur = (t_tok // l_sel)[:, None]
    key = _packed_keys(imp, j, cur)
    ok = ((tt < bt) & (t_tok <= t_last))[:, None] & ((cols < bj) & (j0 + cols < n_blocks))[None, :]
    base = out_ptr + b.to(tl.int64) * sob + g.to(tl.int64) * sog
    tl.store(base + (t_tok - row0)[:, None].to(tl.int64) * sot + j, key, mask=ok)

@triton.jit
def _blocksel_topk_kernel(q_ptr, k_ptr, lse_ptr, out_ptr, S, G, hpg, n_cmp, d_k, l, d, l_sel, A, B_, bj, n_sel,
                   qk_scale, hs_scale, out_scale, sqb, sqh, sqs, sqd, skb, skg, skn, skd, slb, slh, sls,
                   BM: tl.constexpr, BT_PAD: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr,
                   BC: tl.constexpr, HEAD_SUM: tl.constexpr, IEEE: tl.constexpr, LOG_K: tl.constexpr,
                   N_DIMS: tl.constexpr):
    """Fused path: importance tile by tile and a running top-K per token; no importance buffer.

    Grid (token tiles, B*G). Each program walks the selection blocks its tokens have started, BJ at a time in
    ascending order, and merges every tile into a per-token list of the K best keys, kept sorted descending.
    A key packs (importance bits << 32) | (2^32 - 1 - j): non-negative fp32 bits order like the floats, so
    keys order by importance, ties to the lower block index: choose_blocks' order exactly. Forced blocks get
    +inf's bits, blocks not yet started (and padding) the key -1. The merge is the bitonic top-K step: the
    new tile sorted ascending, the elementwise max with the descending list is a bitonic sequence holding the
    K best of both, one bitonic merge sorts it. A tile none of whose keys beats its token's K-th key is
    skipped. At the end the first n_sel keys' block indices are sorted ascending, -1 last.
    """
    pid_t, pid_bg = tl.program_id(0), tl.program_id(1)
    b, g = pid_bg // G, pid_bg % G
    if HEAD_SUM:
        bt = BM // hpg
    else:
        bt = BM
    t0 = pid_t * bt
    if t0 >= S:
        return
    t_last = tl.minimum(t0 + bt, S) - 1
    q, t_row, lse2, row_ok, R = _load_rows(q_ptr, lse_ptr, b, g, t0, S, hpg, bt, d_k, sqb, sqh, sqs, sqd,
                                            slb, slh, sls, BM, BT_PAD, D_PAD, HEAD_SUM)
    k_base = k_ptr + b.to(tl.int64) * skb + g.to(tl.int64) * skg
    tt = tl.arange(0, BT_PAD)
    cols = tl.arange(0, K)
    t_tok = t0 + tt
    tok_ok = (tt < bt) & (t_tok < S)
    cur = t_tok // l_sel
    n_started = t_last // l_sel + 1
    need = n_started > n_sel  # else every started block is kept and importance cannot matter
    top = tl.full([BT_PAD, K], -1, tl.int64)
    w = _overlap_tile(A, B_, BC, K)
    # a while loop: triton 3.6's interpreter cannot take a runtime bound in range() under numpy 2
    j0 = 0
    while j0 < n_started:
        if need:
            imp = _importance_tile(q, t_row, lse2, row_ok, R, k_base, skn, skd, n_cmp, d_k, l, d, A, B_, j0,
                                   qk_scale, hs_scale, out_scale, w, BC, D_PAD, K, HEAD_SUM, IEEE, True)
        else:
            imp = tl.zeros([BT_PAD, K], tl.float32)
        j = j0 + cols[None, :]
        ok = tok_ok[:, None] & (cols[None, :] < bj) & (j <= cur[:, None])
        forced = (j == 0) | (j == cur[:, None]) | (j == cur[:, None] - 1)
        bits = tl.where(imp > 0, imp.to(tl.int32, bitcast=True), 0)  # NaN, -0.0 -> 0
        bits = tl.where(forced, 0x7F800000, bits)
        key = (bits.to(tl.int64) << 32) | (0xFFFFFFFF - j.to(tl.int64))
        key = tl.where(ok, key, -1)
        thr = tl.min(top, axis=1)
        if tl.max((key > thr[:, None]).to(tl.int32)) > 0:
            top = _merge_rows(tl.maximum(top, _sort_rows(key, 0, LOG_K, N_DIMS)), 1, LOG_K, N_DIMS)
        j0 += bj
    rank = cols[None, :]
    idx = (0xFFFFFFFF - (top & 0xFFFFFFFF)).to(tl.int32)
    idx = tl.where((top >= 0) & (rank < n_sel), idx, 0x7FFFFFFF)
    idx = _sort_rows(idx, 0, LOG_K, N_DIMS)  # ascending, the empty slots last
    blocks = tl.where(idx == 0x7FFFFFFF, -1, idx).to(tl.int64)
    out = out_ptr + ((b * G + g).to(tl.int64) * S + t_tok[:, None]) * n_sel + rank
    tl.store(out, blocks, mask=tok_ok[:, None] & (rank < n_sel))


@triton.jit
def _blocksel_finish_kernel(top_ptr, out_ptr, n_rows, rows, k, n_sel, sog, sot, row0,
                            BLOCK_R: tl.constexpr, K_PAD: tl.constexpr, LOG_K: tl.constexpr,
                            N_DIMS: tl.constexpr):
    """Tiled path, choice "topk": torch.topk's n_sel best packed keys of each row -> the row's blocks, in one launch
    (nsa.attention.selection.blocks_from_keys' masked_fill, sort, pad, masked_fill and the copy into the output).

    top [n_rows, k] int64 (topk's values, any order within a row; row r = (bg, t): bg = r // rows, t = r % rows);
    out [B*G, S, n_sel] int64 with strides (sog, sot, 1), rows row0 .. row0 + rows - 1 written. A key's block is
    0xFFFFFFFF - its low half; a key whose high half (the monotone score) is -inf's or below is an empty slot, as
    are the columns k .. n_sel - 1 (fewer blocks than n_sel): the blocks ascending, -1 last. Grid cdiv(n_rows,
    BLOCK_R); K_PAD = 2**LOG_K >= n_sel, N_DIMS = log2(BLOCK_R * K_PAD) (the bitonic sort's hypercube).
    """
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, K_PAD)
    row_ok = r < n_rows
    ok = row_ok[:, None] & (c < k)[None, :]
    key = tl.load(top_ptr + r[:, None].to(tl.int64) * k + c[None, :], mask=ok, other=0)
    # an empty slot: score -inf (monotone -2139095041: not started, or -inf importance); block indices fit in int32
    full = ok & ((key >> 32) > -2139095041)
    idx = (0xFFFFFFFF - (key & 0xFFFFFFFF)).to(tl.int32)
    big = 0x3FFFFFFF  # above any block index; two of them sum without wrapping in the sort's partner sums
    idx = _sort_rows(tl.where(full, idx, big), 0, LOG_K, N_DIMS)  # ascending, the empty slots last
    blocks = tl.where(idx == big, -1, idx).to(tl.int64)
    bg, t = r // rows, r % rows
    dst = out_ptr + bg.to(tl.int64)[:, None] * sog + (row0 + t).to(tl.int64)[:, None] * sot + c[None, :]
    tl.store(dst, blocks, mask=row_ok[:, None] & (c < n_sel)[None, :])


@triton.jit
def _store_tile(imp, base, t_tok, row0, sot, rows_ok, cur, j0, bj, n_blocks, K: tl.constexpr, KEYS: tl.constexpr):
    """Store one importance tile [BT_PAD, K] (KEYS False) or its packed keys (_packed_keys, as _blocksel_keys_kernel
    writes them) at blocks j0 .. j0 + bj - 1 of the rows t_tok - row0."""
    cols = tl.arange(0, K)
    j = (j0 + cols)[None, :]
    ok = rows_ok[:, None] & ((cols < bj) & (j0 + cols < n_blocks))[None, :]
    dst = base + (t_tok - row0)[:, None].to(tl.int64) * sot + j
    if KEYS:
        tl.store(dst, _packed_keys(imp, j, cur), mask=ok)
    else:
        tl.store(dst, imp, mask=ok)


@triton.jit
def _blocksel_rows_kernel(q_ptr, k_ptr, lse_ptr, out_ptr, S, G, hpg, n_cmp, n_blocks, d_k, l, d, l_sel, A, B_,
                          bj, row0, n_rows, skip_n, jt, qk_scale, hs_scale, out_scale,
                          sqb, sqh, sqs, sqd, skb, skg, skn, skd, slb, slh, sls, sob, sog, sot,
                          BM: tl.constexpr, BT_PAD: tl.constexpr, D_PAD: tl.constexpr, K: tl.constexpr,
                          BC: tl.constexpr, HEAD_SUM: tl.constexpr, IEEE: tl.constexpr, KEYS: tl.constexpr):
    """Tiled path, importance choices "rows8" and "rows" (host.IMPORTANCE_CHOICES): what _blocksel_importance_kernel
    (KEYS False) or _blocksel_keys_kernel (KEYS True) writes, with each program walking `jt` selection tiles of its
    tokens in a loop instead of one: the query rows, their lse, the head-sum matrix R and the overlap tile W are
    loaded or built once per program (W before the loop: the fused kernel's ptxas 3.6 finding), and the loop over
    the tiles that need the importance has no branch. The one-tile kernel reloads all of them for every tile: at S
    65,536 on an H200 it ran at 10.6% of its floor (reports/gpu/2026-11-30-h200). The price is occupancy: compiled
    as the GPU's JIT compiles the model's launch (integer arguments that are multiples of 16 specialised), triton 3.6
    gives this loop 149 registers (KEYS 1: 171), one CTA of 8 warps per SM, where the one-tile importance kernel takes
    77 (3 CTAs) and the keys kernel 95 (2): reports/aot/selection_importance_rows.md. The loads are not pipelined
    across tiles (num_stages 1, as the one-tile kernels); the A/B (bench_choices) decides.

    Launched at hpg 1 and hpg >= 4 only (the host falls back to the one-tile kernels at hpg 2-3): with 64 token rows
    (hpg 2-3) the head sum R @ acc becomes a wgmma, and triton 3.6's ptxas then reads a uniform register of a wgmma
    descriptor before writing it in the loop's preheader (the fused kernel's H100 fault; the compiled-code test in
    test_triton_selection.py found it here too, R rebuilt inside the loop or not). At hpg 1 and 6 it compiles clean.

    Grid (token tiles, cdiv(tiles, jt), B*G): program (t, p) takes selection tiles p*jt .. p*jt + jt - 1. The tiles
    holding a block its tokens have started get the importance, unless its tokens have at most skip_n started
    blocks (all kept whatever their importance); KEYS False: the other tiles are not visited (the buffer is
    zero-filled), as the one-tile kernel; KEYS True: they are written with importance 0 (the keys kernel's contract:
    every entry written, no fill before it).
    """
    pid_j, b, g, bt, t0, t_last = _token_tile(G, hpg, row0, n_rows, S, BM)
    live = t_last // l_sel + 1 > skip_n
    tt = tl.arange(0, BT_PAD)
    t_tok = t0 + tt
    rows_ok = (tt < bt) & (t_tok <= t_last)
    cur = (t_tok // l_sel)[:, None]
    base = out_ptr + b.to(tl.int64) * sob + g.to(tl.int64) * sog
    i0 = pid_j * jt
    i_end = tl.minimum(i0 + jt, tl.cdiv(n_blocks, bj))
    i_started = tl.minimum(i_end, t_last // (l_sel * bj) + 1)  # tiles i0 .. i_started - 1 hold a started block
    i_zero = i0  # first tile written with importance 0 (KEYS)
    if live:
        q, t_row, lse2, row_ok, R = _load_rows(q_ptr, lse_ptr, b, g, t0, tl.minimum(row0 + n_rows, S), hpg, bt,
                                                d_k, sqb, sqh, sqs, sqd, slb, slh, sls, BM, BT_PAD, D_PAD, HEAD_SUM)
        k_base = k_ptr + b.to(tl.int64) * skb + g.to(tl.int64) * skg
        w = _overlap_tile(A, B_, BC, K)
        # while loops: triton 3.6's interpreter cannot take a bound computed in the kernel in range() under numpy 2
        i = i0
        while i < i_started:
            imp = _importance_tile(q, t_row, lse2, row_ok, R, k_base, skn, skd, n_cmp, d_k, l, d, A, B_, i * bj,
                                   qk_scale, hs_scale, out_scale, w, BC, D_PAD, K, HEAD_SUM, IEEE, True)
            _store_tile(imp, base, t_tok, row0, sot, rows_ok, cur, i * bj, bj, n_blocks, K, KEYS)
            i += 1
        i_zero = tl.maximum(i0, i_started)
    if KEYS:
        zero = tl.zeros([BT_PAD, K], tl.float32)
        i = i_zero
        while i < i_end:
            _store_tile(zero, base, t_tok, row0, sot, rows_ok, cur, i * bj, bj, n_blocks, K, KEYS)
            i += 1
