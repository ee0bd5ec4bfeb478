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
from validation.analysis.interference import launch_records
from validation.analysis.plausibility import implausible
from validation.report import findings
from validation.report.command import validated_command
from validation.report.performance import performance_view
from validation.report.problems import last_recorded, open_problems, removed_steps
from validation.results.codec import decode
from validation.results.run import Implausible, Plot, Run, Step, read_run
from validation.results.store import RunDirError, inside_run_dir, resume_note, reused_notes
from validation.results.model import FINAL_STEP_STATUSES, RunResults
from validation.results.trainer_launch import LaunchMetrics
from validation.formatting import (CRITERION_LABELS, FAILED_STATUSES, NA, STATUS_LABELS, VERDICT_LABELS, as_dict,
                                      as_list, command_text, fence, fmt_duration, fmt_num, plural, printable,
                                      status_view)




REMOVED = {"value": "removed", "word": "REMOVED", "label": "REMOVED", "css": "skip"}  # a step's status view when
# the runbook no longer has it


def _step_view(number: str, name: str, record: Step | None, raw: Any, removed: bool = False) -> dict:
    """The view of one step: what every step shows (heading, status, command, failure evidence), plus its kind's
    own part (StepKind.blocks) and its changes to the common fields (StepKind.view); `raw` is the step's record as
    results.json holds it, which its kind reads. `removed`: the runbook no longer has the step (kept from an
    earlier attempt of a resumed run): its status is REMOVED and "removed" says what it last recorded (its kind's
    part only when it ran to an end: a step that never did measured nothing)."""
    known = record is not None
    step = record or Step()
    raw = as_dict(raw)
    kind_name = str(step.kind or "unknown")
    kind = step_kinds.find(kind_name)
    status = step.status if known else "missing"
    ended = known and str(status) in FINAL_STEP_STATUSES and status != "skipped"
    view: dict[str, Any] = {
        "number": number, "name": name, "kind": kind_name,
        "title": str(step.title or name),
        "description": step.description or None,
        "status": status_view(status), "reason": step.reason or None,
        "duration": fmt_duration(step.duration_s),
        "command": command_text(step.command),
        "dir": step.dir or None, "failure": None,
        "skipped": status == "skipped", "missing": not known,
        "removed": None,
        "plots": [],  # build_view puts the step's plots here, beside its tables
        "blocks": kind.blocks(kind.read({**raw, "name": name})) if kind is not None and (ended or not removed)
        else [],
    }
    if kind is not None:
        view.update(kind.view(kind.read({**raw, "name": name}), view))
    if removed:  # after the kind's part: whatever the kind says of its status, the runbook has it no more
        view.update(status=dict(REMOVED), skipped=False, missing=False,
                    removed=f"not part of this runbook any more (removed since an earlier attempt recorded it); "
                            f"{last_recorded(record)}")
    if status in FAILED_STATUSES or step.excerpt or step.stack_dumps:
        excerpt = step.excerpt or None
        # the fence is longer than any backtick run of the text as shown (printable: a terminal's colour codes
        # removed, which can join two runs into one)
        view["failure"] = {"failed": status in FAILED_STATUSES, "excerpt": excerpt,
                           "fence": fence(printable(excerpt)),
                           "stack_dumps": [str(p) for p in step.stack_dumps]}
    return view


def _phase_status(step_views: list[dict], removed: dict[int, str] | None = None) -> dict:
    """A phase's status in a word: FAILED (a step failed), INCOMPLETE (a step did not finish or has no result),
    SKIPPED (every step skipped), REMOVED (every step one the runbook no longer has, whatever it recorded), PASSED
    (otherwise: every step that ran passed). `removed`: {index in step_views: the status it last recorded} of the
    steps the runbook no longer has."""
    removed = removed or {}
    # a step the runbook no longer has counts for nothing, whatever it last recorded: the verdict neither waits for
    # it nor stands on it (validation.execution.acceptance.verdict)
    statuses = [v["status"]["value"] for i, v in enumerate(step_views) if i not in removed]
    if step_views and not statuses:
        return {"word": "REMOVED", "css": "skip"}
    if any(s in FAILED_STATUSES for s in statuses):
        return {"word": "FAILED", "css": "fail"}
    if any(s in ("pending", "interrupted", "missing", "unknown") or s not in STATUS_LABELS for s in statuses):
        return {"word": "INCOMPLETE", "css": "warn"}
    if statuses and all(s == "skipped" for s in statuses):
        return {"word": "SKIPPED", "css": "skip"}
    return {"word": "PASSED", "css": "pass"}




