"""The language model's cross entropy fused with its head: `linear_cross_entropy(hidden, weight, targets)` equals
`F.cross_entropy((hidden @ weight.T).float(), targets)` (mean over the targets that are not `ignore_index`) and
its gradients, without the logits of the whole batch: chunks of `chunk` tokens at a time, each chunk's logits
made in the compute dtype, upcast to fp32 for the log-sum-exp and the softmax, and turned into that chunk's
gradients at once (w.r.t. the hidden states and the head weight, accumulated in fp32), so that backward only
scales them (by the incoming gradient over the number of counted targets, in fp32). At most one chunk's logits
exist (bf16 and fp32); the reference keeps the batch's bf16 logits and makes an fp32 copy of them (3.3 GB at B 8 x
2,048 x 50,304).

With `fused`, each chunk's loss and logit gradient come from one Triton kernel
(nsa.attention.kernels.cross_entropy: each row read twice and overwritten once with its gradient, in the logits'
dtype), where the PyTorch path makes the chunk's fp32 copy and runs about six element-wise passes over it; a chunk
then holds its logits alone. It runs where the Triton kernels run (CUDA; CPU under TRITON_INTERPRET=1), and is an
error elsewhere, never a silent fallback. One difference: a target outside [0, V) gives a NaN loss (a kernel cannot
raise) where the PyTorch path raises an index error.

No host synchronisation and no data-dependent Python (the chunks follow from the shapes): it runs under CUDA graph
capture and torch.compile. Under autocast the matmuls run in the autocast dtype, as the head's nn.Linear would.
NSAModel(input_ids, targets) uses it when ModelConfig.loss (NSA_LOSS) is "chunked" (PyTorch) or "fused" (Triton).
"""

from __future__ import annotations

import torch

from nsa.attention.kernels import KernelUnavailable, triton_modules, triton_status
from nsa.config import resolve_auto

LOSS_IMPLS = ("reference", "chunked", "fused")  # what ModelConfig.loss ("auto" | one of these) resolves to
CHUNK_TOKENS = 8192  # tokens per chunk: at V 50,304 one chunk's logits are 0.8 GB bf16 (+ 1.6 GB fp32 unfused)
IGNORE_INDEX = -100  # F.cross_entropy's default
# what "auto" runs: the reference; the chunked loss, alone, ran at 0.93x its tokens/s on an H200 (dense twin, CUDA
# graphs, 2 repeats alternated: reports/gpu/2026-11-28-h200), so it is the choice to save memory, not time; the
# fused one has not run on a GPU yet
QUALIFIED_LOSS = "reference"


def resolve_loss(choice: str) -> str:
    """The implementation ModelConfig.loss `choice` runs: auto is QUALIFIED_LOSS."""
    return resolve_auto("loss", choice, LOSS_IMPLS, QUALIFIED_LOSS)


_KERNEL = None  # the fused loss's kernel module (nsa.attention.kernels.cross_entropy.host), once check_loss loaded it


