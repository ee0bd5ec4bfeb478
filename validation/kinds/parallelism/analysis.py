"""What the `parallelism` step makes of its runs (validation.kinds.parallelism): per-strategy figures from each
run's summary.json (validation.contracts.read_summary) and profiler trace, the paired comparisons between the
strategies, the batch-size search on GPU and the recommendation. Not a step kind (the leading underscore keeps the
registry from treating it as one)."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from validation import contracts
from validation.analysis.collectives import predict_seconds
from validation.analysis.parallelism import SearchError, aligned_collectives, batch_search, exposed_comm, is_oom, recommend
from validation.analysis.significance import StatsError, adjust_family, compare_paired, compare_series
from validation.kinds.parallelism.launch import strategy_launch
from validation.kinds import trainer
from validation.kinds.trainer import run_values

CPU_SEARCH_SKIPPED = ("skipped on CPU: a rank's memory (RSS) has no hard limit there, so a batch that does not fit "
                      "swaps the host instead of failing out of memory; the search runs on GPU only")
NOT_AVAILABLE = "not available: the step names no `comm` step (key `comm:`) whose bandwidth tables would predict it"


def _mean(values) -> float | None:
    values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.fmean(values) if values else None


def comm_tables(step, results: dict) -> tuple[dict | None, str]:
    """The bandwidth tables of the step's `comm` step ({kind: table}) and where they come from, or (None, why)."""
    if not step.comm:
        return None, NOT_AVAILABLE
    comm = (results.get("steps") or {}).get(step.comm) or {}
    metrics = comm.get("metrics") if isinstance(comm.get("metrics"), dict) else {}
    tables = {k: v["table"] for k, v in metrics.items() if isinstance(v, dict) and v.get("table")}
    if comm.get("status") != "passed" or not tables:
        return None, (f"not available: comm step {step.comm!r} {comm.get('status') or 'did not run'}"
                      + (f" ({comm.get('reason')})" if comm.get("reason") else "") + ", so no bandwidth table")
    return tables, (f"comm step {step.comm!r} ({metrics.get('backend')}, {metrics.get('source')}, world size "
                    f"{metrics.get('world_size')})")


def read_run(ctx, run: dict) -> dict[str, Any]:
    """summary.json, the exposed communication of the rank-0 trace and the env.json of one run (or their errors)."""
    out_dir = Path(ctx.run_dir) / run["dir"] / "out"
    info: dict[str, Any] = {"summary": None, "trace": None, "env": contracts.read_env_json(out_dir)}
    summary = contracts.read_summary(out_dir)  # {} when a failed run has none; {"problem"} when damaged
    if summary and "problem" not in summary:
        info["summary"] = summary
    else:
        info["summary_error"] = summary.get("problem") or f"no summary.json in {out_dir}"
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


def _sizes(per_step: Any) -> dict[str, list[int]]:
    """{kind: [bytes of each call]} of one optimizer step, from summary.json's comm.per_step (a list of rows)."""
    out: dict[str, list[int]] = {}
    for row in per_step if isinstance(per_step, list) else []:
        if isinstance(row, dict) and row.get("kind"):
            out.setdefault(str(row["kind"]), []).extend(int(s) for s in row.get("sizes") or [])
    return out


