"""NSAAttention: Native Sparse Attention (Yuan et al., 2025, "Native Sparse Attention: Hardware-Aligned and
Natively Trainable Sparse Attention") as one nn.Module.

    o_t = sum over c in (cmp, sel, win) of g_t^c * Attn(q_t, K_t^c, V_t^c)          (paper Eq. 5)

Each branch has its own key/value projections; queries are shared. Per query t:
- cmp: attention over compressed tokens phi(k[i*d : i*d + l]) of the blocks that have ended (i*d + l - 1 <= t).
- sel: attention over the tokens <= t of n_sel selection blocks of length l_sel, chosen per KV group from the
  compressed attention probabilities (Eq. 9, 10) with block 0 and the two local blocks always kept.
- win: attention over the last w tokens (t - w, t].
RoPE rotates queries and the keys of every branch: token keys at their position, compressed keys at their
block's last position. Gates are per head and per branch: sigmoid(MLP(x)) or a softmax over the branches.

Two prefill paths give the same result: "batched" (vectorized) and "sequential" (a per-token loop, the readable
oracle). The decode step is the per-token form of the same function with its selected branch vectorized
(_attend_one(gather=True): no host synchronisation; DECODE_SELECTED "loop" runs the oracle's gathers instead). The
batched path has two kernel sets (NSAConfig.kernel / NSA_KERNEL): the PyTorch reference (CPU and CUDA) and the
Triton GPU kernels (nsa.attention.kernels). Two selection-range builders for the PyTorch path: "v2" (vectorized)
and "v1" (a loop); the Triton path and the decode step read block indices directly.
The Triton path's forward (_forward_triton) computes the same function in few kernel launches: one GEMM for every
projection (the weights concatenated per forward; the parameters stay separate) and fused kernels for the glue
(nsa.attention.kernels.glue.host); benchmarks/bench_ops.py counts its ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from nsa.attention import kernels
from nsa.attention.cache import NSACache
from nsa.attention.kernels.backend import Branches, TritonBranches, branches
from nsa.attention.compression import Compressor
from nsa.config import NSAConfig, resolve_auto
from nsa.attention.geometry import num_cmp_blocks, num_sel_blocks
from nsa.observability import span
from nsa.attention.selection import RANGE_BUILDERS, choose_blocks, importance_from_cmp

BRANCHES = ("cmp", "sel", "win")


def _compress_fused(phi: Compressor, raw: torch.Tensor, tk: SimpleNamespace):
    """The Triton path's phi(raw) in two parts: (mean [B, G, n, width], mlp [B, G, n, width] or None for "avg"),
    phi(x) = mean + mlp for x = raw [B, S, G, width] (contiguous) seen as [B, G, S, width]. The pooling (block mean,
    block + position embedding) is one fused kernel; what stays in aten is the MLP's GEMMs."""
    flat, mean = tk.glue.compress_pool(raw, phi.pos if phi.kind == "mlp" else None, phi.l, phi.d)
    if phi.kind == "avg":
        return mean, None
    return mean, phi.fc2(F.gelu(phi.fc1(flat))).view(mean.shape)


@dataclass
class NSAProjections:
    """Everything the three branches attend with, for a whole sequence (see NSAAttention.project)."""

    q: torch.Tensor  # [B, H, S, d_k], RoPE at 0..S-1
    k_cmp: torch.Tensor  # [B, G, n_cmp, d_k], RoPE at each block's last position
    v_cmp: torch.Tensor  # [B, G, n_cmp, d_v]
    k_sel: torch.Tensor  # [B, G, S, d_k]
    v_sel: torch.Tensor  # [B, G, S, d_v]
    k_win: torch.Tensor  # [B, G, S, d_k]
    v_win: torch.Tensor  # [B, G, S, d_v]
    gates: torch.Tensor | None  # [B, S, H, 3], branch order BRANCHES (None on the Triton path: fused in the combine)


