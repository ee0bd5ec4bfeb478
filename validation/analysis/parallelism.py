"""The parallelism analysis's pure parts (seed 003), torch-free: the batch-size search, the DDP-vs-FSDP
recommendation rule, exposed communication time from a profiler trace, and the scaling efficiency table.
The step kinds validation.kinds.parallelism and validation.kinds.scaling feed them what they measured.

Batch-size search (`batch_search`): double the micro-batch from `start` while it fits (never past `maximum`),
then bisect between the last batch that fit and the first that did not; the largest batch that fits.

Recommendation (`recommend`), the seed's rule applied to the evidence, per strategy at the batch the runbook needs:
  - DDP fits with headroom (peak memory <= (1 - headroom) x the memory a rank has): DDP, unless an FSDP mode is
    significantly faster (then that mode: the evidence outranks the rule of thumb; when both FSDP modes are and
    neither is significantly faster than the other, no-reshard if it fits with headroom, else full shard);
  - DDP does not fit (it failed out of memory, or its peak exceeds the memory a rank has): FSDP; no-reshard
    (SHARD_GRAD_OP: no backward all-gather) when it fits with headroom and is not significantly slower than full
    shard, else full shard (the most memory saved);
  - tight (DDP fits, less headroom than asked): the significantly faster strategy among those that fit (several
    that no other is significantly faster than: the one that saves more memory, full shard, no-reshard, DDP);
    without a significant difference the one that saves the most memory of those that fit, in the same order
    (FSDP full shard where it fits: the headroom for a larger batch).
"Faster" always means a significant paired comparison (validation.analysis.significance) handed in as its record
(validation.results.decision.ComparisonRecord, or its JSON form): rel, ci_low, ci_high, p_value (p_adjusted),
significant, method; the reason states the numbers that decided it. A comparison of one run a side (method
"blocks": the step's repeats 1) is shown but never weighed, however small its p: its block means measure the noise
within each run, not how much two runs of one configuration differ (on cpu_smoke about 10%, against a run's own 2-4%;
validation.analysis.significance.comparison), and one run per variant never decides what a user is told to set
(validation.analysis.significance.decision). `recommendation` returns a typed Recommendation, `recommend` its JSON
form.

Exposed communication (`exposed_comm`): collective time not overlapped with compute, from the torch profiler's
chrome trace of rank 0: the union of the collectives' intervals (gloo's `gloo:*` work on its own threads, NCCL
kernels on the GPU streams) minus the union of the intervals during which compute ran (CPU: operators on the
training thread other than collectives and their waits; GPU: kernels other than NCCL's), divided by the profiled
steps (the trace's ProfilerStep# ranges; a trace without one has no per-step figure).

Scaling (`scaling_table`): per world size n the throughput X(n) (tokens/s, all ranks). Speedup S(n) =
X(n) / X(n0) with n0 the smallest world size measured; efficiency E(n) = S(n) x n0 / n. For strong scaling (the
global batch fixed) X(n) / X(n0) = T(n0) / T(n), the step-time speedup, and E = T(n0) n0 / (T(n) n); for weak
scaling (the per-rank batch fixed) E = X(n) n0 / (X(n0) n) = T(n0) / T(n). 1.0 is perfect scaling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from validation.analysis.significance.distributions import t_ppf
from validation.formatting import fmt_pct
from validation.results.codec import decode
from validation.results.decision import ComparisonRecord

STRATEGIES = {"ddp": "DDP", "fsdp": "FSDP2 full shard", "fsdp_no_reshard": "FSDP2 no-reshard (SHARD_GRAD_OP)"}
DEFAULT_HEADROOM = 0.2


class SearchError(Exception):
    """A batch-size search stopped by a failure that is not out of memory."""


# ---------------------------------------------------------------------------------------------- batch search
@dataclass
class SearchResult:
    largest: int | None  # the largest batch that fit (None: not even `start`)
    first_oom: int | None  # the smallest batch that did not fit (None: `maximum` fit)
    tried: list[tuple[int, bool]] = field(default_factory=list)  # (batch, fit) in the order tried
    error: str | None = None  # a failure that was not out of memory stopped the search

    def as_dict(self) -> dict[str, Any]:
        return {"largest": self.largest, "first_oom": self.first_oom, "error": self.error,
                "tried": [{"batch": b, "fits": f} for b, f in self.tried]}


def batch_search(fits: Callable[[int], bool], start: int = 1, maximum: int = 64) -> SearchResult:
    """The largest micro-batch in [start, maximum] for which fits(batch) is True, assuming that a batch that does
    not fit means no larger one fits: doubling until the first that does not fit, then bisection. fits raises
    SearchError for a failure other than out of memory: the search stops and says so, keeping what it found."""
    if not (isinstance(start, int) and isinstance(maximum, int) and 1 <= start <= maximum):
        raise ValueError(f"a batch search needs 1 <= start <= max, got start={start!r}, max={maximum!r}")
    out = SearchResult(largest=None, first_oom=None)

    def probe(b: int) -> bool:
        ok = bool(fits(b))
        out.tried.append((b, ok))
        return ok

    try:
        b = start
        while True:
            if not probe(b):
                out.first_oom = b
                break
            out.largest = b
            if b >= maximum:
                return out
            b = min(2 * b, maximum)
        if out.largest is None:
            return out
        lo, hi = out.largest, out.first_oom
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(mid):
                lo = out.largest = mid
            else:
                hi = out.first_oom = mid
    except SearchError as exc:
        out.error = str(exc)
    return out


OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "cublas_status_alloc_failed")


def is_oom(*texts: Any) -> bool:
    """Whether a launch's reason or traceback excerpt says it ran out of memory."""
    return any(m in str(t).lower() for t in texts if t for m in OOM_MARKERS)


