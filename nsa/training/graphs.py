"""The whole train step in CUDA graphs (train.cuda_graphs, `nsa-train --cuda-graphs`).

On a GPU the NSA layer is host-bound (hundreds of small launches per layer); replaying a captured step costs
one launch per graph. What is captured, over static buffers that never move:

    step graph       for each micro-batch: forward, loss, backward (DDP's bucket all-reduces on the last one);
                     then gradient clipping. Writes loss_sum (fp64, summed over the micro-batches) and
                     grad_norm into static tensors; the gradients stay in the graph's memory.
    optimizer graph  AdamW's step, capturable (nsa.training.optim.make_capturable): the learning rate is a
                     device tensor the schedule fills in place before each step (optim.set_lr).

Two graphs, not one, because the trainer checks the loss and gradient norm on the host before it steps the
optimizer (a non-finite step is never applied): it reads them where it always synchronised, between the replays.
Inputs are copied (copy_) into static [accum, batch, seq] buffers before each replay.

Before the capture, warm-up steps (WARMUP_STEPS; DDP_WARMUP_STEPS under DDP, whose first iterations rebuild its
gradient buckets and time themselves on the host) run eagerly on a side stream over zero tokens, with the
optimizer, so that every lazy initialisation (optimizer state, Triton compilation, cuBLAS workspaces, DDP buckets)
happens outside the capture. The parameters and the optimizer state are then put back in place (copy_) as they
were before the warm-up, so a run with graphs starts from the same state as one without. DDP is built on the same
side stream (DistributedDataParallel(gradient_as_bucket_view=True): gradients live in its buckets, at fixed
addresses; autograd's gradient accumulators remember the stream they were made on, and one left on the default
stream would pull it into the capture). static_graph is not set: after the warm-up the buckets are final and DDP
searches for no unused parameters (find_unused_parameters is off), so the captured iteration is like any other.

Nothing inside the step may synchronise with the host (.item(), nonzero, data-dependent shapes, host copies):
the NSA Triton path and the dense twin's SDPA do not; the PyTorch reference kernels and the sequential prefill do
(check_supported refuses them). Autocast runs with cache_enabled=False (its weight cache is not graph-safe).
Layer statistics (the aux stats) are recorded on every replay when they are on at all: a graph cannot choose per
step; they are read on the steps the trainer logs them. The communication counter (nsa.training.comm_count)
sees DDP's hook calls only while capturing; they are recorded then and counted again at every replay. For the
same reason NSA_SDPA_AUDIT counts the warm-up's and the capture's calls only, and NVTX ranges (NSA_NVTX) mark
the warm-up and the capture, not the replays (a profile shows the graphs' kernels under the replay).
Refused in the config (nsa.training.config): FSDP2, fp16 (the GradScaler decides on the host). With --compile the
compiled model is what is captured: dynamo and inductor compile it during the eager warm-up steps (the same shapes
as the captured ones, so nothing recompiles under capture), and the capture records the compiled kernels.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch

from nsa.training.config import UsageError

WARMUP_STEPS = 3  # eager steps on the side stream before capture (torch's whole-network capture example)
DDP_WARMUP_STEPS = 11  # DDP: the first iterations rebuild its buckets and sample timing stats on the host
CAPTURE_DEVICES = ("cuda",)
CAPTURABLE_KERNELS = ("triton", "sdpa")  # attention paths (trainer.attention_kernel) with no host sync in the step


def check_supported(device: torch.device, attention_kernel: str) -> None:
    """UsageError unless the train step on `device`, with attention layers running `attention_kernel` (triton |
    torch | sequential | sdpa), can be captured."""
    if device.type not in CAPTURE_DEVICES:
        raise UsageError(f"train.cuda_graphs (--cuda-graphs) needs a CUDA device, but this run is on {device.type} "
                         "(train.device: auto and no CUDA device is visible)")
    if attention_kernel not in CAPTURABLE_KERNELS:
        raise UsageError(
            f"train.cuda_graphs (--cuda-graphs): the NSA layers would run the '{attention_kernel}' path here "
            "(model.kernel / NSA_KERNEL, model.prefill / NSA_PREFILL_BATCHED), which synchronises with the host "
            "inside the step and cannot be captured; use the Triton kernels (model.kernel: auto or triton, batched "
            "prefill) or the dense twin (--attention dense)")


class CudaCapture:
    """torch.cuda's side of the capture: one side stream (DDP is built, the warm-up runs and the graphs are
    captured on it) and one memory pool shared by the graphs, which are always replayed in capture order."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = None

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            yield
        current.wait_stream(self.stream)

    def capture(self, fn: Callable[[], None]):
        """fn's CUDA work captured into a torch.cuda.CUDAGraph (fn's Python runs once; its kernels do not).
        thread_local: only this thread's CUDA calls are checked during the capture, not those of other threads
        (NCCL's watchdog polling events, a data loader), as NCCL's notes on graph capture advise."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            fn()
        if self.pool is None:
            self.pool = graph.pool()
        return graph


@contextlib.contextmanager
def _recording_comm(counter) -> Iterator[list[tuple[str, int, str]]]:
    """The (kind, bytes, source) of every collective `counter` (comm_count.CommCounter) is told of inside, in
    order, instead of counting them: what the captured step issues at every replay."""
    calls: list[tuple[str, int, str]] = []
    if counter is None:
        yield calls
        return

    def issue(kind: str, nbytes: int, source: str = "model"):
        calls.append((kind, int(nbytes), source))
        return None

    counter.issue, counter.complete = issue, (lambda token: None)  # instance attributes over the methods
    try:
        yield calls
    finally:
        del counter.issue, counter.complete


class GraphedStep:
    """One optimizer step as two CUDA-graph replays over static input buffers (see the module docstring).

    micro_step(inputs, targets, last, loss_factor) runs one micro-batch's forward and backward and returns its
    detached loss (the trainer's own code, the same the eager step runs); grad_norm() clips and returns the norm.
    `capture()` once, then per step: `step(batches, nan)` -> (loss_sum, grad_norm) static tensors, and
    `optimizer_step()`.
    """

    def __init__(self, *, capture: CudaCapture, micro_step: Callable, grad_norm: Callable[[], torch.Tensor],
                 set_record_stats: Callable[[bool], None], optimizer: torch.optim.Optimizer,
                 params: list[torch.Tensor], accum: int, batch_size: int, seq_len: int, device: torch.device,
                 record_stats: bool, warmup_steps: int, counter=None):
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        self.capture_backend = capture
        self.micro_step, self.grad_norm_fn, self.set_record_stats = micro_step, grad_norm, set_record_stats
        self.optimizer, self.params = optimizer, params
        self.accum, self.device, self.record_stats = accum, device, record_stats
        self.warmup_steps, self.counter = warmup_steps, counter
        self.batch_shape = (batch_size, seq_len)
        # static buffers: inputs, the loss factor (1, or NaN for the NSA_FAULT=nan testing aid), outputs
        self.inputs = torch.zeros(accum, batch_size, seq_len, dtype=torch.long, device=device)
        self.targets = torch.zeros(accum, batch_size, seq_len, dtype=torch.long, device=device)
        self.loss_factor = torch.ones((), dtype=torch.float32, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.grad_norm = torch.zeros((), dtype=torch.float32, device=device)
        self._nan = False
        self.step_graph = self.optimizer_graph = None
        self.comm_calls: list[tuple[str, int, str]] = []

    def describe(self) -> dict:
        """env.json's cuda_graphs record."""
        return {"enabled": True, "warmup_steps": self.warmup_steps, "graphs": ["step", "optimizer"],
                "static_inputs": [self.accum, *self.batch_shape], "record_stats": self.record_stats}

    # ------------------------------------------------------------------ what is captured
    def _step_body(self) -> None:
        """The captured step. Replay-safe when its Python is run again (a mocked capture does that): the gradients
        are dropped first, so the first micro-batch writes them afresh, as in the capture."""
        for p in self.params:
            p.grad = None
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(self.accum):
            last = micro == self.accum - 1
            self.set_record_stats(self.record_stats and last)
            loss = self.micro_step(self.inputs[micro], self.targets[micro], last, self.loss_factor)
            total += loss.double()
        self.set_record_stats(False)
        norm = self.grad_norm_fn()
        self.loss_sum.copy_(total)
        self.grad_norm.copy_(norm)

    def _optimizer_body(self) -> None:
        self.optimizer.step()

    # ------------------------------------------------------------------ capture
    def _snapshot(self) -> tuple[list[torch.Tensor], dict]:
        params = [p.detach().clone() for p in self.params]
        state = {p: {k: v.clone() for k, v in self.optimizer.state[p].items() if isinstance(v, torch.Tensor)}
                 for p in self.params if p in self.optimizer.state}
        return params, state

    def _restore(self, snapshot) -> None:
        """Parameters and optimizer state back to the snapshot, in place (the graphs hold their addresses);
        state the warm-up created is zeroed, which is AdamW's fresh state (step 0, zero moments)."""
        params, state = snapshot
        with torch.no_grad():
            for p, saved in zip(self.params, params):
                p.copy_(saved)
            for p in self.params:
                before = state.get(p, {})
                for key, value in self.optimizer.state.get(p, {}).items():
                    if not isinstance(value, torch.Tensor):
                        continue
                    if key in before:
                        value.copy_(before[key])
                    else:
                        value.zero_()

    def capture(self) -> dict:
        """Warm up on the side stream, capture both graphs, restore the pre-warm-up state. Returns what happened
        (for the heartbeat): warmup_steps, capture_s, comm_calls_per_step."""
        t0 = time.perf_counter()
        snapshot = self._snapshot()
        with self.capture_backend.side_stream():
            for _ in range(self.warmup_steps):
                self._step_body()
                self._optimizer_body()
        self.optimizer.zero_grad(set_to_none=True)  # the step graph allocates its gradients in its own pool
        with _recording_comm(self.counter) as calls:
            self.step_graph = self.capture_backend.capture(self._step_body)
        self.comm_calls = calls
        self.optimizer_graph = self.capture_backend.capture(self._optimizer_body)
        self._restore(snapshot)
        return {"warmup_steps": self.warmup_steps, "capture_s": round(time.perf_counter() - t0, 3),
                "comm_calls_per_step": len(calls)}

    # ------------------------------------------------------------------ per step
    def step(self, batches: list[tuple[torch.Tensor, torch.Tensor]], nan: bool = False):
        """Copy the step's micro-batches into the static buffers and replay the step graph; returns the static
        (loss_sum, grad_norm) tensors (read them before the next replay). nan: NSA_FAULT=nan at this step."""
        if self.step_graph is None:
            raise RuntimeError("GraphedStep.step before capture()")
        if len(batches) != self.accum:
            raise ValueError(f"expected {self.accum} micro-batches, got {len(batches)}")
        for micro, (inputs, targets) in enumerate(batches):
            if tuple(inputs.shape) != self.batch_shape or tuple(targets.shape) != self.batch_shape:
                raise ValueError(f"train.cuda_graphs replays a step of fixed shape: every batch must be "
                                 f"[batch_size, seq_len] = {list(self.batch_shape)}, the data source gave "
                                 f"{list(inputs.shape)} / {list(targets.shape)}")
            self.inputs[micro].copy_(inputs, non_blocking=True)
            self.targets[micro].copy_(targets, non_blocking=True)
        if nan != self._nan:
            self.loss_factor.fill_(float("nan") if nan else 1.0)
            self._nan = nan
        self.step_graph.replay()
        if self.counter is not None:
            for kind, nbytes, source in self.comm_calls:
                self.counter.complete(self.counter.issue(kind, nbytes, source))
        return self.loss_sum, self.grad_norm

    def optimizer_step(self) -> None:
        self.optimizer_graph.replay()
