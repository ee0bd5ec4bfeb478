"""`profile`: a trainer launch with NSA_NVTX=1 and the torch profiler over `profile_steps` steps (under Nsight
Systems when `profiler` is nsys, or auto with nsys on PATH): the top operators and the nsa.* ranges seen.

Own keys: `profile_steps` (default 3), `profiler: auto | torch | nsys`.
Metrics: a trainer launch's (validation.kinds.trainer) plus "profile": {"trace", "top_ops": [{"name", "total_ms",
"calls"}], "nvtx_ranges": [nsa.* range names seen], "attribution": validation.analysis.attribution's shares of step time
by category and by nsa.* range}. No trace written by this launch (one an earlier launch left in the directory is
none), or one that cannot be read (empty, cut off), fails the step.
Options: the keys above. Result: the step record of one trainer launch (validation.kinds.trainer.TrainerResult), its
metrics the launch's LaunchMetrics with its ProfileRecord (Metrics); the report hooks read it decoded leniently.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

from validation import kinds
from validation.analysis.attribution import attribute_events
from validation.analysis.parallelism import complete_events
from validation.formatting import file_name, finite, fmt_num, fmt_pct
from validation.runbook.schema import typed
from validation.kinds.blocks import Block, Bullets, Column, Paragraph, Table, code
from validation.kinds.base import run_path
from validation.kinds.trainer import (TRAINER_METRICS, TrainerKind, TrainerResult, launch_one, launch_started,
                                      trainer_launch, written_before)
from validation.results.codec import absent, decode, given
from validation.results.trainer_launch import LaunchMetrics, Num


@dataclasses.dataclass(frozen=True)
class Options:
    profile_steps: int = 3
    profiler: str = "auto"  # torch, nsys


@dataclasses.dataclass(frozen=True)
class TopOp:
    """One operator of the trace (profile_summary): its name, its time and its calls; older records named the time
    self_time_ms or time_ms."""
    name: Any = None
    self_time_ms: Num | None = absent()
    total_ms: Num | None = absent()
    time_ms: Num | None = absent()
    calls: Num | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ms(self) -> Num | None:
        """The operator's time, under whichever name its record has."""
        return next((t for t in (self.self_time_ms, self.total_ms, self.time_ms) if t is not None), None)


@dataclasses.dataclass(frozen=True)
class Attribution:
    """Shares of step time (validation.analysis.attribution.attribute_events): the profiled steps, their mean time,
    the shares by category and by nsa.* range."""
    steps: int | None = None
    step_time_ms: Num | None = None
    categories: dict[str, Any] = dataclasses.field(default_factory=dict)  # category: share, as written
    ranges: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ProfileRecord:
    """The step's "profile": the trace (relative to the run directory), the top operators, the nsa.* ranges seen
    and, where a trace was written, the attribution."""
    trace: str | None = None
    top_ops: list[TopOp] = dataclasses.field(default_factory=list)
    nvtx_ranges: list[Any] = dataclasses.field(default_factory=list)
    attribution: Attribution = absent(Attribution())  # none without a trace: a blank Attribution
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Metrics(LaunchMetrics):
    """The step's metrics: its trainer launch's, then its profile (run() always writes one; a hand-made record may
    hold its keys at the top instead: then they are in `extra`)."""
    profile: ProfileRecord = dataclasses.field(default_factory=ProfileRecord)