# ---------------------------------------------------------------------------------------------- recommendation
Num = int | float


@dataclass(frozen=True)
class Evidence:
    """What was measured of one strategy at the batch the runbook needs."""
    fits: bool | None = None  # a run passed, none ran out of memory, and a batch-size search (if any) did not show
    # the batch out of memory
    peak_gb: Num | None = None
    capacity_gb: Num | None = None
    toks_per_s: Num | None = None
    largest_batch: int | None = None


@dataclass(frozen=True)
class Numbers:
    """The figures the rule weighed for one strategy (a parallelism step's "recommendation_numbers"): whether it fits
    (its evidence, and a peak within the memory a rank has), its headroom (1 - peak / capacity; None unknown)."""
    fits: bool | None = None
    headroom: Num | None = None
    toks_per_s: Num | None = None
    peak_gb: Num | None = None
    capacity_gb: Num | None = None
    largest_batch: int | None = None


@dataclass(frozen=True)
class Recommendation:
    """The strategy the rule recommends (None when nothing fits or DDP was not measured), the memory regime
    (fits_with_headroom, tight or does_not_fit), the reason with the numbers that decided it, the numbers."""
    strategy: str | None = None
    regime: str | None = None
    reason: str | None = None
    numbers: dict[str, Numbers] = field(default_factory=dict)
    headroom_required: Num | None = None


def _comparison(comp: ComparisonRecord | Mapping | None) -> ComparisonRecord | None:
    if isinstance(comp, ComparisonRecord):
        return comp
    if not comp:
        return None
    return decode(ComparisonRecord, comp, lenient=True)


UNREPLICATED = "blocks"  # significance's method of one run a side (block means of each run's window)


def _significance_text(comp: ComparisonRecord) -> str:
    if not comp.significant:
        return "not significant"
    if comp.method == UNREPLICATED:
        return "significant within one run a side, not replicated: not weighed"
    return "significant"


def _comparison_text(comp: ComparisonRecord | None) -> str:
    if not comp:
        return "not compared"
    adjusted = comp.p_adjusted is not None
    p = comp.p_adjusted if adjusted else comp.p_value
    return (f"{fmt_pct(comp.rel, True)} tokens/s (95% CI {fmt_pct(comp.ci_low, True)} .. "
            f"{fmt_pct(comp.ci_high, True)}, {'Holm-adjusted ' if adjusted else ''}p = {p:.3g}, "
            f"{_significance_text(comp)})"
            if isinstance(p, (int, float)) else f"{fmt_pct(comp.rel, True)} tokens/s (no p-value)")


