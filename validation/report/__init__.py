"""Reports of a validation run, rendered from RUN_DIR/results.json alone (validation.results.store).

    view       the view model: everything the templates show, formatted (each step kind adds its own part)
    renderer   Markdown and HTML through Jinja2 (templates are package data), JSON; writing the report files
    junit      JUnit XML: one <testsuite> per phase and an "acceptance" suite
    plots      PNG plots (tokens/s per step through the metrics loader; each kind's own plots), each titled with
               what it measured (seq_len, micro-batch, precision, world size, device) and shown in its step's section
    findings   the run's own with/without comparisons (A/B, sweep, triage), the key finding, the recommended
               settings with their measured effect or reason, the conclusion
    performance  the comparison with an earlier run (--against)
    progress   the console while `nsa-validate run` runs: a live bar on a terminal, plain lines in a pipe or log

Formats (FORMATS):
- md:    Markdown in the shape of the v4 DDP validation report: executive summary with the GO / NO-GO /
         INCOMPLETE verdict and the key finding, test environment (git branch and dirty flag included), one
         section per runbook phase (each step's plots beside its tables), the performance analysis (the run's
         own with/without comparisons; the earlier run's with --against), acceptance criteria, open problems,
         recommendations (an `export` block, each setting with why), the conclusion and artifacts
         (templates/report.md.j2).
- html:  the same content as one standalone page, inline CSS, everything escaped (templates/report.html.j2).
- json:  results.json pretty-printed with sorted keys.
- junit: JUnit XML.

Rendering is pure: the same results give byte-identical output. Missing or malformed metrics render as "n/a"; a
report never fails because a step failed. Numbers, rates, durations and statuses are formatted by
validation.formatting (a foundation module: the step kinds use it too). The names below are imported on first use
(matplotlib only when plots are made).
"""

from __future__ import annotations

import importlib

_EXPORTS = {"FORMATS": "renderer", "REPORT_FILES": "renderer", "ReportError": "renderer", "render": "renderer",
            "write_reports": "renderer", "build_view": "view", "make_plots": "plots"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"validation.report.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'validation.report' has no attribute {name!r}")
