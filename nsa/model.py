"""NSAModel: a decoder-only, LLaMA-style language model whose attention is Native Sparse Attention.

    tokens -> embedding -> n_layers x [x + NSA(RMSNorm(x)); x + SwiGLU(RMSNorm(x))] -> RMSNorm -> head -> logits

Read top to bottom: the two sub-layers, the block, the model, then the cost model (parameter count and FLOPs per
token) the trainer uses for MFU. ModelConfig (nsa.config) gives the shape; `attention: dense` builds the dense twin
(causal SDPA in place of NSA), the baseline NSA is compared with.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from nsa.attention import DenseAttention, NSAAttention
from nsa.attention.geometry import mean_reads, num_cmp_blocks
from nsa.config import ModelConfig
from nsa.loss import IGNORE_INDEX, linear_cross_entropy, resolve_loss


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = NSAAttention(cfg.nsa) if cfg.attention == "nsa" else DenseAttention(cfg.nsa)
        self.mlp_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class NSAModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2/LLaMA-style init: N(0, init_std) weights, zero biases, residual outputs scaled by
        1/sqrt(2 * n_layers); the NSA compressors' own position embeddings keep their init."""
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:
            for residual_out in (block.attn.o_proj, block.mlp.w_down):
                nn.init.normal_(residual_out.weight, 0.0, std / math.sqrt(2 * self.cfg.n_layers))

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, S] (int64) -> logits [B, S, vocab_size]; with targets [B, S]: the mean next-token cross
        entropy instead (`loss`), computed inside forward so that DDP's and FSDP's forward hooks see it."""
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"NSAModel expects input_ids of shape [B, S] (integer), "
                             f"got {tuple(input_ids.shape)} {input_ids.dtype}")
        # a [S, B] target (as many elements as input_ids) would otherwise give a finite, wrong loss
        if targets is not None and (targets.shape != input_ids.shape
                                    or targets.dtype not in (torch.int64, torch.int32)):
            raise ValueError(f"NSAModel expects targets of the shape of input_ids {tuple(input_ids.shape)} (integer), "
                             f"got {tuple(targets.shape)} {targets.dtype}")
        x = self.tok_emb(input_ids)
        for block in self.blocks:
            if self.cfg.activation_checkpointing and torch.is_grad_enabled():
                # the block is bound here, per iteration: each layer recomputes itself (non-reentrant, DDP-safe)
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.norm(x)
        if targets is None:
            return self.head(x)
        impl = resolve_loss(self.cfg.loss)
        if impl != "reference":  # the head fused with the loss (chunked: PyTorch, fused: Triton): no batch-wide logits
            return linear_cross_entropy(x.flatten(0, 1), self.head.weight, targets.flatten(), fused=impl == "fused")
        return lm_loss(self.head(x), targets)

    def loss(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross entropy (computed in fp32; targets equal to -100 do not count), as cfg.loss says:
        the reference (lm_loss of the whole batch's logits) or the head fused with the loss over chunks of tokens
        (nsa.loss.linear_cross_entropy: "chunked" in PyTorch, "fused" with its Triton kernel); the same value and
        gradients."""
        return self(input_ids, targets)

    # ------------------------------------------------------------------ statistics
    def set_record_stats(self, enabled: bool) -> None:
        for block in self.blocks:
            block.attn.record_stats = enabled

    def aux_stats(self) -> dict[str, float]:
        """Gate and selection statistics of the last forward with record_stats on, averaged over layers."""
        per_layer = [block.attn.stats for block in self.blocks if block.attn.stats]
        if not per_layer:
            return {}
        return {key: float(torch.stack([s[key] for s in per_layer]).mean()) for key in per_layer[0]}

    # ------------------------------------------------------------------ cost model
    def num_params(self) -> int:
        """Trainable parameters (a tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        return flops_per_token(self.cfg, seq_len)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of logits [B, S, V] against targets [B, S], in fp32 (the reference: an fp32 copy of the
    whole logits; NSAModel(input_ids, targets) with model.loss "chunked" or "fused" never makes one). Targets are
    integer (int64 or int32) of shape logits.shape[:-1]; any other shape is an error, even with as many elements."""
    if logits.dim() < 2 or targets.shape != logits.shape[:-1] or targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"lm_loss expects targets of shape {tuple(logits.shape[:-1])} (integer) for logits "
                         f"{tuple(logits.shape)}, got {tuple(targets.shape)} {targets.dtype}")
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten().long(), ignore_index=IGNORE_INDEX)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward) at sequence length seq_len.

    Dense: 2 FLOPs per weight of every matmul a token goes through (projections, gate MLP, SwiGLU, head), plus the
    compression MLP (run once per compression block, i.e. shared by d tokens). Attention: what NSA computes,
    averaged over positions 0..seq_len-1: per head, 2*(d_k + d_v) FLOPs per key read, keys read = visible
    compressed tokens + the selected blocks' tokens + the window (nsa.decode_reads), plus the forward-only
    importance scores (2*d_k per visible compressed token). Embedding lookups and norms are not counted.
    The dense twin (attention="dense"): its projections, and (t + 1) keys at position t.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    a = cfg.nsa
    h, g = cfg.n_heads, cfg.n_kv_groups
    qo_mlp = cfg.dim * h * a.d_k + h * a.d_v * cfg.dim + 3 * cfg.dim * cfg.hidden
    if cfg.attention == "dense":  # one K/V projection; causal attention reads (t + 1) keys at position t
        per_layer = qo_mlp + cfg.dim * g * (a.d_k + a.d_v)
        dense = 2.0 * (cfg.n_layers * per_layer + cfg.dim * cfg.vocab_size)
        attention = cfg.n_layers * h * 2.0 * (a.d_k + a.d_v) * (seq_len + 1) / 2
        return 3.0 * (dense + attention)
    gate_hidden = max(16, cfg.dim // 4)
    per_layer = qo_mlp + cfg.dim * g * 3 * (a.d_k + a.d_v) + cfg.dim * gate_hidden + gate_hidden * 3 * h
    dense = 2.0 * (cfg.n_layers * per_layer + cfg.dim * cfg.vocab_size)
    if a.phi == "mlp":  # fc1 (l*width -> 2*width) and fc2 (2*width -> width) per block, for keys and values
        per_block = sum(a.l * wd * 2 * wd + 2 * wd * wd for wd in (a.d_k, a.d_v)) * g
        dense += 2.0 * cfg.n_layers * per_block * num_cmp_blocks(seq_len, a.l, a.d) / seq_len
    reads, cmp_reads = mean_reads(a, seq_len)
    attention = cfg.n_layers * h * (2.0 * (a.d_k + a.d_v) * reads)
    importance = cfg.n_layers * h * 2.0 * a.d_k * cmp_reads
    return 3.0 * (dense + attention) + importance