def _faster(comparisons: Mapping[str, ComparisonRecord], a: str, b: str) -> int:
    """+1 when a is significantly faster than b, -1 when significantly slower, 0 otherwise (a comparison of one run
    a side counts as no difference: module doc). comparisons hold "b_vs_a"-style keys "<variant>:<baseline>" with
    rel = variant / baseline - 1."""
    for key, sign in ((f"{a}:{b}", 1), (f"{b}:{a}", -1)):
        comp = comparisons.get(key)
        if comp and comp.significant and comp.method != UNREPLICATED and isinstance(comp.rel, (int, float)):
            return sign if comp.rel > 0 else -sign
    return 0


def _comp(comparisons: Mapping[str, ComparisonRecord], a: str, b: str) -> tuple[str, ComparisonRecord | None]:
    """The comparison of a against b, as text with a's label first."""
    if f"{a}:{b}" in comparisons:
        return f"{a} vs {b}", comparisons[f"{a}:{b}"]
    if f"{b}:{a}" in comparisons:
        return f"{b} vs {a}", comparisons[f"{b}:{a}"]
    return f"{a} vs {b}", None


def recommend(evidence: Mapping[str, Evidence | Mapping], comparisons: Mapping[str, ComparisonRecord | Mapping], *,
              headroom: float = DEFAULT_HEADROOM) -> dict[str, Any]:
    """recommendation() as a dict: {"strategy", "regime", "reason", "numbers": {strategy: {"fits", "headroom",
    "toks_per_s", "peak_gb", "capacity_gb", "largest_batch"}}, "headroom_required"}."""
    return asdict(recommendation(evidence, comparisons, headroom=headroom))