def _key_figures(run: Run, raw_steps: dict) -> list[dict]:
    """The executive summary's figures: every kind's key_figures over the steps in run order (their records as
    results.json holds them, `raw_steps`), sorted by order."""
    names = [n for n, step in run.steps_in_order() if step is not None]
    read = step_kinds.read_steps([raw_steps[n] for n in names])  # each step read once, not once per kind
    figures = sorted((fig for kind in step_kinds.kinds() for fig in kind.key_figures(list(read))),
                     key=lambda fig: fig.order)
    caveat = _cpu_scaling_caveat(run, [run.steps[n] for n in names])
    out = []
    for fig in figures:
        value, note = fig.value, f"{fig.note}; {caveat}" if caveat and fig.shared_cores else fig.note
        bad = [] if fig.problem else [text for n in fig.steps for text in _implausible(raw_steps.get(n))]
        if bad:  # a figure of a step whose measurement is outside its physical range is not a result either
            value += ": NOT A RESULT, outside its physical range"
            note += "; " + "; ".join(bad)
        out.append({"id": fig.id, "label": fig.label, "value": value, "note": note})
    return out


def _implausible(raw_step: Any) -> list[str]:
    """"metric = value outside [range]: reason" of every figure of a step (its own launch or its runs') outside its
    physical range (validation.analysis.plausibility: what the run's evidence records), from its record alone."""
    out = []
    for label, _, metrics in launch_records(as_dict(raw_step)):
        for bad in (decode(Implausible, item, lenient=True) for item in implausible(metrics)):
            out.append((f"run {label}: " if label else "") + f"{fmt_num(bad.metric)} = {fmt_num(bad.value)} outside "
                       f"{fmt_num(bad.range)}: {fmt_num(bad.reason)}")
    return out


def _criteria_counts(run: Run, counts: Counter) -> str:
    """"9 required, 3 warnings only; 12 pass": the criteria counted once, by severity, then by outcome."""
    crits = run.acceptance
    if not crits:
        return "none"
    required = sum(c.severity == "fail" for c in crits)
    split = f"{required} required, {len(crits) - required} warning{'s' if len(crits) - required != 1 else ''} only"
    return f"{split}; " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))


def _cpu_scaling_caveat(run: Run, in_order: list[Step]) -> str | None:
    """On a CPU-only machine, the cores each rank had: N ranks share the machine's cores, while the single process
    had all of them, so a figure that divides the two (KeyFigure.shared_cores) measures core sharing there, not the
    interconnect."""
    env = run.environment
    cpus = env.cpu_count
    if env.gpu_count not in (0, None) or cpus is None or cpus < 1:
        return None
    worlds = [_launch(s.metrics).world_size for s in in_order if s.status == "passed"]
    world = max((w for w in worlds if w is not None), default=None)
    if not world or world < 2:
        return None
    per_rank = cpus / world
    return (f"CPU: {plural(cpus, 'core')} for {world} ranks, {per_rank:g} core{'s' if per_rank != 1 else ''} per "
            f"rank against {cpus} for the single process, so this measures sharing the cores, not scaling")


def _launch(metrics: dict) -> LaunchMetrics:
    """A step's metrics as a trainer launch's (a step of another kind: the keys it shares with one)."""
    return decode(LaunchMetrics, metrics, lenient=True)


def _raw_steps(results: Any) -> dict:
    """The step records as results.json holds them: what the kinds read."""
    return as_dict(as_dict(results).get("steps"))


def key_figure_lines(results: dict) -> list[str]:
    """The executive summary's figures as plain lines for the console ("Baseline throughput: ... — step baseline,
    ...; at seq_len 256, ..."), inline Markdown removed."""
    figures = _key_figures(read_run(results), _raw_steps(results))
    lines = [f"{f['label']}: {f['value']} — {f['note']}" for f in figures]
    finding = findings.key_finding(findings.comparisons(as_dict(results)))
    if finding:  # the same sentence as the report's executive summary
        lines.append(f"Key finding: {finding['text']}")
    return [re.sub(r"`+([^`]*)`+", r"\1", line).replace("**", "") for line in lines]


CONSOLE_ACCEPTANCE_COLUMNS = ("criterion", "target", "actual", "status")