@dataclass
class _Tokens:
    """Projections of a run of tokens before compression; k_raw/v_raw are the cmp branch's un-rotated inputs."""

    q: torch.Tensor
    k_raw: torch.Tensor
    v_raw: torch.Tensor
    k_sel: torch.Tensor
    v_sel: torch.Tensor
    k_win: torch.Tensor
    v_win: torch.Tensor
    gates: torch.Tensor


# How decode_step attends over the selected blocks, side by side for an alternated A/B (benchmarks/bench_decode.py
# --selected-ab); both give the same function of the cache (tests/nsa/test_generate.py):
#   "gather"  one gather of the n_sel * l_sel key/value slots of every (sequence, group), the slots outside a selected
#             block's tokens <= t masked before the softmax; no host synchronisation (_attend_one(gather=True)).
#             The default.
#   "loop"    the per-token oracle's: its ranges read on the host, one gather per (sequence, group).
DECODE_SELECTED_CHOICES = ("gather", "loop")
DECODE_SELECTED = "gather"  # read at each decode step


class NSAAttention(nn.Module):
    def __init__(self, cfg: NSAConfig):
        super().__init__()
        self.cfg = cfg
        # the PyTorch paths' selection-range builder, cfg.selection's: (blocks [..., n_sel], positions) -> ranges
        self.range_builder = RANGE_BUILDERS[cfg.selection]
        h, g, d_k, d_v = cfg.n_heads, cfg.n_kv_groups, cfg.d_k, cfg.d_v
        self.q_proj = nn.Linear(cfg.dim, h * d_k, bias=False)
        self.k_cmp = nn.Linear(cfg.dim, g * d_k, bias=False)
        self.v_cmp = nn.Linear(cfg.dim, g * d_v, bias=False)
        self.k_sel = nn.Linear(cfg.dim, g * d_k, bias=False)
        self.v_sel = nn.Linear(cfg.dim, g * d_v, bias=False)
        self.k_win = nn.Linear(cfg.dim, g * d_k, bias=False)
        self.v_win = nn.Linear(cfg.dim, g * d_v, bias=False)
        self.phi_k = Compressor(cfg.phi, cfg.l, cfg.d, d_k)
        self.phi_v = Compressor(cfg.phi, cfg.l, cfg.d, d_v)
        gate_hidden = max(16, cfg.dim // 4)
        self.gate = nn.Sequential(nn.Linear(cfg.dim, gate_hidden), nn.SiLU(), nn.Linear(gate_hidden, 3 * h))
        self.o_proj = nn.Linear(h * d_v, cfg.dim, bias=False)
        # When record_stats is set, forward keeps detached gate/selection statistics in self.stats:
        # gate_cmp/gate_sel/gate_win (mean gate value) and sel_mean_dist_blocks (mean distance, in selection
        # blocks, from a query's block back to the blocks it selected). Off by default: it costs a few reductions.
        self.record_stats = False
        self.stats: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ projections
    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, n, -1).transpose(1, 2)

    def _project_tokens(self, x: torch.Tensor, start: int) -> _Tokens:
        cfg = self.cfg
        rope = lambda t: kernels.rotary(t, cfg.rope_theta, cfg.rope, start=start)  # noqa: E731
        g = cfg.n_kv_groups
        gates = self._gates_of(self.gate(x).view(*x.shape[:2], cfg.n_heads, 3))
        return _Tokens(
            q=rope(self._heads(self.q_proj(x), cfg.n_heads)),
            k_raw=self._heads(self.k_cmp(x), g), v_raw=self._heads(self.v_cmp(x), g),
            k_sel=rope(self._heads(self.k_sel(x), g)), v_sel=self._heads(self.v_sel(x), g),
            k_win=rope(self._heads(self.k_win(x), g)), v_win=self._heads(self.v_win(x), g),
            gates=gates,
        )

    def _compress(self, k_raw: torch.Tensor, v_raw: torch.Tensor, first_block: int = 0):
        """Compressed keys (rotated at each block's last position) and values of every block in k_raw/v_raw."""
        cfg = self.cfg
        k_cmp, v_cmp = self.phi_k(k_raw), self.phi_v(v_raw)
        # block i's last position: (first_block + i) * d + l - 1
        start = first_block * cfg.d + cfg.l - 1
        return kernels.rotary(k_cmp, cfg.rope_theta, cfg.rope, start=start, step=cfg.d), v_cmp

    def project(self, x: torch.Tensor) -> NSAProjections:
        """Queries, every branch's keys and values, and the gates for x [B, S, dim]."""
        tok = self._project_tokens(x, 0)
        k_cmp, v_cmp = self._compress(tok.k_raw, tok.v_raw)
        return NSAProjections(tok.q, k_cmp, v_cmp, tok.k_sel, tok.v_sel, tok.k_win, tok.v_win, tok.gates)

    # ------------------------------------------------------------------ batched path
    def _select_batched(self, q: torch.Tensor, k_cmp: torch.Tensor, s: int) -> torch.Tensor:
        cfg = self.cfg
        b, g = q.shape[0], cfg.n_kv_groups
        n_blocks = num_sel_blocks(s, cfg.l_sel)
        importance = torch.zeros(b, g, s, n_blocks, device=q.device)
        # Before t = n_sel * l_sel at most n_sel blocks have started and all are kept: importance cannot matter.
        first = min(s, cfg.n_sel * cfg.l_sel)
        with span("nsa.sel.importance"):
            if k_cmp.shape[2] > 0:
                for start, per_group in kernels.cmp_group_probabilities(q, k_cmp, cfg.l, cfg.d, first):  # Eq. 10
                    rows = per_group.shape[2]
                    importance[:, :, start: start + rows] = importance_from_cmp(  # Eq. 9
                        per_group, n_blocks, cfg.l, cfg.d, cfg.l_sel)
        with span("nsa.sel.topk"):
            return choose_blocks(importance, torch.arange(s, device=q.device), cfg.n_sel, cfg.l_sel)

    def _branches_batched(self, p: NSAProjections, logits: torch.Tensor | None = None,
                          backend: Branches | None = None) -> dict[str, torch.Tensor]:
        """The batched path's three branches, written once over a backend of kernels (nsa.attention.kernels.backend:
        TorchBranches, the PyTorch path; TritonBranches, the GPU kernels, no host sync; by default the one the
        configured kernel resolves to). The compressed branch may return its log-sum-exp, which the Triton
        selection uses to rank the blocks without a second softmax pass."""
        if backend is None:
            backend = branches(self.cfg, p.q.device, self._select_batched, self.range_builder, p.q.dtype)
        out = {}
        with span("nsa.cmp"):
            out["cmp"], lse = backend.compressed(p)
        with span("nsa.sel"):
            blocks = backend.select(p, lse)
            out["sel"] = backend.selected(p, blocks)
        with span("nsa.win"):
            out["win"] = backend.window(p)
        if self.record_stats:
            self._record_stats(p.gates if logits is None else self._gates_of(logits), blocks)
        return out

    def _record_stats(self, gates: torch.Tensor, blocks: torch.Tensor | None) -> None:
        """Detached gate and selection statistics of the last forward (see `stats`); no host sync here."""
        cfg = self.cfg
        with torch.no_grad():
            mean_gates = gates.float().mean(dim=(0, 1, 2))
            stats = {f"gate_{name}": mean_gates[i] for i, name in enumerate(BRANCHES)}
            if blocks is not None:
                # how far back (in selection blocks) the chosen blocks reach, over valid choices
                current = torch.arange(blocks.shape[2], device=blocks.device).view(1, 1, -1, 1) // cfg.l_sel
                valid = blocks >= 0
                dist = ((current - blocks) * valid).sum() / valid.sum().clamp(min=1)
                stats["sel_mean_dist_blocks"] = dist.float()
        self.stats = stats

    # ------------------------------------------------------------------ per-token paths (oracle, decode)
    def _attend_one(self, q_t, t: int, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gather: bool = False):
        """One query position t for every sequence and head, written for obviousness.

        q_t [B, H, d_k]; k_cmp/v_cmp: the compressed tokens visible to t; k_sel/v_sel: tokens 0..t; k_win/v_win:
        exactly the window tokens of t. Returns ({branch: [B, H, d_v]}, blocks [B, G, n_sel], KV tokens read per
        sequence and group). The selected branch gathers each (sequence, group)'s tokens from its ranges, read on the
        host (the oracle); gather=True (the decode step, DECODE_SELECTED "gather") takes the n_sel * l_sel token
        slots of its chosen blocks at once instead (block j's slot i is token j * l_sel + i), a slot of an empty
        choice (-1) or past t at score -inf, so that the softmax and the weighted sum run over exactly the same
        tokens with no value read on the host and no loop over sequences and groups.
        """
        cfg = self.cfg
        b, h, d_k = q_t.shape
        g, hpg = cfg.n_kv_groups, cfg.heads_per_group
        scale = 1.0 / math.sqrt(d_k)
        qg = q_t.view(b, g, hpg, d_k)
        acc = torch.promote_types(q_t.dtype, torch.float32)  # as the batched kernels: fp32 or better

        def probs(keys):  # keys [B, G, n, d_k] -> softmax [B, G, hpg, n]
            return torch.softmax((qg.to(acc) @ keys.to(acc).transpose(-1, -2)) * scale, -1)

        def attend(p, values):  # -> [B, H, d_v]
            return (p @ values.to(acc)).to(q_t.dtype).reshape(b, h, -1)

        # compressed branch; its probabilities also rank the selection blocks
        n_cmp = k_cmp.shape[2]
        n_blocks = t // cfg.l_sel + 1
        if n_cmp == 0:
            o_cmp = q_t.new_zeros(b, h, cfg.d_v)
            importance = torch.zeros(b, g, n_blocks, device=q_t.device)
        else:
            p_cmp = probs(k_cmp)
            o_cmp = attend(p_cmp, v_cmp)
            # heads of a group summed (Eq. 10), blocks mapped (Eq. 9) by the batched path's importance_from_cmp:
            # the same additions in the same order, so blocks of equal importance tie exactly as they do there
            # (ties go to the lower block; a matmul by the overlap weights summed in another order and could
            # rank one of two equal blocks above the other); selection is fp32 on every path
            importance = importance_from_cmp(p_cmp.detach().float().sum(dim=2), n_blocks, cfg.l, cfg.d, cfg.l_sel)

        # selected branch: one block list per group
        position = torch.full((), t, dtype=torch.long, device=q_t.device)
        blocks = choose_blocks(importance, position, cfg.n_sel, cfg.l_sel)  # [B, G, n_sel], -1 for empty
        if gather:
            slots = (blocks.unsqueeze(-1) * cfg.l_sel + torch.arange(cfg.l_sel, device=q_t.device)).flatten(-2)
            valid = (slots >= 0) & (slots <= t)  # [B, G, n_sel * l_sel]; an empty choice's slots are -l_sel .. -1
            idx = slots.clamp(0, t).unsqueeze(-1)
            keys = k_sel.gather(2, idx.expand(-1, -1, -1, k_sel.shape[-1]))
            values = v_sel.gather(2, idx.expand(-1, -1, -1, v_sel.shape[-1]))
            scores = (qg.to(acc) @ keys.to(acc).transpose(-1, -2)) * scale  # [B, G, hpg, n_sel * l_sel]
            o_sel = attend(torch.softmax(scores.masked_fill(~valid.unsqueeze(2), float("-inf")), -1), values)
            # the tokens read, from the selection's geometry: NSAConfig keeps n_sel >= 3, so the current block,
            # the one before it and block 0 are always among the min(n_sel, started) blocks kept (decode_reads)
            n_kept = min(cfg.n_sel, n_blocks)
            selected = (n_kept - 1) * cfg.l_sel + t + 1 - (n_blocks - 1) * cfg.l_sel
        else:  # token by token from its ranges
            ranges = self.range_builder(blocks, position, cfg.l_sel).tolist()
            o_sel = q_t.new_empty(b, h, cfg.d_v)
            gathered = 0
            for bi in range(b):
                for gi in range(g):
                    idx = torch.cat([torch.arange(lo, hi, device=q_t.device) for lo, hi in ranges[bi][gi] if hi > lo])
                    gathered += idx.numel()
                    keys = k_sel[bi, gi].index_select(0, idx)
                    values = v_sel[bi, gi].index_select(0, idx)
                    scores = (qg[bi, gi].to(acc) @ keys.to(acc).T) * scale
                    o_sel[bi, gi * hpg: (gi + 1) * hpg] = (torch.softmax(scores, -1) @ values.to(acc)).to(q_t.dtype)
            selected = gathered // (b * g)

        o_win = attend(probs(k_win), v_win)
        return {"cmp": o_cmp, "sel": o_sel, "win": o_win}, blocks, n_cmp + selected + k_win.shape[2]

    def _branches_sequential(self, p: NSAProjections) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        cfg = self.cfg
        s = p.q.shape[2]
        outs = {name: [] for name in BRANCHES}
        blocks = []
        for t in range(s):
            n_vis = num_cmp_blocks(t + 1, cfg.l, cfg.d)
            lo = max(0, t - cfg.w + 1)
            o, blk, _ = self._attend_one(
                p.q[:, :, t], t, p.k_cmp[:, :, :n_vis], p.v_cmp[:, :, :n_vis],
                p.k_sel[:, :, : t + 1], p.v_sel[:, :, : t + 1], p.k_win[:, :, lo: t + 1], p.v_win[:, :, lo: t + 1])
            for name in BRANCHES:
                outs[name].append(o[name])
            blocks.append(blk)
        return {name: torch.stack(v, dim=2) for name, v in outs.items()}, torch.stack(blocks, dim=2)

    # ------------------------------------------------------------------ public API
    def _check_input(self, x: torch.Tensor) -> None:
        """x must be [B>=1, S>=1, dim]: an empty batch or sequence is an error naming the shape, on every path."""
        if x.dim() != 3 or x.shape[-1] != self.cfg.dim or x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"NSAAttention expects x of shape [B>=1, S>=1, {self.cfg.dim}], got {tuple(x.shape)}")

    def branch_outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each branch's attention output before gating, {"cmp", "sel", "win"}: [B, H, S, d_v]."""
        self._check_input(x)
        return self._branches(self.project(x))

    def _branches(self, p: NSAProjections) -> dict[str, torch.Tensor]:
        if self.cfg.prefill == "batched":
            return self._branches_batched(p)
        out, blocks = self._branches_sequential(p)
        if self.record_stats:
            self._record_stats(p.gates, blocks)
        return out

    def _combine(self, branches: dict[str, torch.Tensor], gates: torch.Tensor) -> torch.Tensor:
        """o_proj(sum_c gate_c * branch_c); branches [B, H, S, d_v], gates [B, S, H, 3] -> [B, S, dim]."""
        mixed = sum(gates[..., i].unsqueeze(-1) * branches[name].transpose(1, 2) for i, name in enumerate(BRANCHES))
        return self.o_proj(mixed.flatten(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, dim] -> [B, S, dim]."""
        self._check_input(x)
        if self.cfg.prefill == "batched" and kernels.resolve(self.cfg.kernel, x.device, self.cfg,
                                                             kernels.compute_dtype(x)) == "triton":
            return self._forward_triton(x)
        p = self.project(x)
        return self._combine(self._branches(p), p.gates)

    # ------------------------------------------------------------------ the Triton path's forward: few ops
    def packed_weight(self) -> torch.Tensor:
        """Every projection of x in one [N, dim] matrix, in nsa.attention.kernels.glue.host's column order:
        q, k_sel, k_win, v_sel, v_win, k_cmp, v_cmp, then the gate MLP's first layer. The parameters stay separate
        (state_dict, sharding and checkpoints unchanged); one cat per forward joins them, its backward is views."""
        return torch.cat([self.q_proj.weight, self.k_sel.weight, self.k_win.weight, self.v_sel.weight,
                          self.v_win.weight, self.k_cmp.weight, self.v_cmp.weight, self.gate[0].weight])

    def _forward_triton(self, x: torch.Tensor) -> torch.Tensor:
        """forward() on the Triton path, the same function as the PyTorch path's in fewer ops (issue 21): one GEMM
        for every projection, fused kernels (kernels/glue) for the head split + RoPE + gate activation, the
        compression pooling, the compressed keys' RoPE and the gate + branch combine; the rest are GEMMs and the
        attention kernels."""
        tk = kernels.triton_modules()
        cfg = self.cfg
        b, s, dim = x.shape
        h, g = cfg.n_heads, cfg.n_kv_groups
        y = torch.mm(x.reshape(b * s, dim), self.packed_weight().t())
        q, k_sel, k_win, v_sel, v_win, k_raw, v_raw, a = tk.glue.project_heads(
            y, self.gate[0].bias, h, g, cfg.d_k, cfg.d_v, s, 0, cfg.rope_theta)
        logits = self.gate[2](a).view(b, s, h, 3)
        mean_k, mlp_k = _compress_fused(self.phi_k, k_raw, tk)
        mean_v, mlp_v = _compress_fused(self.phi_v, v_raw, tk)
        n_cmp = mean_k.shape[2]
        # compressed keys rotated at each block's last position i*d + l - 1
        k_cmp = tk.glue.rope_add(mean_k, mlp_k, max(n_cmp, 1), cfg.d, cfg.l - 1, cfg.rope_theta)
        v_cmp = mean_v if mlp_v is None else mean_v + mlp_v
        t = lambda z: z.transpose(1, 2)  # noqa: E731 - [B, S, n, d] storage seen as [B, n, S, d]
        p = NSAProjections(t(q), k_cmp, v_cmp, t(k_sel), t(v_sel), t(k_win), t(v_win), gates=None)
        out = self._branches_batched(p, logits=logits, backend=TritonBranches(cfg))  # forward() resolved it
        mixed = tk.glue.gate_combine(logits, out["cmp"], out["sel"], out["win"], cfg.gate)
        return self.o_proj(mixed)

    def _gates_of(self, logits: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if cfg.gate == "sigmoid":
            return torch.sigmoid(logits)
        # the softmax in fp32, or float64 for float64 logits (never below their own precision)
        return torch.softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32)).to(logits.dtype)

    @torch.no_grad()
    def selected_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """[B, G, S, n_sel] selection-block indices forward uses (ascending, -1 where fewer are valid yet)."""
        self._check_input(x)
        p = self.project(x)
        if self.cfg.prefill == "sequential":
            return self._branches_sequential(p)[1]
        if kernels.resolve(self.cfg.kernel, p.q.device, self.cfg, p.q.dtype) == "triton":
            backend = TritonBranches(self.cfg)
            return backend.select(p, backend.compressed(p)[1])
        return self._select_batched(p.q, p.k_cmp, x.shape[1])

    def new_cache(self, batch_size: int) -> NSACache:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"new_cache expects a batch size >= 1, got {batch_size!r}")
        return NSACache(batch_size=batch_size, w=self.cfg.w, l=self.cfg.l)

    def _check_cache(self, cache: NSACache, where: str) -> None:
        cfg = self.cfg
        if not isinstance(cache, NSACache):
            raise ValueError(f"{where} expects an NSACache (this layer's new_cache), got {type(cache).__name__}")
        if cache.w < cfg.w or cache.l < cfg.l:  # it would drop window or block tokens this layer still reads
            raise ValueError(f"{where}: the cache keeps w={cache.w}, l={cache.l} but this layer needs w={cfg.w}, "
                             f"l={cfg.l}; make it with this layer's new_cache")

    @torch.no_grad()
    def prefill(self, x: torch.Tensor, cache: NSACache) -> torch.Tensor:
        """forward(x) for a prompt x [B, S, dim] -> [B, S, dim] (the configured prefill path, batched by default),
        filling an empty `cache` with what the decode steps at positions S, S+1, ... read: the selected branch's
        keys/values of every token, the window's of the last w, the last l raw (un-compressed) keys/values of the
        compressed branch and every compressed key/value of the blocks that have ended (inference only)."""
        self._check_input(x)
        self._check_cache(cache, "prefill")
        if cache.length or x.shape[0] != cache.batch_size:
            raise ValueError(f"prefill expects an empty cache for {x.shape[0]} sequences, got one holding "
                             f"{cache.length} tokens of {cache.batch_size}")
        cfg = self.cfg
        tok = self._project_tokens(x, 0)
        k_cmp, v_cmp = self._compress(tok.k_raw, tok.v_raw)
        p = NSAProjections(tok.q, k_cmp, v_cmp, tok.k_sel, tok.v_sel, tok.k_win, tok.v_win, tok.gates)
        out = self._combine(self._branches(p), p.gates)
        cache.k_sel.append(tok.k_sel)
        cache.v_sel.append(tok.v_sel)
        cache.k_win.append(tok.k_win[:, :, -cfg.w:])
        cache.v_win.append(tok.v_win[:, :, -cfg.w:])
        cache.k_raw.append(tok.k_raw[:, :, -cfg.l:])
        cache.v_raw.append(tok.v_raw[:, :, -cfg.l:])
        if k_cmp.shape[2]:
            cache.k_cmp.append(k_cmp)
            cache.v_cmp.append(v_cmp)
        cache.length = x.shape[1]
        return out

    @torch.no_grad()
    def decode_step(self, x_t: torch.Tensor, cache: NSACache) -> torch.Tensor:
        """One token for every sequence: x_t [B, 1, dim] -> [B, 1, dim]; appends to `cache` (inference only)."""
        cfg = self.cfg
        self._check_cache(cache, "decode_step")
        if x_t.dim() != 3 or x_t.shape[1] != 1 or x_t.shape[2] != cfg.dim or x_t.shape[0] != cache.batch_size:
            raise ValueError(f"decode_step expects x_t of shape [{cache.batch_size}, 1, {cfg.dim}], "
                             f"got {tuple(x_t.shape)}")
        # every error before the cache changes: a step that raises leaves it as it was, so it can be taken again
        choice = resolve_auto("layer: DECODE_SELECTED", DECODE_SELECTED, DECODE_SELECTED_CHOICES, "gather")
        t = cache.length
        tok = self._project_tokens(x_t, t)
        cache.k_sel.append(tok.k_sel)
        cache.v_sel.append(tok.v_sel)
        cache.k_win.append(tok.k_win)
        cache.v_win.append(tok.v_win)
        cache.k_raw.append(tok.k_raw)
        cache.v_raw.append(tok.v_raw)
        cache.length = t + 1
        if num_cmp_blocks(t + 1, cfg.l, cfg.d) > cache.n_cmp:  # block [t + 1 - l, t + 1) just completed
            k_c, v_c = self._compress(cache.k_raw.last(cfg.l), cache.v_raw.last(cfg.l), first_block=cache.n_cmp)
            cache.k_cmp.append(k_c)
            cache.v_cmp.append(v_c)
        k_cmp = cache.k_cmp.last() if cache.n_cmp else tok.k_raw.new_zeros(x_t.shape[0], cfg.n_kv_groups, 0, cfg.d_k)
        v_cmp = cache.v_cmp.last() if cache.n_cmp else tok.v_raw.new_zeros(x_t.shape[0], cfg.n_kv_groups, 0, cfg.d_v)
        o, _, reads = self._attend_one(tok.q[:, :, 0], t, k_cmp, v_cmp, cache.k_sel.last(), cache.v_sel.last(),
                                       cache.k_win.last(cfg.w), cache.v_win.last(cfg.w), gather=choice == "gather")
        cache.reads.append(reads)
        return self._combine({name: o[name].unsqueeze(2) for name in BRANCHES}, tok.gates)
