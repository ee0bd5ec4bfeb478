"""What a trainer launch shows beyond its training.csv: the Training Summary (summary.json), the start-up timeline
(timeline.json) and the device telemetry beside it (telemetry.csv), as metrics (collected with every trainer launch
by validation.kinds.trainer.collect) and as the report's view of them. No step kind lives here.

Metrics added to a trainer launch's (results.json step or run "metrics"):

    summary              the Training Summary: steps, avg/min/max step time (s), samples/s, tokens/s, avg and final
                         loss, peak and average allocated / reserved memory (GiB; memory_kind cuda or cpu_rss),
                         comm_time_s and comm_share (CPU/gloo), parallel, world_size; {} without summary.json
    time_to_first_step_s rank 0's first logged step, seconds after its process started (timeline.json)
    startup              {"milestones": {name: s}, "imports_s" (process start -> imports_done: the interpreter,
                          torch and the trainer's modules), "init_s" (imports_done -> setup_done: process group,
                          model build, move to device, wrapping, optimizer, data), "first_step_s" (the first step
                          itself: first_logged_step - setup_done), "slowest", "n_params", "init_interference"
                          (what else used the machine over the init, or None), "init_growth" (below)}
    gpu_util, gpu_mem_used_gb, power_w, sm_clock_mhz, temp_c   {mean, min, max, n} over the training window, or None
                         without GPU figures (no pynvml, no GPU)
    throttled, throttle_reasons, pcie_gen_min, pcie_width_min, ecc_uncorrected, xid_errors   (None without them)
    cpu_util, rss_gb     {mean, min, max, n}: the launch's process tree (percent of one core; GiB)
    telemetry            {"files", "samples", "nodes", "gpus", "period" (what the figures cover), "sampler_cpu_ms"
                          (the sampler's own CPU time per sample, mean)}
    gpu_diagnosis        validation.launch.telemetry.diagnose: low GPU utilisation and its likely causes, or None
    interference         validation.launch.telemetry.interference over the same period: what else used the machine
                         ({"disturbed", "samples", "contended", "share", "causes", "text", "rules", ...}), or None
                         without the figures (telemetry written before they existed)

The training window in time: the trainer logs its first step at timeline's process_start_unix +
time_to_first_step_s; every later step ends step_time_s (training.csv) after the one before, so the statistics
window's steps [first, last] span (end of step first-1, end of step last]. Without a timeline, the whole launch.

"Init grows faster than the model" (``init_growth``): a run is flagged against the earlier trainer run of the same
validation run with the smallest model (the reference; of equal models, the fastest init) when its init time
(``init_s``: after the imports, which do not depend on the model and swing most with the machine's load) is
more than INIT_GROWTH_FACTOR times the reference's scaled by the model-size ratio
(init / init_ref > INIT_GROWTH_FACTOR x n_params / n_params_ref) AND at least INIT_GROWTH_MIN_S longer: start-up
should grow at most like the model (building, moving, broadcasting parameters), not faster (seed 000's "extremely
slow initialization"). Other work on the machine during an init (``init_interference``: what
validation.launch.telemetry.interference finds over imports_done -> setup_done) only lengthens it, so a disturbed
init is no fair figure: earlier runs with a disturbed init are left out as references (and named) while an
undisturbed one is left; a growth of a disturbed launch, or an absence of one measured against a disturbed
reference, is no verdict (``"inconclusive": true``, never flagged); a growth over a disturbed reference stands.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any

from nsa.training import outputs
from validation import contracts
from validation.kinds.blocks import Block, Bullets, Heading, Pairs, Paragraph
from validation.formatting import NA, finite, fmt_duration, fmt_gb, fmt_num, fmt_pct, fmt_rate, plural
from validation.analysis.interference import launch_interference
from validation.launch import telemetry
from validation.results.codec import decode, encode, written
from validation.results.run import read_run
from validation.results.trainer_launch import (Gauge, LaunchMetrics, LaunchRun, Problem, RunContext, Startup,
                                               Telemetry, Timeline, Window)

INIT_GROWTH_FACTOR = 2.0
RATIO_MIN_S = 0.5  # init times below this are shown side by side, never as a ratio
INIT_GROWTH_MIN_S = 5.0
INIT_INTERFERENCE = "init_interference"  # the startup metrics' key of what else used the machine over the init

SUMMARY_KEYS = ("steps", "avg_step_time_s", "min_step_time_s", "max_step_time_s", "avg_step_time_excl_first_s",
                "samples_per_s", "tokens_per_s", "avg_loss", "final_loss", "memory_kind", "peak_mem_alloc_gb",
                "avg_mem_alloc_gb", "peak_mem_reserved_gb", "avg_mem_reserved_gb", "comm_time_s", "comm_share",
                "comm_time_method", "parallel", "world_size", "status")


# ---------------------------------------------------------------------------------------------- metrics
def summary_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """The Training Summary fields the report shows, from validation.contracts.read_summary ({} without one)."""
    if not summary:
        return {}
    if "problem" in summary and len(summary) == 1:
        return encode(decode(Problem, summary, "summary.json", lenient=True))
    return {k: summary.get(k) for k in SUMMARY_KEYS}


def startup_metrics(timeline: dict[str, Any], n_params: Any = None) -> dict[str, Any]:
    """{"milestones", "imports_s", "init_s", "first_step_s", "time_to_first_step_s", "slowest", "n_params"} from
    timeline.json
    (validation.contracts.read_timeline); {} without one."""
    read = decode(Timeline, timeline, "timeline.json", lenient=True)
    if read.milestones is None:
        return {"problem": read.problem} if read.problem else {}
    marks = read.milestones
    ttfs = finite(read.time_to_first_step_s)
    imports, setup = finite(marks.get("imports_done")), finite(marks.get("setup_done"))
    # init is the time between the two marks: without imports_done it is unknown (setup_done alone counts the
    # imports too, and would flag an init that grew when the imports did)
    init = setup - imports if setup is not None and imports is not None else None
    first = ttfs - setup if ttfs is not None and setup is not None else None
    return {"milestones": {k: v for k, v in marks.items() if finite(v) is not None}, "imports_s": imports,
            "init_s": init, "first_step_s": first, "time_to_first_step_s": ttfs, "slowest": read.slowest,
            "n_params": finite(n_params), "process_start_unix": finite(read.process_start_unix),
            "missing": list(read.missing_milestones)}


def init_disturbed(startup: dict[str, Any] | Startup) -> bool:
    """Whether other work on the machine disturbed a launch's init: its "init_interference" (init_interference's
    record) says so. A launch without one (no telemetry, or recorded before it existed) reads as undisturbed."""
    rec = _startup(startup).init_interference
    return rec is not None and rec.disturbed is True


def init_interference(rows: list[dict[str, Any]], startup: dict[str, Any] | Startup,
                      use_gpus: bool = True) -> dict[str, Any] | None:
    """What else used the machine over the launch's init (imports_done -> setup_done, in unix time from the
    timeline's process start): validation.launch.telemetry.interference's record (JSON), or None without the
    figures or the marks."""
    st = _startup(startup)
    t0, imports, init = finite(st.process_start_unix), finite(st.imports_s), finite(st.init_s)
    if t0 is None or imports is None or init is None or not rows:
        return None
    return encode(telemetry.interference(rows, t0 + imports, t0 + imports + init, use_gpus=use_gpus))


def init_growth(run: dict[str, Any] | Startup, earlier: list[tuple[str, dict[str, Any] | Startup]],
                factor: float = INIT_GROWTH_FACTOR, min_s: float = INIT_GROWTH_MIN_S) -> dict[str, Any] | None:
    """The "init grows faster than the model" flag of one run (see the module docstring). `run` and each of
    `earlier`'s (label, startup) carry "init_s" and "n_params" (startup_metrics), and "init_interference" where
    telemetry covered the init. None when there is nothing to compare with; else {"flagged", "reference",
    "init_ratio", "model_ratio", "text"}, and "inconclusive": true where a disturbed init leaves the comparison
    without a verdict (see the module docstring)."""
    own = _startup(run)
    init, params = finite(own.init_s), finite(own.n_params)
    if init is None or not params:
        return None
    usable = [(label, finite(s.init_s), finite(s.n_params), init_disturbed(s))
              for label, s in ((k, _startup(v)) for k, v in earlier)]
    usable = [u for u in usable if u[1] is not None and u[1] > 0 and u[2]]
    if not usable:
        return None
    clean = [u for u in usable if not u[3]]
    label, ref_init, ref_params, ref_shaken = min(clean or usable, key=lambda u: (u[2], u[1]))
    left_out = [u[0] for u in usable if u[3]] if clean else []
    init_ratio, model_ratio = init / ref_init, params / ref_params
    grown = init_ratio > factor * model_ratio and init - ref_init >= min_s
    # other work only lengthens an init: a disturbed launch's growth may be the disturbance's (no flag stands on
    # it), and a reference's disturbed init may hide a growth (no absence of one stands on it)
    own_shaken = init_disturbed(own)
    inconclusive = (grown and own_shaken) or (not grown and ref_shaken)
    flagged = grown and not inconclusive
    if min(init, ref_init) < RATIO_MIN_S:  # a ratio of times near zero says nothing (0.1 s vs 0.04 s: "2.56x")
        text = (f"init {init:.1f} s vs {ref_init:.1f} s for `{label}` with a model {model_ratio:.2f}x its size "
                f"(under {RATIO_MIN_S:g} s: not compared as a ratio)")
    else:
        text = (f"init {init:.1f} s vs {ref_init:.1f} s for `{label}` ({init_ratio:.2f}x) with a model "
                f"{model_ratio:.2f}x its size")
    if flagged:
        text = (f"Init grows faster than the model: {text} (more than {factor:g}x the model's growth and "
                f"{init - ref_init:.1f} s longer)")
        if ref_shaken:
            text += "; the reference's init was disturbed, which only lengthens it"
    elif inconclusive and own_shaken:
        text = (f"Init growth inconclusive: {text}, but other work on the machine disturbed this launch's init "
                f"({_interference_text(own)})")
    elif inconclusive:
        text = (f"Init growth inconclusive: {text}, but other work on the machine disturbed the reference's init "
                f"and no undisturbed earlier launch is left to compare with")
    if left_out:
        text += f" (left out as references, their init disturbed: {', '.join(f'`{x}`' for x in left_out)})"
    out = {"flagged": flagged, "reference": label, "init_ratio": init_ratio, "model_ratio": model_ratio,
           "text": text}
    if inconclusive:
        out["inconclusive"] = True
    return out


def _interference_text(startup: Startup) -> str:
    rec = startup.init_interference
    return str(rec.text or "disturbed") if rec is not None else "disturbed"


def _startup(startup: dict[str, Any] | Startup) -> Startup:
    """A launch's start-up metrics (startup_metrics') as a record, read leniently: they come from the trainer's
    timeline.json; a Startup as it is."""
    return startup if isinstance(startup, Startup) else decode(Startup, startup, "startup", lenient=True)


def training_period(startup: dict[str, Any] | Startup, steps: list[int], step_times: list[float],
                    first: int | None, last: int | None) -> tuple[float, float] | None:
    """(start, end) unix times of the window's steps [first, last] (see the module docstring), or None."""
    st = _startup(startup)
    t0, ttfs = finite(st.process_start_unix), finite(st.time_to_first_step_s)
    if t0 is None or ttfs is None or not steps or first is None or last is None:
        return None
    ends, t = {}, t0 + ttfs
    for i, (step, dt) in enumerate(zip(steps, step_times)):
        if i > 0:
            t += dt if finite(dt) is not None else 0.0
        ends[step] = t
    if last not in ends:
        return None
    prev = [s for s in ends if s < first]
    start = ends[max(prev)] if prev else (ends[first] - (finite(step_times[steps.index(first)]) or 0.0)
                                          if first in ends else None)
    return (start, ends[last]) if start is not None else None