def console_summary(results: dict, run_dir: Path, paths: list[Path]) -> tuple[list[tuple], list[tuple]]:
    """What `nsa-validate run` prints at its end: (the acceptance table's rows under CONSOLE_ACCEPTANCE_COLUMNS,
    then (text, style) lines: the key figures, the verdict, the recommended settings, where the files are)."""
    run = read_run(results)
    rows = [(c.name, c.target, c.actual or "", status_view(c.status, CRITERION_LABELS)["word"])
            for c in run.acceptance]
    lines: list[tuple] = [(line, None) for line in key_figure_lines(results)]
    colour = {"GO": "green", "NO-GO": "red"}.get(run.verdict, "yellow")
    lines.append((f"{run.verdict}: {run.verdict_reason}", f"bold {colour}"))
    if run.recommendations.env:
        lines.append(("recommended: " + " ".join(f"{k}={v}" for k, v in run.recommendations.env.items()), None))
    lines.append((f"results: {run_dir / 'results.json'}", None))
    return rows, lines + [(f"report:  {p}", None) for p in paths]


def _environment_rows(run: Run) -> list[tuple[str, str]]:
    env = run.environment
    runbook = run.runbook
    if env.gpus:
        groups: Counter = Counter()
        for g in env.gpus:
            cap = g.capability
            cap = ".".join(str(c) for c in cap) if isinstance(cap, (list, tuple)) else cap
            detail = ", ".join(x for x in (f"{fmt_num(g.memory_gb)} GB" if g.memory_gb is not None
                                           else "", f"sm {cap}" if cap else "") if x)
            groups[(str(g.name or "GPU"), detail)] += 1
        gpu_text = "; ".join(f"{n}× {name}" + (f" ({detail})" if detail else "")
                             for (name, detail), n in sorted(groups.items()))
    elif env.gpu_count in (0, None) and env.gpus is not None:
        gpu_text = "none (CPU only)"
    else:
        gpu_text = fmt_num(env.gpu_count)
    started, finished = run.started, run.finished
    date = fmt_num(started) + (f" → {finished}" if finished else " (not finished)")
    option_parts = []
    for flag, values in (("only", run.options.only), ("skip", run.options.skip)):
        if values:
            option_parts.append(f"--{flag} " + ",".join(str(x) for x in values))
    overrides = run.options.set
    if isinstance(overrides, dict):
        overrides = [f"{k}={overrides[k]}" for k in sorted(overrides, key=str)]
    option_parts += [f"--set {item}" for item in overrides]
    tool = run.tool
    rows = [
        ("Host", fmt_num(env.host)),
        ("Platform", fmt_num(env.platform)),
        ("Git SHA", fmt_num(env.git_sha)),
        ("Git branch", fmt_num(env.git_branch)),
        ("Working tree", NA if env.git_dirty is None else
         (f"dirty: {plural(env.git_changes, 'tracked file')} changed since the commit"
          if env.git_dirty else "clean (no tracked file changed since the commit)")),
        ("PyTorch", fmt_num(env.torch)),
        ("CUDA", fmt_num(env.cuda)),
        ("NCCL", fmt_num(env.nccl)),
        ("GPUs", gpu_text),
        ("CPUs", fmt_num(env.cpu_count)),
        ("Python", fmt_num(env.python)),
        ("Date", date),
        ("Duration", fmt_duration(run.duration_s)),
        ("Runbook", fmt_num(runbook.path) + (f" (sha256 {str(runbook.sha256)[:12]})" if runbook.sha256 else "")),
        ("Run directory", fmt_num(run.run_dir)),
        ("Tool", f"{tool.name or 'nsa-validate'} {tool.version or ''}".strip()),
    ]
    if option_parts:
        rows.append(("Options", " ".join(option_parts)))
    if env.packages:
        rows.append(("Packages", ", ".join(f"{k} {env.packages[k]}" for k in sorted(env.packages, key=str))))
    if env.nodes:  # every node a training step ran on (the trainers' env.json)
        parts = []
        for name in sorted(env.nodes, key=str):
            node = env.nodes[name]
            nccl = sorted(k for k in node.env if str(k).startswith(("NCCL_", "UCX_", "IBV_", "MLX5_")))
            parts.append(f"{name} (host {fmt_num(node.host)}"
                         + (f", {len(node.gpus)}x {node.gpus[0]}" if node.gpus else "")
                         + (f", {' '.join(nccl)}" if nccl else "") + ")")
        rows.append((f"Nodes ({len(env.nodes)})", "; ".join(parts)))
    return rows


# what a criterion's failure does (its `severity`), in the words of the verdict: a column of "fail" beside PASS rows
# read as a contradiction
_ON_FAILURE = {"fail": "NO-GO", "warn": "warning"}


