"""The report's "Performance analysis": this run against an earlier one (`nsa-validate run ... --against RUN_DIR`,
`nsa-validate report --against RUN_DIR`), every metric beside the earlier run's with the statistics of `compare`, and
the key finding the executive summary names (the largest significant change, or none).

Read from results.json's `performance_analysis` block, written by validation.report.compare.performance_analysis (its
docstring documents the block). The keys read here, each optional (a missing one renders as n/a):

    against: {run_dir, runbook, started, verdict, git_sha}   the earlier run (a plain string: its directory)
    alpha, noise (the user's threshold or null), noise_source ("user" | "measured")
    family: {statement}        how the family-wise error was controlled (Holm over the tested rows)
    run_noise: {text}          the run-to-run variation measured from repeated runs, or null
    gate                       one sentence: regressions, or none
    warnings                   [sentences]: environments that differ, run-to-run variation not measured, ...
    key_finding: {text}        the largest significant change, or "none: ..." (computed here when absent)
    rows: [{step, metric, tested, mean_a (the earlier run), mean_b (this run), rel_delta (or rel: B / A - 1),
            ci_low, ci_high (the confidence interval of the relative difference), confidence (0.95),
            p_adjusted (Holm; p_value when absent), significant, verdict ("better" | "worse" | "same"), note
            (why a row is not tested)}]

Pure; accepts damaged input.
"""

from __future__ import annotations

import re
from typing import Any

from validation.formatting import NA, as_dict, finite, fmt_num, fmt_p, fmt_pct, plural
from validation.results.run import AgainstRun, AnalysisRow, PerformanceAnalysis, Run, read_run

VERDICT_CSS = {"better": "pass", "worse": "fail", "same": "skip"}

# compare names the two runs A and B (validation.report.compare: A = the earlier run, B = this run) and so does this
# section: its sentence names A and B once, its table heads them, and compare's warnings and notes keep its letters
SIDES = "A is the earlier run, B this run"


_NOT_TESTED = re.compile(r"^not tested:\s*", re.I)


def _row_notes(rows: list[AnalysisRow]) -> tuple[list[str], list[str]]:
    """(why rows were not tested, what qualifies a tested row), each note once with the rows it is about ("baseline
    final_loss, single final_loss: one value per run: ..."): a note is compare's sentence on its row, which names no
    row, and the section shows its notes below the table. A note of an untested row without compare's own "not
    tested:" before it (the section says that); a tested row's note (one run a side, the common change) is no
    reason it was not tested."""
    untested: dict[str, list[AnalysisRow]] = {}
    tested: dict[str, list[AnalysisRow]] = {}
    for r in rows:
        if not r.note:
            continue
        untested_row = r.tested is False
        note = _NOT_TESTED.sub("", str(r.note)) if untested_row else str(r.note)
        (untested if untested_row else tested).setdefault(note, []).append(r)
    return ([f"{_rows_named(about)}: {note}" for note, about in untested.items()],
            [f"{_rows_named(about)}: {note}" for note, about in tested.items()])


def _rows_named(rows: list[AnalysisRow], listed: int = 4) -> str:
    """The rows a note is about: "baseline final_loss, single toks_per_s", or past `listed` rows their metrics and
    how many launches ("final_loss and mem_peak_gb of 19 launches")."""
    names = list(dict.fromkeys(f"{fmt_num(r.step)} {fmt_num(r.metric)}" for r in rows))
    if len(names) <= listed:
        return ", ".join(names)
    metrics = list(dict.fromkeys(fmt_num(r.metric) for r in rows))
    steps = len(dict.fromkeys(fmt_num(r.step) for r in rows))
    return f"{' and '.join(metrics)} of {plural(steps, 'launch', 'launches')}"


def _value(value: Any) -> str:
    """A mean as compare's table prints it (fmt_num: 5,843.2, 0.62; a figure past 1e15, outside any physical range,
    as 4.096e+18, never a 25-digit number), so that the section and `compare` never show one figure two ways."""
    v = finite(value)
    return NA if v is None else fmt_num(v)


