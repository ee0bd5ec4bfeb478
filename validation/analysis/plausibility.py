"""The physical range of every metric that has one, declared once, and the check of figures against it: a
scaling efficiency above 1.1 or at most 0 (a train step's `scaling_efficiency`, and a `scaling` step's
`strong`/`weak` efficiencies: `efficiency.min`, `.last` and each row's), a tokens/s CV above 50%, an MFU above
100%, a GPU utilisation outside 0..100%, a share (communication, a parallelism step's per strategy, interference)
outside 0..1, and a negative time, tokens/s, TFLOP/s, loss, norm, memory, power, clock or bandwidth, and a speed-up
(a ratio of two times) at most 0;
where a trainer launch's context (env.json) knows its device's peak and the FLOPs a token, its tokens/s (all ranks
and per GPU) and TFLOP/s above what the devices do at MFU 1 (peak_ceiling); where its telemetry knows the cores of
its nodes, a CPU utilisation above what they have (cpu_ceiling); a collective's bus or algorithm bandwidth between
ranks above what the GPU's link carries (bandwidth_ceiling; any GPU's, where the device is not known). Lists are walked too (a scaling step's rows, a
benchmark's records, a comm step's table). A figure outside its range is a bug in the measurement, not a result
(validation.execution.evidence: a criterion reading it is an error, inconclusive when its step was disturbed; a
decision over runs that measured one recommends nothing and is no key finding; the report lists it among the open
problems). Pure; no kind imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from nsa.devices import link_gbps
from validation.analysis.interference import launch_records
from validation.formatting import finite, fmt_num, plural
from validation.results.codec import decode
from validation.results.trainer_launch import RunContext


@dataclass(frozen=True)
class Range:
    """The physical range of a metric: `low` < value (<= with low_closed), value <= `high` (< with not
    high_closed); None: unbounded on that side."""

    # a dotted metric name, "<i>" standing for a list index, "<label>" for a mapping's key (a parallelism step's
    # strategy): "toks_per_s.cv", "weak.rows.<i>.efficiency", "strategies.<label>.comm_share"
    pattern: str
    low: float | None
    high: float | None
    low_closed: bool = True
    high_closed: bool = True
    reason: str = ""

    def holds(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (value == self.low and not self.low_closed)):
            return False
        if self.high is not None and (value > self.high or (value == self.high and not self.high_closed)):
            return False
        return True

    def text(self) -> str:
        low = "-inf" if self.low is None else fmt_num(self.low)
        high = "inf" if self.high is None else fmt_num(self.high)
        return f"{'[' if self.low_closed and self.low is not None else '('}{low}, {high}" \
               f"{']' if self.high_closed and self.high is not None else ')'}"


_STATS = ("mean", "median", "min", "max")
_MEMORY, _LOSS = "memory in use is never negative", "a cross-entropy loss is never negative"
_NON_NEGATIVE = {"loss": _LOSS, "grad_norm": "a norm is never negative",
                 "mem_alloc_gb": _MEMORY, "mem_reserved_gb": _MEMORY}
_EFFICIENCY = "N ranks cannot do more than N times the work of one, beyond a cache effect of a few percent"
_TIMES = ("step_time_s", "time_to_first_step_s", "startup.imports_s", "startup.init_s", "startup.first_step_s",
          "summary.avg_step_time_s", "summary.min_step_time_s", "summary.max_step_time_s", "summary.comm_time_s")
# a training step's time (a forward, a backward and an optimizer step) is never 0: above it, not at it
_STEP_TIMES = ("step_time_s", "summary.avg_step_time_s", "summary.min_step_time_s", "summary.max_step_time_s")
RANGES: tuple[Range, ...] = (
    Range("scaling_efficiency", 0.0, 1.1, low_closed=False, reason=_EFFICIENCY),
    Range("scaling_efficiency_low", 0.0, 1.1, low_closed=False, reason=_EFFICIENCY),  # an interval's lower bound
    *(Range(f"{mode}.{at}", 0.0, 1.1, low_closed=False, reason=_EFFICIENCY)
      for mode in ("strong", "weak") for at in ("efficiency.min", "efficiency.last", "rows.<i>.efficiency",
                                                  # an interval's lower bound above the range: its efficiency is too
                                                  # (its upper bound may pass 1.1 by noise alone)
                                                  "efficiency.min_low", "efficiency.last_low",
                                                  "rows.<i>.efficiency_low")),
    Range("toks_per_s.cv", 0.0, 0.5,
          reason="a window whose tokens/s vary by more than half their mean measures the machine, not the run"),
    *(Range(f"toks_per_s.{s}", 0.0, None) for s in ("mean", "median", "min", "max")),
    Range("toks_per_s_per_gpu", 0.0, None), Range("tflops_per_s", 0.0, None),
    *(Range(f"mfu.{s}", 0.0, 1.0, reason="no device does more FLOP/s than its peak")
      for s in ("mean", "median", "min", "max")),
    *(Range(f"{t}.{s}" if t == "step_time_s" else t, 0.0, None, low_closed=t not in _STEP_TIMES,
            reason="a step takes time" if t in _STEP_TIMES else "a time is never negative")
      for t in _TIMES for s in (("mean", "median", "min", "max") if t == "step_time_s" else ("",))),
    Range("summary.comm_share", 0.0, 1.0, reason="a share of the step time"),
    Range("strategies.<label>.comm_share", 0.0, 1.0, reason="a share of the step time"),  # a parallelism step's
    Range("toks_per_s.stdev", 0.0, None), Range("toks_per_s_per_node", 0.0, None),
    *(Range(f"summary.{k}", 0.0, None) for k in ("tokens_per_s", "samples_per_s")),
    Range("summary.avg_step_time_excl_first_s", 0.0, None, low_closed=False, reason="a step takes time"),
    *(Range(f"{c}.{s}" if s else c, 0.0, None, reason=_NON_NEGATIVE[c])
      for c in ("loss", "grad_norm", "mem_alloc_gb", "mem_reserved_gb") for s in _STATS),
    *(Range(k, 0.0, None, reason=_LOSS if "loss" in k else _MEMORY)
      for k in ("first_loss", "final_loss", "mem_peak_gb", "summary.avg_loss", "summary.final_loss",
                *(f"summary.{w}_mem_{m}_gb" for w in ("peak", "avg") for m in ("alloc", "reserved")))),
    *(Range(f"{g}.{s}", 0.0, None, reason=_MEMORY) for g in ("gpu_mem_used_gb", "rss_gb")
      for s in ("mean", "min", "max")),
    *(Range(f"gpu_util.{s}", 0.0, 100.0, reason="a utilisation is a percentage of the time")
      for s in ("mean", "min", "max")),
    *(Range(f"{g}.{s}", 0.0, None) for g in ("cpu_util", "power_w", "sm_clock_mhz") for s in ("mean", "min", "max")),
    Range("interference.share", 0.0, 1.0, reason="a share of the samples"),
    *(Range(f"{k}.{bw}", 0.0, None, reason="a bandwidth is never negative")
      for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
      for bw in ("busbw_gbps.max", "busbw_gbps.median", "algbw_gbps.max", "algbw_gbps.median", "avg_busbw_gbps_reported",
                 "table.<i>.busbw_gbps", "table.<i>.algbw_gbps", "table.<i>.reported_busbw_gbps")),
)
_RATE = "a rate (tokens, samples or operations per second) is never negative"
_SPEEDUP = Range("speedup", 0.0, None, low_closed=False,
                 reason="a speed-up is the ratio of two times, each of them positive")


def _by_end(ranges: tuple[Range, ...]) -> dict[tuple[int, str], tuple[tuple[Range, tuple[str, ...]], ...]]:
    """RANGES by (number of parts, last part) of their patterns, each with its parts, in declaration order: a path
    can match only the patterns of its own length whose last part is its last key (no pattern ends in "<i>" or
    "<label>"). A report's views look up a range for every figure of every step (12,924 lookups for cpu_smoke's),
    and splitting and trying all 120 patterns each time took 2.5 s of a 12-s report."""
    found: dict[tuple[int, str], list] = {}
    for r in ranges:
        parts = tuple(r.pattern.split("."))
        if parts[-1].startswith("<"):  # such a range would never be looked up: refused where it is declared
            raise ValueError(f"a range's pattern ends in a placeholder (<i>, <label>): {r.pattern}")
        found.setdefault((len(parts), parts[-1]), []).append((r, parts))
    return {k: tuple(v) for k, v in found.items()}


_BY_END = _by_end(RANGES)


def _range_for(path: tuple, launch: Any = None) -> Range | None:
    """The declared range of a metric at `path` (the leading "runs.<label>" or "<variant>" of a multi-run kind's
    record left to the caller), or None; `launch`: the launch's metrics the figure belongs to, whose context bounds
    its throughput (peak_ceiling), its telemetry its CPU (cpu_ceiling) and its world size its bandwidths
    (bandwidth_ceiling). A figure whose last name holds "speedup" (a benchmark's `ranges_speedup_min`, a scaling
    row's `speedup`) is a ratio of two times; one whose last name ends in "_per_s" a rate and in "_ms" or "_s" a
    time, both never negative (a benchmark's records: `best.dense.toks_per_s`, `forward_v1_ms`)."""
    name = ".".join(str(k) for k in path)
    for r, parts in _BY_END.get((len(path), str(path[-1])), ()) if path else ():
        if all(_matches(p, k) for p, k in zip(parts, path)):
            for ceiling in (peak_ceiling(launch, name), cpu_ceiling(launch, name), bandwidth_ceiling(launch, name)):
                r = _tighter(r, ceiling)
            return r
    last = next((str(k) for k in reversed(path) if not _index(k)), "")
    if "speedup" in last.lower():
        return Range(name, _SPEEDUP.low, None, False, True, _SPEEDUP.reason)
    if last.endswith("_per_s"):  # a benchmark's toks_per_s, best.<group>.toks_per_s, samples_per_s
        return Range(name, 0.0, None, reason=_RATE)
    if last.endswith(("_ms", "_s")):  # a benchmark's forward_v1_ms, wall_s, a time anywhere
        return Range(name, 0.0, None, reason="a time is never negative")
    return None


@dataclass(frozen=True)
class _Nodes:
    """What the CPU ceiling reads of a launch's telemetry record: the nodes it sampled."""
    nodes: list[Any] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Cores:
    """What the CPU ceiling reads of a launch's interference record: the CPUs of a node (the most of its nodes)."""
    ncpu: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchFigures:
    """What the ceilings of a launch's figures read of its metrics (the rest kept aside): the device context of a
    trainer launch's throughput, its world size, a comm launch's GPU, the nodes and cores its telemetry sampled."""
    context: RunContext | None = None
    world_size: Any = None
    device_name: Any = None
    nnodes: Any = None
    telemetry: _Nodes | None = None
    interference: _Cores | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_PEAK_BOUND = ("toks_per_s.mean", "toks_per_s.median", "toks_per_s.max", "summary.tokens_per_s",
               "toks_per_s_per_gpu", "tflops_per_s")
_PEAK_REASON = "no device does more FLOP/s than its peak ({world} x {peak} TFLOP/s{fpt}: MFU above 1)"


def peak_ceiling(launch: Any, name: str) -> Range | None:
    """The range of a trainer launch's throughput figure `name` (tokens/s, tokens/s per GPU, model TFLOP/s) that
    its device's peak allows: at most world_size x peak_flops / flops_per_token tokens/s (MFU 1, the same division
    as the trainer's "mfu" column), from the launch's "context" (env.json); None where the peak, the FLOPs a token
    or the world size is unknown (a CPU), or `name` is not such a figure."""
    if name not in _PEAK_BOUND or not isinstance(launch, dict):
        return None
    figures = decode(LaunchFigures, launch, "metrics", lenient=True)
    ctx = figures.context or RunContext()
    peak, fpt = finite(ctx.peak_flops), finite(ctx.flops_per_token)
    world = finite(ctx.world_size) or finite(figures.world_size)
    if not peak or not fpt or not world or peak <= 0 or fpt <= 0 or world <= 0:
        return None
    per_gpu = name == "toks_per_s_per_gpu"
    high = (peak / 1e12 * world if name == "tflops_per_s" else peak / fpt * (1 if per_gpu else world))
    per_token = "" if name == "tflops_per_s" else f" at {fpt:,.4g} FLOPs a token"
    return Range(name, 0.0, high, reason=_PEAK_REASON.format(world=1 if per_gpu else f"{world:g}",
                                                             peak=f"{peak / 1e12:,.4g}", fpt=per_token))


# A process tree's CPU time over a period, in percent of one core (validation.launch.telemetry), is at most 100% of
# each core of its nodes; the sampler reads each process's time in whole clock ticks, so a sample may exceed that by
# a tick per process: a tenth of the cores is left for it, as the scaling efficiency leaves 10% for a cache effect
CPU_SLACK = 1.1
_CPU_BOUND = ("cpu_util.mean", "cpu_util.min", "cpu_util.max")


def cpu_ceiling(launch: Any, name: str) -> Range | None:
    """The range of a launch's CPU utilisation `name` (cpu_util.mean/min/max, percent of one core, its nodes summed)
    that its cores allow: at most CPU_SLACK x 100% x the CPUs of a node (its interference record's ncpu) x the nodes
    its telemetry sampled (else its nnodes, else 1); None where the CPUs are unknown or `name` is not such a figure."""
    if name not in _CPU_BOUND or not isinstance(launch, dict):
        return None
    figures = decode(LaunchFigures, launch, "metrics", lenient=True)
    ncpu = finite(figures.interference.ncpu) if figures.interference is not None else None
    if not ncpu or ncpu <= 0:
        return None
    nodes = len(figures.telemetry.nodes) if figures.telemetry is not None and figures.telemetry.nodes else 0
    nodes = nodes or int(finite(figures.nnodes) or 1)
    cores = ncpu * max(nodes, 1)
    return Range(name, 0.0, CPU_SLACK * 100.0 * cores,
                 reason=f"a process tree cannot use more than the {cores:g} cores of its "
                        f"{plural(max(nodes, 1), 'node')} (100% each)")


# The fastest link between two GPUs: NVLink 6 (announced for Rubin, 3.6 TB/s a GPU in both directions), 1,800 GB/s
# each way; a listed device's own link: nsa.devices (450 GB/s each way on an H100 or H200 SXM). A collective's bus
# bandwidth (nccl-tests' busbw) is the rate each rank's own link carries (PERFORMANCE.md): an all-gather's rank
# receives (n-1)/n of the output, a reduce-scatter's sends (n-1)/n of its input, a broadcast's receives it all, so
# their busbw is at most the link's rate. Reduction in the switch (NVLS, SHARP) has an all-reduce's rank send its S
# bytes and receive the S-byte result once, so its algbw is at most one link's rate and its busbw, 2(n-1)/n x algbw,
# at most 2(n-1)/n x the link (twice it with n unknown). algbw = busbw / the bus factor: at most the link for an
# all-reduce and a broadcast, n/(n-1) x it (twice it at two ranks) for an all-gather and a reduce-scatter.
LINK_PEAK_GBPS = 1800.0
_BANDWIDTH_NAMES = ("busbw_gbps.max", "busbw_gbps.median", "algbw_gbps.max", "algbw_gbps.median",
                    "avg_busbw_gbps_reported", "busbw_gbps", "algbw_gbps", "reported_busbw_gbps")


def bandwidth_ceiling(launch: Any, name: str) -> Range | None:
    """The range of a collective's bandwidth `name` (a comm step's "<kind>.busbw_gbps.max", a row of its table...)
    that the link between two of its GPUs allows: link_share x the link's rate each way (nsa.devices.link_gbps) for
    the launch's device_name, else x the fastest link's (LINK_PEAK_GBPS: a CPU, an unknown GPU); None for
    another figure, or at one rank (its launch's world_size 1), where nothing moves between ranks and the figures
    are the calls' own overhead."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] not in _COLLECTIVES or not any(name.endswith(n) for n in _BANDWIDTH_NAMES):
        return None
    figures = decode(LaunchFigures, launch, "metrics", lenient=True) if isinstance(launch, dict) else LaunchFigures()
    if finite(figures.world_size) == 1:
        return None
    n = finite(figures.world_size)
    n = int(n) if n is not None and n >= 2 else None
    share, why = link_share(parts[0], "busbw" in name, n)
    device = str(figures.device_name) if isinstance(figures.device_name, str) else ""
    link = link_gbps(device) if device and device.lower() != "cpu" else None
    if link:
        return Range(name, 0.0, share * link,
                     reason=f"the link between two {device} GPUs carries at most {link:,.0f} GB/s each way, "
                            f"{share * link:,.0f} GB/s for this figure ({why})")
    return Range(name, 0.0, share * LINK_PEAK_GBPS,
                 reason=f"no link between GPUs carries more than {LINK_PEAK_GBPS:,.0f} GB/s each way (NVLink 6), "
                        f"{share * LINK_PEAK_GBPS:,.0f} GB/s for this figure ({why})")


def link_share(collective: str, busbw: bool, n: int | None) -> tuple[float, str]:
    """How many times one link's rate (each way) a collective's bandwidth figure can reach at n ranks (None: not
    known, the largest share any n gives), and why: busbw is the rate a rank's own link carries (an all-reduce's up
    to 2(n-1)/n x with reduction in the switch), algbw = busbw / the bus factor."""
    if busbw:
        if collective == "all_reduce":
            return (2 * (n - 1) / n if n else 2.0), "an all-reduce's busbw, with reduction in the switch"
        return 1.0, f"a {collective.replace('_', '-')}'s busbw: the bytes a rank's own link carries"
    if collective in ("all_gather", "reduce_scatter"):
        return (n / (n - 1) if n else 2.0), f"a {collective.replace('_', '-')}'s algbw: n/(n-1) x its busbw"
    return 1.0, f"a {collective.replace('_', '-')}'s algbw"


_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _tighter(declared: Range, ceiling: Range | None) -> Range:
    """The declared range, or the device's ceiling where it is lower."""
    if ceiling is None or (declared.high is not None and declared.high <= (ceiling.high or 0.0)):
        return declared
    return Range(declared.pattern, declared.low, ceiling.high, declared.low_closed, True, ceiling.reason)


def _matches(part: str, key: Any) -> bool:
    """Whether a key of a metric path is what one part of a Range's pattern names: that name, a list index for
    "<i>", a mapping's key (not an index) for "<label>"."""
    return part == str(key) or (part == "<i>" and _index(key)) or (part == "<label>" and not _index(key))


def _index(key: Any) -> bool:
    """Whether a key of a metric path is a list index (an int, or its digits in a dotted name)."""
    return (isinstance(key, int) and not isinstance(key, bool)) or (isinstance(key, str) and key.isdigit())


def range_of(name: str) -> Range | None:
    """The declared range of the metric named `name` ("scaling_efficiency", "toks_per_s.cv"), or None."""
    return _range_for(tuple(name.split("."))) if name else None


def implausible(metrics: Any, at: tuple = (), shown: tuple = (), launch: Any = None) -> list[dict[str, Any]]:
    """Every figure in `metrics` outside its declared range: [{"metric" (dotted, after `shown`), "value", "range",
    "reason"}]. `metrics` is a launch's metrics, or the part of them at key path `at` (what a criterion read) of the
    launch's metrics `launch` (whose context bounds its throughput: peak_ceiling)."""
    out = []
    launch = metrics if launch is None and not at else launch

    def walk(value: Any, path: tuple) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, path + (key,))
            return
        if isinstance(value, list):
            for i, inner in enumerate(value):
                walk(inner, path + (i,))
            return
        v = finite(value)
        if v is None or isinstance(value, bool):
            return
        r = _range_for(tuple(at) + path, launch)
        if r is not None and not r.holds(v):
            out.append({"metric": ".".join(str(k) for k in tuple(shown) + path), "value": v, "range": r.text(),
                        "reason": r.reason or "outside its physical range"})

    walk(metrics, ())
    return out


