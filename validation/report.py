"""Reports of a validation run, rendered from RUN_DIR/results.json alone (validation.results).

Formats (FORMATS):
- md:    Markdown in the shape of the v4 DDP validation report: executive summary with the GO / NO-GO /
         INCOMPLETE verdict, test environment, one section per runbook phase, acceptance criteria,
         recommendations (an `export` block), plots and artifacts (reports/templates/report.md.j2).
- html:  the same content as one standalone page, inline CSS, everything escaped (report.html.j2).
- json:  results.json pretty-printed with sorted keys.
- junit: JUnit XML: one <testsuite> per phase (a <testcase> per step) and one "acceptance" suite.

Rendering is pure: the same results give byte-identical output (nothing about the time of rendering goes
in, dicts whose order the schema does not fix are iterated sorted). Plots (make_plots) are PNG files
written with matplotlib's Agg backend at a fixed size and dpi and without a Software/date stamp.
Missing or malformed metrics render as "n/a"; a report never fails because a step failed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from validation.results import read_results

FORMATS = ("md", "html", "json", "junit")
TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "reports" / "templates"
TEMPLATE_NAMES = {"md": "report.md.j2", "html": "report.html.j2"}
REPORT_FILES = {"md": "report.md", "html": "report.html", "json": "report.json", "junit": "junit.xml"}
PLOTS_DIR = "plots"
NA = "n/a"

TRAIN_LIKE_KINDS = ("train", "longrun", "profile")
FAILED_STATUSES = ("failed", "hang", "timeout", "error")
STATUS_LABELS = {
    "passed": ("✅", "PASSED", "pass"),
    "failed": ("❌", "FAILED", "fail"),
    "error": ("❗", "ERROR", "error"),
    "hang": ("❌", "HANG", "fail"),
    "timeout": ("⏱", "TIMEOUT", "fail"),
    "skipped": ("⏭", "SKIPPED", "skip"),
    "pending": ("⏳", "PENDING", "warn"),
    "interrupted": ("⚠️", "INTERRUPTED", "warn"),
    "running": ("⏳", "RUNNING", "warn"),
}
CRITERION_LABELS = {
    "pass": ("✅", "PASS", "pass"),
    "fail": ("❌", "FAIL", "fail"),
    "warn": ("⚠️", "WARN", "warn"),
    "skipped": ("⏭", "SKIPPED", "skip"),
    "error": ("❗", "ERROR", "error"),
}
VERDICT_LABELS = {
    "GO": ("✅", "go"),
    "NO-GO": ("❌", "nogo"),
    "INCOMPLETE": ("⚠️", "incomplete"),
}


class ReportError(RuntimeError):
    """A report cannot be produced (unknown format, templates not found)."""


# --------------------------------------------------------------------------------------------------------------
# Small, total helpers: every one accepts anything and returns a string or a plain container, never raises.

def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def _finite(value: Any) -> float | None:
    """A real number as float, or None (bools, strings, NaN and inf are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def fmt_num(value: Any) -> str:
    """A value as a short human-readable string: 5843.2 -> '5,843.2', 0.62 -> '0.62', None -> 'n/a'."""
    if value is None:
        return NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return NA
        if abs(value) >= 100:
            return f"{value:,.1f}"
        if value == int(value):
            return f"{int(value)}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_num(v) for v in value) if value else NA
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt_num(value[k])}" for k in sorted(value, key=str)) if value else NA
    text = str(value)
    return text if text.strip() else NA


def fmt_rate(value: Any) -> str:
    """Tokens per second: thousands separators, one decimal."""
    v = _finite(value)
    return NA if v is None else f"{v:,.1f}"


def fmt_pct(fraction: Any, signed: bool = False) -> str:
    v = _finite(fraction)
    if v is None:
        return NA
    return f"{v * 100:+.1f}%" if signed else f"{v * 100:.1f}%"


def fmt_gb(value: Any) -> str:
    v = _finite(value)
    return NA if v is None else f"{v:.2f} GB"


def fmt_p(value: Any) -> str:
    v = _finite(value)
    if v is None:
        return NA
    return "< 0.001" if v < 0.001 else f"{v:.3f}"


def fmt_duration(seconds: Any) -> str:
    v = _finite(seconds)
    if v is None or v < 0:
        return NA
    if v < 60:
        return f"{v:.1f} s"
    total = int(round(v))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _stat(metrics: dict, key: str) -> dict:
    """metrics[key] as a statistics dict ({mean, stdev, ...}); a bare number becomes {"mean": number}."""
    value = metrics.get(key)
    if isinstance(value, dict):
        return value
    if _finite(value) is not None:
        return {"mean": value}
    return {}


def _mean_pm(stat: dict) -> str:
    mean, stdev = _finite(stat.get("mean")), _finite(stat.get("stdev"))
    if mean is None:
        return NA
    return f"{mean:,.1f} ± {stdev:,.1f}" if stdev is not None else f"{mean:,.1f}"


def _window(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, str):
        return value or NA
    if isinstance(value, int) and not isinstance(value, bool):
        return f"last {value} steps"
    if isinstance(value, dict):
        for key in ("description", "label", "rule"):
            if isinstance(value.get(key), str) and value[key]:
                return value[key]
        first = next((value[k] for k in ("first_step", "start", "from") if k in value), None)
        last = next((value[k] for k in ("last_step", "end", "to") if k in value), None)
        n = value.get("n", value.get("steps"))
        if first is not None and last is not None:
            text = f"steps {fmt_num(first)}–{fmt_num(last)}"
            return f"{text} (n={fmt_num(n)})" if n is not None else text
        if n is not None:
            return f"last {fmt_num(n)} steps"
        return fmt_num(value)
    return fmt_num(value)


