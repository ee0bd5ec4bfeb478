"""What the `parallelism` step makes of its runs (validation.kinds.parallelism): per-strategy figures from each
run's summary.json (validation.contracts.read_summary) and profiler trace, the paired comparisons between the
strategies, the batch-size search on GPU and the recommendation. Not a step kind (the leading underscore keeps the
registry from treating it as one). The runs are LaunchRun records, each run's files read as a RunInfo and the
metrics built as the Metrics record (validation.kinds.parallelism.records)."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from validation import contracts
from validation.analysis.collectives import predict_seconds
from validation.analysis.interference import disturbed_flags
from validation.analysis.parallelism import (UNREPLICATED, Evidence, SearchError, aligned_collectives, batch_search,
                                             exposed_comm, is_oom, recommendation)
from validation.analysis.metrics import window_mean
from validation.analysis.significance import StatsError, adjust_family, compare_paired
from validation.analysis.significance.windows import compare_windows, measured_run_noise
from validation.kinds.parallelism.launch import strategy_launch
from validation.kinds.parallelism.records import (Capacity, CommCount, CommMeasured, Compared, Metrics, NotCompared,
                                                  RunInfo, Searched, Skipped, StrategyFigures)
from validation.kinds import trainer
from validation.kinds.trainer import declared_pair_noise, run_values
from validation.formatting import finite
from validation.results.codec import decode, encode
from validation.results.run import Step, read_run as read_results
from validation.results.trainer_launch import LaunchRun, RunContext

CPU_SEARCH_SKIPPED = ("skipped on CPU: a rank's memory (RSS) has no hard limit there, so a batch that does not fit "
                      "swaps the host instead of failing out of memory; the search runs on GPU only")
NOT_AVAILABLE = "not available: the step names no `comm` step (key `comm:`) whose bandwidth tables would predict it"
T = TypeVar("T")


def _mean(values) -> float | None:
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.fmean(values) if values else None


def _record(cls: type[T], value: Any) -> T:
    """`value` as a `cls` record: given as one, or its JSON form (read leniently)."""
    return value if isinstance(value, cls) else decode(cls, value, lenient=True)


def _comm_step(results: dict, name: str | None) -> tuple[Step, CommMeasured]:
    """The record of the `comm` step `name` in the run's results (blank where missing) and what its metrics say of
    its tables."""
    comm = read_results(results).steps.get(name) or Step()
    return comm, decode(CommMeasured, comm.metrics, lenient=True)


def comm_tables(step, results: dict) -> tuple[dict | None, str]:
    """The bandwidth tables of the step's `comm` step ({kind: table}) and where they come from, or (None, why)."""
    if not step.comm:
        return None, NOT_AVAILABLE
    comm, measured = _comm_step(results, step.comm)
    tables = measured.tables()
    if comm.status != "passed" or not tables:
        return None, (f"not available: comm step {step.comm!r} {comm.status or 'did not run'}"
                      + (f" ({comm.reason})" if comm.reason else "") + ", so no bandwidth table")
    return tables, (f"comm step {step.comm!r} ({measured.backend}, {measured.source}, world size "
                    f"{measured.world_size})")


def read_run(ctx, run: LaunchRun) -> dict[str, Any]:
    """summary.json, the exposed communication of the rank-0 trace and the env.json of one run (or their errors):
    a RunInfo's JSON form."""
    out_dir = Path(ctx.run_dir) / str(run.dir) / "out"
    info: dict[str, Any] = {"summary": None, "trace": None, "env": contracts.read_env_json(out_dir)}
    summary = contracts.read_summary(out_dir)  # {} when a failed run has none; {"problem"} when damaged
    problem = summary.get("problem")
    if summary and problem is None:
        info["summary"] = summary
    else:
        info["summary_error"] = problem or f"no summary.json in {out_dir}"
    traces = sorted((out_dir / "profile").glob("trace_rank0_*.json"))
    if traces:
        try:
            data = json.loads(traces[-1].read_text())
            info["trace"] = exposed_comm(data.get("traceEvents", []) if isinstance(data, dict) else [])
            info["trace_path"] = ctx.rel(traces[-1])
        except (OSError, ValueError):
            info["trace"] = None
        # the same profiled step's trace of every rank: each collective's own time, ranks aligned
        step_tail = traces[-1].name.split("_", 2)[-1]
        ranks = sorted((out_dir / "profile").glob(f"trace_rank*_{step_tail}"),
                       key=lambda p: int(p.name[len("trace_rank"):].split("_")[0] or 0))
        try:
            events = [(json.loads(t.read_text()) or {}).get("traceEvents", []) for t in ranks]
            info["aligned"] = aligned_collectives(events)
        except (OSError, ValueError, AttributeError):
            info["aligned"] = None
    return info