def _acceptance_rows(run: Run) -> list[dict]:
    rows = []
    for crit in run.acceptance:
        rows.append({
            "name": fmt_num(crit.name), "expr": crit.expr or None,
            "target": fmt_num(crit.target), "actual": fmt_num(crit.actual),
            "status": status_view(crit.status, CRITERION_LABELS),
            "severity": _ON_FAILURE.get(crit.severity, fmt_num(crit.severity)),
            "detail": crit.detail or "",
        })
    return rows


def _artifacts(run: Run, run_dir: Path | None) -> list[dict]:
    def item(path: Any, what: str) -> dict:
        text = str(path)
        try:
            missing = run_dir is not None and not (Path(run_dir) / text).exists()
        except OSError:  # a name past the file system's length, a directory it may not search: not there to read
            missing = True
        return {"path": text, "what": what, "missing": missing}

    out = []
    for name, step in run.steps_in_order():
        if step is None:
            continue
        items, seen = [], set()

        def add(path: Any, what: str) -> None:
            if path and str(path) not in seen:
                seen.add(str(path))
                items.append(item(path, what))

        metrics = step.metrics
        add(_launch(metrics).csv, "training csv")
        for launch in step.runs:
            add(launch.metrics.csv, f"training csv ({fmt_num(launch.label)})")
        add(metrics.get("trace"), "profiler trace")  # the profile kind's
        for path in step.artifacts:
            add(path, "artifact")
        for path in step.stack_dumps + as_list(metrics.get("stack_dumps")):  # the longrun kind's
            add(path, "stack dump")
        if step.dir or items:
            out.append({"step": name, "dir": step.dir or None, "files": items})
    return out


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # the first bytes of every PNG file


def _plot_list(run: Run, run_dir: Path | None, plots: list[dict] | None, inline: bool) -> tuple[list[dict], list[dict]]:
    """([{"title", "path", "src", ...}] of the plots shown, [{"path", "why"}] of those recorded but not shown for a
    reason the reader should know: outside the run directory, unreadable, or damaged (not a PNG)).

    A plot is shown when its path stays inside the run directory (relative, no `..`, no symlink out of it: a
    results.json never makes the page carry another file) and, with run_dir, its file is there and is a PNG (one
    whose file is not there is left out); without run_dir, every plot inside is shown unless inline. src is the path (Markdown links it) or, with
    inline, a data: URI of the PNG (the HTML page carries it). Markdown and HTML show the same plots."""
    out, not_shown = [], []
    records = run.plots if plots is None else [decode(Plot, p, "plots", lenient=True) for p in plots]
    for p in records:
        if not p.path:
            continue
        path = str(p.path)
        rel = Path(path)
        if rel.is_absolute() or ".." in rel.parts:
            not_shown.append({"path": path, "why": "outside the run directory"})
            continue
        data = None
        if run_dir is not None:
            try:
                file = inside_run_dir(run_dir, path)
            except RunDirError:
                not_shown.append({"path": path, "why": "outside the run directory"})
                continue
            try:
                with open(file, "rb") as fh:
                    data = fh.read() if inline else fh.read(len(PNG_SIGNATURE))
            except FileNotFoundError:  # not drawn, or not copied with the run: left out, as `report --write` does
                continue
            except OSError as exc:
                not_shown.append({"path": path, "why": f"unreadable ({exc.strerror or type(exc).__name__})"})
                continue
            except ValueError:  # a NUL character, which no file name holds
                not_shown.append({"path": path, "why": "unreadable (a NUL character in its path)"})
                continue
            if not data.startswith(PNG_SIGNATURE):
                not_shown.append({"path": path, "why": "damaged: not a PNG image"})
                continue
        elif inline:
            continue
        src = "data:image/png;base64," + base64.b64encode(data).decode("ascii") if inline and data else path
        title = str(p.title or path)
        out.append({"title": title, "path": path, "src": src, "step": p.step or None,
                    "caption": str(p.caption or title), "marked": p.marked, "mark": p.mark})
    return out, not_shown


def _status_key(status) -> str:
    """A status as the summary counts it: its value, "unknown" for none (status_view's value)."""
    return "unknown" if status is None else str(status)