def _loss(metrics: dict) -> str:
    first = next((metrics[k] for k in ("initial_loss", "first_loss", "loss_first", "loss_start")
                  if _finite(metrics.get(k)) is not None), None)
    last = next((metrics[k] for k in ("final_loss", "last_loss", "loss_last", "loss_end")
                 if _finite(metrics.get(k)) is not None), None)
    if first is not None and last is not None:
        drop = (first - last) / first if first else None
        text = f"{first:.3f} → {last:.3f}"
        return f"{text} (−{drop * 100:.1f}%)" if drop is not None and drop >= 0 else (
            f"{text} (+{-drop * 100:.1f}%)" if drop is not None else text)
    drop = _finite(metrics.get("loss_drop"))
    if drop is not None:
        return f"drop {drop:.3f}"
    if last is not None:
        return f"final {last:.3f}"
    return NA


def _param_name(key: str) -> str:
    return key[4:] if key.startswith("env.") else key


def _params_text(params: Any) -> str:
    params = _d(params)
    return ", ".join(f"{_param_name(str(k))}={fmt_num(params[k])}" for k in sorted(params, key=str)) or "—"


def _status(status: Any, table: dict = STATUS_LABELS) -> dict:
    key = str(status) if status is not None else "unknown"
    icon, word, css = table.get(key, ("❔", key.upper(), "unknown"))
    return {"value": key, "icon": icon, "word": word, "label": f"{icon} {word}", "css": css}


def _fence(text: str) -> str:
    """A Markdown code fence longer than any backtick run inside text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _command(argv: Any) -> str:
    argv = _l(argv)
    return shlex.join(str(a) for a in argv) if argv else ""


def _env_text(env: Any, skip: Iterable[str] = ("CONFIG",)) -> str:
    env = _d(env)
    items = [f"{k}={env[k]}" for k in sorted(env, key=str) if k not in skip]
    return ", ".join(items) if items else "—"


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "step"


def _ordered_steps(results: dict) -> list[tuple[dict, list[str]]]:
    """(phase, [step names]) in runbook order, plus an 'other' phase for steps no phase lists."""
    steps = _d(results.get("steps"))
    phases = [_d(p) for p in _l(results.get("phases"))]
    listed: set[str] = set()
    out = []
    for phase in phases:
        names = [str(n) for n in _l(phase.get("steps"))]
        listed.update(names)
        out.append((phase, names))
    others = sorted(str(n) for n in steps if str(n) not in listed)
    if others:
        out.append(({"name": "other", "title": "Other steps", "description": None}, others))
    return out


# --------------------------------------------------------------------------------------------------------------
# The view: everything the templates show, already formatted. Both templates read the same view.

def _config_path(record: dict) -> str:
    """The model/training config of a launch: CONFIG in its env, else --config in its command."""
    env = _d(record.get("env"))
    if env.get("CONFIG"):
        return str(env["CONFIG"])
    argv = [str(a) for a in _l(record.get("command"))]
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return "—"


def _train_row(label: str, record: dict) -> dict:
    metrics = _d(record.get("metrics"))
    env = _d(record.get("env"))
    toks = _stat(metrics, "toks_per_s")
    per_gpu = _stat(metrics, "toks_per_s_per_gpu")
    world = metrics.get("world_size")
    return {
        "label": label,
        "config": _config_path(record),
        "env": _env_text(env),
        "ranks": fmt_num(world),
        "window": _window(metrics.get("window")),
        "toks": _mean_pm(toks),
        "cv": fmt_pct(toks.get("cv")),
        "n": fmt_num(toks.get("n")),
        "per_gpu": fmt_rate(per_gpu.get("mean")),
        "loss": _loss(metrics),
        "mem": fmt_gb(metrics.get("mem_peak_gb")),
        "status": _status(record.get("status")),
        "csv": str(metrics["csv"]) if metrics.get("csv") else None,
    }


def _train_notes(metrics: dict) -> list[str]:
    notes = []
    csv_status = metrics.get("status")
    if csv_status not in (None, "ok"):
        detail = str(metrics.get("reason") or metrics.get("note") or NA)
        if detail.startswith(f"{csv_status}: "):  # the reader's reason already names the status
            detail = detail[len(csv_status) + 2:]
        notes.append(f"training.csv {csv_status}: {detail}")
    elif metrics.get("note"):
        notes.append(f"training.csv: {metrics['note']}")
    if "compression" in metrics:
        notes.append(f"DDP gradient compression: {metrics['compression'] or 'none'}")
    if "trainer_status" in metrics:
        notes.append(f"Trainer status: {fmt_num(metrics['trainer_status'])}")
    if "throughput_stable" in metrics:
        notes.append(f"Throughput stable: {fmt_num(metrics['throughput_stable'])}")
    audit = metrics.get("sdpa_audit")
    if isinstance(audit, dict):
        per_backend: Counter = Counter()
        for row in (_d(r) for r in _l(audit.get("by_site"))):
            calls = _finite(row.get("calls"))
            per_backend[f"{row.get('backend')} on {row.get('device')}"] += int(calls) if calls is not None else 0
        if per_backend:
            backend_text = ", ".join(f"{k}={per_backend[k]:,}" for k in sorted(per_backend))
        elif isinstance(audit.get("backends"), dict):
            backends = audit["backends"]
            backend_text = ", ".join(f"{k}={fmt_num(backends[k])}" for k in sorted(backends, key=str)) or NA
        else:
            backend_text = fmt_num(sorted(str(b) for b in _l(audit.get("backends"))))
        notes.append(f"SDPA audit: {fmt_num(audit.get('calls'))} calls; backends: {backend_text}; "
                     f"fallbacks to math on GPU: {fmt_num(audit.get('fallbacks'))}")
    if len(_l(metrics.get("nodes"))) > 1 or _finite(metrics.get("nnodes")) not in (None, 1):
        job = f", Slurm job {metrics['slurm_job']}" if metrics.get("slurm_job") else ""
        notes.append(f"Nodes: {', '.join(map(str, _l(metrics.get('nodes')))) or '—'} ({metrics.get('launcher')}{job}); "
                     f"{fmt_rate(_finite(metrics.get('toks_per_s_per_node')))} tokens/s per node")
    if _finite(metrics.get("scaling_efficiency")) is not None:
        notes.append(f"Scaling efficiency: {fmt_num(metrics['scaling_efficiency'])}")
    return notes


def _sweep_view(step: dict) -> dict:
    runs = [_d(r) for r in _l(step.get("runs"))]
    winner = _d(step.get("winner"))
    keys = sorted({str(k) for r in runs for k in _d(r.get("params"))})
    header = _param_name(keys[0]) if len(keys) == 1 else "value"
    label_counts = Counter(str(r.get("label")) for r in runs)
    rows = []
    for run in runs:
        params = _d(run.get("params"))
        if len(keys) == 1 and keys[0] in params:
            value = fmt_num(params[keys[0]])
        else:
            value = _params_text(params) if params else fmt_num(run.get("label"))
        if label_counts[str(run.get("label"))] > 1 and run.get("repeat") is not None:
            value = f"{value} (repeat {fmt_num(run.get('repeat'))})"
        toks = _stat(_d(run.get("metrics")), "toks_per_s")
        best = bool(winner) and run.get("label") == winner.get("label")
        rows.append({
            "value": value, "label": fmt_num(run.get("label")), "best": best,
            "mean": fmt_rate(toks.get("mean")), "stdev": fmt_rate(toks.get("stdev")),
            "cv": fmt_pct(toks.get("cv")), "n": fmt_num(toks.get("n")),
            "status": _status(run.get("status")), "reason": run.get("reason"),
        })
    winner_view = None
    if winner:
        winner_view = {"label": fmt_num(winner.get("label")), "params": _params_text(winner.get("params")),
                       "explanation": fmt_num(winner.get("explanation"))}
    metrics = _d(step.get("metrics"))
    rule = metrics.get("rule") or metrics.get("selection_rule")
    no_winner = None if winner else (metrics.get("selection") or "no run finished with a throughput figure")
    return {"header": header, "rows": rows, "winner": winner_view, "no_winner": str(no_winner) if no_winner else None,
            "rule": str(rule) if rule else None}


def _ab_view(step: dict) -> dict:
    runs = [_d(r) for r in _l(step.get("runs"))]
    label_counts = Counter(str(r.get("label")) for r in runs)
    rows = []
    for run in runs:
        toks = _stat(_d(run.get("metrics")), "toks_per_s")
        label = fmt_num(run.get("label"))
        if label_counts[str(run.get("label"))] > 1 and _finite(run.get("repeat")) is not None:
            label = f"{label} (repeat {int(run['repeat']) + 1})"
        rows.append({"label": label, "params": _params_text(run.get("params")),
                     "repeat": fmt_num(run.get("repeat")), "toks": _mean_pm(toks),
                     "cv": fmt_pct(toks.get("cv")), "n": fmt_num(toks.get("n")),
                     "status": _status(run.get("status")), "reason": run.get("reason")})
    comparisons = []
    for comp in (_d(c) for c in _l(step.get("comparison"))):
        comparisons.append({
            "baseline": fmt_num(comp.get("baseline")), "variant": fmt_num(comp.get("variant")),
            "metric": fmt_num(comp.get("metric")),
            "mean_a": fmt_num(comp.get("mean_a")), "mean_b": fmt_num(comp.get("mean_b")),
            "delta": fmt_num(comp.get("delta")), "rel_delta": fmt_pct(comp.get("rel_delta"), signed=True),
            "p_value": fmt_p(comp.get("p_value")), "significant": fmt_num(comp.get("significant")),
            "verdict": fmt_num(comp.get("verdict")), "test": fmt_num(comp.get("test")),
            "n": f"{fmt_num(comp.get('n_a'))} / {fmt_num(comp.get('n_b'))}",
        })
    winner = _d(step.get("winner"))
    chosen = None
    if winner:
        chosen = {"label": fmt_num(winner.get("label")), "params": _params_text(winner.get("params")),
                  "explanation": fmt_num(winner.get("explanation"))}
    return {"rows": rows, "comparisons": comparisons, "winner": chosen}


def _bench_view(metrics: dict) -> dict:
    """A benchmark's JSON: its scalar figures, and one table per list of records (e.g. by_seq_len)."""
    scalars, tables = [], []
    for key in sorted(metrics, key=str):
        value = metrics[key]
        records = [_d(v) for v in _l(value)]
        if records and all(isinstance(v, dict) for v in _l(value)):
            columns = sorted({str(k) for r in records for k in r})
            tables.append({"name": str(key), "columns": columns,
                           "rows": [[fmt_num(r.get(c)) for c in columns] for r in records]})
        else:
            scalars.append((str(key), fmt_num(value)))
    return {"scalars": scalars, "tables": tables}