def step_times(read) -> tuple[list[int], list[float]] | None:
    """(steps, step times in s) of a launch's training.csv as read (validation.analysis.metrics.CsvRead), what
    training_period places steps in time by; None without rows or a step time column."""
    frame = getattr(read, "frame", None)
    if frame is None or frame.empty or "step_time_s" not in frame.columns:
        return None
    return [int(s) for s in frame["step"].to_list()], [float(x) for x in frame["step_time_s"].to_list()]


def telemetry_metrics(step_dir: Path, startup: dict[str, Any], read, window: Window,
                      context: dict[str, Any], rows: list | None = None) -> dict[str, Any]:
    """Telemetry metrics of one launch (see the module docstring); {} without a telemetry file. `rows`: its
    telemetry as contracts.read_telemetry(step_dir) gives it, where the caller has read it already."""
    rows = contracts.read_telemetry(step_dir) if rows is None else rows
    if not rows:
        return {}
    period, what = None, "the whole launch (no timeline.json or training.csv to place the window)"
    timed = step_times(read)
    if timed is not None:
        period = training_period(startup, *timed, window.first_step, window.last_step)
        if period is not None:
            what = f"the statistics window, steps {window.first_step}-{window.last_step}"
    on_gpu = decode(RunContext, context, "context", lenient=True).on_cpu() is not True  # a CPU run on a GPU node
    t = telemetry.summarize(rows, *(period or (None, None)), use_gpus=on_gpu)
    if t.samples == 0 and period is not None:  # a window shorter than one sample: a second either side
        period = (period[0] - 1.0, period[1] + 1.0)
        t = telemetry.summarize(rows, *period, use_gpus=on_gpu)
    costs = [s.sampler_cpu_ms for s in map(telemetry.Sample.of, rows) if finite(s.sampler_cpu_ms) is not None]
    files = [p.name for p in contracts.telemetry_files(step_dir)]
    out = t.criteria_metrics()
    out["telemetry"] = {"files": files, "samples": t.samples, "nodes": t.nodes, "gpus": t.gpus,
                        "gpu_match": t.gpu_match,
                        "period": what, "sampler_cpu_ms": round(sum(costs) / len(costs), 3) if costs else None,
                        "gpu_mem_total_gb": t.gpu_mem_total_gb, "pcie_gen_max": t.pcie_gen_max,
                        "pcie_width_max": t.pcie_width_max, "window_unix": list(period) if period else None}
    out["gpu_diagnosis"] = encode(telemetry.diagnose(t, context))
    # what else used the machine over the same period (the window's samples, or the whole launch)
    out["interference"] = encode(telemetry.interference(rows, *(period or (None, None)), use_gpus=on_gpu))
    return out


