"""JUnit XML of a validation run, for CI systems: one <testsuite> per runbook phase (a <testcase> per step: a failed,
hung, timed-out or errored step is a failure; a skipped, pending or interrupted one is skipped) and one "acceptance"
suite (a <testcase> per criterion: a failed one a failure, one that could not be evaluated an error, a skipped or
inconclusive one skipped, a warning passed with its WARN in system-out, one of no or an unknown status skipped)
carrying the verdict as properties.

What fails or errs here is what the verdict stands on (validation.execution.acceptance.verdict), so that a CI reading
the file never fails a run the suite called GO: an optional step that failed, and a criterion of severity warn that
could not be evaluated, are skipped test cases saying so (the failure's excerpt in system-out); a step the runbook
no longer has (kept from an earlier attempt of a resumed run, validation.report.problems.removed_steps) is skipped
with what it last recorded, unless it failed (the verdict still counts that)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any

from validation.formatting import FAILED_STATUSES, finite, fmt_num, printable
from validation.report.problems import last_recorded, removed_steps
from validation.results.run import Run, Step, read_run

def _xml_text(value: Any) -> str:
    """Text XML 1.0 holds: a terminal's escape sequences removed, every other character it forbids as U+FFFD."""
    return printable(value)


def _junit_time(seconds: Any) -> str:
    v = finite(seconds)
    return f"{max(v, 0.0):.3f}" if v is not None else "0.000"


def _suite(parent: ET.Element, name: str, cases: list[tuple[ET.Element, str]], **attrs: str) -> ET.Element:
    suite = ET.SubElement(parent, "testsuite", {"name": _xml_text(name), **attrs})
    counts = Counter(outcome for _, outcome in cases)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(counts["failure"]))
    suite.set("errors", str(counts["error"]))
    suite.set("skipped", str(counts["skipped"]))
    # a sum past a float's range (durations of 1e308 s) is no time either: "0.000", never "inf"
    suite.set("time", _junit_time(sum(float(c.get("time", "0")) for c, _ in cases)))
    for case, _ in cases:
        suite.append(case)
    return suite


def render_junit(results: Run | dict) -> str:
    """JUnit XML: a testsuite per phase (a testcase per step) and an "acceptance" testsuite."""
    run = read_run(results)
    runbook = str(run.runbook.name or "nsa-validate")
    host = _xml_text(run.environment.host or "")
    root = ET.Element("testsuites", {"name": _xml_text(runbook)})
    removed = set(removed_steps(run))
    for phase, names in run.phases_in_order():
        phase_name = str(phase.name or "phase")
        cases = []
        for name in names:
            record = run.steps.get(name)
            step = record or Step()
            status = str(step.status) if record is not None else "missing"
            case = ET.Element("testcase", {"classname": _xml_text(f"{runbook}.{phase_name}"),
                                           "name": _xml_text(name), "time": _junit_time(step.duration_s)})
            reason = step.reason
            body = [step.excerpt] if step.excerpt else []
            body += [f"stack dump: {p}" for p in step.stack_dumps]
            out = []  # the case's system-out lines
            if name in removed:  # not part of this runbook: nothing the verdict waits for or stands on, whatever
                # an earlier attempt recorded of it
                ET.SubElement(case, "skipped", {"message": _xml_text(
                    f"not part of this runbook any more (removed since an earlier attempt recorded it); "
                    f"{last_recorded(record)}")})
                out += body
                outcome = "skipped"
            elif status in FAILED_STATUSES and not step.optional:  # what the verdict counts
                message = reason or status
                failure = ET.SubElement(case, "failure", {"message": _xml_text(message), "type": status})
                failure.text = _xml_text("\n".join(body) or reason or status)
                outcome = "failure"
            elif status in FAILED_STATUSES:  # an optional step: its failure does not make the run NO-GO
                ET.SubElement(case, "skipped", {"message": _xml_text(
                    f"optional step {status}, which the verdict does not stand on: {reason or status}")})
                out += body
                outcome = "skipped"
            elif status == "passed":
                outcome = "passed"
            else:  # skipped, pending, interrupted, missing: not run to the end, not a failure of the node
                message = reason or {"pending": "not run yet", "interrupted": "run interrupted",
                                     "missing": "no result recorded"}.get(status, status)
                text = message if status == "skipped" else f"{status}: {message}"
                ET.SubElement(case, "skipped", {"message": _xml_text(text)})
                outcome = "skipped"
            if step.dir:
                out.append(f"step directory: {step.dir}")
            if out:
                ET.SubElement(case, "system-out").text = _xml_text("\n".join(out))
            cases.append((case, outcome))
        _suite(root, phase_name, cases, hostname=host)
    cases = []
    for crit in run.acceptance:
        status = str(crit.status)
        name = str(crit.name or "criterion")
        case = ET.Element("testcase", {"classname": _xml_text(f"{runbook}.acceptance"), "name": _xml_text(name),
                                       "time": "0.000"})
        summary = (f"target {fmt_num(crit.target)}, actual {fmt_num(crit.actual)}"
                   + (f": {crit.detail}" if crit.detail else ""))
        if status == "fail":
            ET.SubElement(case, "failure", {"message": _xml_text(summary), "type": _xml_text(crit.severity or "fail")}
                          ).text = _xml_text(crit.expr or summary)
            outcome = "failure"
        elif status == "error" and crit.severity == "warn":  # a warning the verdict does not stand on (GO
            # names it among its warnings): not computable is no error of the run
            ET.SubElement(case, "skipped", {"message": _xml_text(
                f"warning not evaluated (could not be computed; the verdict does not stand on it): {summary}")})
            outcome = "skipped"
        elif status == "error":
            ET.SubElement(case, "error", {"message": _xml_text(summary), "type": "error"}
                          ).text = _xml_text(crit.expr or summary)
            outcome = "error"
        elif status == "skipped":
            ET.SubElement(case, "skipped", {"message": _xml_text(crit.detail or summary)})
            outcome = "skipped"
        elif status == "inconclusive":  # judged on disturbed evidence: neither held nor failed (the verdict is
            # INCOMPLETE when it is required), so never a passing testcase
            ET.SubElement(case, "skipped", {"message": _xml_text(f"inconclusive: {summary}")})
            outcome = "skipped"
        elif status in ("pass", "warn"):
            prefix = "WARN: " if status == "warn" else ""
            ET.SubElement(case, "system-out").text = _xml_text(prefix + summary)
            outcome = "passed"
        else:  # no status, or one no evaluation gives (a damaged record): not known to hold, never a pass
            word = str(crit.status) if crit.status is not None else "unknown"
            ET.SubElement(case, "skipped", {"message": _xml_text(f"{word}: {summary}")})
            outcome = "skipped"
        cases.append((case, outcome))
    suite = _suite(root, "acceptance", cases, hostname=host)
    props = ET.Element("properties")
    for key, value in (("verdict", run.verdict), ("verdict_reason", run.verdict_reason)):
        ET.SubElement(props, "property", {"name": key, "value": _xml_text(value or "")})
    suite.insert(0, props)
    totals = Counter()
    for s in root.findall("testsuite"):
        for key in ("tests", "failures", "errors", "skipped"):
            totals[key] += int(s.get(key))
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals[key]))
    root.set("time", _junit_time(run.duration_s))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