def _step_view(number: str, name: str, step: dict | None) -> dict:
    known = step is not None
    step = _d(step)
    kind = str(step.get("kind") or "unknown")
    metrics = _d(step.get("metrics"))
    status = step.get("status") if known else "missing"
    view: dict[str, Any] = {
        "number": number, "name": name, "kind": kind,
        "title": str(step.get("title") or name),
        "description": step.get("description") or None,
        "status": _status(status), "reason": step.get("reason") or None,
        "duration": fmt_duration(step.get("duration_s")),
        "command": "" if kind in ("sweep", "ab") else _command(step.get("command")),  # runs have their own
        "dir": step.get("dir") or None,
        "train": None, "notes": [], "sweep": None, "ab": None, "pytest": None, "profile": None, "bench": None,
        "longrun": None, "snapshot": None, "failure": None,
        "skipped": status == "skipped", "missing": not known,
    }
    if kind in TRAIN_LIKE_KINDS:
        view["train"] = _train_row(name, step)
        view["notes"] = _train_notes(metrics)
    if kind == "sweep":
        view["sweep"] = _sweep_view(step)
    elif kind == "ab":
        view["ab"] = _ab_view(step)
    elif kind == "pytest":
        view["pytest"] = {k: fmt_num(metrics.get(k)) for k in ("passed", "failed", "skipped", "errors", "total")}
        view["pytest"]["duration"] = fmt_duration(metrics.get("duration_s"))
    elif kind == "profile":
        prof = _d(metrics.get("profile")) or metrics  # the runner nests it under "profile"
        ops = [_d(o) for o in _l(prof.get("top_ops"))]
        view["profile"] = {
            "trace": prof.get("trace") or None,
            "top_ops": [{"name": fmt_num(o.get("name")),
                         "time_ms": fmt_num(next((o[k] for k in ("self_time_ms", "total_ms", "time_ms") if k in o),
                                                 None)),
                         "calls": fmt_num(o.get("calls"))} for o in ops],
            "nvtx_ranges": [str(r) for r in _l(prof.get("nvtx_ranges"))],
        }
    elif kind == "bench":
        view["bench"] = _bench_view(metrics)
    elif kind == "longrun":
        stalls = metrics.get("stalls")
        dumps = sorted({str(p) for p in _l(metrics.get("stack_dumps")) + _l(step.get("stack_dumps"))})
        view["longrun"] = {
            "throughput_stable": fmt_num(metrics.get("throughput_stable")),
            "mem_plateau": fmt_num(metrics.get("mem_plateau")),
            "mem_peak": fmt_gb(metrics.get("mem_peak_gb")),
            "halted": fmt_num(metrics.get("halted")),
            "stalls": fmt_num(len(stalls) if isinstance(stalls, list) else stalls),
            "stack_dumps": dumps,
        }
    elif kind == "snapshot":
        files = [str(f) for f in _l(metrics.get("files"))] or [str(f) for f in _l(step.get("artifacts"))]
        if view["reason"] in _l(metrics.get("problems")) or view["reason"] == "; ".join(
                str(p) for p in _l(metrics.get("problems"))):
            view["reason"] = None  # shown as the problems below
        view["snapshot"] = {"git_sha": fmt_num(metrics.get("git_sha")),
                            "gpu_count": fmt_num(metrics.get("gpu_count")), "files": files,
                            "problems": [str(p) for p in _l(metrics.get("problems"))]}
    if status in FAILED_STATUSES or step.get("excerpt") or _l(step.get("stack_dumps")):
        excerpt = step.get("excerpt")
        excerpt = str(excerpt) if excerpt else None
        view["failure"] = {"failed": status in FAILED_STATUSES, "excerpt": excerpt, "fence": _fence(excerpt or ""),
                           "stack_dumps": [str(p) for p in _l(step.get("stack_dumps"))]}
    return view