def earlier_startups(results: dict[str, Any], exclude_csv: str | None) -> list[tuple[str, Startup]]:
    """(label, startup) of every trainer run recorded so far in results.json (steps and their runs) that has a
    start-up timeline (read leniently: the steps of a resumed run come from an earlier attempt's results.json)."""
    found = []
    for name, step in read_run(results).steps.items():
        if step is None:
            continue
        candidates = [(name, decode(LaunchMetrics, step.metrics, f"steps.{name}.metrics", lenient=True))]
        candidates += [(f"{name}[{r.label}]", r.metrics) for r in step.runs]
        for label, m in candidates:
            if isinstance(m.startup, Startup) and m.csv != exclude_csv:
                found.append((label, m.startup))
    return found


def launch_metrics(ctx, spec, out_dir: Path, read, m: dict[str, Any],
                   earlier: Collection[str] = ()) -> dict[str, Any]:
    """Everything above for one trainer launch, given its training.csv summary `m` (validation.analysis.metrics).
    `earlier`: the names of the out_dir's files an earlier launch left there (validation.kinds.trainer.earlier_files),
    read as absent."""
    so_far = decode(LaunchMetrics, m, "metrics")
    context = so_far.context or RunContext()
    timeline = {} if outputs.TIMELINE_JSON in earlier else contracts.read_timeline(out_dir)
    startup = startup_metrics(timeline, context.n_params)
    rows = contracts.read_telemetry(Path(spec.step_dir))  # read once: the init's interference and the window's
    if startup and "problem" not in startup:
        on_gpu = context.on_cpu() is not True  # as telemetry_metrics: a CPU run on a GPU node reads no GPU
        shaken = init_interference(rows, startup, use_gpus=on_gpu)
        if shaken is not None:  # absent without telemetry over the init
            startup[INIT_INTERFERENCE] = shaken
        startup["init_growth"] = init_growth(startup, earlier_startups(ctx.results, so_far.csv))
    summary = {} if outputs.SUMMARY_JSON in earlier else contracts.read_summary(out_dir)
    out = {"summary": summary_metrics(summary), "startup": startup,
           "time_to_first_step_s": _startup(startup).time_to_first_step_s}
    out.update(telemetry_metrics(Path(spec.step_dir), startup, read, so_far.window, written(so_far.context), rows))
    return out


