"""What --reuse and a suggested command take from a resumed run: a step --rerun named that did not run again
(results.json's resume `not_rerun`) kept the result of an earlier attempt, so that resume did not run it: not its
source, not its --set. Checked on results records written by hand (read leniently, as reuse reads another run's),
against a two-phase runbook loaded from a file."""

from __future__ import annotations

import datetime
import json
import re
import types
from pathlib import Path

from validation.results import reuse
from validation.results.run import read_run
from validation.runbook.loader import load_runbook
from validation.runbook.model import step_definition

NOW = "a" * 64  # this tree's source digest, as the tests pass it
BEFORE = "b" * 64  # the source of the run's first attempt


def _runbook(tmp: Path):
    script = tmp / "bench.py"
    script.write_text("print(1)\n")
    path = tmp / "rb.yaml"
    path.write_text(f"""\
name: two_phases
requirements: {{gpus: 0}}
phases:
  - name: setup
    steps:
      - {{name: gate, kind: bench, on_failure: stop, command: [{script}]}}
  - name: kernels
    steps:
      - {{name: kbench, kind: bench, command: [{script}, --speed, "3"]}}
""")
    return load_runbook(path)


def _resumed(rb, not_rerun: dict[str, str], resume_set: list[str]) -> dict:
    """A run of `rb` first run at source BEFORE with no --set, then resumed at source NOW with --rerun gate
    --rerun kbench and `resume_set`, where `not_rerun` names the steps that did not run again (their earlier
    results kept)."""
    steps = {s.name: {"name": s.name, "phase": s.phase, "kind": s.kind, "status": "passed",
                      "definition": step_definition(s)} for s in rb.steps()}
    steps["gate"]["status"] = "failed"
    return {
        "runbook": {"name": rb.name},
        "environment": {"source_digest": NOW},
        "options": {"only": [], "skip": [], "set": []},
        "phases": [{"name": p.name, "steps": [s.name for s in p.steps]} for p in rb.phases],
        "steps": steps,
        "resumes": [{"at": "2026-12-01T10:00:00+0000", "steps": ["gate", "kbench"], "rerun": ["gate", "kbench"],
                     "replaced": {}, "runbook_changed": False,
                     "options": {"only": [], "skip": [], "set": resume_set},
                     "source_changed": {"before": {"source_digest": BEFORE}, "now": {"source_digest": NOW}},
                     "not_rerun": not_rerun}],
    }


def test_a_step_kept_by_a_resume_at_another_source_is_not_taken_as_run_at_this_one(tmp_path):
    rb = _runbook(tmp_path)
    kept = _resumed(rb, {"kbench": "not run: step gate failed and on_failure is stop"}, [])
    why = reuse.refusal(kept, rb, "kernels", [], NOW)
    assert why is not None and "its step kbench ran before the run was resumed" in why
    rerun = _resumed(rb, {}, [])  # the resume did run kbench again: at this source
    assert reuse.refusal(rerun, rb, "kernels", [], NOW) is None


def test_the_set_of_a_step_kept_by_a_resume_is_the_attempt_that_ran_it(tmp_path):
    rb = _runbook(tmp_path)
    resume_set = ["steps.gate.timeout_s=30"]
    kept = _resumed(rb, {"kbench": "not run: step gate failed and on_failure is stop"}, resume_set)
    run = read_run(kept)
    assert run.overrides(["kbench"]) == []  # the first run's: kbench is its result
    assert run.overrides(["gate"]) == resume_set
    assert run.overrides() == resume_set  # the latest attempt's
    assert read_run(_resumed(rb, {}, resume_set)).overrides(["kbench"]) == resume_set
    # reuse holds the phase's --set against the attempt that ran its steps: none, as here
    assert reuse.refusal({**kept, "environment": {"source_digest": NOW},
                          "resumes": [{**kept["resumes"][0], "source_changed": None,
                                       "options": {"only": [], "skip": [],
                                                   "set": ["steps.kbench.timeout_s=30"]}}]},
                         rb, "kernels", [], NOW) is None


class _Py310Datetime(datetime.datetime):
    """datetime as Python 3.10 (which pyproject.toml supports) has it: fromisoformat reads an offset only as
    "+HH:MM", not the "+HHMM" the runner writes."""

    @classmethod
    def fromisoformat(cls, text):
        if re.search(r"[+-]\d{4}$", text):
            raise ValueError(f"Invalid isoformat string: {text!r}")
        return super().fromisoformat(text)


def test_a_bare_reuse_takes_the_run_that_finished_last_with_python_3_10s_datetime(tmp_path, monkeypatch):
    """Two committed runs that match: the one that finished last by the instant is taken (b: 09:30 UTC), not the
    first by path (a: 10:00+0100, 09:00 UTC)."""
    from validation.execution.runner import Runner

    rb = _runbook(tmp_path)
    base = json.loads((Path(__file__).parent / "fixtures/results_example.json").read_text())
    steps = {s.name: {**Runner._pending(s), "status": "passed"} for s in rb.steps()}
    base.update(environment={"source_digest": NOW}, options={"only": [], "skip": [], "set": []}, steps=steps,
                phases=[{"name": p.name, "title": p.name, "description": "", "steps": [s.name for s in p.steps]}
                        for p in rb.phases])
    for name, finished in (("a", "2026-12-01T10:00:00+0100"), ("b", "2026-12-01T09:30:00+0000")):
        (tmp_path / "reports" / name).mkdir(parents=True)
        (tmp_path / "reports" / name / "results.json").write_text(json.dumps({**base, "finished": finished}))
    monkeypatch.setattr(reuse, "datetime", types.SimpleNamespace(datetime=_Py310Datetime,
                                                                 timezone=datetime.timezone))
    taken = reuse.resolve(rb, {"kernels": None}, [], tmp_path, digest=NOW)
    assert taken["kernels"].source == tmp_path / "reports" / "b" / "results.json"