def _phase_status(step_views: list[dict]) -> dict:
    statuses = [v["status"]["value"] for v in step_views]
    if any(s in FAILED_STATUSES for s in statuses):
        return {"icon": "❌", "css": "fail"}
    if any(s in ("pending", "interrupted", "missing", "unknown") or s not in STATUS_LABELS for s in statuses):
        return {"icon": "⚠️", "css": "warn"}
    if statuses and all(s == "skipped" for s in statuses):
        return {"icon": "⏭", "css": "skip"}
    return {"icon": "✅", "css": "pass"}


def _key_figures(results: dict, ordered: list[tuple[dict, list[str]]]) -> list[dict]:
    steps = _d(results.get("steps"))
    in_order = [steps[n] for _, names in ordered for n in names if isinstance(steps.get(n), dict)]
    figures = []
    train_steps = [s for s in in_order if s.get("kind") == "train"]
    baseline = next((s for s in train_steps if "baseline" in str(s.get("name", "")).lower()), None)
    baseline = baseline or next((s for s in train_steps if s.get("status") == "passed"), None)
    if baseline is not None:
        metrics = _d(baseline.get("metrics"))
        toks = _stat(metrics, "toks_per_s")
        per_gpu = _stat(metrics, "toks_per_s_per_gpu")
        value = (f"{_mean_pm(toks)} tokens/s" if _finite(toks.get("mean")) is not None
                 else f"{NA} (step {baseline.get('status') or 'has no result'})")
        window = _window(metrics.get("window"))
        note = f"step `{baseline.get('name')}`" + (f", {window}" if window != NA else "")
        if _finite(per_gpu.get("mean")) is not None:
            note += f", {fmt_rate(per_gpu.get('mean'))} tokens/s per GPU"
        figures.append({"label": "Baseline throughput", "value": value, "note": note})
    for step in in_order:
        winner = _d(step.get("winner"))
        if step.get("kind") != "sweep" or not winner:
            continue
        params = _d(winner.get("params"))
        if len(params) == 1:
            key = _param_name(str(next(iter(params))))
            value = fmt_num(next(iter(params.values())))
            is_bucket = "BUCKET" in key.upper()
            label = "Best bucket" if is_bucket else f"Best {key}"
            value = f"{value} MB ({key})" if is_bucket and key.upper().endswith("_MB") else (
                f"{value} ({key})" if is_bucket else value)
        else:
            label, value = "Sweep winner", _params_text(params) if params else fmt_num(winner.get("label"))
        run = next((_d(r) for r in _l(step.get("runs")) if _d(r).get("label") == winner.get("label")), {})
        mean = _stat(_d(run.get("metrics")), "toks_per_s").get("mean")
        note = f"step `{step.get('name')}`" + (f", {fmt_rate(mean)} tokens/s" if _finite(mean) is not None else "")
        figures.append({"label": label, "value": value, "note": note})
    scaling = None
    for step in in_order:
        v = _finite(_d(step.get("metrics")).get("scaling_efficiency"))
        if v is not None:
            scaling = {"value": v, "note": f"step `{step.get('name')}`"}
            break
    if scaling is None and baseline is not None:
        # per-GPU throughput of the multi-rank baseline over the throughput of a single-process train step
        base_metrics = _d(baseline.get("metrics"))
        world = _finite(base_metrics.get("world_size"))
        per_gpu = _finite(_stat(base_metrics, "toks_per_s_per_gpu").get("mean"))
        single = next((s for s in train_steps if s.get("status") == "passed"
                       and _finite(_d(s.get("metrics")).get("world_size")) == 1), None)
        single_mean = _finite(_stat(_d(_d(single).get("metrics")), "toks_per_s").get("mean"))
        if world is not None and world > 1 and per_gpu is not None and single_mean:
            scaling = {"value": per_gpu / single_mean,
                       "note": f"`{baseline.get('name')}` {fmt_rate(per_gpu)} tokens/s per GPU over "
                               f"`{single.get('name')}` {fmt_rate(single_mean)} tokens/s single-process"}
    if scaling is not None:
        v = scaling["value"]
        figures.append({"label": "Scaling efficiency", "value": f"{v:.2f} ({v * 100:.0f}% of linear)",
                        "note": scaling["note"]})
    return figures


