"""What a run takes from another run, and whether the steps it takes are the steps it would run: `run --reuse`
(validation.results.reuse) holds each reused step's recorded definition (validation.runbook.model.step_definition)
against this runbook's, the --set the steps ran with (a resume's own), and the source of the attempt that ran them;
`run --resume` says which kept steps were measured under other settings than the runbook now gives them; `compare`
names the settings two runs did not share. Hand-built results.json records (tests/validation/results_records.py),
except one short run of benchmark steps (no torch) for the resume."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from validation.execution.runner import kept_but_changed
from validation.report.compare import compare_runs
from validation.results import reuse
from validation.results.store import resume_note
from validation.runbook.loader import load_runbook
from validation.runbook.model import step_definition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_records import run_record  # noqa: E402
from reuse_support import two_phase_runbook  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DIGEST = "d" * 64


def _runbook(tmp: Path, speed: str = "3.0", name: str = "two_phases.yaml") -> Path:
    return two_phase_runbook(tmp, speed, name, rest_criterion=False)


def _earlier(tmp: Path, rb_path: Path, overrides=(), **extra) -> Path:
    """A finished run of `rb_path`'s phase kernels (with `overrides`) as results.json in tmp/earlier."""
    rb = load_runbook(rb_path, list(overrides))
    steps = {s.name: {"kind": s.kind, "phase": s.phase, "metrics": {"speed": 3.0}, "definition": step_definition(s)}
             for s in rb.steps()}
    record = run_record({"steps": steps, "environment": {"source_digest": DIGEST}, "runbook": {"name": rb.name},
                         "options": {"only": [], "skip": [], "set": list(overrides)}, **extra})
    record["phases"] = [{"name": p.name, "title": p.name, "description": "", "steps": [s.name for s in p.steps]}
                        for p in rb.phases]
    where = tmp / "earlier"
    where.mkdir(exist_ok=True)
    (where / "results.json").write_text(json.dumps(record))
    return where


def _resolve(rb_path: Path, where: Path, overrides=()):
    rb = load_runbook(rb_path, list(overrides))
    return reuse.resolve(rb, {"kernels": where}, list(overrides), Path("."), digest=DIGEST)


def test_the_same_steps_are_reused(tmp_path):
    rb = _runbook(tmp_path)
    taken = _resolve(rb, _earlier(tmp_path, rb))
    assert taken["kernels"].differences == ()
    assert "nothing of it ran here" in taken["kernels"].note()


def test_a_phase_whose_step_runs_something_else_is_refused_naming_the_difference(tmp_path):
    """The runbook file lies outside runbooks/, so the source digest does not cover it: the same digest, another
    command."""
    first = _earlier(tmp_path, _runbook(tmp_path, "3.0"))
    changed = _runbook(tmp_path, "1.0", name="changed.yaml")
    with pytest.raises(reuse.ReuseError) as err:
        _resolve(changed, first)
    assert 'its step kbench ran something else: launches[0].argv[3]: "1.0" here, "3.0" there' in str(err.value)


def test_a_step_that_recorded_no_definition_is_not_taken(tmp_path):
    rb = _runbook(tmp_path)
    where = _earlier(tmp_path, rb)
    data = json.loads((where / "results.json").read_text())
    del data["steps"]["kbench"]["definition"]
    (where / "results.json").write_text(json.dumps(data))
    with pytest.raises(reuse.ReuseError, match="its step kbench recorded no definition"):
        _resolve(rb, where)


def test_a_set_by_the_full_phase_path_counts_as_a_set_of_the_step(tmp_path):
    rb = _runbook(tmp_path)
    first = _earlier(tmp_path, rb)
    with pytest.raises(reuse.ReuseError) as err:
        _resolve(rb, first, ["phases.kernels.steps.kbench.timeout_s=5"])
    assert "other --set for its steps (none; here steps.kbench.timeout_s=5)" in str(err.value)


def test_the_set_compared_is_the_one_the_steps_ran_with_a_resume_s_own(tmp_path):
    """The first attempt ran no --set; the resume that ran kbench ran with one. A reuse without it is refused."""
    rb = _runbook(tmp_path)
    resume = {"at": "2026-01-02T00:00:00+0000", "previous_end": None, "previous_state": "interrupted by SIGINT",
              "steps": ["kbench"], "rerun": [], "replaced": {}, "runbook_changed": False,
              "options": {"only": [], "skip": [], "set": ["steps.kbench.timeout_s=5"]}}
    first = _earlier(tmp_path, rb, ["steps.kbench.timeout_s=5"], resumes=[resume])
    data = json.loads((first / "results.json").read_text())
    data["options"]["set"] = []
    (first / "results.json").write_text(json.dumps(data))
    with pytest.raises(reuse.ReuseError, match=r"other --set for its steps \(steps.kbench.timeout_s=5; here none\)"):
        _resolve(rb, first)


def test_a_phase_the_run_itself_took_from_another_run_is_refused(tmp_path):
    rb = _runbook(tmp_path)
    first = _earlier(tmp_path, rb)
    data = json.loads((first / "results.json").read_text())
    data["steps"]["kbench"]["reused"] = {"phase": "kernels", "from": "/elsewhere/results.json"}
    (first / "results.json").write_text(json.dumps(data))
    with pytest.raises(reuse.ReuseError, match="its step kbench was itself taken from /elsewhere/results.json"):
        _resolve(rb, first)


