"""The fused cross entropy's host side: `cross_entropy_rows(logits, targets, ignore_index, with_grad)`.

    logits [N, V] (contiguous rows; bf16, fp16 or fp32), targets [N] (int64)  ->  loss [N] fp32
        loss[r] = logsumexp(logits[r]) - logits[r, targets[r]]: 0 where targets[r] == ignore_index, NaN where the
        target is outside [0, V) (a kernel cannot raise; the trainer's non-finite-loss check stops on it, where
        F.cross_entropy raises or asserts on the device).
    with_grad: logits[r] is overwritten, in place, with softmax(logits[r]) - onehot(targets[r]) (zero for an
        ignored row), in logits' dtype: d loss[r] / d logits[r].

One program per row reads the row twice (its log-sum-exp, online over blocks of BLOCK_V columns; then the
gradient) and writes it once: at V 50,304 in bf16 about 0.3 MB of traffic a row, where the PyTorch chunked path
(nsa.loss, its reference) makes an fp32 copy and runs about six element-wise passes over it. Arithmetic in fp32;
the gradient is rounded to logits' dtype once, as the PyTorch path rounds its fp32 softmax.

A torch.library custom op (`nsa::cross_entropy_rows`) that mutates `logits`, with a fake implementation: opaque
to torch.compile, capturable in a CUDA graph, no host synchronisation.

Measured: nothing on a GPU yet (reports/gpu/next_run.sh PART=trainer times it against the reference and the
chunked PyTorch path, benchmarks/bench_loss.py); through Triton's interpreter against float64 (tests/nsa/
test_loss.py) and compiled ahead of time for sm_80 and sm_90 (reports/aot/).
"""

from __future__ import annotations

import torch
import triton

from nsa.attention.kernels.aot import AotCase
from nsa.attention.kernels.cross_entropy.jit import _ce_rows_kernel

BLOCK_V = 4096  # columns a program holds at a time (4096 fp32 over 8 warps: 16 a thread); less for a narrow row
NUM_WARPS = 8
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _block(v: int) -> int:
    return min(BLOCK_V, triton.next_power_of_2(max(v, 16)))


@torch.library.custom_op("nsa::cross_entropy_rows", mutates_args=("logits",))
def _ce_rows_op(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, with_grad: bool) -> torch.Tensor:
    n, v = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        block = _block(v)
        _ce_rows_kernel[(n,)](logits, targets, loss, v, logits.stride(0), ignore_index, BLOCK_V=block,
                              WITH_GRAD=with_grad, num_warps=min(NUM_WARPS, max(1, block // 128)))
    return loss


@_ce_rows_op.register_fake
def _(logits, targets, ignore_index, with_grad):
    return logits.new_empty(logits.shape[0], dtype=torch.float32)


def cross_entropy_rows(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                       with_grad: bool = True) -> torch.Tensor:
    """Each row's cross entropy (fp32 [N]); with_grad: logits becomes its gradient, in place (module docstring)."""
    if logits.dim() != 2 or logits.dtype not in DTYPES:
        raise ValueError(f"cross_entropy_rows expects logits [N, V] in bf16, fp16 or fp32, got "
                         f"{tuple(logits.shape)} {logits.dtype}")
    if logits.stride(1) != 1:
        raise ValueError(f"cross_entropy_rows expects rows of unit stride, got strides {logits.stride()}")
    if targets.shape != logits.shape[:1] or targets.dtype != torch.int64 or targets.device != logits.device:
        raise ValueError(f"cross_entropy_rows expects int64 targets [{logits.shape[0]}] on {logits.device}, got "
                         f"{tuple(targets.shape)} {targets.dtype} on {targets.device}")
    return _ce_rows_op(logits, targets.contiguous(), int(ignore_index), bool(with_grad))


def aot_cases() -> list:
    """The kernel at the launch configuration a real vocabulary gets (any V of BLOCK_V or more: the m7c model's
    50,304, LLaMA's 32,000), each logits dtype, with and without the gradient. Memory-bound: no tensor-core
    instruction expected. Only NSA_LOSS=fused launches it (a GPU run has not qualified it yet)."""
    cases = []
    for dtype in ("bf16", "fp16", "fp32"):
        for with_grad in (True, False):
            constexprs = dict(BLOCK_V=BLOCK_V, WITH_GRAD=with_grad)
            cases.append(AotCase(
                name=f"ce_rows[BLOCK_V={BLOCK_V},WITH_GRAD={with_grad},warps={NUM_WARPS},{dtype}]",
                fn=_ce_rows_kernel,
                signature={"LOGITS": f"*{dtype}", "TARGETS": "*i64", "LOSS": "*fp32", "V": "i32", "stride_row": "i32",
                           "ignore_index": "i32", **{k: "constexpr" for k in constexprs}},
                constexprs=constexprs, num_warps=NUM_WARPS, num_stages=1, tensor_cores=False,
                divisible=("V", "stride_row"), choice="NSA_LOSS fused"))
    return cases