@dataclasses.dataclass(frozen=True)
class Result(TrainerResult):
    """A profile step's record: its one trainer launch's, its metrics with the profile."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


class Profile(TrainerKind):
    name = "profile"
    listing = 70
    summary = "a trainer run with `NSA_NVTX=1` and a torch profiler trace: top operators and the `nsa.*` ranges seen"
    keys = ("profile_steps", "profiler")
    performance = ()  # a profile's steps run under the profiler: a trace, not a measurement of speed
    metrics = TRAINER_METRICS + ("profile.trace", "profile.top_ops.<i>.*", "profile.nvtx_ranges.<i>",
                                 "profile.attribution.*")
    result_type = Result

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        return Options(profile_steps=typed(raw.get("profile_steps", 3), int, path + ("profile_steps",), ctx, minimum=1),
                       profiler=typed(raw.get("profiler", "auto"), str, path + ("profiler",), ctx,
                                      choices=("auto", "torch", "nsys")))

    def launches(self, step, winners, run_dir):
        spec = trainer_launch(step, step.launch, "", step.name, winners, run_dir,
                              extra_args={"profile_steps": step.profile_steps}, extra_env={"NSA_NVTX": "1"})
        if nsys_available(step):
            spec.wrapper = ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--force-overwrite", "true", "-o",
                            run_path(run_dir, f"{step.name}/nsys_profile")]
        return [spec]

    def skip_reason(self, step) -> str | None:
        if step.profiler == "nsys" and not nsys_available(step):
            return "profiler nsys requested, but nsys is not on PATH"
        return None

    def run(self, options: Options, ctx) -> Result:
        one = launch_one(ctx)
        spec = one.spec
        artifacts = [ctx.rel(p) for p in sorted((ctx.run_dir / spec.dir).glob("nsys_profile*"))] if spec.wrapper else []
        # a trace an earlier launch left in the directory (a rerun whose trainer died before it moved its files
        # aside; the earlier process of a resumed run) is not this launch's, as collect() reads the trainer's other
        # files; without the launch's duration its start is not known and every trace counts
        since = launch_started(one.lr)
        found = sorted((ctx.run_dir / spec.out_dir / "profile").glob("trace_rank0_*.json"), key=_trace_order)
        traces = [t for t in found if not written_before(t, since)]
        status, reason = one.status, one.reason
        prof = ProfileRecord()
        if traces:
            trace = traces[-1]  # the latest step's
            events, problem = read_trace(trace)  # one read of a file that reaches hundreds of MB on a GPU
            prof = decode(ProfileRecord, {"trace": ctx.rel(trace), **profile_summary(trace, events=events),
                                          "attribution": attribute_events(events)}, "metrics.profile")
            artifacts.append(ctx.rel(trace))
            if problem is not None and status == "passed":
                status, reason = "failed", f"profiler trace {ctx.rel(trace)}: {problem}"
        elif status == "passed":
            earlier = f" (only an earlier launch's: {', '.join(ctx.rel(t) for t in found)})" if found else ""
            status, reason = "failed", f"no profiler trace was written{earlier}"
        launch = {f.name: getattr(one.metrics, f.name) for f in dataclasses.fields(LaunchMetrics)}
        return Result(status=status, reason=reason, metrics=Metrics(**launch, profile=prof), artifacts=artifacts)

    def blocks(self, result: Result) -> list[Block]:
        """The trainer launch's blocks, then the top operators, the NVTX ranges, the attribution and the trace."""
        m = result.metrics
        # run() nests them under "profile"; a record without one holds its keys at the top (in `extra`)
        prof = given(m.profile) or decode(ProfileRecord, m.extra, lenient=True)
        out = super().blocks(result)
        if prof.top_ops:
            out.append(Table((Column("Operator"), Column("Time (ms)", numeric=True), Column("Calls", numeric=True)),
                             [(code(fmt_num(o.name)), fmt_num(o.ms), fmt_num(o.calls)) for o in prof.top_ops]))
        else:
            out.append(Paragraph("No operator table recorded."))
        ranges = [code(r) for r in prof.nvtx_ranges]
        items = ["NVTX ranges seen: " + (", ".join(ranges) or "none")]
        attribution = _attribution_text(prof.attribution)
        if attribution:
            items.append(f"Step time by category ({fmt_num(prof.attribution.steps)} profiled "
                         f"step(s), host side): {attribution}")
        if prof.trace:
            items.append(f"Trace: {code(prof.trace)}")
        return out + [Bullets(items)]

    def plots(self, name: str, result: Result, plotter) -> None:
        """The trainer launch's plots, and the shares of step time by category (validation.analysis.attribution)."""
        super().plots(name, result, plotter)
        shares = result.metrics.profile.attribution.categories
        if not shares:
            return
        title = f"Step time by category: {result.title or name}"
        fig, ax = plotter.figure(title, "share of step time")
        ax.barh(list(shares), [float(v) for v in shares.values()], color="tab:blue")
        plotter.save(fig, f"attribution_{file_name(name)}.png", title)