def analysis_rows(results: Run | dict) -> list[dict]:
    """The performance_analysis rows, formatted: step, metric, mean_a, mean_b, rel_delta, ci (a sentence),
    ci_range, p, significant ("yes" / "no" / "not tested"), verdict, verdict_value, css, note, and `change`
    (|relative difference| for ordering, None when unknown)."""
    rows = []
    for row in read_run(results).performance_analysis.rows:
        low, high = finite(row.ci_low), finite(row.ci_high)
        rel = finite(row.rel_delta)
        rel = finite(row.rel) if rel is None else rel
        p = next((v for v in (row.p_adjusted, row.p_value) if finite(v) is not None), None)
        confidence = finite(row.confidence) or 0.95
        tested = row.tested is not False
        significant = tested and row.significant is True
        verdict = str(row.verdict or NA)
        ci_range = (f"{fmt_pct(low, signed=True)} to {fmt_pct(high, signed=True)}"
                    if low is not None and high is not None else NA)
        rows.append({
            "step": fmt_num(row.step), "metric": fmt_num(row.metric),
            "mean_a": _value(row.mean_a), "mean_b": _value(row.mean_b),
            "rel_delta": fmt_pct(rel, signed=True), "ci_range": ci_range,
            "ci": f"{confidence:.0%} CI {ci_range}" if ci_range != NA else f"CI {NA}",
            "p": fmt_p(p) if tested else "not tested",
            "significant": ("yes" if significant else "no") if tested else "not tested",
            "verdict": verdict, "verdict_value": verdict.lower(),
            "css": VERDICT_CSS.get(verdict.lower(), "unknown") if (significant or verdict.lower() == "same") else "skip",
            "note": str(row.note) if row.note else None,
            "change": abs(rel) if rel is not None else None,
        })
    return rows


def key_finding(rows: list[dict]) -> str:
    """The largest significant change (by |relative difference|) in one sentence, or 'none' with why."""
    states = [r["significant"] for r in rows]
    significant = [r for r, state in zip(rows, states) if state == "yes" and r["change"] is not None]
    if not significant:
        if rows and set(states) == {"not tested"}:
            return (f"none: no metric could be tested against the earlier run ({plural(len(rows), 'metric')} "
                    "compared, none with the values a test needs)")
        return ("none: no metric changed significantly against the earlier run" if rows else
                "none: no metric could be compared with the earlier run")
    top = max(significant, key=lambda r: r["change"])
    return (f"{top['step']} {top['metric']} {top['verdict_value']}, {top['rel_delta']} ({top['ci']}, adjusted p "
            f"{top['p']}): {top['mean_a']} before, {top['mean_b']} now")


def performance_view(results: Run | dict) -> dict | None:
    """What the Performance analysis section shows, or None when results.json has no performance_analysis block."""
    run = read_run(results)
    block = run.performance_analysis
    if block == PerformanceAnalysis():
        return None
    rows = analysis_rows(run)
    against = block.against if isinstance(block.against, AgainstRun) else AgainstRun(run_dir=block.against)
    counts = {v: sum(r["significant"] == "yes" and r["verdict_value"] == v for r in rows) for v in ("better", "worse")}
    tested = sum(r["significant"] != "not tested" for r in rows)
    settings = []
    if finite(block.alpha) is not None:
        settings.append(f"alpha {fmt_num(block.alpha)}")
    if finite(block.noise) is not None:
        settings.append(f"noise threshold {fmt_pct(block.noise)} (given)")
    elif block.noise_source == "measured":
        settings.append("noise floor measured from the data")
    finding = (block.key_finding.text if block.key_finding else None) or key_finding(rows)
    # run_noise: {"text"} in the records this section was written for ({step: RunNoise} since: no "text")
    about = [str(x) for x in (block.family.statement, as_dict(block.run_noise).get("text")) if x]
    not_tested, qualified = _row_notes(block.rows)
    about = [x.rstrip(". ") for x in about + qualified]  # what qualifies a tested row: with how rows were tested
    return {
        "against": fmt_num(against.run_dir),
        "against_verdict": fmt_num(against.verdict) if against.verdict else None,
        "against_started": fmt_num(against.started) if against.started else None,
        "against_sha": str(against.git_sha)[:12] if against.git_sha else None,
        # what is known of the earlier run, each part on its own (its start and git sha also without a verdict)
        "against_about": ", ".join(x for x in (f"verdict {fmt_num(against.verdict)}" if against.verdict else "",
                                               f"started {fmt_num(against.started)}" if against.started else "",
                                               f"git {str(against.git_sha)[:12]}" if against.git_sha else "") if x)
                         or None,
        "method": "; ".join(about) or None,
        "settings": ", ".join(settings) or None,
        "gate": str(block.gate) if block.gate else None,
        "warnings": [str(w) for w in block.warnings],
        "sides": SIDES,
        "rows": rows,
        "notes": not_tested,  # why rows were not tested, each reason once with the rows it is about
        "summary": (f"{plural(len(rows), 'metric')} compared, {tested} tested: {counts['better']} significantly better, "
                    f"{counts['worse']} significantly worse"),
        "key_finding": str(finding),
    }