def recommendation(evidence: Mapping[str, Evidence | Mapping],
                   comparisons: Mapping[str, ComparisonRecord | Mapping], *,
                   headroom: float = DEFAULT_HEADROOM) -> Recommendation:
    """The seed's rule (module doc) on `evidence` {strategy: Evidence} and `comparisons` {"<variant>:<baseline>":
    significance.Comparison's record (rel, ci_low, ci_high, p_value, p_adjusted, significant)}, either given as
    records or as their JSON form."""
    comparisons = {k: _comparison(c) for k, c in comparisons.items()}
    numbers: dict[str, Numbers] = {}
    for name, ev in evidence.items():
        ev = ev if isinstance(ev, Evidence) else decode(Evidence, ev, lenient=True)
        peak, cap = ev.peak_gb, ev.capacity_gb
        room = 1 - peak / cap if isinstance(peak, (int, float)) and isinstance(cap, (int, float)) and cap > 0 else None
        fits = bool(ev.fits) and (room is None or room >= 0)
        numbers[name] = Numbers(fits=fits, headroom=room, toks_per_s=ev.toks_per_s, peak_gb=peak, capacity_gb=cap,
                                largest_batch=ev.largest_batch)

    def mem(name: str) -> str:
        n = numbers[name]
        if not n.fits:
            if n.headroom is not None and n.headroom < 0:
                return f"{name} does not fit (peak {n.peak_gb:.3g} GiB of {n.capacity_gb:.3g} GiB)"
            # out of memory in a run or in the batch-size search, whatever peak the runs that passed reached
            largest = f": the largest micro-batch that fits is {n.largest_batch}" if n.largest_batch else ""
            return f"{name} does not fit (out of memory{largest})"
        if n.headroom is None:
            return f"{name} fits (memory available unknown)"
        return f"{name} fits with {fmt_pct(n.headroom)} headroom ({n.peak_gb:.3g} of {n.capacity_gb:.3g} GiB)"

    def roomy(name: str) -> bool:
        """Fits with the headroom asked: peak <= (1 - headroom) x capacity (compared so, not as 1 - peak /
        capacity >= headroom, whose rounding would put a peak exactly at the limit on the wrong side); unknown
        memory counts as enough."""
        n = numbers[name]
        return n.headroom is None or n.peak_gb <= (1 - headroom) * n.capacity_gb

    def speed(a: str, b: str) -> str:
        label, comp = _comp(comparisons, a, b)
        return f"{label}: {_comparison_text(comp)}"

    def out(strategy: str | None = None, regime: str | None = None, reason: str | None = None) -> Recommendation:
        return Recommendation(strategy, regime, reason, numbers, headroom)

    fsdp_modes = [m for m in ("fsdp", "fsdp_no_reshard") if m in numbers]
    if "ddp" not in numbers:
        return out(reason="no recommendation: DDP was not measured")
    ddp = numbers["ddp"]
    if not ddp.fits:
        fitting = [m for m in fsdp_modes if numbers[m].fits]
        if not fitting:
            return out(regime="does_not_fit",
                       reason=(f"no strategy fits: {'; '.join(mem(m) for m in numbers)}; reduce the micro-batch (use "
                               "gradient accumulation for the global batch) or checkpoint activations"))
        choice = "fsdp" if "fsdp" in fitting else fitting[0]
        if "fsdp_no_reshard" in fitting and "fsdp" in fitting:
            if _faster(comparisons, "fsdp", "fsdp_no_reshard") <= 0 and roomy("fsdp_no_reshard"):
                choice = "fsdp_no_reshard"
        why = [mem("ddp")] + [mem(m) for m in fsdp_modes]
        if len(fitting) > 1:
            why.append(speed("fsdp_no_reshard", "fsdp"))
        return out(choice, "does_not_fit", f"{STRATEGIES[choice]}: DDP does not fit; " + "; ".join(why))
    fitting = ["ddp"] + [m for m in fsdp_modes if numbers[m].fits]
    with_room = roomy("ddp")

    def unbeaten(m: str) -> bool:
        """No other strategy that fits is significantly faster than m."""
        return all(_faster(comparisons, o, m) <= 0 for o in fitting if o != m)

    def tie_break(modes: list[str]) -> str:
        """Of FSDP modes not significantly different: no-reshard when it fits with headroom, else full shard."""
        with_headroom = [m for m in modes if roomy(m)]
        return ("fsdp_no_reshard" if "fsdp_no_reshard" in with_headroom else "fsdp" if "fsdp" in modes
                else modes[0])

    # FSDP modes significantly faster than DDP and not significantly slower than another mode that fits
    faster_fsdp = [m for m in fitting[1:] if _faster(comparisons, m, "ddp") > 0 and unbeaten(m)]
    if with_room:
        why = [mem("ddp") + f" (>= {fmt_pct(headroom)} asked)" if ddp.headroom is not None
               else mem("ddp") + "; headroom taken as sufficient"]
        why += [speed(m, "ddp") for m in fsdp_modes]
        if faster_fsdp:
            choice = tie_break(faster_fsdp)
            lead = f"{STRATEGIES[choice]}: DDP fits with headroom but {choice} is significantly faster"
            if len(faster_fsdp) > 1:
                lead += (" (as is " + ", ".join(m for m in faster_fsdp if m != choice) + ", not significantly "
                         "different from it: no-reshard when it fits with headroom)")
                why.append(speed("fsdp_no_reshard", "fsdp"))
        elif all(_faster(comparisons, "ddp", m) > 0 for m in fitting[1:]) and len(fitting) > 1:
            choice, lead = "ddp", "DDP: it fits with headroom and is significantly faster"
        else:
            choice, lead = "ddp", ("DDP: it fits with headroom and no FSDP mode is significantly faster "
                                   "(no significant difference: the simpler strategy is kept)")
        return out(choice, "fits_with_headroom", f"{lead}; " + "; ".join(why))
    why = [mem(m) for m in numbers] + [speed(m, "ddp") for m in fsdp_modes]
    # where some strategy that fits is significantly slower than another: those no other is significantly faster than
    fastest = [m for m in fitting if unbeaten(m)]
    if fastest and len(fastest) < len(fitting):
        choice = next(m for m in ("fsdp", "fsdp_no_reshard", "ddp") if m in fastest)  # the most memory saved first
        lead = f"{STRATEGIES[choice]}: memory is tight for DDP and {choice} is the significantly faster at this batch"
        if len(fastest) > 1:
            slower = [m for m in fitting if m not in fastest]
            lead = (f"{STRATEGIES[choice]}: memory is tight for DDP and {' and '.join(slower)} significantly slower "
                    f"at this batch; of {', '.join(fastest)} (no significant difference) the one that saves more memory")
            if "fsdp_no_reshard" in fitting and "fsdp" in fitting:
                why.append(speed("fsdp_no_reshard", "fsdp"))
    else:
        # no significant difference: the strategy that saves the most memory among those that fit
        choice = next(m for m in ("fsdp", "fsdp_no_reshard", "ddp") if m in fitting)
        lead = (f"{STRATEGIES[choice]}: memory is tight for DDP (less than {fmt_pct(headroom)} headroom) and no "
                f"strategy is significantly faster at this batch" + (", so the one that saves the most memory"
                                                                     if choice != "ddp" else ""))
    return out(choice, "tight", f"{lead}; " + "; ".join(why))


