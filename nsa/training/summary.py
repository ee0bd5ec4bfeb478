"""The Training Summary (seed 003): accumulated step by step by the trainer, written by rank 0 as summary.json at the
end of every run and printed as a block. The fields are defined in nsa.training.outputs.SUMMARY_FIELDS (read back
with outputs.read_summary); this module only computes them."""

from __future__ import annotations

import math
from typing import Any

from nsa.training import outputs
from nsa.training.comm_count import CommCounter, counts_table


class _Mean:
    """Running count, sum, min and max (a run may be long: no per-step lists are kept)."""

    def __init__(self) -> None:
        self.n, self.total, self.low, self.high = 0, 0.0, math.inf, -math.inf

    def add(self, x: float) -> None:
        self.n, self.total = self.n + 1, self.total + x
        self.low, self.high = min(self.low, x), max(self.high, x)

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


class SummaryAccumulator:
    """Per-step figures of rank 0, reduced to the summary at the end."""

    def __init__(self, *, parallel: str, world_size: int, device_type: str, tokens_per_step: int,
                 samples_per_step: int, steps_planned: int, fsdp_reshard: bool | None = None):
        self.static = {"parallel": parallel, "fsdp_reshard": fsdp_reshard, "world_size": world_size,
                       "device": device_type, "steps_planned": steps_planned, "tokens_per_step": tokens_per_step,
                       "samples_per_step": samples_per_step}
        self.memory_kind = "cuda" if device_type == "cuda" else "cpu_rss"
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.first_time = 0.0
        self.times, self.rates, self.losses, self.alloc, self.reserved = (_Mean() for _ in range(5))
        self.final_loss: float | None = None
        self.peaks = {"alloc": None, "reserved": None}

    def add(self, step: int, step_time_s: float, toks_per_s: float, loss: float, alloc_gb: float,
            reserved_gb: float | None) -> None:
        if self.first_step is None:
            self.first_step, self.first_time = step, step_time_s
        self.last_step, self.final_loss = step, loss
        self.times.add(step_time_s)
        self.rates.add(toks_per_s)
        self.losses.add(loss)
        self.alloc.add(alloc_gb)
        if reserved_gb is not None:
            self.reserved.add(reserved_gb)

    def set_peaks(self, alloc_gb: float | None, reserved_gb: float | None) -> None:
        self.peaks = {"alloc": alloc_gb, "reserved": reserved_gb}

    def build(self, status: str, counter: CommCounter | None, counted_by: str | None,
              prediction: dict | None, memory_model: dict | None) -> dict[str, Any]:
        n, total_time = self.times.n, self.times.total
        cuda = self.memory_kind == "cuda"
        out: dict[str, Any] = {"schema": outputs.SUMMARY_SCHEMA, "status": status, **self.static}
        out.update({
            "steps": n, "first_step": self.first_step, "last_step": self.last_step,
            "avg_step_time_s": self.times.mean, "min_step_time_s": self.times.low if n else None,
            "max_step_time_s": self.times.high if n else None,
            "avg_step_time_excl_first_s": (total_time - self.first_time) / (n - 1) if n > 1 else None,
            "samples_per_s": n * self.static["samples_per_step"] / total_time if total_time > 0 else None,
            "tokens_per_s": n * self.static["tokens_per_step"] / total_time if total_time > 0 else None,
            "throughput_first_step": self.first_step + 1 if n > 1 else None,
            "samples_per_s_excl_first": _rate(n - 1, self.static["samples_per_step"], total_time - self.first_time),
            "tokens_per_s_excl_first": _rate(n - 1, self.static["tokens_per_step"], total_time - self.first_time),
            "mean_step_toks_per_s": self.rates.mean,
            "avg_loss": self.losses.mean, "final_loss": self.final_loss,
            "memory_kind": self.memory_kind,
            "peak_mem_alloc_gb": self.peaks["alloc"], "avg_mem_alloc_gb": self.alloc.mean,
            "peak_mem_reserved_gb": self.peaks["reserved"] if cuda else None,
            "avg_mem_reserved_gb": self.reserved.mean if cuda else None,
        })
        out.update(_comm_fields(counter, counted_by, total_time))
        out["comm_model"] = prediction
        out["comm_model_matches"] = _matches(out["comm"], prediction)
        out["memory_model"] = memory_model
        return {k: _finite(v) for k, v in out.items()}


def _comm_fields(counter: CommCounter | None, counted_by: str | None, total_time: float) -> dict[str, Any]:
    if counter is None or counter.n_steps == 0:
        comm = {"counted_by": counted_by, "steps": 0, "per_step": [], "first_step": [], "total": [],
                "constant": True, "trainer": {"per_step": [], "total": []}}
        method = ("nothing communicated: a single process" if counted_by is None
                  else "no step completed")
        return {"comm_time_s": 0.0 if counted_by is None else None,
                "comm_share": 0.0 if counted_by is None else None, "comm_time_method": method, "comm": comm}
    last = counter.last_step
    comm = {
        "counted_by": counted_by, "steps": counter.n_steps,
        "per_step": counts_table(last["model"]), "first_step": counts_table(counter.first_step["model"]),
        "total": counts_table(counter.total["model"]), "constant": counter.constant,
        "trainer": {"per_step": counts_table(last["trainer"]), "total": counts_table(counter.total["trainer"])},
    }
    if counter.measure_time:
        seconds = counter.time_total_s
        share = seconds / total_time if total_time > 0 else None
        method = ("wall time during which a counted collective was in flight, from its call until it completed "
                  "(union over overlapping calls), rank 0")
    else:
        seconds = share = None
        method = ("not measured: CUDA collectives run asynchronously to the host; use the profiler "
                  "(train.profile_steps) for communication time")
    return {"comm_time_s": seconds, "comm_share": share, "comm_time_method": method, "comm": comm}


