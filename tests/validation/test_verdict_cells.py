"""The verdict's truth table (validation.execution.acceptance's module docstring, the README's exit codes) in two
cells the other suites leave out:

- a decision (an A/B) that left a disturbed run out and decided on the others, where that disturbed run measured a
  figure outside its physical range (a tokens/s CV of 0.8 on a shared machine): a disturbance explains the figure,
  so a criterion on the decision is inconclusive and the run INCOMPLETE with the command that runs it again, never
  NO-GO for "a bug in the measurement"; the same figure from an undisturbed run stays an error (NO-GO);
- a step that only an earlier attempt's runbook had, left pending by an interrupt: a resume of the changed runbook
  never runs it, so the run is not held INCOMPLETE waiting for it ("--resume continues it" would be false: a further
  --resume has nothing to do);
- an on_failure: stop step run again by a resume (--rerun) once it passes: the steps its stop had skipped run too,
  instead of a GO with those steps never run and their reason still saying that it failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation.analysis.interference import decision_record
from validation.execution.acceptance import evaluate, recommendations, verdict
from validation.execution.evidence import assess
from validation.results.run import read_run
from validation.run import RunRequest, run_runbook
from validation.runbook.loader import load_runbook

AB_RUNBOOK = """\
name: ev
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - name: prefill
        kind: ab
        baseline: {}
        variants: {batched: {env: {NSA_PREFILL_BATCHED: "1"}}}
        repeats: 3
acceptance:
  - {name: "Prefill decided", expr: "prefill.significant", target: "a significant difference"}
"""

QUIET = {"disturbed": False, "text": "no interference in 8 samples", "share": 0.0}
BUSY = {"disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 5 of 8 samples (62%)",
        "share": 0.625}


def _run(label: str, repeat: int, toks: float, cv: float, interference: dict) -> dict:
    return {"label": label, "repeat": repeat, "params": {"env.NSA_PREFILL_BATCHED": "1"} if label == "batched" else {},
            "metrics": {"toks_per_s": {"mean": toks, "cv": cv, "n": 20}, "interference": interference}}


def _ab_results(odd_run_disturbed: bool) -> dict:
    """An A/B whose second batched repeat measured a CV of 0.8 (the physical range is [0, 0.5]); the decision stands
    on the other five runs (significant, replicated), and the step's interference record says so when that run was
    disturbed (validation.analysis.interference.decision_record, as the kind writes it)."""
    odd = BUSY if odd_run_disturbed else QUIET
    runs = ([_run("baseline", r, 1000.0 + r, 0.05, QUIET) for r in range(3)]
            + [_run("batched", 0, 1300.0, 0.05, QUIET), _run("batched", 1, 700.0, 0.8, odd),
               _run("batched", 2, 1310.0, 0.05, QUIET)])
    choice = {"label": "batched", "explanation": "30% faster in every block", "significant": True,
              "params": {"env.NSA_PREFILL_BATCHED": "1"}}
    step = {"name": "prefill", "kind": "ab", "status": "passed", "runs": runs, "choice": choice, "winner": choice,
            "decision": {"significant": True, "recommendable": True},
            "metrics": {"decided": True, "significant": True}}
    step["interference"] = decision_record(step, conclusive=True)
    return {"runbook": {"name": "ev", "path": "runbooks/ev.yaml"}, "run_dir": "artifacts/validate/ev-1",
            "steps": {"prefill": step}, "acceptance": []}


def _judge(rb, results: dict) -> tuple[dict, tuple[str, str]]:
    """The run's evidence, criteria and verdict as validation.execution.runner computes them when a run ends."""
    results["evidence"] = assess(rb, results, results["run_dir"])
    results["acceptance"] = evaluate(rb, results, results["run_dir"])
    return results["acceptance"][0], verdict(results, False)


@pytest.fixture
def ab_runbook(tmp_path):
    path = tmp_path / "ev.yaml"
    path.write_text(AB_RUNBOOK)
    return load_runbook(path)