# ---------------------------------------------------------------------------------------------- exposed comm
_COMM_WORDS = ("c10d::", "_c10d_functional", "nccl", "gloo", "record_param_comms", "allreduce", "all_reduce",
               "allgather", "all_gather", "reduce_scatter", "broadcast", "wait", "fsdp::", "ddp::")


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """a minus b; both unions (sorted, disjoint)."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


class Event(NamedTuple):
    """A complete ("X") event of a chrome trace: its name, category, start and duration (us), process and thread."""
    name: str
    cat: Any
    ts: float
    dur: float
    pid: Any
    tid: Any


GPU_ANNOTATION = "gpu_user_annotation"  # Kineto's device-side copy of a record_function range (ProfilerStep#N too)


def profiler_steps(events: Iterable[Event]) -> int:
    """The profiled steps of a trace: its host-side ProfilerStep#N ranges (on a GPU Kineto also writes each as a
    gpu_user_annotation over the step's kernels; counting those too would halve every per-step figure)."""
    return sum(1 for e in events if e.name.startswith("ProfilerStep#") and e.cat != GPU_ANNOTATION)


def complete_events(events: Iterable[Any]) -> list[Event]:
    """The complete events of a chrome trace's traceEvents that have a numeric start and duration, in order."""
    out = []
    for e in events:
        if not isinstance(e, Mapping) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if isinstance(ts, (int, float)) and isinstance(dur, (int, float)):
            out.append(Event(str(e.get("name", "")), e.get("cat"), ts, dur, e.get("pid"), e.get("tid")))
    return out


@dataclass(frozen=True)
class ExposedComm:
    """Collective time in rank 0's profiled steps and the part of it not overlapped with compute (seconds)."""
    comm_s: Num
    exposed_s: Num
    steps: int
    per_step_comm_s: Num | None  # None: the trace has no ProfilerStep range (its source says so)
    per_step_exposed_s: Num | None
    source: str


NO_PROFILER_STEP = ("no ProfilerStep# range in the trace, so its collective time is of no known number of steps "
                    "and no per-step figure")