def _sizes(per_step: list[CommCount] | None) -> dict[str, list[int]]:
    """{kind: [bytes of each call]} of one optimizer step, from summary.json's comm.per_step (a list of rows)."""
    out: dict[str, list[int]] = {}
    for row in per_step or []:
        if row.kind:
            out.setdefault(str(row.kind), []).extend(int(s) for s in row.sizes or [])
    return out


def strategy_figures(label: str, spec, runs: Sequence[LaunchRun | dict], infos: Sequence[RunInfo | dict], tables,
                     why_no_tables, comm_world: Any = None) -> dict:
    """figures() as results.json holds them (runs and infos as records or their JSON form)."""
    return encode(figures(label, spec, [_record(LaunchRun, r) for r in runs], [_record(RunInfo, i) for i in infos],
                          tables, why_no_tables, comm_world))


def _step_time(ok: Sequence[tuple[LaunchRun, RunInfo]]) -> float | None:
    """The mean step time over the runs, each from the window its tokens/s comes from (training.csv's step_time_s
    there: the profiler's steps and the warm-up are outside it, as the tokens/s beside it); a run whose window has
    no step_time_s column falls back to its summary's average without the first step (profiled steps included)."""
    times = []
    for r, i in ok:
        stat = r.metrics.step_time_s if r.metrics is not None else None
        if stat is not None and finite(stat.mean) is not None:
            times.append(stat.mean)
        elif i.summary is not None:
            times.append(i.summary.avg_step_time_excl_first_s or i.summary.avg_step_time_s)
    return _mean(times)


def _world_size(value: Any) -> int | None:
    """A summary.json's world size as a whole number of ranks (>= 1), or None where it records none."""
    n = finite(value)
    return int(n) if n is not None and n >= 1 and n == int(n) else None


