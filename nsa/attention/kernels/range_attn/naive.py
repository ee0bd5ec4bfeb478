"""The compressed and sliding-window branches in plain PyTorch (CPU and CUDA): the reference the Triton range
kernels (host.py, jit.py) are tested against, and the CPU path.

Shapes: queries [B, H, S, d_k]; keys/values [B, G, T, d] with H = G * heads_per_group and head h in group
h // heads_per_group. No loops in Python over batch, positions, heads or groups; the window branch loops over
fixed-size query chunks that bound memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nsa.observability import audited_sdpa

# Query rows per SDPA chunk of the sliding-window kernel. Measured on the 2-core CPU, w=512, S=2048, fwd+bwd:
# 64 -> 37 ms, 128 -> 40 ms, 256 -> 45 ms, 512 -> 63 ms (smaller chunks waste fewer masked keys).
WINDOW_CHUNK = 64


def _sdpa(site: str, q, k, v, mask=None, causal=False):
    k, v = gqa_operands(q, k, v, mask)
    return audited_sdpa(site, F.scaled_dot_product_attention, q, k, v, attn_mask=mask, is_causal=causal,
                        enable_gqa=q.shape[1] != k.shape[1])


def gqa_operands(q, k, v, mask, device_type: str | None = None):
    """k and v as SDPA takes them with `mask`: on CUDA, a masked call with fewer key/value heads than query heads
    gets them repeated to the query heads (each kv head for its hpg query heads, as enable_gqa reads them): CUDA's
    flash kernel takes GQA but no mask and its memory-efficient one a mask but no GQA, so the call would fall to the
    math kernel (the SDPA audit's fallback). Unchanged elsewhere (the CPU kernels take both)."""
    device_type = device_type or q.device.type
    if mask is None or device_type != "cuda" or q.shape[1] == k.shape[1]:
        return k, v
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def cmp_mask(s: int, n_cmp: int, l: int, d: int, device) -> torch.Tensor:
    """[s, n_cmp] bool: compression block i is visible to query t (it ended at or before t)."""
    t = torch.arange(s, device=device).unsqueeze(1)
    i = torch.arange(n_cmp, device=device).unsqueeze(0)
    return i * d + l - 1 <= t


def compressed_attention(q, k_cmp, v_cmp, l: int, d: int) -> torch.Tensor:
    """Attention of every query over the compression blocks it can see; exactly 0 where it sees none.

    Query t = l - 1 + m*d + r (0 <= r < d) sees blocks 0..m. Moving r into the head dimension turns the visibility
    mask into the square causal mask over (m, block), so SDPA's causal kernel applies (it skips the masked half
    and needs no mask tensor); queries t < l - 1 see nothing and get 0.
    """
    b, h, s, d_k = q.shape
    n_cmp, d_v = k_cmp.shape[2], v_cmp.shape[-1]
    if n_cmp == 0:
        return q.new_zeros(b, h, s, d_v)
    seen = s - (l - 1)  # queries that see at least one block; n_cmp * d >= seen
    qg = F.pad(q[:, :, l - 1:], (0, 0, 0, n_cmp * d - seen))
    qg = qg.view(b, h, n_cmp, d, d_k).transpose(2, 3).reshape(b, h * d, n_cmp, d_k)  # head h*d + r -> group h//hpg
    out = _sdpa("cmp", qg, k_cmp, v_cmp, causal=True)
    out = out.view(b, h, d, n_cmp, d_v).transpose(2, 3).reshape(b, h, n_cmp * d, d_v)[:, :, :seen]
    return F.pad(out, (0, 0, l - 1, 0))


def window_attention(q, k, v, w: int, chunk: int = WINDOW_CHUNK) -> torch.Tensor:
    """Sliding-window attention: query t attends to keys (t - w, t]."""
    b, h, s, d_k = q.shape
    g = k.shape[1]
    if s <= w:
        return _sdpa("win", q, k, v, causal=True)  # square causal mask: t sees [0, t]
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
    out = _sdpa("win", qc, kw, vw, mask.repeat(b, 1, 1).unsqueeze(1))
    out = out.view(b, n_chunks, h, c, -1).transpose(1, 2).reshape(b, h, n_chunks * c, -1)
    return out[:, :, :s]