def exposed_comm(events: list[Mapping]) -> dict[str, Any] | None:
    """ExposedComm as a dict ({"comm_s", "exposed_s", "steps", "per_step_comm_s", "per_step_exposed_s", "source"})
    from a chrome trace's traceEvents (module doc), or None when it holds no collective. A trace without a
    ProfilerStep# range (steps 0) has the trace's totals but no per-step figures (None; the source says why)."""
    xs = complete_events(events)
    steps = profiler_steps(xs)
    kernels = [e for e in xs if e.cat == "kernel"]
    if any("nccl" in e.name.lower() for e in kernels):
        comm = [e for e in kernels if "nccl" in e.name.lower()]
        compute = [e for e in kernels if "nccl" not in e.name.lower()]
        comm_u, busy = _union((e.ts, e.ts + e.dur) for e in comm), _union((e.ts, e.ts + e.dur) for e in compute)
        source = "GPU kernels: NCCL kernels minus the time compute kernels ran"
    else:
        comm = [e for e in xs if e.name.startswith("gloo:")]
        if not comm:
            return None
        ops = [e for e in xs if e.cat == "cpu_op"]
        main = {}
        for e in ops:
            key = (e.pid, e.tid)
            main[key] = main.get(key, 0) + 1
        thread = max(main, key=main.get) if main else None
        own = [e for e in xs if (e.pid, e.tid) == thread and e.cat in ("cpu_op", "user_annotation")
               and not e.name.startswith("ProfilerStep#")]
        is_comm = [any(w in e.name.lower() for w in _COMM_WORDS) for e in own]
        work = _union((e.ts, e.ts + e.dur) for e, c in zip(own, is_comm) if not c and e.cat == "cpu_op")
        waiting = _union((e.ts, e.ts + e.dur) for e, c in zip(own, is_comm) if c)
        busy = _subtract(work, waiting)
        comm_u = _union((e.ts, e.ts + e.dur) for e in comm)
        source = ("CPU trace: gloo collective work (its own threads) minus the time the training thread computed "
                  "(operators other than collectives and their waits)")
    total, exposed = _length(comm_u) / 1e6, _length(_subtract(comm_u, busy)) / 1e6
    if not steps:
        return asdict(ExposedComm(total, exposed, 0, None, None, f"{source}; {NO_PROFILER_STEP}"))
    return asdict(ExposedComm(total, exposed, steps, total / steps, exposed / steps, source))


# ---------------------------------------------------------------------------------------------- scaling
def scaling_table(points: Mapping[int, float | None], mode: str, runs: Mapping[int, int] | None = None,
                  spread: tuple[float, float] | None = None) -> dict[str, Any]:
    """{"rows": [{"world_size", "toks_per_s", "speedup", "efficiency", "efficiency_low", "efficiency_high"}], "base",
    "efficiency": {"min", "last", "min_low", "min_high", "last_low", "last_high", "reason"}} from {world_size:
    tokens/s (all ranks)} (module doc); None throughputs give None rows. efficiency.min and .last are over the
    world sizes beyond the base (the base's efficiency is 1.0 by definition, so a min that included it could never
    show a superlinear point); None when only the base was measured, and None when a world size the step asked for
    was not measured, the smallest as much as a larger one: the min of the others would be a figure of fewer points
    than the step asked for, .last (the largest world size's) another world size's, and without the smallest every
    efficiency is against a base the step did not ask for (4 ranks against 2, not against 1); "reason" says why
    they are None (None when they are not).

    The 95% interval of an efficiency (efficiency_low/high; the base row's is None: 1.0 by definition): E(n) is a
    ratio of two points' throughputs, so with `spread` = (s, df), s the sd of one run's log tokens/s from run to run
    and df its degrees of freedom, and `runs` {world size: the runs behind its X} (default 1 each), log E(n) has the
    standard error s sqrt(1/r(n0) + 1/r(n)) and the interval is E(n) exp(-/+ t(0.975, df) x that). Without `spread`
    every interval is None (the run-to-run noise unknown). min_low/min_high are the lowest of the rows' low and high
    bounds (they hold the lowest true efficiency whenever every row's interval holds its own), last_low/last_high
    the largest world size's; None wherever min / last is."""
    if mode not in ("strong", "weak"):
        raise ValueError(f"scaling mode is strong or weak, got {mode!r}")
    measured = {n: x for n, x in points.items() if isinstance(x, (int, float)) and x > 0}
    base = min(measured) if measured else None
    quantile = None
    if spread is not None:
        sd, df = spread
        if not (isinstance(sd, (int, float)) and math.isfinite(sd) and sd >= 0 and isinstance(df, (int, float))
                and df > 0):
            raise ValueError(f"spread is (sd >= 0, df > 0), got {spread!r}")
        quantile = t_ppf(0.975, float(df))
    count = {n: (runs or {}).get(n) or 1 for n in points}
    rows, effs, bounds = [], [], []
    for n in sorted(points):
        x = measured.get(n)
        speedup = eff = low = high = None
        if x is not None and base is not None:
            speedup = x / measured[base]
            eff = speedup * base / n
            if n != base:
                if quantile is not None:
                    half = quantile * spread[0] * math.sqrt(1.0 / count[base] + 1.0 / count[n])
                    low, high = eff * math.exp(-half), eff * math.exp(half)
                effs.append(eff)
                bounds.append((low, high))
        rows.append({"world_size": n, "toks_per_s": x, "speedup": speedup, "efficiency": eff,
                     "efficiency_low": low, "efficiency_high": high})
    # a world size asked for and not measured, the smallest included: no min / last of fewer points, or against
    # another base
    missing = [n for n in sorted(points) if n not in measured] if base is not None else []
    whole = bool(effs) and not missing
    known = whole and quantile is not None
    reason = None
    if base is not None and not effs:
        reason = f"only world size {base} was measured: no efficiency beyond the base"
    elif missing:
        reason = (f"world size(s) {', '.join(map(str, missing))} not measured: the min and last efficiency would be "
                  + (f"against world size {base}, not the smallest asked for ({min(points)})" if min(points) < base
                     else "a figure of fewer points than the step asked for"))
    return {"mode": mode, "base": base, "rows": rows,
            "efficiency": {"min": min(effs) if whole else None, "last": effs[-1] if whole else None,
                           "min_low": min(b[0] for b in bounds) if known else None,
                           "min_high": min(b[1] for b in bounds) if known else None,
                           "last_low": bounds[-1][0] if known else None,
                           "last_high": bounds[-1][1] if known else None, "reason": reason}}


