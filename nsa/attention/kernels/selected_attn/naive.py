"""The selected branch in plain PyTorch (CPU and CUDA): block-sparse attention of each query over its selected
token ranges, the CPU path and the reference the Triton kernels (host.py, jit.py) are tested against.

Shapes: queries [B, H, S, d_k]; keys/values [B, G, S, d] with H = G * heads_per_group and head h in group
h // heads_per_group. The only loops are over chunks of at most common.SCORE_CHUNK scores.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nsa.attention.kernels import common

# (query, block) pairs per GEMM tile of the selected-branch kernel.
SEL_TILE = 64


class _SparseBlocks(torch.autograd.Function):
    """The sparse part of selected attention: (query, key block) pairs tiled by key block.

    For tiles of `tile` pairs that share one key block: scores = q_rows @ k_block^T, w = exp(scores - m[query]),
    u[query] += w @ v_block, z[query] += sum(w), where m is the per-query maximum over these scores and `m_floor`
    (the other part's maximum); m is returned, non-differentiable, so the caller stabilises with the same value.

    Flash-style: tiles are processed in chunks of at most common.SCORE_CHUNK score entries with an online softmax (the
    accumulators are rescaled when a query's maximum grows), and backward recomputes each chunk's scores instead
    of saving them. No (pairs * heads * l_sel)-sized tensor is ever allocated, so memory stays flat in S and the
    allocator never has to map (and the kernel zero-fill) hundreds of MB per step; autograd over the same
    expressions made about twenty passes over such tensors.
    """

    @staticmethod
    def _chunks(tile_block, row_query, tile, per_tile):
        step = max(1, common.SCORE_CHUNK // per_tile)
        for c0 in range(0, tile_block.shape[0], step):
            c1 = min(c0 + step, tile_block.shape[0])
            yield tile_block[c0:c1], row_query[c0 * tile: c1 * tile]

    @staticmethod
    def _scores(q, k_blocks, tb, rq, tile, dtype):
        """Scores of one chunk of tiles as [rows, hpg, l_sel]: each tile's query rows against its key block."""
        nt, hpg, d_k = tb.shape[0], q.shape[1], q.shape[-1]
        q_rows = q.index_select(0, rq).view(nt, tile * hpg, d_k)
        scores = torch.bmm(q_rows, k_blocks.index_select(0, tb).transpose(1, 2))
        return scores.to(dtype).view(-1, hpg, k_blocks.shape[1]), q_rows

    @staticmethod
    def forward(ctx, q, k_blocks, v_blocks, m_floor, row_query, tile_block, tile):
        l_sel, (n_q, hpg, _), d_v = k_blocks.shape[1], q.shape, v_blocks.shape[-1]
        acc = m_floor.dtype
        m = m_floor.clone()
        z = torch.zeros_like(m)
        u = torch.zeros(n_q, hpg, d_v, dtype=acc, device=q.device)
        for tb, rq in _SparseBlocks._chunks(tile_block, row_query, tile, tile * hpg * l_sel):
            nt = tb.shape[0]
            w, _ = _SparseBlocks._scores(q, k_blocks, tb, rq, tile, acc)
            m_new = m.clone().scatter_reduce_(0, rq.unsqueeze(1).expand(-1, hpg), w.amax(-1), reduce="amax")
            grow = torch.exp(m - m_new)  # rescale what was accumulated under the old maximum
            u.mul_(grow.unsqueeze(-1))
            z.mul_(grow)
            m = m_new
            w.sub_(m.index_select(0, rq).unsqueeze(-1)).exp_()
            z.index_add_(0, rq, w.sum(-1))
            pv = torch.bmm(w.view(nt, tile * hpg, l_sel).to(v_blocks.dtype), v_blocks.index_select(0, tb))
            u.index_add_(0, rq, pv.to(acc).view(-1, hpg, d_v))
        ctx.save_for_backward(q, k_blocks, v_blocks, m, row_query, tile_block)
        ctx.tile = tile
        ctx.mark_non_differentiable(m)
        return u, z, m

    @staticmethod
    def backward(ctx, du, dz, _dm):
        q, k_blocks, v_blocks, m, row_query, tile_block = ctx.saved_tensors
        tile, l_sel = ctx.tile, k_blocks.shape[1]
        hpg, d_k, d_v = q.shape[1], q.shape[-1], v_blocks.shape[-1]
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k_blocks), torch.zeros_like(v_blocks)
        for tb, rq in _SparseBlocks._chunks(tile_block, row_query, tile, tile * hpg * l_sel):
            nt = tb.shape[0]
            w, q_rows = _SparseBlocks._scores(q, k_blocks, tb, rq, tile, m.dtype)
            k_tiles, v_tiles = k_blocks.index_select(0, tb), v_blocks.index_select(0, tb)
            du_rows = du.index_select(0, rq).to(v_tiles.dtype).view(nt, tile * hpg, d_v)
            w.sub_(m.index_select(0, rq).unsqueeze(-1)).exp_()
            w_tiles = w.view(nt, tile * hpg, l_sel)
            # u = w @ v, z = sum(w)  =>  dw = du @ v^T + dz;  w = exp(s - m)  =>  ds = dw * w
            dv.index_add_(0, tb, torch.bmm(w_tiles.transpose(1, 2).to(v_tiles.dtype), du_rows).to(dv.dtype))
            ds = torch.bmm(du_rows, v_tiles.transpose(1, 2)).to(w.dtype).view(-1, hpg, l_sel)
            ds.add_(dz.index_select(0, rq).unsqueeze(-1)).mul_(w)
            ds = ds.view(nt, tile * hpg, l_sel).to(q.dtype)
            dq.index_add_(0, rq, torch.bmm(ds, k_tiles).view(-1, hpg, d_k))
            dk.index_add_(0, tb, torch.bmm(ds.transpose(1, 2), q_rows))
        return dq, dk, dv, None, None, None, None


# Eager under torch.compile: its tiling has data-dependent sizes (pairs per key block), which would recompile
# for nearly every batch. The rest of the model (projections, cmp/win branches, MLP) compiles. The eager wrapper
# (torch.compiler.disable) is made by prepare_compile, not at import: making it imports torch._dynamo, about a
# second at every start-up of a trainer that never compiles.
_EAGER = None


def prepare_compile() -> None:
    """Make the wrapper that keeps selected_attention eager under torch.compile; call it before compiling a model
    that uses this path (nsa.training.trainer does). Idempotent."""
    global _EAGER
    if _EAGER is None:
        _EAGER = torch.compiler.disable(_selected_attention)


def selected_attention(q, k, v, ranges, l_sel: int, tile: int = SEL_TILE) -> torch.Tensor:
    """_selected_attention, kept eager under torch.compile (see prepare_compile)."""
    if torch.compiler.is_compiling():
        eager = _EAGER if _EAGER is not None else torch.compiler.disable(_selected_attention)
        return eager(q, k, v, ranges, l_sel, tile)
    return _selected_attention(q, k, v, ranges, l_sel, tile)


def _selected_attention(q, k, v, ranges, l_sel: int, tile: int = SEL_TILE) -> torch.Tensor:
    """Block-sparse attention of each query over its own selected token ranges.

    q: [B, H, S, d_k]; k, v: [B, G, S, d]; ranges: [B, G, S, n_sel, 2] of [start, end) per slot (end <= start:
    empty slot), as built by nsa.attention.selection: block-aligned starts, a block's range ends at the block end except the
    query's own block, which ends at t + 1. Every query's own block must be among its ranges.

    Two parts share one softmax per (query, head):
    - band: the query's own block and the one before it (both always selected, the only ones that can be partial)
      as a dense block-banded product with a causal mask, each query block against 2*l_sel keys;
    - sparse (_SparseBlocks): every other selected block. The (query, block) pairs are sorted by block and cut into
      tiles of `tile` pairs sharing one key block, so each tile is one GEMM of (tile * heads_per_group) query rows
      against l_sel keys: queries are gathered (d_k floats a head), not keys (l_sel * d_k floats a block), and no
      mask is needed.
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

    # sparse part: lay the (query, block) pairs out in tiles; key block beta owns ceil(count / tile) tiles
    pair = torch.nonzero(other.reshape(-1)).squeeze(1)
    query = torch.div(pair, n_sel, rounding_mode="floor")  # (b*G + g)*S + t
    blk = torch.div(query, s, rounding_mode="floor") * nb + block.reshape(-1)[pair]
    order = torch.argsort(blk, stable=True)
    blk, query = blk[order], query[order]
    counts = torch.bincount(blk, minlength=b * g * nb)
    tiles_per_block = torch.div(counts + tile - 1, tile, rounding_mode="floor")
    tile_block = torch.repeat_interleave(torch.arange(b * g * nb, device=dev), tiles_per_block)
    rank = torch.arange(blk.shape[0], device=dev) - (torch.cumsum(counts, 0) - counts)[blk]
    row = (torch.cumsum(tiles_per_block, 0) - tiles_per_block)[blk] * tile + rank
    n_query = b * g * s  # padding rows read an extra all-zero query and are summed into it, never read back
    row_query = torch.full((tile_block.shape[0] * tile,), n_query, dtype=torch.long, device=dev)
    row_query[row] = query

    # one softmax across both parts: the sparse part stabilises with max(band max, its own max)
    m_band = s_band.detach().amax(dim=-1).reshape(b * g, sp, hpg)[:, :s].reshape(n_query, hpg)
    q_all = torch.cat((qs.reshape(n_query, hpg, d_k), qs.new_zeros(1, hpg, d_k)))
    u, z, m = _SparseBlocks.apply(q_all, kp.reshape(-1, l_sel, d_k), vp.reshape(-1, l_sel, d_v),
                                  torch.cat((m_band, m_band.new_zeros(1, hpg))), row_query, tile_block, tile)
    m_pad = F.pad(m[:n_query].view(b, g, s, hpg), (0, 0, 0, sp - s)).view(b, g, nb, l_sel, hpg, 1)
    w_band = torch.exp(s_band - m_pad)
    u_band = (w_band.view(b, g, nb, l_sel * hpg, 2 * l_sel).to(v.dtype) @ vb).to(acc)
    u_band = u_band.view(b * g, sp, hpg, d_v)[:, :s].reshape(n_query, hpg, d_v)
    z_band = w_band.sum(-1).view(b * g, sp, hpg)[:, :s].reshape(n_query, hpg)
    out = (u[:n_query] + u_band) / (z[:n_query] + z_band).unsqueeze(-1)
    return out.to(q.dtype).view(b, g, s, hpg, d_v).transpose(2, 3).reshape(b, h, s, d_v)