def test_an_impossible_figure_only_a_left_out_disturbed_run_measured_is_inconclusive_not_no_go(ab_runbook):
    results = _ab_results(odd_run_disturbed=True)
    assert results["steps"]["prefill"]["interference"]["disturbed"] is False  # the decision stands on the others
    row, (word, reason) = _judge(ab_runbook, results)
    rerun = "nsa-validate run runbooks/ev.yaml --resume artifacts/validate/ev-1 --rerun prefill"
    assert row["status"] == "inconclusive", row
    assert row["detail"].startswith("it held, but on disturbed evidence: disturbed runs of step prefill measured "
                                    "runs.batched.toks_per_s.cv = 0.8 outside [0, 0.5]")
    assert row["detail"].endswith(f"run again: {rerun}")
    assert word == "INCOMPLETE", reason
    assert reason == ("1 required criterion inconclusive: Prefill decided, measured while other work used the "
                      f"machine (disturbed: prefill); run again: {rerun}; nothing evaluated failed")
    # the open problems' record: the figure is explained by a disturbance, not a bug in the measurement
    [bad] = results["evidence"]["implausible"]
    assert (bad["metric"], bad["value"], bad["disturbed"]) == ("runs.batched.toks_per_s.cv", 0.8, True)
    # nothing is recommended from it either way, and the note gives the cause the evidence shows
    note = recommendations(ab_runbook, results)["notes"][0]
    assert note.startswith("prefill: no recommendation: a figure of its runs is outside its physical range, "
                           "measured while other work used the machine, not a result"), note


def test_the_same_impossible_figure_from_an_undisturbed_run_stays_an_error(ab_runbook):
    results = _ab_results(odd_run_disturbed=False)
    row, (word, reason) = _judge(ab_runbook, results)
    assert row["status"] == "error" and "a bug in the measurement" in row["detail"]
    assert (word, reason) == ("NO-GO", "criteria failed: Prefill decided")
    assert results["evidence"]["implausible"][0]["disturbed"] is False
    assert "a bug in the measurement" in recommendations(ab_runbook, results)["notes"][0]


def _steps_results(statuses: dict[str, str], phases: dict[str, list[str]] | None) -> dict:
    out = {"steps": {n: {"name": n, "kind": "bench", "status": st, "optional": False} for n, st in statuses.items()},
           "acceptance": []}
    if phases is not None:
        out["phases"] = [{"name": p, "steps": names} for p, names in phases.items()]
    return out


@pytest.mark.parametrize("status", ["pending", "running", "interrupted"])
def test_a_step_the_runbook_no_longer_has_is_not_waited_for(status):
    # the run's phases (the runbook as it runs now) list only `one`: `two` is an earlier runbook's, kept as it was
    got = verdict(_steps_results({"one": "passed", "two": status}, {"a": ["one"]}), False)
    assert got == ("GO", "1 step(s) passed and every required criterion holds")
    # a step the runbook has is still waited for, and so is every step of a record without phases
    assert verdict(_steps_results({"one": "passed", "two": status}, {"a": ["one"], "b": ["two"]}), False) == \
        ("INCOMPLETE", "step(s) not run yet: two")
    assert verdict(_steps_results({"one": "passed", "two": status}, None), False) == \
        ("INCOMPLETE", "step(s) not run yet: two")


WRITE_JSON = "import json, sys; open(sys.argv[2], 'w').write(json.dumps({'x': 1}))"