# ---------------------------------------------------------------------------------------------- across ranks
def _collective_kind(name: str) -> str | None:
    """gloo:all_reduce -> all_reduce; ncclDevKernel_AllGather_... / ncclKernel_ReduceScatter_... -> all_gather /
    reduce_scatter; anything else None."""
    if name.startswith("gloo:"):
        return name[5:]
    for prefix in ("ncclDevKernel_", "ncclKernel_"):
        if name.startswith(prefix):
            word = name[len(prefix):].split("_")[0]
            return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(word))
    return None


@dataclass(frozen=True)
class KindTime:
    calls: int
    total_s: Num


@dataclass(frozen=True)
class AlignedComm:
    """The collectives' own time across ranks: per kind, in all, the profiled steps and per step (seconds)."""
    by_kind: dict[str, KindTime]
    total_s: Num
    steps: int
    per_step_s: Num | None


def aligned_collectives(ranks: list[list[Mapping]]) -> dict[str, Any] | None:
    """A collective's own time across ranks, from the Chrome-trace events of every rank of one run: the calls of
    each kind pair by order across ranks (every rank issues the same collectives in the same order), and a call's
    own time runs from the LATEST rank's start to the LATEST rank's end (before the last rank joins, the others
    only wait for it: one rank's in-flight time counts the peers' skew). Returns AlignedComm as a dict
    ({"by_kind": {kind: {"calls", "total_s"}}, "total_s", "steps" (rank 0's ProfilerStep ranges: profiler_steps),
    "per_step_s"}),
    or None with fewer than two ranks or no collective. Traces are clock-aligned as the profiler writes them (one
    host's wall clock)."""
    if len(ranks) < 2:
        return None
    per_rank: list[dict[str, list[tuple[float, float]]]] = []
    for events in ranks:
        calls: dict[str, list[tuple[float, float]]] = {}
        for e in complete_events(events):
            kind = _collective_kind(e.name)
            if kind:
                calls.setdefault(kind, []).append((float(e.ts), float(e.ts) + float(e.dur)))
        per_rank.append({k: sorted(v) for k, v in calls.items()})
    kinds = set.intersection(*(set(c) for c in per_rank))
    by_kind = {}
    for kind in sorted(kinds):
        n = min(len(c[kind]) for c in per_rank)
        total = sum(max(0.0, max(c[kind][i][1] for c in per_rank) - max(c[kind][i][0] for c in per_rank))
                    for i in range(n))
        by_kind[kind] = KindTime(n, total / 1e6)
    if not by_kind:
        return None
    steps = profiler_steps(complete_events(ranks[0]))
    total_s = sum(v.total_s for v in by_kind.values())
    return asdict(AlignedComm(by_kind, total_s, steps, total_s / steps if steps else None))
