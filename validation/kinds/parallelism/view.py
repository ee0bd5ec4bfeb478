"""The report's view and plots of a `parallelism` step (validation.kinds.parallelism): the strategies side by side,
the memory table (measured peaks beside the memory model), predicted vs measured communication, the comparisons,
the batch-size search and the recommendation with its reason, from the kind's Result (the report decodes it
leniently: results may be damaged)."""

from __future__ import annotations

from typing import Any, Callable

from validation.analysis.parallelism import STRATEGIES
from validation.kinds.blocks import Block, Bullets, Column, Paragraph, Table
from validation.kinds.parallelism.records import Capacity, MemoryModel, Result, Skipped, StrategyFigures
from validation.formatting import file_name, finite, fmt_num, fmt_pct, fmt_rate

GIB = 1024 ** 3


def _ms(x: Any) -> str:
    x = finite(x)
    return "—" if x is None else f"{x * 1000:,.1f} ms"


def _gb(x: Any) -> str:
    """GiB, as the trainer writes them; below 1 GiB in MiB, so a tiny model's figures are not all 0.000."""
    x = finite(x)
    if x is None:
        return "—"
    return f"{x:,.3f} GiB" if abs(x) >= 1 else f"{x * 1024:,.2f} MiB"


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


def parallelism_blocks(r: Result) -> list[Block]:
    """The strategies side by side (the recommended one marked), communication, memory, the comparisons, the
    batch-size search and the recommendation with its reason."""
    m = r.metrics
    strategies = {str(k): s for k, s in m.strategies.items()}
    recommendation = fmt_num(m.recommendation) if m.recommendation else "none"
    rows, memory, comm, notes = [], [], [], []
    estimates: set[str] = set()
    for label, s in strategies.items():
        toks = [t for t in (finite(t) for t in s.toks_per_s_runs) if t is not None]
        spread = f" ({fmt_rate(min(toks))} .. {fmt_rate(max(toks))})" if len(toks) > 1 else ""
        rows.append((label, STRATEGIES.get(str(s.strategy), fmt_num(s.strategy)),
                     f"{fmt_num(s.passed)}/{fmt_num(s.runs)}", _ms(s.step_time_s),
                     fmt_rate(finite(s.toks_per_s)) + spread, fmt_num(s.oom)))
        mm = s.memory_model or MemoryModel()
        mem_kind = "RSS" if s.memory_kind == "cpu_rss" else "allocated"
        model = [_gb(finite(v) and v / GIB) for v in (mm.params, mm.grads, mm.optimizer_state, mm.activations,
                                                      mm.total)]
        if isinstance(mm.activations_basis, str) and mm.activations_basis.startswith("estimate"):
            # the activations off CPU are the PyTorch path's CPU count: an estimate, and so is the total
            model[3:] = [f"~{v}" if v != "—" else v for v in model[3:]]
            estimates.add(mm.activations_basis)
        memory.append((label, f"{_gb(s.peak_alloc_gb)} ({mem_kind})", _gb(s.peak_reserved_gb), *model))
        matches = s.comm_model_matches
        comm_note = prediction_note(label, s.comm_predicted_s, s.aligned_comm_s, s.comm_time_s)
        if comm_note:
            notes.append(comm_note)
        comm.append((label, _bytes(s.comm_bytes_counted), _bytes(s.comm_bytes_model),
                     "yes" if matches is True else "NO" if matches is False else "—", _ms(s.comm_time_s),
                     _ms(s.comm_predicted_s), _ms(s.aligned_comm_s), _ms(s.profiled_comm_s), _ms(s.exposed_comm_s),
                     fmt_pct(s.comm_share)))
    first = next(iter(strategies.values()), StrategyFigures())
    cap = m.capacity
    capacity = (f"{_gb(cap.gb)} per rank ({fmt_num(cap.source)})" if cap != Capacity() else "—")
    seed = r.order_seed
    out: list[Block] = [
        Table((Column("Strategy"), Column("Description"), *(Column(c, numeric=True) for c in (
            "Runs passed", "Step time",
            "Tokens/s, window mean (all ranks; over repeats; lowest .. highest repeat)", "OOM"))), rows,
            marked={i for i, label in enumerate(strategies) if label == recommendation}),
        Paragraph("**Communication per step** (bytes counted by the trainer at its collective calls vs the byte model. "
                  "Times per step: *Rank 0 in flight* = from rank 0 issuing each collective until it completed, over the "
                  "whole run, including waiting for slower peers; *Predicted* from the comm step's tables; *Collective "
                  "(ranks aligned)* = each call from the later rank's start to the last rank's end, from every rank's "
                  "profiler trace (the collective's own time, comparable with the prediction); *Rank 0 in profile* = "
                  "rank 0's collective time in the profiled steps; *Exposed* = the part of it not overlapped with rank "
                  "0's compute):"),
        Table((Column("Strategy"), Column("Counted", numeric=True), Column("Byte model", numeric=True), Column("Match"),
               *(Column(c, numeric=True) for c in ("Rank 0 in flight", "Predicted", "Collective (ranks aligned)",
                                                   "Rank 0 in profile", "Exposed", "Share of step"))), comm),
        Paragraph(f"Prediction: {fmt_num(first.comm_prediction)}. Exposed time: {fmt_num(first.exposed_source)}.",
                  style="muted"),
        *(Paragraph(f"Note: {n}", style="muted") for n in notes),
        Paragraph("**Memory** (measured peak beside the memory model per rank):"),
        Table((Column("Strategy"), *(Column(c, numeric=True) for c in (
            "Peak measured", "Peak reserved", "Model: params", "grads", "optimizer", "activations", "total"))), memory),
        Paragraph(f"Memory per rank: {capacity}; headroom asked for DDP: {fmt_pct(m.headroom)}.", style="muted"),
        *(Paragraph(f"~ activations and total: {e}.", style="muted") for e in sorted(estimates)),
        Paragraph(f"**Comparisons** (tokens/s, {fmt_num(m.repeats)} repeat(s)"
                  + (f", run order random within each repeat (seed {seed})" if seed is not None else "") + "):")]
    comparisons = [f"{str(k).replace(':', ' vs ')}: {fmt_num(c.text)}" for k, c in m.comparisons.items()]
    if comparisons:
        out.append(Bullets(comparisons))
    search = m.batch_search
    if isinstance(search, Skipped) and search.skipped:
        out.append(Paragraph(f"**Batch-size search**: {search.skipped}"))
    elif isinstance(search, dict):
        out += [Paragraph("**Batch-size search**:"),
                Table((Column("Strategy"), Column("Largest batch that fits", numeric=True),
                       Column("First OOM", numeric=True), Column("Tried")),
                      [(str(k), fmt_num(v.largest), fmt_num(v.first_oom),
                        ", ".join(f"{t.batch}{'' if t.fits else ' (OOM)'}" for t in v.tried)
                        + (f" (stopped: {v.error})" if v.error else ""))
                       for k, v in search.items()])]
    out.append(Paragraph(f"**Recommendation**: {recommendation} ({fmt_num(m.regime)}) — "
                         f"{fmt_num(m.recommendation_reason)}"))
    return out


