"""NSAModel: a decoder-only, LLaMA-style language model whose attention is Native Sparse Attention.

    tokens -> embedding -> n_layers x [x + NSA(RMSNorm(x)); x + SwiGLU(RMSNorm(x))] -> RMSNorm -> head -> logits

Read top to bottom: the two sub-layers, the block, the model (training forward, then inference: prefill, decode
steps, generate), then the cost model (parameter count and FLOPs per token) the trainer uses for MFU. ModelConfig
(nsa.config) gives the shape; `attention: dense` builds the dense twin (causal SDPA in place of NSA), the baseline
NSA is compared with.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from nsa.attention import DenseAttention, NSAAttention
from nsa.attention.cache import DenseCache, NSACache
from nsa.attention.geometry import mean_reads, num_cmp_blocks
from nsa.config import ModelConfig
from nsa.loss import IGNORE_INDEX, linear_cross_entropy, resolve_loss

LayerCache = NSACache | DenseCache  # one layer's decode cache: NSACache (attention "nsa") or DenseCache ("dense")


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

    def prefill(self, x: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """forward(x), the attention filling its empty decode cache."""
        x = x + self.attn.prefill(self.attn_norm(x), cache)
        return x + self.mlp(self.mlp_norm(x))

    def decode_step(self, x_t: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """x_t [B, 1, dim]: the next token of every sequence, its attention reading and appending to `cache`."""
        x_t = x_t + self.attn.decode_step(self.attn_norm(x_t), cache)
        return x_t + self.mlp(self.mlp_norm(x_t))


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

    # ------------------------------------------------------------------ inference: prefill, decode, generate
    # RoPE is the only position information and has no maximum position: a prompt may be of any length >= 1.
    def _check_ids(self, ids: torch.Tensor, what: str, length: int | None = None) -> None:
        """ids must be integer [B>=1, S>=1] (S == length if given) with every id in [0, vocab_size)."""
        shape = f"[B>=1, {length if length is not None else 'S>=1'}]"
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32) \
                or ids.shape[0] < 1 or ids.shape[1] < 1 or (length is not None and ids.shape[1] != length):
            got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"{what} expects token ids of shape {shape} (int64 or int32), got {got}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.cfg.vocab_size:
            raise ValueError(f"{what}: token ids must be in [0, {self.cfg.vocab_size}) (vocab_size), "
                             f"got ids from {lo} to {hi}")

    def new_caches(self, batch_size: int) -> list[LayerCache]:
        """Empty decode caches, one per layer, for `batch_size` sequences (what decode_step reads and appends to)."""
        return [block.attn.new_cache(batch_size) for block in self.blocks]

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[LayerCache]]:
        """Run a prompt input_ids [B, S] through the model once (each layer's prefill: NSA's configured path, batched
        by default; the dense twin's causal SDPA) and return (the last position's logits [B, vocab_size], the
        per-layer caches, holding the S tokens). The logits are forward(input_ids)[:, -1]."""
        self._check_ids(input_ids, "prefill")
        caches = self.new_caches(input_ids.shape[0])
        x = self.tok_emb(input_ids)
        for block, cache in zip(self.blocks, caches):
            x = block.prefill(x, cache)
        return self.head(self.norm(x[:, -1])), caches

    @torch.no_grad()
    def decode_step(self, ids_t: torch.Tensor, caches: list[LayerCache]) -> torch.Tensor:
        """The next token of every sequence, ids_t [B, 1], at position caches' length: its logits [B, vocab_size]
        (forward over the whole sequence so far, last position); appends it to `caches` (new_caches or prefill's)."""
        self._check_ids(ids_t, "decode_step", length=1)
        kind = NSACache if self.cfg.attention == "nsa" else DenseCache
        if not isinstance(caches, (list, tuple)) or len(caches) != len(self.blocks) \
                or not all(isinstance(c, kind) for c in caches):
            raise ValueError(f"decode_step expects {len(self.blocks)} {kind.__name__}s (new_caches or prefill), got "
                             f"{[type(c).__name__ for c in caches] if isinstance(caches, (list, tuple)) else caches!r}")
        if caches[0].batch_size != ids_t.shape[0]:
            raise ValueError(f"decode_step: ids_t has {ids_t.shape[0]} sequences, the caches "
                             f"{caches[0].batch_size}")
        return self._decode(ids_t, caches)

    def _decode(self, ids_t: torch.Tensor, caches: list[LayerCache]) -> torch.Tensor:
        x = self.tok_emb(ids_t)
        for block, cache in zip(self.blocks, caches):
            x = block.decode_step(x, cache)
        return self.head(self.norm(x[:, 0]))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None, eos_id: int | None = None) -> torch.Tensor:
        """The prompt input_ids [B, S] followed by up to max_new_tokens generated tokens: [B, S + T] in input_ids'
        dtype, T <= max_new_tokens. One prefill of the prompt, then one cached decode step per new token.

        temperature 0: greedy (argmax of the logits, ties to the lower id); > 0: sampled from
        softmax(logits / temperature) (fp32, float64 for a float64 model) by torch.multinomial with `generator`
        (the global RNG when None), one draw for the whole batch per step, so a fixed generator reproduces the
        tokens. eos_id: a row stops at its first generated eos_id and every later position of that row holds eos_id
        (the padding); generation ends when every row has stopped (T < max_new_tokens) or after max_new_tokens.
        """
        self._check_ids(input_ids, "generate")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"generate: temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generate: generator must be a torch.Generator, got {type(generator).__name__}")
        if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int)
                                   or not 0 <= eos_id < self.cfg.vocab_size):
            raise ValueError(f"generate: eos_id must be a token id in [0, {self.cfg.vocab_size}) or None, "
                             f"got {eos_id!r}")
        if max_new_tokens == 0:
            return input_ids.clone()
        logits, caches = self.prefill(input_ids)
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        new = []
        for step in range(max_new_tokens):
            token = self._next_token(logits, temperature, generator)
            if eos_id is not None:
                token = token.masked_fill(done, eos_id)
                done |= token == eos_id
            new.append(token)
            if step + 1 == max_new_tokens or (eos_id is not None and bool(done.all())):
                break
            logits = self._decode(token.unsqueeze(1), caches)
        return torch.cat([input_ids, torch.stack(new, dim=1).to(input_ids.dtype)], dim=1)

    @staticmethod
    def _next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
        """[B, V] logits -> [B] int64 token ids: argmax (temperature 0) or one draw from softmax(logits / T)."""
        if temperature == 0:
            return logits.argmax(dim=-1)
        wide = torch.promote_types(logits.dtype, torch.float32)
        # softmax(logits / T) with the largest logit subtracted first, so that no quotient overflows: a tiny T gives
        # the argmax (every other probability 0) where logits / T would be inf and the probabilities NaN. The largest
        # logits' quotient is 0 whatever T: set, not divided, since a T below the dtype's smallest number rounds to 0
        # (0 / 0) and CUDA divides by a scalar as a multiply by its reciprocal (0 * inf once 1 / T overflows)
        logits = logits.to(wide)
        shifted = logits - logits.amax(dim=-1, keepdim=True)
        probs = torch.softmax(torch.where(shifted == 0, 0.0, shifted / temperature), dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

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
