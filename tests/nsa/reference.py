"""Independent dense reference for the NSA tests.

Everything here is written from the specification only and deliberately
plainly (explicit masks, explicit overlap counting, Python loops for the
block choice).  Nothing in this file imports or mirrors the implementation
under test: the tests feed it the projected tensors returned by the public
``attn.project(x)`` hook and compare the implementation's branch outputs
against it.

Conventions (0-based positions):
  * compressed block i covers tokens [i*d, i*d + l) and is visible to query t
    iff i*d + l - 1 <= t;
  * sliding window: key j is visible to query t iff t - w < j <= t;
  * selection block j covers tokens [j*l_sel, (j+1)*l_sel).
"""

from __future__ import annotations

import math

import torch

# ---------------------------------------------------------------------------
# Dense masked softmax attention
# ---------------------------------------------------------------------------


def masked_attention(q, k, v, mask, scale=None, out_dtype=None):
    """softmax(q k^T * scale + log(mask)) v, computed in float64.

    q: [..., Sq, dk], k: [..., Sk, dk], v: [..., Sk, dv], mask: boolean,
    broadcastable to [..., Sq, Sk].  Rows whose mask is empty give exactly 0.
    Result is cast to ``out_dtype`` (default: q.dtype).
    """
    out_dtype = q.dtype if out_dtype is None else out_dtype
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    q64, k64, v64 = q.double(), k.double(), v.double()
    sq, sk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if sk == 0:
        return torch.zeros(*lead, sq, dv, dtype=out_dtype, device=q.device)
    scores = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    mask = torch.as_tensor(mask, device=q.device).bool()
    mask = mask.expand(scores.shape)
    scores = scores.masked_fill(~mask, float("-inf"))
    row_has_key = mask.any(dim=-1, keepdim=True)
    # Empty rows: replace the all -inf row by zeros so softmax is finite, then
    # zero the probabilities with the mask -> exact 0 output for that row.
    scores = torch.where(row_has_key, scores, torch.zeros_like(scores))
    probs = torch.softmax(scores, dim=-1) * mask.double()
    out = torch.matmul(probs, v64)
    return out.to(out_dtype)