def strategy_figures(label: str, spec, runs: list[dict], infos: list[dict], tables, why_no_tables,
                     comm_world: Any = None) -> dict:
    """The per-strategy row of the metrics (module doc of validation.kinds.parallelism). `comm_world`: the world
    size the comm step measured at; tables of another world size predict nothing here (said so)."""
    mine = [(r, i) for r, i in zip(runs, infos) if r["label"] == label]
    ok = [(r, i) for r, i in mine if r["status"] == "passed" and i["summary"]]
    sums = [i["summary"] for _, i in ok]
    out: dict[str, Any] = {"strategy": spec.strategy, "runs": len(mine), "passed": len(ok),
                           "oom": sum(is_oom(r.get("reason")) for r, _ in mine)}
    toks = [((r.get("metrics") or {}).get("toks_per_s") or {}).get("mean") for r, _ in ok]
    out["toks_per_s"] = _mean(toks)
    out["toks_per_s_runs"] = toks
    out["step_time_s"] = _mean(s.get("avg_step_time_excl_first_s") or s.get("avg_step_time_s") for s in sums)
    out["peak_alloc_gb"] = max((s["peak_mem_alloc_gb"] for s in sums if s.get("peak_mem_alloc_gb") is not None),
                               default=None)
    out["peak_reserved_gb"] = max((s["peak_mem_reserved_gb"] for s in sums if s.get("peak_mem_reserved_gb")
                                   is not None), default=None)
    out["memory_kind"] = sums[0].get("memory_kind") if sums else None
    out["memory_model"] = sums[0].get("memory_model") if sums else None
    counted = [sum(int(r.get("bytes") or 0) for r in (s.get("comm") or {}).get("per_step") or []) for s in sums]
    model = [sum(int(v.get("bytes") or 0) for v in ((s.get("comm_model") or {}).get("per_step") or {}).values())
             for s in sums]
    out["comm_bytes_counted"] = counted[0] if counted and len(set(counted)) == 1 else (counted or None)
    out["comm_bytes_model"] = model[0] if model and len(set(model)) == 1 else (model or None)
    out["comm_model_matches"] = bool(sums) and all(s.get("comm_model_matches") is True for s in sums) and len(
        sums) == len(mine)
    out["comm_counted_by"] = (sums[0].get("comm") or {}).get("counted_by") if sums else None
    out["per_step"] = (sums[0].get("comm") or {}).get("per_step") if sums else None
    out["comm_time_s"] = _mean(s["comm_time_s"] / s["steps"] for s in sums
                               if isinstance(s.get("comm_time_s"), (int, float)) and s.get("steps"))
    out["comm_share"] = _mean(s.get("comm_share") for s in sums)
    out["comm_predicted_s"], out["comm_prediction"] = None, why_no_tables
    world = sums[0].get("world_size") if sums else None
    if sums and tables is not None and comm_world is not None and comm_world != world:
        out["comm_prediction"] = (f"not available: {why_no_tables} measured at world size {comm_world}, these runs "
                                  f"ran at {world}")
    elif sums and tables is not None:
        pred = predict_seconds(_sizes((sums[0].get("comm") or {}).get("per_step")), tables, int(sums[0]["world_size"]))
        if pred["missing"]:
            out["comm_prediction"] = f"partial: no table for {', '.join(pred['missing'])} in {why_no_tables}"
        else:
            out["comm_prediction"] = f"from {why_no_tables}"
        out["comm_predicted_s"] = pred["total_s"]
        out["comm_predicted_by_kind"] = pred["by_kind"]
    traces = [i["trace"] for _, i in ok if i.get("trace")]
    out["exposed_comm_s"] = _mean(t["per_step_exposed_s"] for t in traces)
    out["profiled_comm_s"] = _mean(t["per_step_comm_s"] for t in traces)
    aligned = [i["aligned"] for _, i in ok if i.get("aligned") and i["aligned"].get("per_step_s") is not None]
    out["aligned_comm_s"] = _mean(a["per_step_s"] for a in aligned)
    out["exposed_source"] = (traces[0]["source"] + f"; {len(traces)} run(s), {traces[0]['steps']} profiled step(s) "
                             "each") if traces else "not measured (no profiler trace with a collective)"
    return out


def compare_strategies(step, runs: list[dict], ctx) -> dict[str, dict]:
    """{"<b>:<a>": Comparison.as_dict()} of tokens/s for every pair of strategies (b listed after a): paired over
    repeats with 2+ repeats, else block means of the one run each; Holm over the pairs."""
    labels = list(step.strategies)
    data = {label: [None] * step.repeats for label in labels}
    for r in runs:
        data[r["label"]][r["repeat"]] = run_values(ctx.run_dir, step, r, "toks_per_s")

    def mean(v):
        return None if v is None else (float(v) if isinstance(v, (int, float)) else sum(v) / len(v))

    comps, notes = [], {}
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            try:
                if step.repeats >= 2:
                    comps.append(compare_paired([mean(v) for v in data[a]], [mean(v) for v in data[b]],
                                                baseline=a, variant=b, metric="toks_per_s"))
                elif isinstance(data[a][0], list) and isinstance(data[b][0], list):
                    comps.append(compare_series(data[a][0], data[b][0], baseline=a, variant=b, metric="toks_per_s"))
                else:
                    notes[f"{b}:{a}"] = {"text": "not compared: a run without a measurement", "significant": False}
            except StatsError as exc:
                notes[f"{b}:{a}"] = {"text": f"not compared: {exc}", "significant": False}
    if len(comps) > 1:
        comps = list(adjust_family(comps).comparisons)
    return {**{f"{c.variant}:{c.baseline}": c.as_dict() for c in comps}, **notes}


