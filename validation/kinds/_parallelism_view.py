"""The report's view and plots of a `parallelism` step (validation.kinds.parallelism): the strategies side by side,
the memory table (measured peaks beside the memory model), predicted vs measured communication, the comparisons,
the batch-size search and the recommendation with its reason. Accepts anything: results may be damaged."""

from __future__ import annotations

from typing import Any

from validation.analysis.parallelism import STRATEGIES
from validation.formatting import as_dict, as_list, file_name, finite, fmt_num, fmt_pct, fmt_rate

GIB = 1024 ** 3


def _ms(x: Any) -> str:
    x = finite(x)
    return "—" if x is None else f"{x * 1000:,.1f} ms"


def _gb(x: Any) -> str:
    """GB (GiB, as the trainer writes them); below 1 GB in MB, so a tiny model's figures are not all 0.000."""
    x = finite(x)
    if x is None:
        return "—"
    return f"{x:,.3f} GB" if abs(x) >= 1 else f"{x * 1024:,.2f} MB"


def _bytes(x: Any) -> str:
    x = finite(x)
    return "—" if x is None else f"{int(x):,} B"


def prediction_note(label: Any, predicted: Any, aligned: Any, in_flight: Any) -> str | None:
    """One line when the predicted collective time and the measured one (ranks aligned, else rank 0's in-flight
    time) differ by more than 2x: the likely cause and the fix; None otherwise or without both."""
    p, m = finite(predicted), finite(aligned)
    what = "collective time (ranks aligned)"
    if m is None:
        m, what = finite(in_flight), "rank 0's in-flight time"
    if p is None or m is None or p <= 0 or m <= 0 or max(p / m, m / p) <= 2:
        return None
    return (f"{label}: predicted {_ms(p)} vs {what} {_ms(m)} per step ({m / p:.1f}x): likely the benchmark timed its "
            "calls back to back while training issues them right after computation (on a CPU, 2-10x slower), or "
            "skew between ranks (in-flight time includes waiting for the slower rank); fix: give the comm step "
            "`compute_ms:` near the training step time (if it has one: more iters, or a quieter machine) and compare "
            "the ranks-aligned column.")