def _environment_rows(results: dict) -> list[tuple[str, str]]:
    env = _d(results.get("environment"))
    runbook = _d(results.get("runbook"))
    gpus = [_d(g) for g in _l(env.get("gpus"))]
    if gpus:
        groups: Counter = Counter()
        for g in gpus:
            cap = g.get("capability")
            cap = ".".join(str(c) for c in cap) if isinstance(cap, (list, tuple)) else cap
            detail = ", ".join(x for x in (f"{fmt_num(g.get('memory_gb'))} GB" if g.get("memory_gb") is not None
                                           else "", f"sm {cap}" if cap else "") if x)
            groups[(str(g.get("name") or "GPU"), detail)] += 1
        gpu_text = "; ".join(f"{n}× {name}" + (f" ({detail})" if detail else "")
                             for (name, detail), n in sorted(groups.items()))
    elif env.get("gpu_count") in (0, None) and "gpus" in env:
        gpu_text = "none (CPU only)"
    else:
        gpu_text = fmt_num(env.get("gpu_count"))
    packages = _d(env.get("packages"))
    started, finished = results.get("started"), results.get("finished")
    date = fmt_num(started) + (f" → {finished}" if finished else " (not finished)")
    options = _d(results.get("options"))
    option_parts = []
    for key in ("only", "skip"):
        if _l(options.get(key)):
            option_parts.append(f"--{key} " + ",".join(str(x) for x in options[key]))
    overrides = options.get("set")
    if isinstance(overrides, dict):
        overrides = [f"{k}={overrides[k]}" for k in sorted(overrides, key=str)]
    option_parts += [f"--set {item}" for item in _l(overrides)]
    tool = _d(results.get("tool"))
    rows = [
        ("Host", fmt_num(env.get("host"))),
        ("Platform", fmt_num(env.get("platform"))),
        ("Git SHA", fmt_num(env.get("git_sha"))),
        ("PyTorch", fmt_num(env.get("torch"))),
        ("CUDA", fmt_num(env.get("cuda"))),
        ("NCCL", fmt_num(env.get("nccl"))),
        ("GPUs", gpu_text),
        ("CPUs", fmt_num(env.get("cpu_count"))),
        ("Python", fmt_num(env.get("python"))),
        ("Date", date),
        ("Duration", fmt_duration(results.get("duration_s"))),
        ("Runbook", fmt_num(runbook.get("path")) + (f" (sha256 {str(runbook['sha256'])[:12]})"
                                                    if runbook.get("sha256") else "")),
        ("Run directory", fmt_num(results.get("run_dir"))),
        ("Tool", f"{tool.get('name') or 'nsa-validate'} {tool.get('version') or ''}".strip()),
    ]
    if option_parts:
        rows.append(("Options", " ".join(option_parts)))
    if packages:
        rows.append(("Packages", ", ".join(f"{k} {packages[k]}" for k in sorted(packages, key=str))))
    nodes = _d(env.get("nodes"))
    if nodes:  # every node a training step ran on (the trainers' env.json)
        parts = []
        for name in sorted(nodes, key=str):
            node = _d(nodes[name])
            gpus = _l(node.get("gpus"))
            nccl = sorted(k for k in _d(node.get("env")) if str(k).startswith(("NCCL_", "UCX_", "IBV_", "MLX5_")))
            parts.append(f"{name} (host {fmt_num(node.get('host'))}"
                         + (f", {len(gpus)}x {gpus[0]}" if gpus else "")
                         + (f", {' '.join(nccl)}" if nccl else "") + ")")
        rows.append((f"Nodes ({len(nodes)})", "; ".join(parts)))
    return rows


def _acceptance_rows(results: dict) -> list[dict]:
    rows = []
    for crit in (_d(c) for c in _l(results.get("acceptance"))):
        rows.append({
            "name": fmt_num(crit.get("name")), "expr": crit.get("expr") or None,
            "target": fmt_num(crit.get("target")), "actual": fmt_num(crit.get("actual")),
            "status": _status(crit.get("status"), CRITERION_LABELS),
            "severity": fmt_num(crit.get("severity")), "detail": crit.get("detail") or "",
        })
    return rows


def _artifacts(results: dict, ordered: list[tuple[dict, list[str]]], run_dir: Path | None) -> list[dict]:
    steps = _d(results.get("steps"))

    def item(path: Any, what: str) -> dict:
        text = str(path)
        missing = run_dir is not None and not (Path(run_dir) / text).exists()
        return {"path": text, "what": what, "missing": missing}

    out = []
    for _, names in ordered:
        for name in names:
            step = steps.get(name)
            if not isinstance(step, dict):
                continue
            items, seen = [], set()

            def add(path: Any, what: str) -> None:
                if path and str(path) not in seen:
                    seen.add(str(path))
                    items.append(item(path, what))

            metrics = _d(step.get("metrics"))
            add(metrics.get("csv"), "training csv")
            for run in (_d(r) for r in _l(step.get("runs"))):
                add(_d(run.get("metrics")).get("csv"), f"training csv ({fmt_num(run.get('label'))})")
            add(metrics.get("trace"), "profiler trace")
            for path in _l(step.get("artifacts")):
                add(path, "artifact")
            for path in _l(step.get("stack_dumps")) + _l(metrics.get("stack_dumps")):
                add(path, "stack dump")
            if step.get("dir") or items:
                out.append({"step": name, "dir": step.get("dir") or None, "files": items})
    return out