def test_a_resume_of_a_runbook_that_dropped_its_pending_step_reaches_its_verdict(tmp_path):
    """An interrupted run (`one` interrupted, `two` pending), resumed with a runbook that no longer has `two`: `one`
    runs and passes, and the run ends GO; it ended INCOMPLETE "step(s) not run yet: two", and a further --resume
    said "nothing to resume"."""
    step = "{{name: {0}, kind: bench, command: [-c, {1}]}}"
    one, two = step.format("one", json.dumps(WRITE_JSON)), step.format("two", json.dumps(WRITE_JSON))
    path = tmp_path / "rb.yaml"
    path.write_text(f"name: life\nphases:\n  - name: a\n    steps:\n      - {one}\n"
                    f"  - name: b\n    steps:\n      - {two}\n")
    run_dir = tmp_path / "run"
    first = run_runbook(RunRequest(runbook=path, out=run_dir, no_report=True, cwd=tmp_path))
    assert first.results["verdict"] == "GO"
    # as an interrupt during `one` leaves it (validation.execution.runner.Runner.run)
    record = json.loads((run_dir / "results.json").read_text())
    record["steps"]["one"].update(status="interrupted", reason="interrupted (SIGINT)")
    record["steps"]["two"].update(status="pending", reason=None)
    record.update(interrupted_by="SIGINT", verdict="INCOMPLETE",
                  verdict_reason="the run was interrupted (SIGINT); `nsa-validate run --resume RUN_DIR` continues it")
    (run_dir / "results.json").write_text(json.dumps(record))
    path.write_text(f"name: life\nphases:\n  - name: a\n    steps:\n      - {one}\n")  # `two` removed
    again = run_runbook(RunRequest(runbook=path, resume=run_dir, no_report=True, cwd=tmp_path))
    run = read_run(again.results)
    assert run.steps["one"].status == "passed" and run.steps["two"].status == "pending"
    assert (run.verdict, run.verdict_reason) == ("GO", "1 step(s) passed and every required criterion holds")
    assert Path(run_dir / "results.json").exists()


def test_a_resume_that_runs_the_stopping_step_again_runs_the_steps_its_stop_skipped(tmp_path):
    """on_failure: stop. `one` fails and stops the run (NO-GO, `two` skipped "not run: step one failed ..."); fixed
    and run again (--resume --rerun one), it passes and `two` runs too. It ended GO with `two` never run and its
    reason still saying that `one` failed."""
    broken = tmp_path / "broken"
    one = (f"import json, os, sys\nif os.path.exists({str(broken)!r}): sys.exit('broken')\n"
           "open(sys.argv[2], 'w').write(json.dumps({'x': 1}))")
    path = tmp_path / "rb.yaml"
    path.write_text("name: stop\nphases:\n  - name: p\n    steps:\n"
                    f"      - {{name: one, kind: bench, on_failure: stop, command: [-c, {json.dumps(one)}]}}\n"
                    f"      - {{name: two, kind: bench, command: [-c, {json.dumps(WRITE_JSON)}]}}\n")
    run_dir = tmp_path / "run"
    broken.touch()
    first = read_run(run_runbook(RunRequest(runbook=path, out=run_dir, no_report=True, cwd=tmp_path)).results)
    assert (first.verdict, first.steps["two"].status) == ("NO-GO", "skipped")
    assert first.steps["two"].reason == "not run: step one failed and on_failure is stop"
    # still failing: the step it stops is skipped again, for the same reason
    still = read_run(run_runbook(RunRequest(runbook=path, resume=run_dir, rerun=("one",), no_report=True,
                                            cwd=tmp_path)).results)
    assert (still.verdict, still.steps["one"].status, still.steps["two"].status) == ("NO-GO", "failed", "skipped")
    assert still.steps["two"].reason == "not run: step one failed and on_failure is stop"
    broken.unlink()
    again = read_run(run_runbook(RunRequest(runbook=path, resume=run_dir, rerun=("one",), no_report=True,
                                            cwd=tmp_path)).results)
    assert {n: s.status for n, s in again.steps.items()} == {"one": "passed", "two": "passed"}
    assert (again.verdict, again.verdict_reason) == ("GO", "2 step(s) passed and every required criterion holds")
    assert again.resumes[-1].steps == ["one", "two"] and again.resumes[-1].rerun == ["one"]