def test_steps_run_before_a_resume_under_another_source_are_not_this_source(tmp_path):
    """environment.source_digest is the last attempt's; kbench ran in the first, at another source."""
    rb = _runbook(tmp_path)
    resume = {"at": "2026-01-02T00:00:00+0000", "previous_end": None, "previous_state": "interrupted by SIGINT",
              "steps": ["rbench"], "rerun": [], "replaced": {}, "runbook_changed": False,
              "source_changed": {"before": {"source_digest": "a" * 64}, "now": {"source_digest": DIGEST}}}
    first = _earlier(tmp_path, rb, resumes=[resume])
    with pytest.raises(reuse.ReuseError, match="its step kbench ran before the run was resumed at "
                                               "2026-01-02T00:00:00.0000 with another source"):
        _resolve(rb, first)
    note = resume_note(json.loads((first / "results.json").read_text()))
    assert "the source had changed since the earlier attempt" in note and "aaaaaaaaaaaa" in note


def test_an_included_phase_is_reused_with_the_environment_the_including_runbook_adds_stated(tmp_path):
    """h100_single.yaml includes gpu_kernels.yaml: its steps there carry h100_single's defaults env, the one
    difference an include makes; a gpu_kernels run is taken, and the note names what its steps ran without."""
    gk = load_runbook(REPO / "runbooks/gpu_kernels.yaml")
    h1 = load_runbook(REPO / "runbooks/h100_single.yaml")
    phase = gk.phases[0]
    steps = {s.name: {"kind": s.kind, "phase": phase.name, "definition": step_definition(s)} for s in phase.steps}
    record = run_record({"steps": steps, "environment": {"source_digest": DIGEST}, "runbook": {"name": gk.name}})
    record["phases"][0]["name"] = phase.name
    (tmp_path / "results.json").write_text(json.dumps(record))
    taken = reuse.resolve(h1, {"kernels": tmp_path}, [], Path("."), digest=DIGEST)["kernels"]
    assert set(taken.differences) == {f"{k}={v}" for k, v in h1.defaults.env.items()}
    assert "its steps ran without NSA_PREFILL_BATCHED=1" in taken.note()
    assert taken.record()["differences"] == list(taken.differences)


def test_a_resume_names_the_kept_steps_measured_under_other_settings(cli, tmp_path):
    rb = _runbook(tmp_path, "3.0")
    run_dir = tmp_path / "run"
    proc = cli("run", rb, "--out", run_dir, "--no-report")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rb.write_text(rb.read_text().replace('"3.0"', '"1.0"'))  # edited in place: kbench now runs at speed 1.0
    proc = cli("run", rb, "--resume", run_dir, "--rerun", "rbench")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert 'kept step(s) measured under other settings' in proc.stderr
    assert 'kbench (launches[0].argv[3]: "1.0" here, "3.0" there)' in proc.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["resumes"][-1]["kept_changed"]) == ["kbench"]
    assert results["steps"]["kbench"]["metrics"]["speed"] == 3.0  # kept, as measured
    report = (run_dir / "report.md").read_text()
    assert "kept as measured under other settings than the runbook now gives them: kbench" in report


def test_kept_steps_whose_definition_holds_are_not_named(tmp_path):
    rb_path = _runbook(tmp_path)
    previous = json.loads((_earlier(tmp_path, rb_path) / "results.json").read_text())
    rb = load_runbook(rb_path)
    assert kept_but_changed(rb, previous, []) == {}
    assert list(kept_but_changed(load_runbook(rb_path, ["steps.rbench.timeout_s=9"]), previous, [])) == ["rbench"]
    assert kept_but_changed(load_runbook(rb_path, ["steps.rbench.timeout_s=9"]), previous, ["rbench"]) == {}


def test_compare_names_the_settings_two_runs_did_not_share(tmp_path):
    rb_path = _runbook(tmp_path)
    a = json.loads((_earlier(tmp_path, rb_path) / "results.json").read_text())
    b = json.loads((_earlier(tmp_path, rb_path, ["steps.kbench.timeout_s=5"]) / "results.json").read_text())
    a["runbook"]["sha256"], b["runbook"]["sha256"] = "1" * 64, "2" * 64
    a["environment"].update(git_sha="abc", git_dirty=False)
    b["environment"].update(git_sha="abc", git_dirty=True, source_digest="e" * 64)
    warnings = compare_runs(a, b, tmp_path / "A", tmp_path / "B")["warnings"]
    text = "\n".join(warnings)
    assert "runbook two_phases differs between the runs (sha256 111111111111 vs 222222222222" in text
    assert "different --set: A none; B steps.kbench.timeout_s=5" in text
    assert "step kbench ran other settings: launches[0].timeout_s: 5.0 in B, 60.0 in A" in text
    assert "the source differs at the same git sha" in text
    assert not [w for w in compare_runs(a, a, tmp_path / "A", tmp_path / "A")["warnings"] if "differ" in w]
