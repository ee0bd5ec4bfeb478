"""The three NSA branches through PyTorch's FlexAttention (torch.nn.attention.flex_attention), a peer of the
PyTorch reference path (the naive.py modules) and of the Triton kernels, for measuring against them.

Each branch is one flex_attention call whose block mask and mask_mod hold the branch's visibility rule,
exactly as the naive.py modules and tests/nsa/reference.py define it (0-based positions, GQA through enable_gqa, the
softmax scale 1/sqrt(d_k)):

    compressed   block i visible to query t iff i*d + l - 1 <= t; a query that sees no block (t < l - 1) gets
                 exactly 0 and passes no gradient, the reference's convention (flex gives fully masked rows 0)
    window       key j visible to query t iff t - w < j <= t
    selected     key j visible to query t iff j // l_sel is among t's selected blocks (per KV group) and j <= t:
                 a mask_mod reading a [B, G, S, n_blocks] table built from the block indices; its block mask is
                 built each forward from the same table (the tiles that any query of a 128-row tile selected),
                 in O(S * n_blocks), never by evaluating the mask_mod over all S x S pairs. The other two masks
                 depend only on the lengths and are cached

On CUDA, flex_attention and create_block_mask are compiled with torch.compile, as PyTorch recommends (eager flex
materialises the whole score matrix). PyTorch's FlexAttention has no backward on CPU: there these functions run
only without autograd (`unavailable` says so), which is enough for forward figures and the CPU tests.

How this path is used: benchmarks/bench_attention.py's "nsa-flex" case runs the NSA layer with its PyTorch-path
projections, selection and gates and these three branches. It is not a choice of NSAConfig.kernel / NSA_KERNEL,
and `auto` never picks it. Before `auto` may pick it at a length, a GPU run must show, at that length and the
production dtype and shape, that it is faster than the path auto picks today (forward+backward medians of
`python benchmarks/bench_attention.py --device cuda --dtype bf16 --shape m7c --paths nsa-triton,nsa-flex,dense`)
and that it is qualified like the Triton kernels: tests/nsa/attention/kernels/test_flex.py's CUDA tests (numerics
against float64 within err <= 2 * err_torch + 1e-3 * max|ref|; runbooks/gpu_kernels.yaml runs every file of that
folder) and a clean compute-sanitizer run (nsa.attention.kernels.qualify does not run these functions yet).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

try:  # torch >= 2.5 has it; the project's floor (2.6) does, but a stripped build may not
    from torch.nn.attention import flex_attention as _flex_module
except ImportError as exc:  # pragma: no cover - depends on the torch build
    _flex_module = None
    _IMPORT_ERROR = f"torch.nn.attention.flex_attention does not import ({exc})"
else:
    _IMPORT_ERROR = None


def unavailable(device: torch.device, needs_grad: bool) -> str | None:
    """None when these functions can run on `device` (with autograd if `needs_grad`), else why not (one line)."""
    if _IMPORT_ERROR:
        return _IMPORT_ERROR
    if device.type not in ("cuda", "cpu"):
        return f"FlexAttention runs on CUDA and CPU here, not {device.type}"
    if device.type == "cpu" and needs_grad:
        return f"PyTorch's FlexAttention has no backward on CPU (torch {torch.__version__}); run it on CUDA"
    return None


# FlexAttention's default sparse block size (query rows and keys per tile of a block mask).
BLOCK = 128


@functools.cache
def _compiled_flex():
    return torch.compile(_flex_module.flex_attention, dynamic=False)


def _attend(q, k, v, block_mask):
    """flex_attention (compiled on CUDA) with GQA; q [B, H, S, d_k], k/v [B, G, T, d]."""
    fn = _compiled_flex() if q.is_cuda else _flex_module.flex_attention
    return fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


@functools.cache
def _compiled_create_block_mask():
    return torch.compile(_flex_module.create_block_mask)


def _block_mask(mask_mod, b, h, q_len, kv_len, device):
    """create_block_mask (compiled on CUDA: eager would build the whole q_len x kv_len mask)."""
    fn = _compiled_create_block_mask() if device.type == "cuda" else _flex_module.create_block_mask
    return fn(mask_mod, b, h, q_len, kv_len, device=device)


def cmp_mask_mod(l: int, d: int):
    """Compression block i is visible to query t iff it ended at or before t: i*d + l - 1 <= t."""
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx * d + l - 1 <= q_idx
    return mask_mod


def window_mask_mod(w: int):
    """Key j is visible to query t iff t - w < j <= t."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < w)
    return mask_mod


@functools.lru_cache(maxsize=32)
def _cmp_block_mask(s: int, n_cmp: int, l: int, d: int, device: str):
    return _block_mask(cmp_mask_mod(l, d), None, None, s, n_cmp, torch.device(device))