def figures(label: str, spec, runs: Sequence[LaunchRun], infos: Sequence[RunInfo], tables, why_no_tables,
            comm_world: Any = None) -> StrategyFigures:
    """The per-strategy row of the metrics (module doc of validation.kinds.parallelism). `comm_world`: the world
    size the comm step measured at; tables of another world size predict nothing here (said so)."""
    mine = [(r, i) for r, i in zip(runs, infos) if r.label == label]
    ok = [(r, i) for r, i in mine if r.status == "passed" and i.summary is not None]
    sums = [i.summary for _, i in ok]
    first = sums[0] if sums else None
    toks = [r.metrics.toks_per_s.mean if r.metrics.toks_per_s else None for r, _ in ok]
    counted = [sum(int(c.bytes or 0) for c in (s.comm and s.comm.per_step) or []) for s in sums]
    model = [sum(int(c.bytes or 0) for c in (s.comm_model.per_step if s.comm_model else {}).values()) for s in sums]
    predicted = by_kind = None
    prediction = why_no_tables
    world = _world_size(first.world_size) if first is not None else None
    if first is not None and tables is not None and world is None:
        prediction = (f"not available: the runs' summary.json records no world size (a whole number of ranks), "
                      f"so {why_no_tables} cannot tell their collectives' time")
    elif first is not None and tables is not None and comm_world is not None and comm_world != world:
        prediction = (f"not available: {why_no_tables} measured at world size {comm_world}, these runs ran at "
                      f"{world}")
    elif first is not None and tables is not None:
        pred = predict_seconds(_sizes(first.comm and first.comm.per_step), tables, world)
        if pred.missing:
            prediction = f"partial: no table for {', '.join(pred.missing)} in {why_no_tables}"
        else:
            prediction = f"from {why_no_tables}"
        predicted, by_kind = pred.total_s, pred.by_kind
    traces = [i.trace for _, i in ok if i.trace]
    aligned = [i.aligned for _, i in ok if i.aligned and i.aligned.per_step_s is not None]
    return StrategyFigures(
        strategy=spec.strategy, runs=len(mine), passed=len(ok), oom=sum(is_oom(r.reason) for r, _ in mine),
        toks_per_s=window_mean(toks, "toks_per_s"), toks_per_s_runs=toks,  # their work over their time
        step_time_s=_step_time(ok),
        peak_alloc_gb=max((s.peak_mem_alloc_gb for s in sums if s.peak_mem_alloc_gb is not None), default=None),
        peak_reserved_gb=max((s.peak_mem_reserved_gb for s in sums if s.peak_mem_reserved_gb is not None),
                             default=None),
        memory_kind=first.memory_kind if first else None, memory_model=first.memory_model if first else None,
        comm_bytes_counted=counted[0] if counted and len(set(counted)) == 1 else (counted or None),
        comm_bytes_model=model[0] if model and len(set(model)) == 1 else (model or None),
        comm_model_matches=bool(sums) and all(s.comm_model_matches is True for s in sums) and len(sums) == len(mine),
        comm_counted_by=first.comm.counted_by if first and first.comm else None,
        per_step=first.comm.per_step if first and first.comm else None,
        comm_time_s=_mean(s.comm_time_s / s.steps for s in sums if isinstance(s.comm_time_s, (int, float)) and s.steps),
        comm_share=_mean(s.comm_share for s in sums), comm_predicted_s=predicted, comm_prediction=prediction,
        comm_predicted_by_kind=by_kind,
        exposed_comm_s=_mean(t.per_step_exposed_s for t in traces),
        profiled_comm_s=_mean(t.per_step_comm_s for t in traces),
        aligned_comm_s=_mean(a.per_step_s for a in aligned),
        exposed_source=(f"{traces[0].source}; {len(traces)} run(s), {traces[0].steps} profiled step(s) each"
                        if traces else "not measured (no profiler trace with a collective)"))


UNREPLICATED_TEXT = ("inconclusive: one run a side, and no run-to-run noise is known (the runbook declares no launch "
                     "noise and no step of this validation run repeated a configuration), so its block means see only "
                     "the noise within each run, not how far two launches of one strategy differ; ")
UNREPLICATED_FIX = ("to measure it, use repeats >= 2 (paired over repeats) or declare the runbook's launch noise, "
                    "`compare: {launch_sd, pairs}` from A/A pairs (benchmarks/bench_aa_compare.py)")


