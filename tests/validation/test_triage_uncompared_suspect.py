"""A triage suspect whose runs all failed (or were all left out as disturbed) is not compared: the step's console
line, key figure and section say so, never "no suspect improves it significantly" over a suspect never measured."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

RUNBOOK = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5}, nproc_per_node: 1}
phases:
  - name: p
    steps:
      - {name: tr, kind: triage, repeats: 3, suspects: {a: {env: {NSA_SEL_RANGES_V2: '1'}}, b: {args: {accum: 2}}}}
"""
TOKS = {"config": [100.0, 101.0, 99.0], "a": [500.0, 505.0, 498.0], "b": [100.5, 100.0, 99.5]}


def _triage(monkeypatch, tmp_path, failed=(), disturbed=()):
    from validation.kinds import triage as triage_mod
    from validation.kinds.trainer import Runs
    from validation.results.codec import decode, encode
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun
    from validation.runbook.loader import load_runbook
    from validation.runbook.plan import step_launches

    def fake_run_all(ctx, retry_disturbed=False, **_):
        runs = [LaunchRun(label=s.label, params=dict(s.params), status="failed" if s.label in failed else "passed",
                          dir=s.dir, command=list(s.argv), repeat=s.repeat,
                          metrics=decode(LaunchMetrics, {"interference": {
                              "disturbed": s.label in disturbed, "share": 0.5 if s.label in disturbed else 0.0,
                              "text": "busy" if s.label in disturbed else "no interference"}}))
                for s in ctx.launches]
        return Runs(runs, problems=[f"{r.label}: crashed" for r in runs if r.status == "failed"])

    monkeypatch.setattr(triage_mod, "run_all", fake_run_all)
    monkeypatch.setattr(triage_mod, "run_toks",
                        lambda ctx, step, run: TOKS[run.label][run.repeat] if run.status == "passed" else None)
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    tr = load_runbook(path, cwd=str(Path(__file__).resolve().parents[2])).steps()[0]
    ctx = SimpleNamespace(run_dir=tmp_path, save=lambda partial=None: None, step=tr,
                          launches=step_launches(tr, {}, tmp_path))
    return {**encode(triage_mod.Triage().run(tr.options, ctx)), "name": "tr", "kind": "triage"}


def test_a_suspect_never_measured_is_named_as_not_compared_not_as_without_effect(monkeypatch, tmp_path):
    from validation import kinds
    from validation.kinds import get
    from validation.report.renderer import blocks_markdown

    triage = get("triage")
    for step in (_triage(monkeypatch, tmp_path, failed=("a",)), _triage(monkeypatch, tmp_path, disturbed=("a",))):
        m = step["metrics"]
        # b (+0.0%) was the only suspect compared: no culprit among those, nothing said of a (5x faster, unmeasured)
        assert m["culprit"] is None and m["ranking"] == ["b"] and "not compared: a (" in m["reason"]
        line = triage.summary_line(triage.read(step))
        assert line == " no culprit among the suspects compared (not compared: a)"
        (figure,) = triage.key_figures(kinds.read_steps([step]))
        assert figure.value == "none named among the suspects compared (a not compared)"
        section = blocks_markdown(triage.blocks(triage.read(step)))
        assert "| a | — | — | not compared | — | — | — |" in section
        assert "**Culprit**: none among the suspects compared (a not compared) — " in section
    # every suspect compared: the sentences are as before
    clean = _triage(monkeypatch, tmp_path)
    assert clean["metrics"]["culprit"] == "a" and triage.summary_line(triage.read(clean)).startswith(" culprit: a (")
    assert "not compared" not in blocks_markdown(triage.blocks(triage.read(clean)))