def expand_groups(t, n_heads):
    """[B, G, ...] -> [B, H, ...]; head h uses group h // (H // G)."""
    g = t.shape[1]
    assert n_heads % g == 0
    return t.repeat_interleave(n_heads // g, dim=1)


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------


def causal_mask(s, device=None):
    """[S, S]: key j visible to query t iff j <= t."""
    t = torch.arange(s, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    return j <= t


def window_mask(s, w, device=None):
    """[S, S]: key j visible to query t iff t - w < j <= t."""
    t = torch.arange(s, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    return (j <= t) & (j > t - w)


def num_cmp_blocks(s, l, d):
    return (s - l) // d + 1 if s >= l else 0


def cmp_visible_mask(s, n_cmp, l, d, device=None):
    """[S, n_cmp]: compressed block i visible to query t iff i*d + l - 1 <= t."""
    m = torch.zeros(s, n_cmp, dtype=torch.bool, device=device)
    for t in range(s):
        for i in range(n_cmp):
            if i * d + l - 1 <= t:
                m[t, i] = True
    return m


def selection_mask_from_blocks(blocks, s, l_sel):
    """blocks: [B, G, S, n] LongTensor of chosen block indices (-1 = padding).

    Returns [B, G, S, S] bool: token p visible to query t iff p // l_sel is one
    of blocks[b, g, t, :] and p <= t.
    """
    blocks = blocks.long()
    device = blocks.device
    p_block = torch.arange(s, device=device) // l_sel  # [S]
    # in_set[b,g,t,p] = any_k blocks[b,g,t,k] == p_block[p]   (-1 never matches)
    in_set = (blocks[..., :, None] == p_block[None, None, None, None, :]).any(dim=-2)
    return in_set & causal_mask(s, device=device)[None, None]


# ---------------------------------------------------------------------------
# Branch references
# ---------------------------------------------------------------------------


def ref_compressed(q, k_cmp, v_cmp, l, d):
    """q [B,H,S,dk], k_cmp [B,G,n,dk], v_cmp [B,G,n,dv] -> [B,H,S,dv]."""
    b, h, s, _ = q.shape
    n = k_cmp.shape[2]
    mask = cmp_visible_mask(s, n, l, d, device=q.device)
    return masked_attention(q, expand_groups(k_cmp, h), expand_groups(v_cmp, h), mask)


def ref_window(q, k_win, v_win, w):
    h, s = q.shape[1], q.shape[2]
    mask = window_mask(s, w, device=q.device)
    return masked_attention(q, expand_groups(k_win, h), expand_groups(v_win, h), mask)


def ref_causal(q, k, v):
    h, s = q.shape[1], q.shape[2]
    mask = causal_mask(s, device=q.device)
    return masked_attention(q, expand_groups(k, h), expand_groups(v, h), mask)


def ref_selected(q, k_sel, v_sel, blocks, l_sel):
    """Selected branch with ONE block list per (b, group, t) shared by the group."""
    h, s = q.shape[1], q.shape[2]
    mask = selection_mask_from_blocks(blocks, s, l_sel)  # [B, G, S, S]
    mask = expand_groups(mask, h)  # [B, H, S, S]
    return masked_attention(q, expand_groups(k_sel, h), expand_groups(v_sel, h), mask)


def combine_gated(gates, cmp, sel, win):
    """gates [B,S,H,3] (cmp, sel, win); branches [B,H,S,dv] -> o [B,S,H*dv]."""
    g = gates.permute(0, 2, 1, 3).to(cmp.dtype)  # [B,H,S,3]
    o = g[..., 0:1] * cmp + g[..., 1:2] * sel + g[..., 2:3] * win  # [B,H,S,dv]
    b, h, s, dv = o.shape
    return o.permute(0, 2, 1, 3).reshape(b, s, h * dv)


# ---------------------------------------------------------------------------
# Independent selection reference (paper Eq. 9 / Eq. 10 + forced blocks)
# ---------------------------------------------------------------------------


def overlap_chunks(i, j, l, d, l_sel):
    """ov(i, j) = |[i*d, i*d+l) ∩ [j*l_sel, (j+1)*l_sel)| / d, counted explicitly."""
    a0, a1 = i * d, i * d + l
    b0, b1 = j * l_sel, (j + 1) * l_sel
    shared = 0
    for tok in range(a0, a1):
        if b0 <= tok < b1:
            shared += 1
    assert shared % d == 0, (i, j, shared, d)
    return shared // d


def selection_importance(q, k_cmp, cfg):
    """Block importance, float64 [B, G, S, n_blocks] with n_blocks = ceil(S/l_sel).

    importance[b, g, t, j] = sum_{h in g} sum_{i visible to t} p_cmp[h, t, i] * ov(i, j)
    where p_cmp[h, t, :] is the softmax over the VISIBLE compressed blocks of
    q_t . k_cmp_i / sqrt(d_k).  Zero everywhere when no block is visible.
    """
    l, d, l_sel = cfg.l, cfg.d, cfg.l_sel
    b, h, s, dk = q.shape
    g = k_cmp.shape[1]
    hpg = h // g
    n_cmp = k_cmp.shape[2]
    n_blk = -(-s // l_sel)
    ov = torch.zeros(max(n_cmp, 0), n_blk, dtype=torch.float64)
    for i in range(n_cmp):
        for j in range(n_blk):
            ov[i, j] = overlap_chunks(i, j, l, d, l_sel)
    ov = ov.to(q.device)
    q64 = q.double()
    k64 = expand_groups(k_cmp.double(), h)  # [B,H,n_cmp,dk]
    imp = torch.zeros(b, g, s, n_blk, dtype=torch.float64, device=q.device)
    for t in range(s):
        n_vis = sum(1 for i in range(n_cmp) if i * d + l - 1 <= t)
        if n_vis == 0:
            continue
        logits = (q64[:, :, t, None, :] * k64[:, :, :n_vis, :]).sum(-1) / math.sqrt(dk)
        p = torch.softmax(logits, dim=-1)  # [B,H,n_vis]
        imp_h = p @ ov[:n_vis]  # [B,H,n_blk]
        imp[:, :, t] = imp_h.reshape(b, g, hpg, n_blk).sum(dim=2)
    return imp


def forced_blocks(t, l_sel):
    cur = t // l_sel
    out = {0, cur}
    if cur - 1 >= 0:
        out.add(cur - 1)
    return out


def reference_selected_blocks(q, k_cmp, cfg, importance=None):
    """[B, G, S, n_sel] LongTensor, ascending, -1 padded (spec of selected_blocks)."""
    if importance is None:
        importance = selection_importance(q, k_cmp, cfg)
    imp = importance.cpu()
    b_sz, g_sz, s, _ = imp.shape
    n_sel, l_sel = cfg.n_sel, cfg.l_sel
    out = torch.full((b_sz, g_sz, s, n_sel), -1, dtype=torch.long)
    for b in range(b_sz):
        for g in range(g_sz):
            for t in range(s):
                n_valid = t // l_sel + 1
                forced = forced_blocks(t, l_sel)
                row = imp[b, g, t].tolist()
                order = sorted(range(n_valid), key=lambda j: (j not in forced, -row[j], j))
                chosen = sorted(order[:n_sel])
                out[b, g, t, : len(chosen)] = torch.tensor(chosen, dtype=torch.long)
    return out.to(q.device)


def selection_discrepancies(actual, importance, cfg, tol):
    """Compare an implementation's block choice with the reference choice.

    Returns a list of human-readable problems.  A choice that differs from the
    reference is only accepted when the swapped blocks are a near-tie: every
    reference-chosen block missing from ``actual`` has importance at most
    ``tol`` above every block ``actual`` chose instead.  Structural
    requirements (forced blocks, count, validity, sorting, padding) are exact.
    """
    problems = []
    imp = importance.cpu()
    act = actual.cpu()
    b_sz, g_sz, s, n_sel = act.shape
    l_sel = cfg.l_sel
    for b in range(b_sz):
        for g in range(g_sz):
            for t in range(s):
                row = act[b, g, t].tolist()
                n_valid = t // l_sel + 1
                n_expect = min(n_sel, n_valid)
                chosen = [x for x in row if x != -1]
                where = f"(b={b}, g={g}, t={t}) got {row}"
                if row[: len(chosen)] != chosen or any(x != -1 for x in row[len(chosen):]):
                    problems.append(f"{where}: -1 padding not at the end")
                    continue
                if len(chosen) != n_expect:
                    problems.append(f"{where}: expected {n_expect} blocks")
                    continue
                if chosen != sorted(set(chosen)):
                    problems.append(f"{where}: not strictly ascending / duplicates")
                    continue
                if any(x < 0 or x >= n_valid for x in chosen):
                    problems.append(f"{where}: block outside 0..{n_valid - 1}")
                    continue
                forced = forced_blocks(t, l_sel)
                if not forced <= set(chosen):
                    problems.append(f"{where}: forced blocks {sorted(forced)} missing")
                    continue
                irow = imp[b, g, t].tolist()
                order = sorted(range(n_valid), key=lambda j: (j not in forced, -irow[j], j))
                expect = set(order[:n_sel])
                got = set(chosen)
                if got == expect:
                    continue
                missing = expect - got
                extra = got - expect
                gap = max(irow[j] for j in missing) - min(irow[j] for j in extra)
                if gap > tol:
                    problems.append(
                        f"{where}: reference {sorted(expect)}; missing {sorted(missing)} "
                        f"(importance {[round(irow[j], 6) for j in sorted(missing)]}) vs extra "
                        f"{sorted(extra)} (importance {[round(irow[j], 6) for j in sorted(extra)]})"
                    )
    return problems


# ---------------------------------------------------------------------------
# Decode read accounting (formula from the spec)
# ---------------------------------------------------------------------------


def ref_decode_reads(ctx, l, d, l_sel, n_sel, w):
    n_cmp = (ctx - l) // d + 1 if ctx >= l else 0
    n_blk = -(-ctx // l_sel)
    if n_blk <= n_sel:
        sel = ctx
    else:
        sel = (n_sel - 1) * l_sel + (ctx - (n_blk - 1) * l_sel)
    return n_cmp + sel + min(w, ctx)


def counted_decode_reads(ctx, blocks_row, l, d, l_sel, w):
    """Reads for the query at position ctx-1 counted from an explicit block list."""
    t = ctx - 1
    n_cmp = num_cmp_blocks(ctx, l, d)
    sel = 0
    for j in blocks_row:
        if j < 0:
            continue
        sel += sum(1 for p in range(j * l_sel, (j + 1) * l_sel) if p <= t)
    win = sum(1 for p in range(ctx) if t - w < p <= t)
    return n_cmp + sel + win