@functools.lru_cache(maxsize=32)
def _window_block_mask(s: int, w: int, device: str):
    return _block_mask(window_mask_mod(w), None, None, s, s, torch.device(device))


def compressed_attention(q, k_cmp, v_cmp, l: int, d: int) -> torch.Tensor:
    """range_attn.naive.compressed_attention through flex: q [B, H, S, d_k], k_cmp/v_cmp [B, G, n_cmp, d]."""
    b, h, s, _ = q.shape
    n_cmp = k_cmp.shape[2]
    if n_cmp == 0:
        return q.new_zeros(b, h, s, v_cmp.shape[-1])
    return _attend(q, k_cmp, v_cmp, _cmp_block_mask(s, n_cmp, l, d, str(q.device)))


def window_attention(q, k, v, w: int) -> torch.Tensor:
    """range_attn.naive.window_attention through flex: query t attends to keys (t - w, t]."""
    return _attend(q, k, v, _window_block_mask(q.shape[2], w, str(q.device)))


def selection_table(blocks: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """[B, G, S, n_sel] block indices (-1: empty slot) -> [B, G, S, n_blocks] bool: block j is selected for t."""
    idx = torch.where(blocks < 0, torch.full_like(blocks, n_blocks), blocks)
    table = torch.zeros(*blocks.shape[:-1], n_blocks + 1, dtype=torch.bool, device=blocks.device)
    return table.scatter_(-1, idx, True)[..., :n_blocks]


def selected_attention(q, k, v, blocks: torch.Tensor, l_sel: int) -> torch.Tensor:
    """Selected-branch attention through flex: q [B, H, S, d_k], k/v [B, G, S, d], blocks [B, G, S, n_sel] as
    nsa.attention.selection.choose_blocks returns them. The same function as selected_attn.naive.selected_attention over
    selection_ranges_v2(blocks): the tokens <= t of each selected block."""
    b, h, s, _ = q.shape
    g = k.shape[1]
    if blocks.shape[:3] != (b, g, s):
        raise ValueError(f"selected_attention: blocks must be [B, G, S, n_sel] = [{b}, {g}, {s}, n_sel], "
                         f"got {list(blocks.shape)}")
    hpg = h // g
    table = selection_table(blocks, -(-s // l_sel))

    def mask_mod(b_idx, h_idx, q_idx, kv_idx):
        return table[b_idx, h_idx // hpg, q_idx, kv_idx // l_sel] & (kv_idx <= q_idx)

    return _attend(q, k, v, selected_block_mask(table, hpg, l_sel, mask_mod))


def selected_block_mask(table: torch.Tensor, hpg: int, l_sel: int, mask_mod):
    """The BlockMask of the selected branch from its [B, G, S, n_blocks] selection table: a (query tile, key tile)
    pair of BLOCK x BLOCK is visited iff some query of the tile selected a block that overlaps the key tile; every
    visited tile applies `mask_mod` (no tile is marked full). Heads h of group h // hpg share their group's tiles."""
    b, g, s, nb = table.shape
    dev = table.device
    n_tiles = -(-s // BLOCK)
    per_tile = F.pad(table, (0, 0, 0, n_tiles * BLOCK - s)).view(b, g, n_tiles, BLOCK, nb).any(dim=3)
    j = torch.arange(nb, device=dev).view(nb, 1)
    tile = torch.arange(n_tiles, device=dev).view(1, n_tiles)
    first, last = j * l_sel // BLOCK, ((j + 1) * l_sel).clamp(max=s).sub(1) // BLOCK
    overlaps = ((tile >= first) & (tile <= last)).float()  # [n_blocks, n_tiles]: selection block j covers tile
    visit = (per_tile.float() @ overlaps > 0).repeat_interleave(hpg, dim=1)  # [B, H, n_tiles, n_tiles]
    kv_num_blocks = visit.sum(-1, dtype=torch.int32)
    kv_indices = torch.argsort((~visit).to(torch.int32), dim=-1, stable=True).to(torch.int32)  # visited first
    return _flex_module.BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                                 seq_lengths=(s, s))


def branches(p, blocks: torch.Tensor, cfg) -> dict[str, torch.Tensor]:
    """The layer's three branch outputs {"cmp", "sel", "win"} [B, H, S, d_v] through flex, from its projections
    `p` (nsa.attention.layer.NSAProjections), the selected blocks [B, G, S, n_sel] and its NSAConfig `cfg`."""
    return {"cmp": compressed_attention(p.q, p.k_cmp, p.v_cmp, cfg.l, cfg.d),
            "sel": selected_attention(p.q, p.k_sel, p.v_sel, blocks, cfg.l_sel),
            "win": window_attention(p.q, p.k_win, p.v_win, cfg.w)}
