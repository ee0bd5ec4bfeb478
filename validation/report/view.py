"""The report's view model: everything the Markdown and HTML templates show, already formatted, built from
results.json alone. Every step's section is the same frame (heading, status, command, failure evidence) around its
kind's own part (validation.kinds: StepKind.blocks, rendered to both formats); summary figures come from the kinds too.

Rendering is pure: the same results give the same view (dicts whose order the schema does not fix are iterated
sorted); missing or malformed values render as "n/a", never as an error.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from validation import kinds as step_kinds
from validation.report import findings
from validation.report.command import validated_command
from validation.report.performance import performance_view
from validation.report.problems import open_problems
from validation.results.store import resume_note, reused_notes
from validation.results.model import RunResults
from validation.formatting import (CRITERION_LABELS, FAILED_STATUSES, NA, STATUS_LABELS, VERDICT_LABELS, as_dict,
                                      as_list, command_text, fence, fmt_duration, fmt_num, ordered_steps, plural,
                                      status_view)




def _step_view(number: str, name: str, step: dict | None) -> dict:
    """The view of one step: what every step shows (heading, status, command, failure evidence), plus its kind's
    own part (StepKind.blocks) and its changes to the common fields (StepKind.view)."""
    known = step is not None
    step = as_dict(step)
    kind_name = str(step.get("kind") or "unknown")
    kind = step_kinds.find(kind_name)
    status = step.get("status") if known else "missing"
    view: dict[str, Any] = {
        "number": number, "name": name, "kind": kind_name,
        "title": str(step.get("title") or name),
        "description": step.get("description") or None,
        "status": status_view(status), "reason": step.get("reason") or None,
        "duration": fmt_duration(step.get("duration_s")),
        "command": command_text(step.get("command")),
        "dir": step.get("dir") or None, "failure": None,
        "skipped": status == "skipped", "missing": not known,
        "plots": [],  # build_view puts the step's plots here, beside its tables
        "blocks": kind.blocks({**step, "name": name}) if kind is not None else [],
    }
    if kind is not None:
        view.update(kind.view(step, view))
    if status in FAILED_STATUSES or step.get("excerpt") or as_list(step.get("stack_dumps")):
        excerpt = step.get("excerpt")
        excerpt = str(excerpt) if excerpt else None
        view["failure"] = {"failed": status in FAILED_STATUSES, "excerpt": excerpt, "fence": fence(excerpt or ""),
                           "stack_dumps": [str(p) for p in as_list(step.get("stack_dumps"))]}
    return view


def _phase_status(step_views: list[dict]) -> dict:
    """A phase's status in a word: FAILED (a step failed), INCOMPLETE (a step did not finish or has no result),
    SKIPPED (every step skipped), PASSED (otherwise: every step that ran passed)."""
    statuses = [v["status"]["value"] for v in step_views]
    if any(s in FAILED_STATUSES for s in statuses):
        return {"word": "FAILED", "css": "fail"}
    if any(s in ("pending", "interrupted", "missing", "unknown") or s not in STATUS_LABELS for s in statuses):
        return {"word": "INCOMPLETE", "css": "warn"}
    if statuses and all(s == "skipped" for s in statuses):
        return {"word": "SKIPPED", "css": "skip"}
    return {"word": "PASSED", "css": "pass"}




def _key_figures(results: dict, ordered: list[tuple[dict, list[str]]]) -> list[dict]:
    """The executive summary's figures: every kind's key_figures over the steps in run order, sorted by order."""
    steps = as_dict(results.get("steps"))
    in_order = [steps[n] for _, names in ordered for n in names if isinstance(steps.get(n), dict)]
    figures = sorted((fig for kind in step_kinds.kinds() for fig in kind.key_figures(in_order)),
                     key=lambda fig: fig.order)
    caveat = _cpu_scaling_caveat(results, in_order)
    return [{"id": fig.id, "label": fig.label, "value": fig.value,
             "note": f"{fig.note}; {caveat}" if caveat and fig.shared_cores else fig.note} for fig in figures]


def _criteria_counts(results: dict, counts: Counter) -> str:
    """"9 required, 3 warnings only; 12 pass": the criteria counted once, by severity, then by outcome."""
    crits = [as_dict(c) for c in as_list(results.get("acceptance"))]
    if not crits:
        return "none"
    required = sum(c.get("severity") == "fail" for c in crits)
    split = f"{required} required, {len(crits) - required} warning{'s' if len(crits) - required != 1 else ''} only"
    return f"{split}; " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))


def _cpu_scaling_caveat(results: dict, in_order: list[dict]) -> str | None:
    """On a CPU-only machine, the cores each rank had: N ranks share the machine's cores, while the single process
    had all of them, so a figure that divides the two (KeyFigure.shared_cores) measures core sharing there, not the
    interconnect."""
    env = as_dict(results.get("environment"))
    cpus = env.get("cpu_count")
    if env.get("gpu_count") not in (0, None) or not isinstance(cpus, int) or cpus < 1:
        return None
    worlds = [as_dict(s.get("metrics")).get("world_size") for s in in_order if s.get("status") == "passed"]
    world = max((w for w in worlds if isinstance(w, int) and not isinstance(w, bool)), default=None)
    if not world or world < 2:
        return None
    per_rank = cpus / world
    return (f"CPU: {plural(cpus, 'core')} for {world} ranks, {per_rank:g} core{'s' if per_rank != 1 else ''} per "
            f"rank against {cpus} for the single process, so this measures sharing the cores, not scaling")


def key_figure_lines(results: dict) -> list[str]:
    """The executive summary's figures as plain lines for the console ("Baseline throughput: ... — step baseline,
    ...; at seq_len 256, ..."), inline Markdown removed."""
    figures = _key_figures(as_dict(results), ordered_steps(as_dict(results)))
    lines = [f"{f['label']}: {f['value']} — {f['note']}" for f in figures]
    finding = findings.key_finding(findings.comparisons(as_dict(results)))
    if finding:  # the same sentence as the report's executive summary
        lines.append(f"Key finding: {finding['text']}")
    return [re.sub(r"`+([^`]*)`+", r"\1", line).replace("**", "") for line in lines]