def _matches(comm: dict, prediction: dict | None) -> bool | None:
    """Counted == predicted, exactly (calls, bytes and every message size in call order): the first step against
    the prediction's first_step, the last against its per_step (when more than one step ran)."""
    if prediction is None or comm["steps"] == 0:
        return None

    def table(counts: dict) -> list[dict]:
        return [{"kind": k, **counts[k]} for k in sorted(counts) if counts[k]["calls"]]

    def by_kind(rows: list[dict]) -> list[dict]:
        return sorted(rows, key=lambda r: r["kind"])

    ok = by_kind(comm["first_step"]) == table(prediction["first_step"])
    if comm["steps"] > 1:
        ok = ok and by_kind(comm["per_step"]) == table(prediction["per_step"]) and comm["constant"]
    return bool(ok)


def _rate(steps: int, per_step: int, seconds: float) -> float | None:
    """steps * per_step / seconds; None without a step or a positive time (a run of one step has no steps after
    its first)."""
    return steps * per_step / seconds if steps > 0 and seconds > 0 else None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def format_summary(s: dict[str, Any]) -> str:
    """The printed Training Summary block (seed 003's layout, with units and the communication figures)."""
    def num(v, fmt="{:.4f}"):
        return "n/a" if v is None else fmt.format(v)

    mem = "GiB" if s["memory_kind"] == "cuda" else "GiB (CPU: resident set size)"
    lines = ["Training Summary", "=" * 50,
             f"status: {s['status']} ({s['parallel']} x {s['world_size']}, {s['device']})",
             f"num_steps: {s['steps']}",
             f"avg_step_time: {num(s['avg_step_time_s'])} s",
             f"min_step_time: {num(s['min_step_time_s'])} s",
             f"max_step_time: {num(s['max_step_time_s'])} s",
             *_throughput_lines(s, num),
             f"avg_loss: {num(s['avg_loss'])}",
             f"final_loss: {num(s['final_loss'])}",
             f"peak_memory_allocated: {num(s['peak_mem_alloc_gb'], '{:.3f}')} {mem}",
             f"avg_memory_allocated: {num(s['avg_mem_alloc_gb'], '{:.3f}')} {mem}"]
    if s["memory_kind"] == "cuda":
        lines += [f"peak_memory_reserved: {num(s['peak_mem_reserved_gb'], '{:.3f}')} GiB",
                  f"avg_memory_reserved: {num(s['avg_mem_reserved_gb'], '{:.3f}')} GiB"]
    comm = s["comm"]
    if comm["counted_by"] is None:
        lines.append("communication: none (single process)")
    else:
        per = ", ".join(f"{r['kind']} {r['calls']} x / {r['bytes']:,} B" for r in comm["per_step"]) or "none"
        lines.append(f"communication per step: {per} (counted by {comm['counted_by']})")
        if s["comm_share"] is not None:
            lines.append(f"communication_share: {s['comm_share'] * 100:.1f}% ({num(s['comm_time_s'])} s in "
                         "collectives)")
        else:
            lines.append("communication_share: n/a (" + s["comm_time_method"] + ")")
        if s["comm_model_matches"] is not None:
            lines.append(f"byte model: {'matches the counted bytes' if s['comm_model_matches'] else 'DIFFERS'} "
                         f"({s['comm_model']['bytes_per_step']:,} B/step predicted)")
    return "\n".join(lines)


def _throughput_lines(s: dict[str, Any], num) -> list[str]:
    """The throughput lines, each naming the steps it covers: steady state (the first step, with its lazy
    initialization and compilation, left out, as the validation suite's statistics leave out their warm-up) and
    the whole run (the first step included)."""
    first, last = s.get("throughput_first_step"), s["last_step"]
    lines = []
    if first is not None and s.get("tokens_per_s_excl_first") is not None:
        lines += [f"throughput_samples_per_sec: {num(s['samples_per_s_excl_first'], '{:.2f}')} (global, steps "
                  f"{first}-{last}: the first step left out)",
                  f"throughput_tokens_per_sec: {num(s['tokens_per_s_excl_first'], '{:,.0f}')} (global, steps "
                  f"{first}-{last}: the first step left out)"]
    span = f"steps {s['first_step']}-{last}" if s["first_step"] is not None else "no step"
    lines += [f"throughput_samples_per_sec_all_steps: {num(s['samples_per_s'], '{:.2f}')} (global, {span})",
              f"throughput_tokens_per_sec_all_steps: {num(s['tokens_per_s'], '{:,.0f}')} (global, {span})"]
    return lines