def build_view(results: dict, *, run_dir: Path | None = None, plots: list[dict] | None = None) -> dict:
    """Everything the Markdown and HTML templates show, formatted (strings, lists, dicts)."""
    results = _d(results)
    runbook = _d(results.get("runbook"))
    steps = _d(results.get("steps"))
    ordered = _ordered_steps(results)
    phases = []
    for index, (phase, names) in enumerate(ordered, start=1):
        title = str(phase.get("title") or phase.get("name") or f"Phase {index}")
        numbered = re.match(r"^phase\b", title, re.I) is not None  # the runbook numbers its phases itself
        views = [_step_view("" if numbered else f"{index}.{i}", name,
                            steps.get(name) if isinstance(steps.get(name), dict) else None)
                 for i, name in enumerate(names, start=1)]
        phases.append({"number": index, "name": str(phase.get("name") or f"phase{index}"),
                       "title": title, "heading": title if numbered else f"Phase {index}: {title}",
                       "description": phase.get("description") or None,
                       "status": _phase_status(views), "steps": views})
    verdict = str(results.get("verdict") or "INCOMPLETE")
    icon, css = VERDICT_LABELS.get(verdict, ("⚠️", "incomplete"))
    step_counts = Counter(str(_d(s).get("status")) for s in steps.values())
    crit_counts = Counter(str(_d(c).get("status")) for c in _l(results.get("acceptance")))
    plot_list = [_d(p) for p in (plots if plots is not None else _l(results.get("plots")))]
    plot_list = [{"title": str(p.get("title") or p.get("path")), "path": str(p["path"])}
                 for p in plot_list if p.get("path")
                 and (run_dir is None or (Path(run_dir) / str(p["path"])).is_file())]
    recs = _d(results.get("recommendations"))
    rec_env = _d(recs.get("env"))
    tool = _d(results.get("tool"))
    return {
        "title": f"{runbook.get('name') or 'nsa-validate'} validation report",
        "runbook": {"name": fmt_num(runbook.get("name")), "description": runbook.get("description") or None,
                    "path": fmt_num(runbook.get("path"))},
        "verdict": {"value": verdict, "icon": icon, "css": css,
                    "reason": results.get("verdict_reason") or NA},
        "key_figures": _key_figures(results, ordered),
        "step_counts": ", ".join(f"{step_counts[k]} {k}" for k in sorted(step_counts)) or "none",
        "step_total": sum(step_counts.values()),
        "criteria_counts": ", ".join(f"{crit_counts[k]} {k}" for k in sorted(crit_counts)) or "none",
        "criteria_total": sum(crit_counts.values()),
        "environment": _environment_rows(results),
        "phases": phases,
        "acceptance": _acceptance_rows(results),
        "exports": [f"export {k}={shlex.quote(str(rec_env[k]))}" for k in sorted(rec_env, key=str)],
        "notes": [str(n) for n in _l(recs.get("notes"))],
        "plots": plot_list,
        "artifacts": _artifacts(results, ordered, run_dir),
        "tool": f"{tool.get('name') or 'nsa-validate'} {tool.get('version') or ''}".strip(),
        "schema_version": fmt_num(results.get("schema_version")),
    }


# --------------------------------------------------------------------------------------------------------------
# Renderers

def _md_cell(value: Any) -> str:
    """Text safe inside a Markdown table cell: no pipes, no line breaks."""
    text = NA if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", " ") or NA


def _md_code(value: Any) -> str:
    """Inline code span that survives backticks inside the value."""
    text = str(value)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _template(fmt: str):
    """The Jinja2 template of fmt ("md" or "html"); ReportError naming the folder when it is not there."""
    path = TEMPLATES_DIR / TEMPLATE_NAMES[fmt]
    if not path.is_file():
        what = "folder" if not TEMPLATES_DIR.is_dir() else f"template {TEMPLATE_NAMES[fmt]}"
        raise ReportError(
            f"report templates not found: no {what} at {path if what != 'folder' else TEMPLATES_DIR} "
            f"(reports/templates/ of the nsa-validate source tree holds report.md.j2 and report.html.j2; "
            f"install nsa-validate from a source checkout, e.g. `pip install -e .`)")
    return _jinja_env().get_template(TEMPLATE_NAMES[fmt])


def _tidy_markdown(text: str) -> str:
    """At most one blank line in a row and none at the end, except inside fenced code blocks."""
    out: list[str] = []
    fence = None
    for line in text.split("\n"):
        stripped = line.strip()
        if fence is None:
            match = re.match(r"^(`{3,})", stripped)
            if match:
                fence = match.group(1)
            elif not stripped and (not out or not out[-1].strip()):
                continue
        elif stripped == fence:
            fence = None
        out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


def _jinja_env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        autoescape=lambda name: bool(name) and name.endswith((".html.j2", ".html")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["cell"] = _md_cell
    env.filters["code"] = _md_code
    return env


_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(value: Any) -> str:
    return _XML_BAD.sub("\ufffd", "" if value is None else str(value))


def _junit_time(seconds: Any) -> str:
    v = _finite(seconds)
    return f"{max(v, 0.0):.3f}" if v is not None else "0.000"


def _suite(parent: ET.Element, name: str, cases: list[tuple[ET.Element, str]], **attrs: str) -> ET.Element:
    suite = ET.SubElement(parent, "testsuite", {"name": _xml_text(name), **attrs})
    counts = Counter(outcome for _, outcome in cases)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(counts["failure"]))
    suite.set("errors", str(counts["error"]))
    suite.set("skipped", str(counts["skipped"]))
    suite.set("time", f"{sum(float(c.get('time', '0')) for c, _ in cases):.3f}")
    for case, _ in cases:
        suite.append(case)
    return suite