def check_loss(choice: str, device) -> None:
    """Where model.loss `choice` is the fused loss: KernelUnavailable if its Triton kernel cannot run on `device`
    (naming why), else its kernel module loaded, so that a model compiled after this finds it (nsa-train calls this
    at start-up). Nothing for the other choices."""
    global _KERNEL
    if resolve_loss(choice) == "fused":
        problem = triton_status(torch.device(device))
        if problem:
            raise KernelUnavailable(f"the fused loss (NSA_LOSS / model.loss 'fused') cannot run: {problem}")
        _KERNEL = triton_modules().cross_entropy


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int | None = None,
                         ignore_index: int = IGNORE_INDEX, fused: bool = False) -> torch.Tensor:
    """Mean cross entropy of the logits hidden [N, D] @ weight [V, D].T against targets [N] (entries equal to
    ignore_index do not count; when none counts the loss is NaN and every gradient 0, as F.cross_entropy gives), in
    fp32, `chunk` tokens at a time
    (None: CHUNK_TOKENS); fused: each chunk's loss and logit gradient by the Triton kernel (module docstring)."""
    chunk = CHUNK_TOKENS if chunk is None else chunk
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy expects hidden [N, D] and weight [V, D], got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1] or targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"linear_cross_entropy expects targets [{hidden.shape[0]}] (int64 or int32), got "
                         f"{tuple(targets.shape)} {targets.dtype}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):  # the dtype the head's nn.Linear would compute in
        dtype = torch.get_autocast_dtype(kind)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
    if fused:
        if not torch.compiler.is_compiling():  # under torch.compile the check ran before (check_loss), or fails here
            check_loss("fused", hidden.device)
        elif _KERNEL is None:
            raise KernelUnavailable("the fused loss under torch.compile: call nsa.loss.check_loss('fused', device) "
                                    "before compiling (nsa-train does), or run it once uncompiled")
        if hidden.dtype not in _KERNEL.DTYPES:
            raise ValueError(f"the fused loss computes in bf16, fp16 or fp32, got {hidden.dtype} (use the chunked "
                             f"loss for float64)")
        targets = targets.long()
    # under no_grad (evaluation) Function.apply still reports needs_input_grad: say it, and no gradient is made
    return _LinearCrossEntropy.apply(hidden, weight, targets, chunk, ignore_index, torch.is_grad_enabled(), fused)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, ignore_index, grad_enabled, fused):
        need_h, need_w = grad_enabled and ctx.needs_input_grad[0], grad_enabled and ctx.needs_input_grad[1]
        n = hidden.shape[0]
        with torch.autocast(hidden.device.type, enabled=False):
            wide = torch.promote_types(hidden.dtype, torch.float32)  # fp32 (float64 inputs stay float64)
            valid = targets != ignore_index
            count = valid.sum().to(wide)  # a tensor: no host synchronisation
            scale = 1.0 / count  # inf when no target counts: the loss is then 0 * inf = NaN, as F.cross_entropy's
            total = torch.zeros((), dtype=wide, device=hidden.device)
            grad_h = torch.empty_like(hidden) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need_w else None
            for lo in range(0, n, chunk):
                h, t, ok = hidden[lo:lo + chunk], targets[lo:lo + chunk], valid[lo:lo + chunk]
                if fused:  # the chunk's loss per row, and its logits overwritten with d(sum of losses) / d logits
                    g = h @ weight.T
                    total = total + _KERNEL.cross_entropy_rows(g, t, ignore_index, need_h or need_w).sum()
                    _chunk_gradients(g, h, weight, grad_h, grad_w, lo, chunk)
                    del g  # freed before the next chunk's logits are made: one chunk's at a time
                    continue
                logits = (h @ weight.T).to(wide)  # [c, V] fp32, one chunk's: never the whole batch's
                safe = torch.where(ok, t, 0).unsqueeze(1)
                lse = torch.logsumexp(logits, dim=1)
                picked = logits.gather(1, safe).squeeze(1)
                total = total + torch.where(ok, lse - picked, 0.0).sum()
                if need_h or need_w:
                    probs = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the logits
                    probs.scatter_add_(1, safe, torch.full_like(picked, -1.0).unsqueeze(1))
                    # d(sum of losses) / d logits, in [-1, 1]; the 1 / count of the mean and the incoming gradient
                    # are applied in backward, in fp32 (in fp16, p / count would underflow before a loss scale)
                    probs.mul_(ok.to(wide).unsqueeze(1))
                    g = probs.to(hidden.dtype)
                    del logits, probs
                    _chunk_gradients(g, h, weight, grad_h, grad_w, lo, chunk)
                # this chunk's [c, V] tensors freed before the next chunk's logits are made (a name still bound to
                # them would keep two chunks' alive at once)
                logits = probs = g = None
        # the gradients' scale: 1 / count, or 1 when no target counts (every gradient is then 0, as F.cross_entropy
        # gives, where 0 * inf would make it NaN)
        ctx.save_for_backward(grad_h, grad_w, 1.0 / count.clamp(min=1))
        ctx.w_dtype = weight.dtype
        return total * scale

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, scale = ctx.saved_tensors
        factor = grad_out.to(scale.dtype) * scale
        dh = (grad_h.to(scale.dtype) * factor).to(grad_h.dtype) if grad_h is not None else None
        dw = (grad_w * factor).to(ctx.w_dtype) if grad_w is not None else None
        return dh, dw, None, None, None, None, None


def _chunk_gradients(g, h, weight, grad_h, grad_w, lo, chunk):
    """A chunk's share of the gradients from g = d(sum of its losses) / d logits [c, V] (compute dtype): its rows of
    grad_h, and its term of grad_w, accumulated over the chunks in fp32 (each None when not wanted)."""
    if grad_h is not None:
        grad_h[lo:lo + chunk] = g @ weight
    if grad_w is not None:
        grad_w.add_(g.T @ h)
