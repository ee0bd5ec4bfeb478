"""Vectorized attention kernels for the batched prefill path, in plain PyTorch (CPU and CUDA).

Shapes: queries [B, H, S, d_k]; keys/values [B, G, T, d] with H = G * heads_per_group and head h in group
h // heads_per_group. No kernel loops in Python over batch, positions, heads or groups.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nsa.geometry import cmp_visible_counts

# Query rows per SDPA chunk of the sliding-window kernel: 64 measured fastest on CPU at w=512 (see benchmarks/).
WINDOW_CHUNK = 64
# (query, block) pairs per GEMM tile of the selected-branch kernel.
SEL_TILE = 64


def _sdpa(q, k, v, mask=None, causal=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=q.shape[1] != k.shape[1])


def cmp_mask(s: int, n_cmp: int, l: int, d: int, device) -> torch.Tensor:
    """[s, n_cmp] bool: compression block i is visible to query t (it ended at or before t)."""
    t = torch.arange(s, device=device).unsqueeze(1)
    i = torch.arange(n_cmp, device=device).unsqueeze(0)
    return i * d + l - 1 <= t


def compressed_attention(q, k_cmp, v_cmp, l: int, d: int) -> torch.Tensor:
    """Attention of every query over the compression blocks it can see; exactly 0 where it sees none."""
    b, h, s, _ = q.shape
    n_cmp = k_cmp.shape[2]
    if n_cmp == 0:
        return q.new_zeros(b, h, s, v_cmp.shape[-1])
    mask = cmp_mask(s, n_cmp, l, d, q.device)
    seen = mask.any(dim=1)
    # Rows that see nothing would be all -inf (NaN); give them block 0 and zero their output afterwards.
    mask = mask.clone()
    mask[:, 0] |= ~seen
    out = _sdpa(q, k_cmp, v_cmp, mask)
    return out * seen.to(out.dtype).view(1, 1, s, 1)


def cmp_probabilities(q, k_cmp, l: int, d: int) -> torch.Tensor:
    """[B, H, S, n_cmp] fp32 softmax over each query's visible compression blocks (rows with none are 0)."""
    b, h, s, d_k = q.shape
    g = k_cmp.shape[1]
    qf = q.detach().float().view(b, g, h // g, s, d_k)
    scores = qf @ k_cmp.detach().float().unsqueeze(2).transpose(-1, -2) / math.sqrt(d_k)
    mask = cmp_mask(s, k_cmp.shape[2], l, d, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(probs, nan=0.0).view(b, h, s, -1)


def window_attention(q, k, v, w: int, chunk: int = WINDOW_CHUNK) -> torch.Tensor:
    """Sliding-window attention: query t attends to keys (t - w, t]."""
    b, h, s, d_k = q.shape
    g = k.shape[1]
    if s <= w:
        return _sdpa(q, k, v, causal=True)  # square causal mask: t sees [0, t]
    c = min(chunk, s)
    n_chunks = -(-s // c)
    tail = n_chunks * c - s
    qp = F.pad(q, (0, 0, 0, tail))
    # Chunk n holds queries [n*c, n*c + c) and keys [n*c - w, n*c + c) (front padding stands for positions < 0).
    kw = F.pad(k, (0, 0, w, tail)).unfold(2, w + c, c).transpose(-1, -2)
    vw = F.pad(v, (0, 0, w, tail)).unfold(2, w + c, c).transpose(-1, -2)
    qc = qp.view(b, h, n_chunks, c, d_k).transpose(1, 2).reshape(b * n_chunks, h, c, d_k)
    kw = kw.transpose(1, 2).reshape(b * n_chunks, g, w + c, d_k)
    vw = vw.transpose(1, 2).reshape(b * n_chunks, g, w + c, v.shape[-1])
    r = torch.arange(c, device=q.device).view(1, c, 1)
    j = torch.arange(w + c, device=q.device).view(1, 1, w + c)
    n = torch.arange(n_chunks, device=q.device).view(n_chunks, 1, 1)
    mask = (j > r) & (j <= r + w) & (j >= w - n * c)  # key position n*c - w + j in (t - w, t], >= 0
    out = _sdpa(qc, kw, vw, mask.repeat(b, 1, 1).unsqueeze(1))
    out = out.view(b, n_chunks, h, c, -1).transpose(1, 2).reshape(b, h, n_chunks * c, -1)
    return out[:, :, :s]


def selected_attention(q, k, v, ranges, l_sel: int, tile: int = SEL_TILE) -> torch.Tensor:
    """Block-sparse attention of each query over its own selected token ranges.

    q: [B, H, S, d_k]; k, v: [B, G, S, d]; ranges: [B, G, S, n_sel, 2] of [start, end) per slot (end <= start:
    empty slot), as built by nsa.selection: block-aligned starts, a block's range ends at the block end except the
    query's own block, which ends at t + 1. Every query's own block must be among its ranges.

    Two parts share one softmax per (query, head):
    - band: the query's own block and the one before it (both always selected, the only ones that can be partial)
      as a dense block-banded product with a causal mask, each query block against 2*l_sel keys;
    - sparse: every other selected block. The (query, block) pairs are sorted by block and cut into tiles of
      `tile` pairs sharing one key block, so each tile is one GEMM of (tile * heads_per_group) query rows against
      l_sel keys: queries are gathered (d_k floats a head), not keys (l_sel * d_k floats a block), and no mask is
      needed. Rows combine with scatter-max / index-add.
    Cost is linear in S * n_sel * l_sel.
    """
    b, h, s, d_k = q.shape
    g, d_v = k.shape[1], v.shape[-1]
    hpg = h // g
    n_sel = ranges.shape[-2]
    dev = q.device
    acc = torch.promote_types(q.dtype, torch.float32)  # softmax statistics and sums: fp32 or better
    nb = -(-s // l_sel)
    sp = nb * l_sel
    t = torch.arange(s, device=dev)
    cur = torch.div(t, l_sel, rounding_mode="floor")

    start, end = ranges[..., 0], ranges[..., 1]
    nonempty = end > start
    block = torch.div(start, l_sel, rounding_mode="floor")
    cur_b = cur.view(1, 1, s, 1)
    own = nonempty & (block == cur_b)
    prev = nonempty & (block == cur_b - 1)
    other = nonempty & ~own & ~prev
    if not bool(own.any(-1).all()):
        raise ValueError("selected_attention: every query's own block must be among its ranges")
    if bool((own & (end != t.view(1, 1, s, 1) + 1)).any()) or bool((nonempty & ~own & (end != start + l_sel)).any()):
        raise ValueError("selected_attention: ranges must be whole blocks, the query's own block ending at t + 1")

    qs = (q * (1.0 / math.sqrt(d_k))).view(b, g, hpg, s, d_k).transpose(2, 3)  # [B, G, S, hpg, d_k]
    kp = F.pad(k, (0, 0, 0, sp - s)).view(b, g, nb, l_sel, d_k)
    vp = F.pad(v, (0, 0, 0, sp - s)).view(b, g, nb, l_sel, d_v)

    # band part: query block J against key blocks J-1 and J
    kb = torch.cat((F.pad(kp, (0, 0, 0, 0, 1, 0))[:, :, :nb], kp), dim=3)  # [B, G, nb, 2*l_sel, d_k]
    vb = torch.cat((F.pad(vp, (0, 0, 0, 0, 1, 0))[:, :, :nb], vp), dim=3)
    qb = F.pad(qs, (0, 0, 0, 0, 0, sp - s)).reshape(b, g, nb, l_sel * hpg, d_k)
    s_band = (qb @ kb.transpose(-1, -2)).to(acc).view(b, g, nb, l_sel, hpg, 2 * l_sel)
    r = torch.arange(l_sel, device=dev).view(1, l_sel, 1)
    c = torch.arange(2 * l_sel, device=dev).view(1, 1, 2 * l_sel)
    jb = torch.arange(nb, device=dev).view(nb, 1, 1)
    use_prev = F.pad(prev.any(-1), (0, sp - s)).view(b, g, nb, l_sel, 1)
    use_own = F.pad(own.any(-1), (0, sp - s)).view(b, g, nb, l_sel, 1)
    band_mask = (((c < l_sel) & (jb > 0)) & use_prev) | ((c >= l_sel) & (c - l_sel <= r) & use_own)
    s_band = s_band.masked_fill(~band_mask.unsqueeze(-2), float("-inf"))

    # sparse part: the other selected blocks, tiled by key block
    pair = torch.nonzero(other.reshape(-1)).squeeze(1)
    query = torch.div(pair, n_sel, rounding_mode="floor")  # (b*G + g)*S + t
    blk = torch.div(query, s, rounding_mode="floor") * nb + block.reshape(-1)[pair]
    order = torch.argsort(blk, stable=True)
    blk, query = blk[order], query[order]
    counts = torch.bincount(blk, minlength=b * g * nb)
    tiles_per_block = torch.div(counts + tile - 1, tile, rounding_mode="floor")
    tile_block = torch.repeat_interleave(torch.arange(b * g * nb, device=dev), tiles_per_block)
    n_tiles = tile_block.shape[0]
    rank = torch.arange(blk.shape[0], device=dev) - (torch.cumsum(counts, 0) - counts)[blk]
    row = (torch.cumsum(tiles_per_block, 0) - tiles_per_block)[blk] * tile + rank
    n_query = b * g * s  # padding rows read an extra all-zero query and are summed into it, never read back
    row_query = torch.full((n_tiles * tile,), n_query, dtype=torch.long, device=dev)
    row_query[row] = query
    q_rows = torch.cat((qs.reshape(n_query, hpg, d_k), qs.new_zeros(1, hpg, d_k))).index_select(0, row_query)
    k_tiles = kp.reshape(-1, l_sel, d_k).index_select(0, tile_block)
    v_tiles = vp.reshape(-1, l_sel, d_v).index_select(0, tile_block)
    s_sparse = torch.bmm(q_rows.view(n_tiles, tile * hpg, d_k), k_tiles.transpose(1, 2)).to(acc)

    # one softmax across both parts; the max only stabilises, so it carries no gradient
    with torch.no_grad():
        m = s_band.amax(dim=-1).reshape(b * g, sp, hpg)[:, :s].reshape(n_query, hpg)
        m = torch.cat((m, m.new_zeros(1, hpg)))
        m.scatter_reduce_(0, row_query.unsqueeze(1).expand(-1, hpg), s_sparse.view(-1, hpg, l_sel).amax(-1),
                          reduce="amax")
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    m_band = F.pad(m[:n_query].view(b, g, s, hpg), (0, 0, 0, sp - s)).view(b, g, nb, l_sel, hpg, 1)
    w_band = torch.exp(s_band - m_band)
    w_sparse = torch.exp(s_sparse.view(-1, hpg, l_sel) - m.index_select(0, row_query).unsqueeze(-1))
    z = torch.zeros(n_query + 1, hpg, dtype=acc, device=dev).index_add(0, row_query, w_sparse.sum(-1))
    u = torch.bmm(w_sparse.view(n_tiles, tile * hpg, l_sel).to(v.dtype), v_tiles).to(acc)
    u = torch.zeros(n_query + 1, hpg, d_v, dtype=acc, device=dev).index_add(0, row_query, u.view(-1, hpg, d_v))
    u_band = (w_band.view(b, g, nb, l_sel * hpg, 2 * l_sel).to(v.dtype) @ vb).to(acc)
    u_band = u_band.view(b * g, sp, hpg, d_v)[:, :s].reshape(n_query, hpg, d_v)
    z_band = w_band.sum(-1).view(b * g, sp, hpg)[:, :s].reshape(n_query, hpg)
    out = (u[:n_query] + u_band) / (z[:n_query] + z_band).unsqueeze(-1)
    return out.to(q.dtype).view(b, g, s, hpg, d_v).transpose(2, 3).reshape(b, h, s, d_v)