def render_junit(results: dict) -> str:
    """JUnit XML: a testsuite per phase (a testcase per step) and an "acceptance" testsuite."""
    results = _d(results)
    runbook = str(_d(results.get("runbook")).get("name") or "nsa-validate")
    steps = _d(results.get("steps"))
    host = _xml_text(_d(results.get("environment")).get("host") or "")
    root = ET.Element("testsuites", {"name": _xml_text(runbook)})
    for phase, names in _ordered_steps(results):
        phase_name = str(phase.get("name") or "phase")
        cases = []
        for name in names:
            step = steps.get(name)
            known = isinstance(step, dict)
            step = _d(step)
            status = str(step.get("status")) if known else "missing"
            case = ET.Element("testcase", {"classname": _xml_text(f"{runbook}.{phase_name}"),
                                           "name": _xml_text(name), "time": _junit_time(step.get("duration_s"))})
            reason = step.get("reason")
            if status in FAILED_STATUSES:
                failure = ET.SubElement(case, "failure", {"message": _xml_text(reason or status), "type": status})
                body = [str(step["excerpt"])] if step.get("excerpt") else []
                body += [f"stack dump: {p}" for p in _l(step.get("stack_dumps"))]
                failure.text = _xml_text("\n".join(body) or reason or status)
                outcome = "failure"
            elif status == "passed":
                outcome = "passed"
            else:  # skipped, pending, interrupted, missing: not run to the end, not a failure of the node
                message = reason or {"pending": "not run yet", "interrupted": "run interrupted",
                                     "missing": "no result recorded"}.get(status, status)
                text = message if status == "skipped" else f"{status}: {message}"
                ET.SubElement(case, "skipped", {"message": _xml_text(text)})
                outcome = "skipped"
            if step.get("dir"):
                ET.SubElement(case, "system-out").text = _xml_text(f"step directory: {step['dir']}")
            cases.append((case, outcome))
        _suite(root, phase_name, cases, hostname=host)
    cases = []
    for crit in (_d(c) for c in _l(results.get("acceptance"))):
        status = str(crit.get("status"))
        name = str(crit.get("name") or "criterion")
        case = ET.Element("testcase", {"classname": _xml_text(f"{runbook}.acceptance"), "name": _xml_text(name),
                                       "time": "0.000"})
        summary = (f"target {fmt_num(crit.get('target'))}, actual {fmt_num(crit.get('actual'))}"
                   + (f": {crit['detail']}" if crit.get("detail") else ""))
        if status == "fail":
            ET.SubElement(case, "failure", {"message": _xml_text(summary), "type": str(crit.get("severity") or "fail")}
                          ).text = _xml_text(crit.get("expr") or summary)
            outcome = "failure"
        elif status == "error":
            ET.SubElement(case, "error", {"message": _xml_text(summary), "type": "error"}
                          ).text = _xml_text(crit.get("expr") or summary)
            outcome = "error"
        elif status == "skipped":
            ET.SubElement(case, "skipped", {"message": _xml_text(crit.get("detail") or summary)})
            outcome = "skipped"
        else:
            prefix = "WARN: " if status == "warn" else ""
            ET.SubElement(case, "system-out").text = _xml_text(prefix + summary)
            outcome = "passed"
        cases.append((case, outcome))
    suite = _suite(root, "acceptance", cases, hostname=host)
    props = ET.Element("properties")
    for key in ("verdict", "verdict_reason"):
        ET.SubElement(props, "property", {"name": key, "value": _xml_text(results.get(key) or "")})
    suite.insert(0, props)
    totals = Counter()
    for s in root.findall("testsuite"):
        for key in ("tests", "failures", "errors", "skipped"):
            totals[key] += int(s.get(key))
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals[key]))
    root.set("time", _junit_time(results.get("duration_s")))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render(results: dict, fmt: str = "md", *, run_dir: Path | None = None,
           plots: list[dict] | None = None) -> str:
    """results (the results.json dict) as a report in fmt (one of FORMATS); pure and deterministic.

    run_dir, when given, is the run directory the report will sit in: plots whose PNG is not there are left out
    and artifacts that are not there are marked missing. plots overrides results["plots"] ([{"title", "path"}]).
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt == "json":
        return json.dumps(results, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if fmt == "junit":
        return render_junit(results)
    text = _template(fmt).render(r=build_view(results, run_dir=run_dir, plots=plots))
    return _tidy_markdown(text) if fmt == "md" else text


# --------------------------------------------------------------------------------------------------------------
# Plots and files

def _atomic_write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _save_figure(fig, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    _atomic_write_bytes(path, buffer.getvalue())


def _read_toks(csv_path: Path):
    """(steps, toks_per_s) from a training.csv, or None when missing/unreadable/without those columns."""
    import pandas as pd

    try:
        frame = pd.read_csv(csv_path)
    except (OSError, ValueError, pd.errors.ParserError):
        return None
    if "toks_per_s" not in frame.columns or frame.empty:
        return None
    toks = pd.to_numeric(frame["toks_per_s"], errors="coerce")
    steps = pd.to_numeric(frame["step"], errors="coerce") if "step" in frame.columns else pd.Series(
        range(1, len(frame) + 1), dtype=float)
    keep = toks.notna() & steps.notna()
    if not keep.any():
        return None
    return steps[keep].to_list(), toks[keep].to_list()


def _bar_points(kind: str, runs: list[dict]) -> list[tuple[str, float, float, Any]]:
    """(tick label, mean, error bar, run label) per bar. Repeats of one label are pooled: the mean of their
    window means, with the stdev of those means as the error bar (a single run: its window stdev)."""
    grouped: dict[str, list[dict]] = {}
    for run in runs:
        toks = _stat(_d(run.get("metrics")), "toks_per_s")
        if _finite(toks.get("mean")) is not None:
            grouped.setdefault(str(run.get("label")), []).append({"run": run, "toks": toks})
    points = []
    for label, members in grouped.items():
        means = [float(m["toks"]["mean"]) for m in members]
        mean = sum(means) / len(means)
        if len(means) == 1:
            err = _finite(members[0]["toks"].get("stdev")) or 0.0
        else:
            err = math.sqrt(sum((x - mean) ** 2 for x in means) / len(means))
        tick = label
        params = _d(members[0]["run"].get("params"))
        if kind == "sweep" and len(params) == 1:
            tick = fmt_num(next(iter(params.values())))
        if len(means) > 1:
            tick += f" (x{len(means)})"
        points.append((tick, mean, err, members[0]["run"].get("label")))
    return points


def make_plots(results: dict, run_dir: Path) -> list[dict]:
    """Write RUN_DIR/plots/*.png and return [{"title", "path" (relative to run_dir)}] for those written.

    (1) tokens/s per step for every train-like step (and each sweep/ab run) whose training.csv is readable;
    (2) each sweep's means with stdev error bars, the winner highlighted; (3) each A/B's means with error bars.
    """
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    results = _d(results)
    run_dir = Path(run_dir)
    steps = _d(results.get("steps"))
    written: list[dict] = []

    def new_figure(title: str, xlabel: str):
        fig = Figure(figsize=(8, 4.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("tokens/s")
        ax.grid(True, alpha=0.3)
        ax.set_axisbelow(True)
        return fig, ax

    def save(fig, filename: str, title: str) -> None:
        fig.tight_layout()
        rel = f"{PLOTS_DIR}/{filename}"
        _save_figure(fig, run_dir / rel)
        written.append({"title": title, "path": rel})

    with matplotlib.style.context("default"):  # the user's matplotlibrc does not change the pictures
        for _, names in _ordered_steps(results):
            for name in names:
                step = _d(steps.get(name))
                kind = step.get("kind")
                series = []
                if kind in TRAIN_LIKE_KINDS:
                    metrics = _d(step.get("metrics"))
                    if metrics.get("csv"):
                        series.append((name, metrics["csv"], metrics.get("window")))
                for run in (_d(r) for r in _l(step.get("runs"))):
                    metrics = _d(run.get("metrics"))
                    if metrics.get("csv"):
                        series.append((str(run.get("label")), metrics["csv"], metrics.get("window")))
                lines = []
                for label, csv, window in series:
                    data = _read_toks(run_dir / str(csv))
                    if data is not None:
                        lines.append((label, data, _d(window)))
                if lines:
                    title = f"Tokens/s per step: {step.get('title') or name}"
                    fig, ax = new_figure(title, "step")
                    for label, (xs, ys), _ in lines:
                        ax.plot(xs, ys, label=label, linewidth=1.2)
                    window = lines[0][2]
                    first = _finite(next((window[k] for k in ("first_step", "start") if k in window), None))
                    last = _finite(next((window[k] for k in ("last_step", "end") if k in window), None))
                    if first is not None and last is not None and last >= first:
                        ax.axvspan(first, last, color="tab:green", alpha=0.08, label="statistics window")
                    ax.legend(loc="lower right", fontsize="small")
                    save(fig, f"toks_per_s_{_safe_name(name)}.png", title)

                if kind in ("sweep", "ab"):
                    runs = [_d(r) for r in _l(step.get("runs"))]
                    points = _bar_points(kind, runs)
                    if not points:
                        continue
                    if kind == "sweep":
                        winner = _d(step.get("winner")).get("label")
                        keys = sorted({str(k) for r in runs for k in _d(r.get("params"))})
                        xlabel = _param_name(keys[0]) if len(keys) == 1 else "run"
                        title = f"Sweep: {step.get('title') or name}"
                        colors = ["tab:green" if raw == winner and winner is not None else "tab:gray"
                                  for *_, raw in points]
                        filename = f"sweep_{_safe_name(name)}.png"
                    else:
                        xlabel, title = "variant", f"A/B: {step.get('title') or name}"
                        colors = ["tab:blue" if i == 0 else "tab:orange" for i in range(len(points))]
                        filename = f"ab_{_safe_name(name)}.png"
                    fig, ax = new_figure(title, xlabel)
                    xs = list(range(len(points)))
                    ax.bar(xs, [p[1] for p in points], yerr=[p[2] for p in points], capsize=6, color=colors,
                           edgecolor="black", linewidth=0.6)
                    ax.set_xticks(xs)
                    ax.set_xticklabels([p[0] for p in points])
                    if kind == "sweep" and winner is not None:
                        for x, point in zip(xs, points):
                            if point[3] == winner:
                                ax.annotate("best", (x, point[1] + point[2]), textcoords="offset points",
                                            xytext=(0, 4), ha="center", fontweight="bold")
                    save(fig, filename, title)
    return written


def write_reports(run_dir: Path, results: dict | None = None, formats: Iterable[str] = ("md", "html", "junit"),
                  plots: bool = True) -> list[Path]:
    """Write the reports of a run into run_dir and return the paths written (plots first).

    results defaults to RUN_DIR/results.json (validation.results.read_results); results.json itself is never
    written here. With plots=True, plots/*.png are made first and shown in the reports.
    """
    run_dir = Path(run_dir)
    formats = tuple(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ReportError(f"unknown report format {unknown[0]!r} (expected one of {', '.join(FORMATS)})")
    if results is None:
        results = read_results(run_dir)
    for fmt in formats:
        if fmt in TEMPLATE_NAMES:
            _template(fmt)  # a template is missing: fail before writing anything
    written: list[Path] = []
    plot_list = None
    if plots:
        plot_list = make_plots(results, run_dir)
        written += [run_dir / p["path"] for p in plot_list]
    for fmt in formats:
        text = render(results, fmt, run_dir=run_dir, plots=plot_list)
        written.append(_atomic_write_bytes(run_dir / REPORT_FILES[fmt], text.encode("utf-8")))
    return written
