"""Communication accounting: what the trainer actually sends through collectives, counted at the calls.

Counts come from the tensors handed to the collective, never from the parameter list, so they can check the
byte model (nsa.training.comm_model) honestly:

- DDP: the gradient-bucket comm hooks below (plain fp32 average, or the bf16/fp16 compression hook) count each
  bucket's all-reduce as it is issued.
- FSDP2: `patch_collectives` wraps the torch.distributed collectives FSDP2 calls (all_gather_single /
  all_gather_into_tensor, reduce_scatter_single / reduce_scatter_tensor, all_reduce, broadcast, ...) for the
  duration of the run and puts the originals back afterwards.
- The trainer's own traffic is counted apart, as "trainer": its per-step all-reduce of loss and stop flags
  (distributed.all_reduce_sum) and, under FSDP2, the gradient-norm reduction DTensor issues through functional
  collectives (`functional_collectives`, around the norm only). No byte model predicts it.

Bytes are the message size in the nccl-tests convention, so that time = bytes / algbw (algbw = busbw / the kind's
bus factor: 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter; validation.analysis.collectives):
all-reduce and broadcast the buffer, all-gather the gathered output (world_size x the input), reduce-scatter the
full input, all-to-all the input. Kinds: COMM_KINDS (defined with summary.json's format in nsa.training.outputs).

Time: on CPU (gloo) the wall time from issuing a collective until it has completed (synchronous calls: around
the call; asynchronous ones: until their future completes), reduced per step to the union of those intervals
(the time during which at least one counted collective was in flight), so overlapping buckets are not counted
twice. On CUDA the host cannot see when a NCCL kernel runs without synchronizing, so no time is measured there:
use the profiler (train.profile_steps) for CUDA communication time.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from nsa.training.outputs import COMM_KINDS  # the kinds summary.json's comm entries may name

SOURCES = ("model", "trainer")  # gradient / parameter traffic; the trainer's own per-step sync

# torch.distributed functions wrapped for FSDP2: name -> (kind, how the message size is read from the arguments).
# "tensor": the first tensor argument; "output"/"input": that argument; "*_list": the sum over a list argument.
_WRAPPED = {
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "_all_gather_base": ("all_gather", "output_tensor"),
    "all_gather": ("all_gather", "tensor_list*"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_reduce_scatter_base": ("reduce_scatter", "input"),
    "reduce_scatter": ("reduce_scatter", "input_list*"),
    "all_to_all_single": ("all_to_all", "input"),
}


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _add(counts: dict, kind: str, calls: int, nbytes: int, size: int | None = None) -> None:
    """Add to counts[kind]; with `size` (one call's message) also to its "sizes" list, in call order."""
    entry = counts.setdefault(kind, {"calls": 0, "bytes": 0} if size is None else {"calls": 0, "bytes": 0,
                                                                                    "sizes": []})
    entry["calls"] += calls
    entry["bytes"] += nbytes
    if size is not None:
        entry["sizes"].append(size)


class CommCounter:
    """Per-step and total counts of the collectives the trainer issues, by source and kind.

    The trainer arms it for each step (`begin_step` ... `end_step`); calls outside a step (setup, evaluation,
    checkpoints) are not counted. Thread-safe: DDP hooks run on autograd threads, completions on gloo's.
    """

    def __init__(self, measure_time: bool):
        self.measure_time = measure_time
        self._lock = threading.Lock()
        self._local = threading.local()  # per-thread pause depth (the trainer's own sync inside wrappers)
        self.armed = False
        self._step: dict[str, dict] = {}
        self._intervals: list[tuple[float, float]] = []
        self._open: dict[int, float] = {}
        self._next = 0
        self.total: dict[str, dict] = {s: {} for s in SOURCES}
        self.time_total_s = 0.0
        # steps closed, the first and the last record, and whether every step after the first was equal (kept
        # instead of every step's record, whose size lists would grow with a long run)
        self.n_steps = 0
        self.first_step: dict | None = None
        self.last_step: dict | None = None
        self.constant = True

    # ------------------------------------------------------------------ recording
    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Collectives issued inside are not seen by the FSDP wrappers (the caller records them itself)."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def is_paused(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def issue(self, kind: str, nbytes: int, source: str = "model") -> int | None:
        """Count one collective of `nbytes`; returns a token for `complete` (None when not armed)."""
        if not self.armed:
            return None
        now = time.perf_counter()
        with self._lock:
            _add(self._step.setdefault(source, {}), kind, 1, int(nbytes), int(nbytes))
            if source == "model":  # time: gradient / parameter collectives only (the sync is its own record)
                token = self._next
                self._next += 1
                self._open[token] = now
                return token
        return None

    def complete(self, token: int | None) -> None:
        if token is None:
            return
        now = time.perf_counter()
        with self._lock:
            start = self._open.pop(token, None)
            if start is not None:
                self._intervals.append((start, now))

    # ------------------------------------------------------------------ steps
    def begin_step(self) -> None:
        with self._lock:
            self._step, self._intervals, self._open = {}, [], {}
        self.armed = True

    def end_step(self) -> dict:
        """Close the step: {"model": {kind: {"calls", "bytes", "sizes"}}, "trainer": {...}, "time_s": float|None}
        (sizes: each call's message bytes, in call order)."""
        self.armed = False
        with self._lock:
            now = time.perf_counter()
            intervals = self._intervals + [(t, now) for t in self._open.values()]  # unfinished: until now
            counts = {s: self._step.get(s, {}) for s in SOURCES}
            self._step, self._intervals, self._open = {}, [], {}
        seconds = _union_length(intervals) if self.measure_time else None
        for source in SOURCES:
            for kind, entry in counts[source].items():
                _add(self.total[source], kind, entry["calls"], entry["bytes"])
        if seconds is not None:
            self.time_total_s += seconds
        record = {**counts, "time_s": seconds}
        if self.n_steps >= 2 and record["model"] != self.last_step["model"]:
            self.constant = False
        self.n_steps += 1
        self.first_step = self.first_step or record
        self.last_step = record
        return record

    def discard_step(self) -> None:
        """Close a step that is not recorded (it stopped on a non-finite loss): its counts are dropped."""
        self.armed = False
        with self._lock:
            self._step, self._intervals, self._open = {}, [], {}

    def step_bytes(self, record: dict) -> int:
        return sum(e["bytes"] for e in record["model"].values())


# ---------------------------------------------------------------------- DDP comm hooks
def ddp_hook(counter: CommCounter | None, dtype: torch.dtype | None = None) -> Callable:
    """A DDP communication hook that averages each gradient bucket over the ranks and counts what it sends.

    dtype None: the bucket is divided by the world size and all-reduced in place in its own dtype (what DDP
    does without a hook). bf16/fp16: cast, divide, all-reduce, cast back into the bucket (like torch's
    fp16/bf16_compress_hook, written here so it also runs on gloo: torch's bf16 hook refuses non-NCCL groups).
    """

    def hook(state, bucket):  # (no annotations: DDP checks them against the real classes)
        group = state if state is not None else dist.group.WORLD
        buffer = bucket.buffer()
        world = dist.get_world_size(group)
        sent = buffer.div_(world) if dtype is None else buffer.to(dtype).div_(world)
        token = counter.issue("all_reduce", tensor_bytes(sent)) if counter is not None else None
        fut = dist.all_reduce(sent, group=group, async_op=True).get_future()

        def finish(f):
            if counter is not None:
                counter.complete(token)
            if dtype is None:
                return f.value()[0]
            buffer.copy_(f.value()[0])
            return buffer

        return fut.then(finish)

    return hook


# ---------------------------------------------------------------------- FSDP2: wrappers around the collectives
def _message_bytes(how: str, bound: inspect.BoundArguments) -> int:
    args = bound.arguments
    if how.endswith("*"):
        return sum(tensor_bytes(t) for t in args[how[:-1]])
    return tensor_bytes(args[how])


def _wrap(fn: Callable, kind: str, how: str, counter: CommCounter, guard: threading.local) -> Callable:
    signature = inspect.signature(fn)

    def counted(*args: Any, **kwargs: Any):
        if getattr(guard, "inside", False) or not counter.armed or counter.is_paused():
            return fn(*args, **kwargs)  # nested (e.g. all_gather_into_tensor -> all_gather_single), or not a step
        bound = signature.bind(*args, **kwargs)
        token = counter.issue(kind, _message_bytes(how, bound))
        guard.inside = True
        try:
            result = fn(*args, **kwargs)
        finally:
            guard.inside = False
        if token is not None:
            if bound.arguments.get("async_op") and result is not None and counter.measure_time:
                try:
                    result.get_future().add_done_callback(lambda _f: counter.complete(token))
                except (RuntimeError, AttributeError):  # a backend without futures: until the call returned
                    counter.complete(token)
            else:
                counter.complete(token)
        return result

    counted.__wrapped__ = fn  # type: ignore[attr-defined]
    counted.__name__ = getattr(fn, "__name__", "collective")
    return counted


@contextlib.contextmanager
def patch_collectives(counter: CommCounter) -> Iterator[list[str]]:
    """Count every wrapped torch.distributed collective issued while `counter` is armed; yields the names wrapped.

    The functions are replaced on torch.distributed and torch.distributed.distributed_c10d (FSDP2 calls them as
    attributes of torch.distributed at call time) and restored on exit, even after an error. A collective
    that calls another wrapped one is counted once.
    """
    guard = threading.local()
    modules = (dist, c10d)
    saved: list[tuple[Any, str, Callable]] = []
    wrapped: dict[int, Callable] = {}
    names = []
    for name, (kind, how) in _WRAPPED.items():
        original = getattr(c10d, name, None) or getattr(dist, name, None)
        if original is None:
            continue
        names.append(name)
        for module in modules:
            current = getattr(module, name, None)
            if current is None:
                continue
            replacement = wrapped.setdefault(id(current), _wrap(current, kind, how, counter, guard))
            saved.append((module, name, current))
            setattr(module, name, replacement)
    try:
        yield names
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


_FUNCTIONAL = {"all_reduce": "all_reduce", "all_reduce_": "all_reduce", "broadcast": "broadcast",
               "broadcast_": "broadcast", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}


@contextlib.contextmanager
def functional_collectives(counter: CommCounter, source: str = "trainer") -> Iterator[None]:
    """Count the functional collectives (torch.ops._c10d_functional.*, which DTensor uses) issued inside, as
    `source` traffic. Message sizes as above: all-gather = input x group size."""
    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **(kwargs or {}))
            if any(t is DTensor for t in types):
                return NotImplemented  # let DTensor run first: it desugars into the collectives counted below
            namespace, _, name = func._schema.name.partition("::")
            kind = _FUNCTIONAL.get(name) if namespace in ("_c10d_functional", "c10d_functional") else None
            if kind is not None and args and isinstance(args[0], torch.Tensor):
                nbytes = tensor_bytes(args[0])
                if kind == "all_gather" and len(args) > 1 and isinstance(args[1], int):
                    nbytes *= args[1]  # (input, group_size, group_name)
                counter.issue(kind, nbytes, source=source)
            return func(*args, **(kwargs or {}))

    with _Mode():
        yield


def counts_table(counts: dict[str, dict]) -> list[dict]:
    """[{"kind", "calls", "bytes"[, "sizes"]}] in COMM_KINDS order: the form summary.json and the orchestrator
    use (sizes, where kept: every call's message bytes in call order)."""
    return [{"kind": k, **counts[k]} for k in COMM_KINDS if k in counts]