# ---------------------------------------------------------------------------------------------- report
def _s(value: Any) -> str:
    v = finite(value)
    return NA if v is None else (f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s")


def summary_blocks(m: LaunchMetrics) -> list[Block]:
    """The Training Summary: its problem, or a heading and its rows; [] without a summary."""
    s = m.summary
    if s is None:
        return []
    if isinstance(s, Problem):
        return [Paragraph(f"**Training Summary**: {s.problem}")]
    cpu = s.memory_kind == "cpu_rss"
    rows = [("Steps", fmt_num(s.steps)),
            ("Step time avg / min / max", f"{_s(s.avg_step_time_s)} / {_s(s.min_step_time_s)} / "
                                          f"{_s(s.max_step_time_s)}"),
            ("Samples/s", fmt_rate(s.samples_per_s)),
            ("Tokens/s over the whole run (all ranks, all steps: tokens / step time)", fmt_rate(s.tokens_per_s)),
            ("Loss avg / final", f"{_loss(s.avg_loss)} / {_loss(s.final_loss)}"),
            ("Memory allocated peak / avg" + (" (CPU: RSS)" if cpu else ""),
             f"{fmt_gb(s.peak_mem_alloc_gb)} / {fmt_gb(s.avg_mem_alloc_gb)}"),
            ("Memory reserved peak / avg", "— (nothing is reserved on CPU)" if cpu else
             f"{fmt_gb(s.peak_mem_reserved_gb)} / {fmt_gb(s.avg_mem_reserved_gb)}")]
    share = finite(s.comm_share)
    rows.append(("Communication share", fmt_pct(share) + (f" ({_s(s.comm_time_s)} in collectives)"
                                                          if share is not None else
                                                          f" ({s.comm_time_method or 'not measured'})")))
    return [Heading("Training Summary"), Pairs(rows)]


def startup_blocks(m: LaunchMetrics) -> list[Block]:
    """Time to first step (imports, init, first step), the milestones, and the init-growth flag or figure; []
    without a timeline."""
    st = m.startup
    if st is None:
        return []
    if isinstance(st, Problem):
        return [Paragraph(f"**Time to first step**: {NA} ({st.problem})")]
    marks = ", ".join(f"{k} {fmt_num(_round(v, 2))} s" for k, v in st.milestones.items() if k != "process_start")
    growth = st.init_growth
    out: list[Block] = [Paragraph(
        f"**Time to first step**: {fmt_duration(st.time_to_first_step_s)} (imports "
        f"{fmt_duration(st.imports_s)}, init {fmt_duration(st.init_s)}, first step "
        f"{fmt_duration(st.first_step_s)})")]
    if marks:
        out.append(Paragraph(f"Start-up milestones (seconds since the process started): {marks}", style="context"))
    if growth is not None and growth.flagged:
        out.append(Paragraph(f"**Flag**: {growth.text}", style="flag"))
    elif growth is not None and growth.inconclusive is True:
        out.append(Paragraph(str(growth.text), style="note"))
    elif growth is not None:
        out.append(Paragraph(f"Init against the model size: {growth.text}", style="context"))
    return out


def _round(value: Any, digits: int = 4) -> Any:
    v = finite(value)
    return None if v is None else round(v, digits)


def _loss(value: Any) -> str:
    """A loss with three decimals, as the step tables show it (2.570, not 2.57)."""
    v = finite(value)
    return fmt_num(None) if v is None else f"{v:.3f}"


def summary_line(m: LaunchMetrics) -> str:
    """One compact line of the Training Summary (a sweep's or A/B's run): the trainer's own figures over the whole
    run, its first (warm-up) steps included, and said so beside the window figures the decisions read."""
    s = m.summary
    if s is None or isinstance(s, Problem):
        return NA
    share = finite(s.comm_share)
    return (f"{fmt_num(s.steps)} steps, warm-up included: {_s(s.avg_step_time_s)}/step, "
            f"{fmt_rate(s.tokens_per_s)} tok/s, loss {fmt_num(_round(s.final_loss))}, "
            f"peak {fmt_gb(s.peak_mem_alloc_gb)}" + (f", comm {fmt_pct(share)}" if share is not None else ""))


def telemetry_notes(m: LaunchMetrics) -> list[str]:
    """The step's notes on its telemetry: what was sampled and over what, the figures, a throttle, the diagnosis."""
    t = m.telemetry
    if t is None or t == Telemetry():
        return []
    def stat(g: Gauge | None, unit: str) -> str:  # each figure n/a on its own (a mean without its max, ...)
        g = g or Gauge()
        mean, top = finite(g.mean), finite(g.max)
        if mean is None and top is None:
            return NA
        def fig(v: float | None) -> str:
            return NA if v is None else f"{v:.0f}{unit}"
        return f"{fig(mean)} mean, {fig(top)} max"
    notes = [f"Telemetry ({plural(t.samples, 'sample')} over {t.period}; "
             f"{', '.join(t.files)}): CPU of the launch's processes {stat(m.cpu_util, '%')}, "
             f"RSS {fmt_gb((m.rss_gb or Gauge()).max)} max"]
    if m.gpu_util is None:
        notes.append("GPU telemetry: none (no GPU, or pynvml not installed): the GPU columns are empty")
    else:
        notes.append(f"GPU ({', '.join(t.gpus)}): utilisation {stat(m.gpu_util, '%')}, power "
                     f"{stat(m.power_w, ' W')}, SM clock {stat(m.sm_clock_mhz, ' MHz')}, temperature "
                     f"{stat(m.temp_c, ' °C')}, PCIe Gen{fmt_num(m.pcie_gen_min)} x{fmt_num(m.pcie_width_min)} "
                     f"(max Gen{fmt_num(t.pcie_gen_max)} x{fmt_num(t.pcie_width_max)}); throttled: "
                     f"{fmt_num(m.throttled)}"
                     + (f" ({', '.join(m.throttle_reasons)})" if m.throttled else "")
                     + f"; ECC uncorrected: {fmt_num(m.ecc_uncorrected)}; Xid errors: "
                       f"{fmt_num(m.xid_errors)}")
    if m.gpu_diagnosis is not None and m.gpu_diagnosis.text:
        notes.append(str(m.gpu_diagnosis.text))
    notes += interference_notes(m)
    return notes


def interference_notes(m: LaunchMetrics) -> list[str]:
    """What else used the machine over the launch's measured period (validation.launch.telemetry.interference)."""
    rec = launch_interference(m.extra)
    if rec is None:
        return []
    if rec.disturbed:
        return [f"DISTURBED: {rec.text} (rule: {rec.rules})"]
    return [f"Interference: {rec.text}"]


def runs_blocks(records: list[LaunchRun]) -> list[Block]:
    """The Training Summary of each run of a sweep or A/B (the step's LaunchRun records), a line per run (label and
    repeat): its summary, time to first step, GPU utilisation when measured, and the init-growth and disturbance
    flags; [] when no run has any."""
    counts = Counter(str(r.label) for r in records)
    lines = []
    for run in records:
        m = run.metrics
        if m.summary is None and m.startup is None and m.telemetry in (None, Telemetry()):
            continue
        label = str(run.label)
        if counts[label] > 1 and run.repeat is not None:
            label += f" (repeat {run.repeat + 1})"
        util = finite((m.gpu_util or Gauge()).mean)
        growth = m.startup.init_growth if isinstance(m.startup, Startup) else None
        shaken = launch_interference(m.extra)
        flag = "; ".join(t for t in (str(growth.text) if growth is not None and growth.flagged else "",
                                     f"DISTURBED: {shaken.text}" if shaken is not None and shaken.disturbed else "")
                         if t)
        lines.append(f"{label}: {summary_line(m)}; time to first step {fmt_duration(m.time_to_first_step_s)}"
                     + (f"; GPU utilisation {util:.0f}%" if util is not None else "")
                     + (f"; **{flag}**" if flag else ""))
    return [Paragraph("Training Summary per run:"), Bullets(lines)] if lines else []