def build_view(results: RunResults, *, run_dir: Path | None = None, plots: list[dict] | None = None,
               inline_plots: bool = False) -> dict:
    """Everything the Markdown and HTML templates show, formatted (strings, lists, dicts), from a run's results
    (validation.results.store.read_results checks a results.json; values are still read defensively, so a record built
    in memory renders too). inline_plots: each plot's "src" is a data: URI of its PNG (read from run_dir; a plot
    that cannot be read is left out)."""

    results = as_dict(results)
    run = read_run(results)
    raw_steps = _raw_steps(results)
    runbook = run.runbook
    removed = removed_steps(run)
    phases = []
    for index, (phase, names) in enumerate(run.phases_in_order(), start=1):
        title = str(phase.title or phase.name or f"Phase {index}")
        if names and all(n in removed for n in names):  # the "other steps" of a resumed run whose runbook lost them
            title = "Other steps: no longer in the runbook"
        numbered = re.match(r"^phase\b", title, re.I) is not None  # the runbook numbers its phases itself
        views = [_step_view("" if numbered else f"{index}.{i}", name, run.steps.get(name), raw_steps.get(name),
                            removed=name in removed)
                 for i, name in enumerate(names, start=1)]
        phases.append({"number": index, "name": str(phase.name or f"phase{index}"),
                       "title": title, "heading": title if numbered else f"Phase {index}: {title}",
                       "description": phase.description or None,
                       "status": _phase_status(views, {i: _status_key(run.steps[n].status) if run.steps.get(n)
                                                       else "missing" for i, n in enumerate(names) if n in removed}),
                       "steps": views})
    plots, plots_not_shown = _plot_list(run, run_dir, plots, inline_plots)
    shown_by_step = {v["name"] for phase in phases for v in phase["steps"]}
    for phase in phases:  # each plot beside its step's table; plots of no step at the end
        for v in phase["steps"]:
            v["plots"] = [p for p in plots if p["step"] == v["name"]]
    verdict = str(run.verdict or "INCOMPLETE")
    css = VERDICT_LABELS.get(verdict, "incomplete")
    # every step of the runbook once, as its section shows it: one with no record "missing", one of no status
    # "unknown" (status_view); a step it no longer has is not one of them (not pending, not waited for): listed
    # apart with what it last recorded
    step_counts = Counter("missing" if s is None else _status_key(s.status)
                          for n, s in dict(run.steps_in_order()).items() if n not in removed)
    steps_removed = [f"{n} ({last_recorded(run.steps.get(n))})" for n in removed]
    crit_counts = Counter(_status_key(c.status) for c in run.acceptance)
    performance = performance_view(run)
    comps = findings.comparisons(results, run)
    finding = findings.key_finding(comps)
    problems = open_problems(run)
    rec_rows = findings.recommendation_rows(run, comps)
    rec_env = run.recommendations.env
    exports = [f"export {k}={shlex.quote(str(rec_env[k]))}" for k in sorted(rec_env, key=str)]
    run_command = validated_command(run)
    return {
        "title": f"{runbook.name or 'nsa-validate'} validation report",
        "runbook": {"name": fmt_num(runbook.name), "description": runbook.description or None,
                    "path": fmt_num(runbook.path)},
        "verdict": {"value": verdict, "css": css, "reason": run.verdict_reason or NA},
        "resumed": resume_note(run),  # how the run was interrupted and continued, or None
        "reused": reused_notes(run),  # the phases taken from an earlier run of the same source
        "key_figures": _key_figures(run, raw_steps),
        "key_finding": finding["text"] if finding else None,
        "key_finding_against": performance["key_finding"] if performance else None,
        "performance": performance,
        "comparisons": findings.comparison_rows(comps),
        "comparisons_unit": findings.comparisons_unit(comps),
        "conclusion": findings.conclusion(run, problems, finding),
        "problems": problems,
        # the thresholds behind every DISTURBED or inconclusive row, once (results.json "evidence")
        "interference_rules": str(run.evidence.rules or "") if run.evidence.disturbed else None,
        "recommended": rec_rows,
        "run_command": run_command,
        "step_counts": ", ".join(f"{step_counts[k]} {k}" for k in sorted(step_counts)) or "none",
        "step_total": sum(step_counts.values()),
        # the steps results.json holds that the runbook no longer has: "name (last recorded: PENDING)"
        "steps_removed": steps_removed,
        "criteria_counts": _criteria_counts(run, crit_counts),
        "criteria_total": sum(crit_counts.values()),
        "environment": _environment_rows(run),
        "phases": phases,
        "acceptance": _acceptance_rows(run),
        "exports": exports,
        "exports_fence": fence(printable("\n".join(exports))),
        "notes": [str(n) for n in run.recommendations.notes],
        "plots": [p for p in plots if p["step"] not in shown_by_step],
        "plots_not_shown": plots_not_shown,  # recorded in results.json, not shown: [{"path", "why"}]
        "artifacts": _artifacts(run, run_dir),
        "tool": f"{run.tool.name or 'nsa-validate'} {run.tool.version or ''}".strip(),
        "schema_version": fmt_num(run.schema_version),
    }


