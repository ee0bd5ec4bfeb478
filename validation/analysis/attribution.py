"""Attribution of step time (issue 17): a torch profiler chrome trace (the profile step's trace_rank0_*.json)
grouped by the nsa.* NVTX/profiler ranges and by category, as shares of step time.

Each step is an `nsa.step` range (forward and backward of every micro-batch) plus the `nsa.optim` range that
follows it (the optimizer step; between the two the trainer's own loss/flag all-reduce is not counted); within them, every instant on the step's thread is given to the highest-priority
category of the events open at that instant (nested ranges: the innermost meaning wins by priority), and instants
with no event open are idle (the profiler's own ProfilerStep#N range, which encloses every step, is no event of the
step):

    importance and top-k   nsa.sel.importance, nsa.sel.topk
    attention branches     nsa.cmp, nsa.sel (and nsa.sel.ranges_*), nsa.win, nsa.dense
    communication          all_reduce / all_gather / reduce_scatter / broadcast / nccl / gloo / c10d
    optimizer              nsa.optim, Optimizer.* (the optimizer step), zero_grad
    data                   DataLoader / data
    MLP/GEMM               aten::mm, addmm, bmm, matmul, linear (outside the attention ranges)
    other                  any other operator
    idle                   nothing open on the step's thread (Python overhead, waits)

Host-side only: the events of the thread that runs the step. On CPU that covers the backward too (autograd runs
CPU work on the calling thread); on a GPU the device's kernels and autograd's device thread are not attributed, nor
are the gpu_user_annotation copies of the ranges that Kineto writes on the GPU's streams (they would count every
step twice), so GPU attribution is still to be checked against a real trace.

Returns {"steps", "step_time_ms" (mean), "categories": {name: share}, "ranges": {nsa.* name: share of step time
(inclusive)}}; shares are of the summed step time. Torch-free.
"""

from __future__ import annotations

from typing import Any

from validation.analysis.parallelism import GPU_ANNOTATION, complete_events
from validation.formatting import finite

CATEGORIES = ("importance and top-k", "attention branches", "communication", "optimizer", "data", "MLP/GEMM",
              "other", "idle")
_COMM = ("all_reduce", "allreduce", "all_gather", "reduce_scatter", "broadcast", "nccl", "gloo", "c10d")
WINDOWS = ("nsa.step", "nsa.optim")  # the ranges that make up a step's time
_GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")
PROFILER_STEP = "ProfilerStep#"  # torch.profiler's range around each profiler.step() period: left out


def category(name: str) -> str:
    low = name.lower()
    if name.startswith(("nsa.sel.importance", "nsa.sel.topk")):
        return "importance and top-k"
    if name.startswith(("nsa.cmp", "nsa.sel", "nsa.win", "nsa.dense")):
        return "attention branches"
    if any(k in low for k in _COMM) and not low.startswith("aten::"):  # aten::broadcast_to is a view, not a collective
        return "communication"
    if name.startswith(("Optimizer.", "nsa.optim")) or "zero_grad" in low:
        return "optimizer"
    if "dataloader" in low or low.startswith("data"):
        return "data"
    if name in _GEMM:
        return "MLP/GEMM"
    return "other"


def attribute_events(events: list[dict]) -> dict[str, Any]:
    """Attribution of complete ("X") events (validation.analysis.parallelism.complete_events): see the module's
    docstring."""
    # an event with a negative or non-finite start or duration is no time (a damaged trace): left out, as the
    # profile kind's operator table leaves it out
    evs = [e for e in complete_events(events)
           if finite(e.ts) is not None and finite(e.dur) is not None and e.dur >= 0]
    # the host's ranges only: on a GPU Kineto writes each range again as a gpu_user_annotation over its kernels
    host = [e for e in evs if e.cat != GPU_ANNOTATION]
    steps = [e for e in host if e.name == "nsa.step"]
    windows = [e for e in host if e.name in WINDOWS]
    totals = {c: 0.0 for c in CATEGORIES}
    ranges: dict[str, float] = {}
    step_total = 0.0
    for st in windows:
        t0, t1 = float(st.ts), float(st.ts) + float(st.dur)
        step_total += t1 - t0
        # the profiler's own ProfilerStep#N range spans every step on the same thread: it is the profiler's marker
        # of the step, not work within it (counted, it left no instant idle and gave that time to "other")
        inside = [e for e in evs if e is not st and (e.pid, e.tid) == (st.pid, st.tid)
                  and not e.name.startswith(PROFILER_STEP)
                  and float(e.ts) < t1 and float(e.ts) + float(e.dur) > t0]
        points = [(t0, 1, CATEGORIES.index(category(st.name)))] if st.name != "nsa.step" else []
        points += [(t1, -1, points[0][2])] if points else []
        for e in inside:
            name = e.name
            a, b = max(t0, float(e.ts)), min(t1, float(e.ts) + float(e.dur))
            if name.startswith("nsa.") and name not in WINDOWS:
                ranges[name] = ranges.get(name, 0.0) + (b - a)
            c = CATEGORIES.index(category(name))
            points += [(a, 1, c), (b, -1, c)]
        points.sort(key=lambda p: (p[0], p[1]))
        open_count = [0] * len(CATEGORIES)
        last = t0
        for t, delta, c in points:
            if t > last:
                active = next((i for i, n in enumerate(open_count) if n > 0), CATEGORIES.index("idle"))
                totals[CATEGORIES[active]] += t - last
                last = t
            open_count[c] += delta
        if t1 > last:
            active = next((i for i, n in enumerate(open_count) if n > 0), CATEGORIES.index("idle"))
            totals[CATEGORIES[active]] += t1 - last
    if step_total <= 0 or not steps:
        return {"steps": 0, "step_time_ms": None, "categories": {}, "ranges": {}}
    return {"steps": len(steps), "step_time_ms": step_total / len(steps) / 1000.0,
            "categories": {c: totals[c] / step_total for c in CATEGORIES},
            "ranges": {k: v / step_total for k, v in sorted(ranges.items())}}