def draw_plots(name: str, result: Result, plotter) -> None:
    """Tokens/s per strategy (each repeat a dot, the mean a bar) and the communication per step: measured at the
    collective calls over the whole run, predicted, and in the profiled steps their total and exposed part."""
    strategies = {str(k): s for k, s in result.metrics.strategies.items()}
    if not strategies:
        return
    labels = list(strategies)
    title = f"Parallelism: {result.title or name}"
    fig, ax = plotter.figure(title, "strategy")
    means = [finite(strategies[k].toks_per_s) or 0.0 for k in labels]
    ax.bar(range(len(labels)), means, color="tab:blue", alpha=0.6, edgecolor="black", linewidth=0.6)
    for i, k in enumerate(labels):
        pts = [finite(t) for t in strategies[k].toks_per_s_runs]
        pts = [p for p in pts if p is not None]
        ax.plot([i] * len(pts), pts, "o", color="black", markersize=4)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    plotter.save(fig, f"parallelism_{file_name(name)}.png", title)
    series: list[tuple[str, Callable[[StrategyFigures], Any]]] = [
        ("measured (collective calls)", lambda s: s.comm_time_s),
        ("predicted (comm tables)", lambda s: s.comm_predicted_s),
        ("in the profiled steps", lambda s: s.profiled_comm_s),
        ("exposed (profiled steps)", lambda s: s.exposed_comm_s)]
    if not any(finite(figure(strategies[k])) is not None for k in labels for _, figure in series):
        return
    if all(finite(strategies[k].comm_predicted_s) is None for k in labels):
        series[1] = ("predicted: not available (no comm step)", series[1][1])
    title = f"Communication per step: {name}"
    fig, ax = plotter.figure(title, "strategy", "seconds per step")
    width = 0.8 / len(series)
    for j, (what, figure) in enumerate(series):
        ax.bar([i + (j - (len(series) - 1) / 2) * width for i in range(len(labels))],
               [finite(figure(strategies[k])) or 0.0 for k in labels], width, label=what)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.legend(fontsize="small")
    plotter.save(fig, f"parallelism_comm_{file_name(name)}.png", title)