def compare_strategies(step, runs: list[LaunchRun], ctx) -> dict[str, Compared | NotCompared]:
    """{"<b>:<a>": the comparison} of tokens/s for every pair of strategies (b listed after a), held to the noise the
    ab kind holds a variant against its baseline to: with 2+ repeats paired over them, each repeat's log-ratio held
    to at least the runbook's declared launch noise (`compare: {launch_sd, pairs}`: trainer.declared_pair_noise)
    where it declares one; with one repeat on block means of the one run each, each run's noise held to at least the
    run-to-run variation this validation run measured in its repeats (significance.windows.measured_run_noise) and
    to one launch's share of the declared launch noise. Where neither is known (no declared launch noise, nothing
    repeated), a one-run-a-side difference is shown but never significant: its verdict is "inconclusive" and its
    text says why and how to measure it (UNREPLICATED_FIX). A run measured under interference is left
    out, as a failed one. Holm over the pairs. A pair that could not be compared has a NotCompared saying why."""
    labels = list(step.strategies)
    data = {label: [None] * step.repeats for label in labels}
    as_written = [encode(r) for r in runs]
    for r, raw in zip(runs, as_written):
        data[r.label][r.repeat] = run_values(ctx.run_dir, step, raw, "toks_per_s")
    shaken = disturbed_flags(as_written, labels, step.repeats)
    data = {k: [None if shaken[k][i] else v for i, v in enumerate(vals)] for k, vals in data.items()}
    declared = declared_pair_noise(ctx)
    rn = None
    if step.repeats < 2:
        rn = measured_run_noise(ctx.results, ctx.run_dir, "toks_per_s")
        if declared is not None:  # one run each: held to one launch's share of the declared launch noise, as ab
            rn = declared.hold(rn)

    def mean(v):
        return None if v is None else (float(v) if isinstance(v, (int, float)) else window_mean(v, "toks_per_s"))

    comps, notes = [], {}
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            left_out = any(shaken[a]) or any(shaken[b])
            try:
                if step.repeats >= 2:
                    comps.append(compare_paired([mean(v) for v in data[a]], [mean(v) for v in data[b]],
                                                baseline=a, variant=b, metric="toks_per_s", pair_noise=declared))
                elif isinstance(data[a][0], list) and isinstance(data[b][0], list):
                    comps.append(compare_windows(data[a][0], data[b][0], baseline=a, variant=b, metric="toks_per_s",
                                                 run_noise=rn))
                else:
                    notes[f"{b}:{a}"] = NotCompared(
                        "not compared: " + ("a run measured under interference, left out" if left_out
                                            else "a run without a measurement"), False)
            except StatsError as exc:
                notes[f"{b}:{a}"] = NotCompared(
                    "not compared: " + ("its disturbed runs were left out and too few remain" if left_out
                                        else str(exc)), False)
    if len(comps) > 1:
        comps = list(adjust_family(comps).comparisons)
    out: dict[str, Compared | NotCompared] = {}
    for c in comps:
        key = f"{c.variant}:{c.baseline}"
        if c.method == UNREPLICATED and c.run_to_run is None:
            text = f"{UNREPLICATED_TEXT}{c.describe()}; {UNREPLICATED_FIX}"
            c = dataclasses.replace(c, significant=False, verdict="inconclusive")
            out[key] = dataclasses.replace(decode(Compared, c.as_dict(), key), text=text)
        else:
            out[key] = decode(Compared, c.as_dict(), key)
    return {**out, **notes}


def host_memory_gb() -> float | None:
    """This host's physical memory in GiB (the orchestrator's host: where local launches run)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024 ** 3
    except (ValueError, OSError, AttributeError):
        return None


def capacity(step, infos: Sequence[RunInfo]) -> Capacity:
    """The memory one rank has: the GPU's (env.json devices) where the runs trained on GPUs, else this host's memory /
    ranks per node. A run that trained on the CPU of a host with GPUs (env.json device "cpu" beside its devices)
    measured its peak as RSS: its capacity is the host's, and no batch-size search runs for it."""
    for info in infos:
        if RunContext(device=info.env.device).on_cpu():
            continue
        gb = next((d.memory_gb for d in info.env.devices if d.memory_gb), None)
        if gb:
            return Capacity(gb=float(gb), device="cuda", source="GPU memory (env.json devices)")
    host = host_memory_gb()
    ranks = max(1, step.launch.nproc_per_node)
    return Capacity(gb=host / ranks if host else None, device="cpu",
                    source=f"host memory / {ranks} rank(s) per node (CPU: peak is the resident set size)")


def analyse(step, runs: list[LaunchRun], ctx) -> Metrics:
    """The step's metrics up to the batch-size search (Metrics' strategies .. oom_only)."""
    infos = [decode(RunInfo, read_run(ctx, r), lenient=True) for r in runs]
    tables, why = comm_tables(step, ctx.results)
    comm_world = _comm_step(ctx.results, step.comm)[1].world_size if step.comm else None
    strategies = {label: figures(label, spec, runs, infos, tables, why, comm_world)
                  for label, spec in step.strategies.items()}
    failed = [r for r in runs if r.status != "passed"]
    return Metrics(strategies=strategies, repeats=step.repeats, comm_step=step.comm, comm_source=why,
                   all_ran=all(s.passed == s.runs and s.runs > 0 for s in strategies.values()),
                   byte_model_matches=all(s.comm_model_matches for s in strategies.values()),
                   comparisons=compare_strategies(step, runs, ctx), capacity=capacity(step, infos),
                   headroom=step.headroom, oom_only=bool(failed) and all(is_oom(r.reason) for r in failed))