def _environment_rows(results: dict) -> list[tuple[str, str]]:
    env = as_dict(results.get("environment"))
    runbook = as_dict(results.get("runbook"))
    gpus = [as_dict(g) for g in as_list(env.get("gpus"))]
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
    packages = as_dict(env.get("packages"))
    started, finished = results.get("started"), results.get("finished")
    date = fmt_num(started) + (f" → {finished}" if finished else " (not finished)")
    options = as_dict(results.get("options"))
    option_parts = []
    for key in ("only", "skip"):
        if as_list(options.get(key)):
            option_parts.append(f"--{key} " + ",".join(str(x) for x in options[key]))
    overrides = options.get("set")
    if isinstance(overrides, dict):
        overrides = [f"{k}={overrides[k]}" for k in sorted(overrides, key=str)]
    option_parts += [f"--set {item}" for item in as_list(overrides)]
    tool = as_dict(results.get("tool"))
    rows = [
        ("Host", fmt_num(env.get("host"))),
        ("Platform", fmt_num(env.get("platform"))),
        ("Git SHA", fmt_num(env.get("git_sha"))),
        ("Git branch", fmt_num(env.get("git_branch"))),
        ("Working tree", NA if env.get("git_dirty") is None else
         (f"dirty: {plural(env.get('git_changes'), 'tracked file')} changed since the commit"
          if env.get("git_dirty") else "clean (no tracked file changed since the commit)")),
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
    nodes = as_dict(env.get("nodes"))
    if nodes:  # every node a training step ran on (the trainers' env.json)
        parts = []
        for name in sorted(nodes, key=str):
            node = as_dict(nodes[name])
            gpus = as_list(node.get("gpus"))
            nccl = sorted(k for k in as_dict(node.get("env")) if str(k).startswith(("NCCL_", "UCX_", "IBV_", "MLX5_")))
            parts.append(f"{name} (host {fmt_num(node.get('host'))}"
                         + (f", {len(gpus)}x {gpus[0]}" if gpus else "")
                         + (f", {' '.join(nccl)}" if nccl else "") + ")")
        rows.append((f"Nodes ({len(nodes)})", "; ".join(parts)))
    return rows


# what a criterion's failure does (its `severity`), in the words of the verdict: a column of "fail" beside PASS rows
# read as a contradiction
_ON_FAILURE = {"fail": "NO-GO", "warn": "warning"}


def _acceptance_rows(results: dict) -> list[dict]:
    rows = []
    for crit in (as_dict(c) for c in as_list(results.get("acceptance"))):
        rows.append({
            "name": fmt_num(crit.get("name")), "expr": crit.get("expr") or None,
            "target": fmt_num(crit.get("target")), "actual": fmt_num(crit.get("actual")),
            "status": status_view(crit.get("status"), CRITERION_LABELS),
            "severity": _ON_FAILURE.get(crit.get("severity"), fmt_num(crit.get("severity"))),
            "detail": crit.get("detail") or "",
        })
    return rows


def _artifacts(results: dict, ordered: list[tuple[dict, list[str]]], run_dir: Path | None) -> list[dict]:
    steps = as_dict(results.get("steps"))

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

            metrics = as_dict(step.get("metrics"))
            add(metrics.get("csv"), "training csv")
            for run in (as_dict(r) for r in as_list(step.get("runs"))):
                add(as_dict(run.get("metrics")).get("csv"), f"training csv ({fmt_num(run.get('label'))})")
            add(metrics.get("trace"), "profiler trace")
            for path in as_list(step.get("artifacts")):
                add(path, "artifact")
            for path in as_list(step.get("stack_dumps")) + as_list(metrics.get("stack_dumps")):
                add(path, "stack dump")
            if step.get("dir") or items:
                out.append({"step": name, "dir": step.get("dir") or None, "files": items})
    return out


def _plot_list(results: dict, run_dir: Path | None, plots: list[dict] | None, inline: bool) -> list[dict]:
    """[{"title", "path", "src"}] of the plots whose PNG is there (all of them without run_dir, unless inline):
    src is the path (Markdown links it) or, with inline, a data: URI of the PNG (the HTML page carries it)."""
    out = []
    for p in (as_dict(p) for p in (plots if plots is not None else as_list(results.get("plots")))):
        if not p.get("path"):
            continue
        path = str(p["path"])
        file = Path(run_dir) / path if run_dir is not None else None
        if file is not None and not file.is_file():
            continue
        src = path
        if inline:
            if file is None:
                continue
            try:
                src = "data:image/png;base64," + base64.b64encode(file.read_bytes()).decode("ascii")
            except OSError:
                continue
        title = str(p.get("title") or path)
        out.append({"title": title, "path": path, "src": src, "step": p.get("step") or None,
                    "caption": str(p.get("caption") or title),
                    "marked": p.get("marked"), "mark": p.get("mark")})
    return out


def build_view(results: RunResults, *, run_dir: Path | None = None, plots: list[dict] | None = None,
               inline_plots: bool = False) -> dict:
    """Everything the Markdown and HTML templates show, formatted (strings, lists, dicts), from a run's results
    (validation.results.store.read_results checks a results.json; values are still read defensively, so a record built
    in memory renders too). inline_plots: each plot's "src" is a data: URI of its PNG (read from run_dir; a plot
    that cannot be read is left out)."""

    results = as_dict(results)
    runbook = as_dict(results.get("runbook"))
    steps = as_dict(results.get("steps"))
    ordered = ordered_steps(results)
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
    plots = _plot_list(results, run_dir, plots, inline_plots)
    shown_by_step = {v["name"] for phase in phases for v in phase["steps"]}
    for phase in phases:  # each plot beside its step's table; plots of no step at the end
        for v in phase["steps"]:
            v["plots"] = [p for p in plots if p["step"] == v["name"]]
    verdict = str(results.get("verdict") or "INCOMPLETE")
    css = VERDICT_LABELS.get(verdict, "incomplete")
    step_counts = Counter(str(as_dict(s).get("status")) for s in steps.values())
    crit_counts = Counter(str(as_dict(c).get("status")) for c in as_list(results.get("acceptance")))
    performance = performance_view(results)
    comps = findings.comparisons(results)
    finding = findings.key_finding(comps)
    problems = open_problems(results)
    rec_rows = findings.recommendation_rows(results, comps)
    recs = as_dict(results.get("recommendations"))
    rec_env = as_dict(recs.get("env"))
    tool = as_dict(results.get("tool"))
    return {
        "title": f"{runbook.get('name') or 'nsa-validate'} validation report",
        "runbook": {"name": fmt_num(runbook.get("name")), "description": runbook.get("description") or None,
                    "path": fmt_num(runbook.get("path"))},
        "verdict": {"value": verdict, "css": css, "reason": results.get("verdict_reason") or NA},
        "resumed": resume_note(results),  # how the run was interrupted and continued, or None
        "reused": reused_notes(results),  # the phases taken from an earlier run of the same source
        "key_figures": _key_figures(results, ordered),
        "key_finding": finding["text"] if finding else None,
        "key_finding_against": performance["key_finding"] if performance else None,
        "performance": performance,
        "comparisons": findings.comparison_rows(comps),
        "conclusion": findings.conclusion(results, problems, finding),
        "problems": problems,
        # the thresholds behind every DISTURBED or inconclusive row, once (results.json "evidence")
        "interference_rules": (str(as_dict(results.get("evidence")).get("rules") or "")
                               if as_list(as_dict(results.get("evidence")).get("disturbed")) else None),
        "recommended": rec_rows,
        "run_command": validated_command(results),
        "step_counts": ", ".join(f"{step_counts[k]} {k}" for k in sorted(step_counts)) or "none",
        "step_total": sum(step_counts.values()),
        "criteria_counts": _criteria_counts(results, crit_counts),
        "criteria_total": sum(crit_counts.values()),
        "environment": _environment_rows(results),
        "phases": phases,
        "acceptance": _acceptance_rows(results),
        "exports": [f"export {k}={shlex.quote(str(rec_env[k]))}" for k in sorted(rec_env, key=str)],
        "notes": [str(n) for n in as_list(recs.get("notes"))],
        "plots": [p for p in plots if p["step"] not in shown_by_step],
        "artifacts": _artifacts(results, ordered, run_dir),
        "tool": f"{tool.get('name') or 'nsa-validate'} {tool.get('version') or ''}".strip(),
        "schema_version": fmt_num(results.get("schema_version")),
    }