def step_implausible(step: Any) -> list[dict[str, Any]]:
    """Every figure of a step record (results.json's, as written) outside its range, as implausible() gives them:
    each launch's (the step's own metrics, or each run's as "runs.<label>...": launch_records) and, for a step of
    runs, the figures the step derived from them (a scaling step's efficiencies, a benchmark's speed-ups); once
    each."""
    out: list[dict[str, Any]] = []
    launches = launch_records(step if isinstance(step, dict) else {})
    if any(label for label, _, _ in launches):
        launches.append(("", None, decode(_StepMetrics, step, "step", lenient=True).metrics))
    for label, _, m in launches:
        out += [b for b in implausible(m, (), ("runs", label) if label else ()) if b not in out]
    return out


@dataclass(frozen=True)
class _StepMetrics:
    """A step record's own metrics (its runs' are launch_records')."""
    metrics: dict[str, Any] = field(default_factory=dict)


def figure_problem(name: str, value: Any) -> str | None:
    """Why a figure shown on its own (a key figure: "scaling_efficiency") is not a result, or None."""
    v = finite(value)
    r = _range_for(tuple(name.split(".")))
    if v is None or r is None or r.holds(v):
        return None
    return f"{fmt_num(round(v, 4))} is outside the physical range {r.text()} of {name}: {r.reason}"


def value_at(namespace: dict, step: str, path: tuple) -> Any:
    value: Any = namespace.get(step)
    for key in path:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
            value = value[key]
        else:
            return None
    return value


def implausible_reads(namespace: dict, reads: Iterable[tuple[str, tuple]]) -> list[str]:
    """"step.metric = value outside (range): reason" for every value the reads take that is outside its range
    (a read of a multi-run kind's run, runs.<label>..., is judged as that launch's metric)."""
    out = []
    for step, path in reads:
        in_run = len(path) >= 2 and path[0] == "runs"
        at = tuple(path)[2:] if in_run else tuple(path)
        shown = (step, *path)
        launch = value_at(namespace, step, tuple(path)[:2] if in_run else ())
        out += [text(bad) for bad in implausible(value_at(namespace, step, path), at, shown, launch)]
    return out


def text(bad: dict[str, Any]) -> str:
    """One figure implausible() found, as the open problems and criteria say it: "metric = value outside [range]:
    reason"."""
    metric, value, where, reason = (bad[k] for k in ("metric", "value", "range", "reason"))
    return f"{metric} = {fmt_num(round(value, 4))} outside {where}: {reason}"