def search_batches(step, metrics: Metrics, ctx, on_progress: Callable[[dict[str, Searched]], None] | None = None,
                   ) -> Skipped | dict[str, Searched] | None:
    """The batch-size search per strategy (GPU only; validation.analysis.parallelism.batch_search), or why it was
    skipped; `on_progress(found so far)` after each strategy's search."""
    if not step.batch_search:
        return None
    if metrics.capacity.device != "cuda":
        return Skipped(CPU_SEARCH_SKIPPED)
    winners = ctx.winners()
    out: dict[str, Searched] = {}
    for label in step.strategies:
        def fits(batch: int, label=label) -> bool:
            spec = strategy_launch(step, label, 0, winners, ctx.run_dir, batch=batch,
                                   steps_override=step.batch_search.steps)
            lr = ctx.launch(spec, 0, 1)
            status, reason, _ = trainer.collect(ctx, step, spec, lr)
            if status == "passed":
                return True
            if is_oom(reason, lr.reason, lr.excerpt):
                return False
            raise SearchError(f"batch {batch}: {reason}")

        found = batch_search(fits, step.batch_search.start, step.batch_search.max)
        out[label] = decode(Searched, found.as_dict(), f"batch_search.{label}")
        if on_progress is not None:
            on_progress(dict(out))
    return out


def search_shows_oom(found: Searched, batch: int, searched: Any) -> bool:
    """Whether a strategy's batch-size search shows that micro-batch `batch` does not fit: a batch no larger than it
    ran out of memory (first_oom <= batch: a batch of 1 that does not fit leaves no batch that does), or the search,
    ended without another failure, decided every batch in [start, max] of `searched` (the step's batch_search) and
    none from `batch` up fit. A search that stopped at its max below `batch`, or on a failure that was not out of
    memory, says nothing of `batch`: the runs at it decide."""
    if isinstance(found.first_oom, int) and found.first_oom <= batch:
        return True
    if found.error is None and searched is not None and searched.start <= batch <= searched.max:
        return found.largest is None or found.largest < batch
    return False


def decide_recommendation(step, metrics: Metrics, runs: list[LaunchRun] | None = None) -> Metrics:
    """`metrics` with the recommendation (validation.analysis.parallelism.recommend) and what it weighed. The batch the
    runbook needs is the step's args.batch_size, else the micro-batch its runs used (env.json, the config's)."""
    need = step.launch.args.get("batch_size")
    if not isinstance(need, int):
        contexts = (r.metrics.context for r in runs or [])
        need = next((c.micro_batch for c in contexts if c is not None and isinstance(c.micro_batch, int)), None)
    search = metrics.batch_search if isinstance(metrics.batch_search, dict) else {}
    evidence, unmeasured = {}, []
    for label, s in metrics.strategies.items():
        if label not in ("ddp", "fsdp", "fsdp_no_reshard"):
            continue  # variants (accumulation) are shown, the rule compares the three strategies
        if s.passed == 0 and s.oom == 0:
            unmeasured.append(label)  # failed for another reason: no evidence either way
            continue
        peak = s.peak_reserved_gb if s.peak_reserved_gb is not None else s.peak_alloc_gb
        largest = search[label].largest if label in search else None
        fits = s.passed > 0 and s.oom == 0
        if label in search and isinstance(need, int):
            fits = fits and not search_shows_oom(search[label], need, step.batch_search)
        evidence[label] = Evidence(fits=fits, peak_gb=peak, capacity_gb=metrics.capacity.gb,
                                   toks_per_s=s.toks_per_s, largest_batch=largest)
    comparisons = {k: c if isinstance(c, Compared) else encode(c) for k, c in metrics.comparisons.items()}
    rec = recommendation(evidence, comparisons, headroom=step.headroom)
    reason = rec.reason
    if unmeasured and reason:
        reason += f"; not considered: {', '.join(unmeasured)} (no run passed, none ran out of memory)"
    return dataclasses.replace(metrics, batch_needed=need, recommendation=rec.strategy, recommendation_reason=reason,
                               regime=rec.regime, recommendation_numbers=dict(rec.numbers))