def host_memory_gb() -> float | None:
    """This host's physical memory in GiB (the orchestrator's host: where local launches run)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024 ** 3
    except (ValueError, OSError, AttributeError):
        return None


def capacity(step, infos: list[dict]) -> dict[str, Any]:
    """The memory one rank has: the GPU's (env.json devices), else this host's memory / ranks per node."""
    for info in infos:
        devices = (info.get("env") or {}).get("devices") or []
        gb = next((d.get("memory_gb") for d in devices if isinstance(d, dict) and d.get("memory_gb")), None)
        if gb:
            return {"gb": float(gb), "source": "GPU memory (env.json devices)", "device": "cuda"}
    host = host_memory_gb()
    ranks = max(1, step.launch.nproc_per_node)
    return {"gb": host / ranks if host else None, "device": "cpu",
            "source": f"host memory / {ranks} rank(s) per node (CPU: peak is the resident set size)"}


def analyse(step, runs: list[dict], ctx) -> dict[str, Any]:
    infos = [read_run(ctx, r) for r in runs]
    tables, why = comm_tables(step, ctx.results)
    comm_world = (((ctx.results.get("steps") or {}).get(step.comm) or {}).get("metrics") or {}).get(
        "world_size") if step.comm else None
    strategies = {label: strategy_figures(label, spec, runs, infos, tables, why, comm_world)
                  for label, spec in step.strategies.items()}
    failed = [r for r in runs if r["status"] != "passed"]
    return {"strategies": strategies, "repeats": step.repeats, "comm_step": step.comm, "comm_source": why,
            "all_ran": all(s["passed"] == s["runs"] and s["runs"] > 0 for s in strategies.values()),
            "byte_model_matches": all(s["comm_model_matches"] for s in strategies.values()),
            "comparisons": compare_strategies(step, runs, ctx), "capacity": capacity(step, infos),
            "headroom": step.headroom, "oom_only": bool(failed) and all(is_oom(r.get("reason")) for r in failed)}


def search_batches(step, runs: list[dict], result: dict, ctx) -> dict[str, Any] | None:
    """The batch-size search per strategy (GPU only; validation.analysis.parallelism.batch_search), or why it was skipped."""
    if not step.batch_search:
        return None
    if (result.get("metrics") or {}).get("capacity", {}).get("device") != "cuda":
        return {"skipped": CPU_SEARCH_SKIPPED}
    winners = ctx.winners()
    out: dict[str, Any] = {}
    for label in step.strategies:
        def fits(batch: int, label=label) -> bool:
            spec = strategy_launch(step, label, 0, winners, ctx.run_dir, batch=batch,
                                   steps_override=step.batch_search.steps)
            lr = ctx.launch(spec, 0, 1)
            ctx.record(result, spec, lr)
            status, reason, _ = trainer.collect(ctx, step, spec, lr)
            if status == "passed":
                return True
            if is_oom(reason, lr.reason, lr.excerpt):
                return False
            raise SearchError(f"batch {batch}: {reason}")

        found = batch_search(fits, step.batch_search.start, step.batch_search.max)
        out[label] = found.as_dict()
        ctx.save()
    return out


def decide_recommendation(step, m: dict, runs: list[dict] | None = None) -> None:
    """The recommendation (validation.analysis.parallelism.recommend) from the metrics, written into them. The batch the
    runbook needs is the step's args.batch_size, else the micro-batch its runs used (env.json, the config's)."""
    need = step.launch.args.get("batch_size")
    if not isinstance(need, int):
        need = next((c.get("micro_batch") for c in (((r.get("metrics") or {}).get("context") or {})
                                                    for r in runs or []) if isinstance(c.get("micro_batch"), int)),
                    None)
    m["batch_needed"] = need
    search = m.get("batch_search") if isinstance(m.get("batch_search"), dict) else {}
    evidence, unmeasured = {}, []
    for label, s in m["strategies"].items():
        if label not in ("ddp", "fsdp", "fsdp_no_reshard"):
            continue  # variants (accumulation) are shown, the rule compares the three strategies
        if s["passed"] == 0 and s["oom"] == 0:
            unmeasured.append(label)  # failed for another reason: no evidence either way
            continue
        peak = s["peak_reserved_gb"] if s.get("peak_reserved_gb") is not None else s.get("peak_alloc_gb")
        largest = (search.get(label) or {}).get("largest") if isinstance(search.get(label), dict) else None
        fits = s["passed"] > 0 and s["oom"] == 0
        if largest is not None and isinstance(need, int):
            fits = fits and largest >= need
        evidence[label] = {"fits": fits, "peak_gb": peak, "capacity_gb": m["capacity"].get("gb"),
                           "toks_per_s": s.get("toks_per_s"), "largest_batch": largest}
    rec = recommend(evidence, m["comparisons"], headroom=step.headroom)
    if unmeasured and rec["reason"]:
        rec["reason"] += f"; not considered: {', '.join(unmeasured)} (no run passed, none ran out of memory)"
    m.update(recommendation=rec["strategy"], recommendation_reason=rec["reason"], regime=rec["regime"],
             recommendation_numbers=rec["numbers"])