def _attribution_text(att: Attribution) -> str | None:
    """"attention branches 24.6%, MLP/GEMM 28.9%, ..." (largest first; shares of step time), or None."""
    shares = {k: v for k, v in att.categories.items() if isinstance(v, (int, float)) and v > 0}
    if not shares:
        return None
    return ", ".join(f"{k} {fmt_pct(v)}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))


def nsys_available(step) -> bool:
    """Whether a profile step runs under Nsight Systems: profiler nsys, or auto with nsys on PATH."""
    if step.launch.launcher.type == "slurm":  # nsys here says nothing about the nodes; torch profiler there
        return False
    return step.profiler in ("nsys", "auto") and shutil.which("nsys") is not None


def _trace_order(path: Path) -> tuple[int, str]:
    """trace_rank0_step<n>.json by its step number (step10 after step9), then by name."""
    number = re.search(r"_step(\d+)\.json$", path.name)
    return (int(number.group(1)) if number else -1, path.name)


def read_trace(trace: Path) -> tuple[list, str | None]:
    """A torch profiler chrome trace's traceEvents list, and why the file cannot be read (what a trainer killed while
    exporting leaves: an empty or cut-off file) or None: "empty", "not valid JSON (...)", "no traceEvents list",
    "unreadable: ...". An unreadable trace gives no events. The one reader of the trainer's traces."""
    try:
        raw = Path(trace).read_bytes()
    except OSError as exc:
        return [], f"unreadable: {exc.strerror or exc}"
    if not raw.strip():
        return [], "empty"
    try:  # bytes: a file cut off inside a multi-byte character (or not UTF-8) is not valid JSON, not an exception
        data = json.loads(raw)
    except ValueError as exc:
        return [], f"not valid JSON ({exc})"
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        return [], "no traceEvents list"
    return data["traceEvents"], None


def trace_problem(trace: Path) -> str | None:
    """Why a profiler trace cannot be read, or None (read_trace)."""
    return read_trace(trace)[1]


def profile_summary(trace: Path, top: int = 15, events: list | None = None) -> dict:
    """Top operators by their time and the nsa.* ranges seen, from a torch profiler chrome trace (the trainer's
    out_dir/profile/trace_rank0_*.json; `events`: its traceEvents when read_trace has read them already): its
    complete events (validation.analysis.parallelism.complete_events). An operator's time is the time its events
    cover on each thread (a CPU thread, a GPU stream; CPU operators and kernels apart), summed over the threads
    (inclusive: the operators it calls are counted in it too; trace microseconds as ms): an event inside another of
    the same name on the same thread (aten::arange calling its out= overload, also named aten::arange) adds no time
    and is no call of its own, while events of other threads or streams count in full, overlapping or not. An event
    with a negative or non-finite start or duration is no time and is left out. An unreadable trace gives empty
    lists (read_trace says why)."""
    if events is None:
        events = read_trace(trace)[0]
    events = complete_events(events)
    ranges = sorted({e.name for e in events if e.name.startswith("nsa.")})
    spans: dict[str, dict[tuple, list[tuple[float, float]]]] = {}
    for e in events:
        if e.cat in ("cpu_op", "kernel", "gpu_op") and finite(e.ts) is not None and finite(e.dur) is not None \
                and e.dur >= 0:
            start = float(e.ts)
            # the thread or stream as written (1 and "1" are two), apart per kind of event: a kernel is never
            # inside a CPU operator, whatever ids a trace gives them
            thread = (repr(e.cat), repr(e.pid), repr(e.tid))
            spans.setdefault(e.name, {}).setdefault(thread, []).append((start, start + float(e.dur)))
    ops = {name: _covered(threads.values()) for name, threads in spans.items()}
    rows = sorted(((k, round(us / 1000, 3), calls) for k, (us, calls) in ops.items()), key=lambda r: -r[1])[:top]
    return {"top_ops": [{"name": name, "total_ms": ms, "calls": calls} for name, ms, calls in rows],
            "nvtx_ranges": ranges}


def _covered(threads) -> tuple[float, int]:
    """(time covered, calls) of one operator's events, given as (start, end) lists per thread: per thread the length
    of the union of its events' intervals, and the events that start outside every earlier one (the outermost). Events
    that start together are taken longest first: the outer one before those inside it (an inner call of no duration
    at its start, as a trace in whole microseconds records one, is no call of its own)."""
    total, calls = 0.0, 0
    for intervals in threads:
        end = -math.inf
        for start, stop in sorted(intervals, key=lambda iv: (iv[0], -iv[1])):
            if start >= end:  # a call of its own; else inside an earlier event of the same name
                calls += 1
                total += stop - start
                end = stop
            elif stop > end:  # overlapping the end of an earlier one: only the part past it is more time
                total += stop - end
                end = stop
    return total, calls


kinds.register(Profile())
