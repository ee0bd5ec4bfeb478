"""Which earlier run `run --reuse PHASE` takes (validation.results.reuse) and which --set a suggested command repeats
(validation.results.run.Run.overrides), against the documented rules: the newest matching run under reports/ by the
instant it finished, whatever UTC offset it was written with; a damaged results.json is named as such and never
taken; a resume recorded before resumes recorded their options counts as the first run's. Hand-built results.json
records (tests/validation/results_records.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from validation.results import reuse
from validation.results.run import read_run
from validation.runbook.loader import load_runbook
from validation.runbook.model import step_definition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_records import run_record  # noqa: E402
from reuse_support import two_phase_runbook  # noqa: E402

DIGEST = "d" * 64


def _record(rb_path: Path, finished: str, speed: float) -> dict:
    """A finished run of the runbook whose phase kernels matches it (same digest, definitions, no --set)."""
    rb = load_runbook(rb_path)
    steps = {s.name: {"kind": s.kind, "phase": s.phase, "metrics": {"speed": speed}, "definition": step_definition(s)}
             for s in rb.steps()}
    record = run_record({"steps": steps, "environment": {"source_digest": DIGEST}, "runbook": {"name": rb.name},
                         "finished": finished})
    record["phases"] = [{"name": p.name, "title": p.name, "description": "", "steps": [s.name for s in p.steps]}
                        for p in rb.phases]
    return record


def _commit(tmp: Path, name: str, text: str) -> Path:
    where = tmp / "reports" / name
    where.mkdir(parents=True)
    (where / "results.json").write_text(text)
    return where / "results.json"


def test_the_newest_matching_run_is_the_one_that_finished_last_whatever_its_utc_offset(tmp_path):
    """10:00 at +0100 is 09:00 UTC, before 09:30 at +0000: the second run is the newer, though its text sorts
    first."""
    rb_path = two_phase_runbook(tmp_path, rest_criterion=False)
    _commit(tmp_path, "a", json.dumps(_record(rb_path, "2026-11-26T10:00:00+0100", 3.0)))
    newer = _commit(tmp_path, "b", json.dumps(_record(rb_path, "2026-11-26T09:30:00+0000", 4.0)))
    _commit(tmp_path, "c", json.dumps(_record(rb_path, None, 5.0)))  # never finished: the oldest
    taken = reuse.resolve(load_runbook(rb_path), {"kernels": None}, [], tmp_path, digest=DIGEST)["kernels"]
    assert taken.source == newer
    assert taken.results["steps"]["kbench"]["metrics"]["speed"] == 4.0


@pytest.mark.parametrize("damage, words", [
    (lambda text: text.replace('"speed": 3.0', '"speed": NaN'),
     "steps.kbench.metrics.speed: nan is not a JSON number (results.json holds finite numbers only)"),
    (lambda text: text.replace('"tool":', '"deep": ' + "[" * 100_000 + "]" * 100_000 + ', "tool":', 1),
     "unreadable (its JSON is nested deeper than can be read)"),
    (lambda text: text.replace('"speed": 3.0', '"speed": 3.0, "speed": 9.0'),
     "unreadable (the key 'speed' appears twice in one object: which value holds is not known)"),
], ids=["NaN figure", "nested too deep", "a key twice"])
def test_a_damaged_results_json_is_never_taken_and_the_refusal_names_what_is_wrong(tmp_path, damage, words):
    """Its figures would otherwise become this run's (a NaN that no results.json may hold, or one of two values
    picked silently); the refusal names the file and the fault, and nothing else crashes the search."""
    rb_path = two_phase_runbook(tmp_path, rest_criterion=False)
    text = json.dumps(_record(rb_path, "2026-11-26T09:30:00+0000", 3.0))
    damaged = damage(text)
    assert damaged != text
    path = _commit(tmp_path, "a", damaged)
    with pytest.raises(reuse.ReuseError) as err:
        reuse.resolve(load_runbook(rb_path), {"kernels": None}, [], tmp_path, digest=DIGEST)
    assert f"({path}: {words})" in str(err.value), str(err.value)


def test_a_resume_that_recorded_no_options_counts_as_the_first_runs_set():
    """Run.overrides: the first run ran with --set A; a resume (options recorded) ran kbench with --set B; a later
    resume from before resumes recorded their options ran kbench again. The last attempt to run kbench counts as the
    first run's: A."""
    def resume(steps, options=None):
        entry = {"at": "T", "previous_end": None, "previous_state": "interrupted by SIGINT", "steps": steps,
                 "rerun": [], "replaced": {}, "runbook_changed": False}
        return {**entry, "options": options} if options is not None else entry
    run = read_run({"options": {"only": [], "skip": [], "set": ["steps.kbench.timeout_s=5"]},
                    "resumes": [resume(["kbench"], {"only": [], "skip": [], "set": ["steps.kbench.timeout_s=9"]}),
                                resume(["kbench"])]})
    assert run.overrides(["kbench"]) == ["steps.kbench.timeout_s=5"]
    assert run.overrides() == ["steps.kbench.timeout_s=5"]  # the latest attempt: that same resume
    assert run.overrides(["rbench"]) == ["steps.kbench.timeout_s=5"]  # no resume ran rbench: the first run's