def parallelism_view(result: dict) -> dict:
    m = as_dict(result.get("metrics"))
    strategies = as_dict(m.get("strategies"))
    rows, memory, comm, notes = [], [], [], []
    for label, s in strategies.items():
        s = as_dict(s)
        name = STRATEGIES.get(str(s.get("strategy")), fmt_num(s.get("strategy")))
        toks = [finite(t) for t in as_list(s.get("toks_per_s_runs"))]
        spread = ""
        if len([t for t in toks if t is not None]) > 1:
            vals = [t for t in toks if t is not None]
            spread = f" ({fmt_rate(min(vals))} .. {fmt_rate(max(vals))})"
        rows.append({"label": str(label), "strategy": name, "runs": f"{fmt_num(s.get('passed'))}/{fmt_num(s.get('runs'))}",
                     "step_time": _ms(s.get("step_time_s")), "toks": fmt_rate(finite(s.get("toks_per_s"))) + spread,
                     "oom": fmt_num(s.get("oom"))})
        mm = as_dict(s.get("memory_model"))
        mem_kind = "RSS" if s.get("memory_kind") == "cpu_rss" else "allocated"
        memory.append({"label": str(label), "peak": f"{_gb(s.get('peak_alloc_gb'))} ({mem_kind})",
                       "reserved": _gb(s.get("peak_reserved_gb")),
                       "params": _gb(finite(mm.get("params")) and mm["params"] / GIB),
                       "grads": _gb(finite(mm.get("grads")) and mm["grads"] / GIB),
                       "optim": _gb(finite(mm.get("optimizer_state")) and mm["optimizer_state"] / GIB),
                       "acts": _gb(finite(mm.get("activations")) and mm["activations"] / GIB),
                       "total": _gb(finite(mm.get("total")) and mm["total"] / GIB)})
        matches = s.get("comm_model_matches")
        comm_note = prediction_note(label, s.get("comm_predicted_s"), s.get("aligned_comm_s"), s.get("comm_time_s"))
        if comm_note:
            notes.append(comm_note)
        comm.append({"label": str(label), "counted": _bytes(s.get("comm_bytes_counted")),
                     "model": _bytes(s.get("comm_bytes_model")),
                     "matches": "yes" if matches is True else "NO" if matches is False else "—",
                     "measured": _ms(s.get("comm_time_s")), "predicted": _ms(s.get("comm_predicted_s")),
                     "profiled": _ms(s.get("profiled_comm_s")), "exposed": _ms(s.get("exposed_comm_s")),
                     "aligned": _ms(s.get("aligned_comm_s")),
                     "share": fmt_pct(s.get("comm_share")), "counted_by": fmt_num(s.get("comm_counted_by"))})
    comparisons = []
    for key, c in as_dict(m.get("comparisons")).items():
        c = as_dict(c)
        comparisons.append({"pair": str(key).replace(":", " vs "), "text": fmt_num(c.get("text")),
                            "verdict": fmt_num(c.get("verdict")) if c.get("verdict") else "—"})
    search = m.get("batch_search")
    search_view = None
    if isinstance(search, dict):
        if search.get("skipped"):
            search_view = {"skipped": str(search["skipped"]), "rows": []}
        else:
            search_view = {"skipped": None, "rows": [
                {"label": str(k), "largest": fmt_num(as_dict(v).get("largest")),
                 "first_oom": fmt_num(as_dict(v).get("first_oom")), "error": as_dict(v).get("error"),
                 "tried": ", ".join(f"{t.get('batch')}{'' if t.get('fits') else ' (OOM)'}"
                                    for t in (as_dict(x) for x in as_list(as_dict(v).get("tried"))))}
                for k, v in search.items()]}
    first = next((as_dict(s) for s in strategies.values()), {})
    cap = as_dict(m.get("capacity"))
    return {"command": "", "parallelism": {
        "rows": rows, "memory": memory, "comm": comm, "comm_notes": notes, "comparisons": comparisons, "search": search_view,
        "recommendation": fmt_num(m.get("recommendation")) if m.get("recommendation") else "none",
        "regime": fmt_num(m.get("regime")), "reason": fmt_num(m.get("recommendation_reason")),
        "capacity": f"{_gb(cap.get('gb'))} per rank ({fmt_num(cap.get('source'))})" if cap else "—",
        "headroom": fmt_pct(m.get("headroom")), "comm_source": fmt_num(m.get("comm_source")),
        "prediction": fmt_num(first.get("comm_prediction")), "exposed_source": fmt_num(first.get("exposed_source")),
        "order": (f"random within each repeat (seed {result['order_seed']})" if result.get("order_seed") is not None
                  else None), "repeats": fmt_num(m.get("repeats"))}}


def draw_plots(name: str, result: dict, plotter) -> None:
    """Tokens/s per strategy (each repeat a dot, the mean a bar) and the communication per step: measured at the
    collective calls over the whole run, predicted, and in the profiled steps their total and exposed part."""
    strategies = {str(k): as_dict(v) for k, v in as_dict(as_dict(result.get("metrics")).get("strategies")).items()}
    if not strategies:
        return
    labels = list(strategies)
    title = f"Parallelism: {result.get('title') or name}"
    fig, ax = plotter.figure(title, "strategy")
    means = [finite(strategies[k].get("toks_per_s")) or 0.0 for k in labels]
    ax.bar(range(len(labels)), means, color="tab:blue", alpha=0.6, edgecolor="black", linewidth=0.6)
    for i, k in enumerate(labels):
        pts = [finite(t) for t in as_list(strategies[k].get("toks_per_s_runs"))]
        pts = [p for p in pts if p is not None]
        ax.plot([i] * len(pts), pts, "o", color="black", markersize=4)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    plotter.save(fig, f"parallelism_{file_name(name)}.png", title)
    series = [("measured (collective calls)", "comm_time_s"), ("predicted (comm tables)", "comm_predicted_s"),
              ("in the profiled steps", "profiled_comm_s"), ("exposed (profiled steps)", "exposed_comm_s")]
    if not any(finite(strategies[k].get(key)) is not None for k in labels for _, key in series):
        return
    if all(finite(strategies[k].get("comm_predicted_s")) is None for k in labels):
        series[1] = ("predicted: not available (no comm step)", "comm_predicted_s")
    title = f"Communication per step: {name}"
    fig, ax = plotter.figure(title, "strategy", "seconds per step")
    width = 0.8 / len(series)
    for j, (what, key) in enumerate(series):
        ax.bar([i + (j - (len(series) - 1) / 2) * width for i in range(len(labels))],
               [finite(strategies[k].get(key)) or 0.0 for k in labels], width, label=what)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.legend(fontsize="small")
    plotter.save(fig, f"parallelism_comm_{file_name(name)}.png", title)
