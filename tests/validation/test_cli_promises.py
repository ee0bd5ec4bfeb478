"""What README.md promises about `nsa-validate` run, plan and compare, on small inputs: a tiny runbook of two bench
steps (one run through the command line, then resumed in-process with validation.run.prepare) and copies of a
committed example's results.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from validation.execution.runner import runbook_file_changed
from validation.run import RunError, RunRequest, compare_run_dirs, load, prepare
from validation.runbook.loader import load_runbook
from validation.runbook.plan import describe, text_lines

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "reports" / "examples" / "cpu_smoke" / "results.json"
WRITE = "import json, sys; open(sys.argv[2], 'w').write(json.dumps({'x': 1}))"
RUNBOOK = f"""name: tiny
phases:
  - name: p1
    steps:
      - {{name: first, kind: bench, command: [-c, {json.dumps(WRITE)}]}}
  - name: p2
    steps:
      - {{name: second, kind: bench, command: [-c, {json.dumps(WRITE)}]}}
acceptance:
  - {{name: second ok, expr: "second.status == 'passed'"}}
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cli):
    """(runbook, run directory) of a finished GO run of the tiny runbook, both steps passed."""
    root = tmp_path_factory.mktemp("tiny")
    runbook = root / "tiny.yaml"
    runbook.write_text(RUNBOOK)
    proc = cli("run", runbook, "--out", root / "run", "--no-report", timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return runbook, root / "run"


@pytest.mark.parametrize("left_out", [{"skip": ("p2",)}, {"only": ("p1",)}])
def test_rerun_of_a_step_its_phase_leaves_out_is_refused(finished, cli, tmp_path, left_out):
    runbook, run = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = (copy / "results.json").read_bytes()
    with pytest.raises(RunError, match=r"--rerun second and phase p2 .*: step second would not run again and its "
                                       r"result in .* would be lost"):
        prepare(RunRequest(runbook=runbook, resume=copy, rerun=("second",), cwd=REPO, **left_out))
    proc = cli("run", runbook, "--resume", copy, "--rerun", "second", "--skip", "p2", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--rerun second and phase p2 skipped (--skip)" in proc.stderr
    assert (copy / "results.json").read_bytes() == before  # the passed step's result is still there


def test_rerun_of_a_step_outside_the_skipped_phase_still_runs(finished):
    runbook, run = finished
    prepared = prepare(RunRequest(runbook=runbook, resume=run, rerun=("first",), skip=("p2",), cwd=REPO))
    assert prepared.options.rerun == ("first",)


def test_resume_with_other_set_does_not_say_the_runbook_file_changed(finished, tmp_path):
    runbook, run = finished
    warnings: list[str] = []
    prepare(RunRequest(runbook=runbook, resume=run, rerun=("first",), overrides=("defaults.timeout_s=100",),
                       cwd=REPO), warn=warnings.append)
    assert any("this resume with --set defaults.timeout_s=100" in w for w in warnings), warnings
    assert not any("changed since" in w for w in warnings), warnings
    edited = tmp_path / "tiny.yaml"  # the same runbook (by name), its file changed
    edited.write_text(RUNBOOK + "description: edited\n")
    warnings.clear()
    prepare(RunRequest(runbook=edited, resume=run, rerun=("first",), cwd=REPO), warn=warnings.append)
    assert any(w.startswith(f"{edited} changed since {run} was started") for w in warnings), warnings


def test_a_resume_with_other_set_is_recorded_as_the_same_runbook_file(finished):
    """The resume record (and the report's resume line) says the runbook changed only when its file did."""
    runbook, run = finished
    previous = json.loads((run / "results.json").read_text())
    same_file = load_runbook(runbook, ["defaults.timeout_s=100"])
    assert same_file.sha256 != previous["runbook"]["sha256"]  # the sha256 covers the --set too
    assert not runbook_file_changed(same_file, previous)
    edited = runbook.parent / "edited.yaml"
    edited.write_text(runbook.read_text() + "description: edited\n")
    assert runbook_file_changed(load_runbook(edited), previous)


def test_compare_names_the_launches_it_could_not_read(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):  # results.json alone: no training.csv beside it
        d.mkdir()
        shutil.copy(EXAMPLE, d / "results.json")
    out, lines = compare_run_dirs(a, b)
    assert not any(r["metric"] == "toks_per_s" for r in out["rows"])
    missing = [w for w in out["warnings"] if "not compared on toks_per_s" in w]
    assert len(missing) == 1, out["warnings"]
    assert missing[0].startswith("19 launches not compared on toks_per_s") and "baseline (A and B)" in missing[0]


def test_plan_header_without_a_description_is_the_name(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(RUNBOOK)
    rb = load(path, [])
    assert text_lines(rb, describe(rb, {}))[0] == ("tiny", "bold")
    path.write_text(RUNBOOK + "description: two steps\n")
    rb = load(path, [])
    assert text_lines(rb, describe(rb, {}))[0] == ("tiny: two steps", "bold")


def test_a_fresh_runs_results_decode_strictly_and_encode_back_unchanged(finished):
    """What a run writes is what the typed records read and write back, key for key: a runbook that declares no
    compare noise has no `compare` key (it was written null, which the record leaves out)."""
    from validation.results.codec import decode, encode
    from validation.results.run import Run

    _, run = finished
    data = json.loads((run / "results.json").read_text())
    assert "compare" not in data["runbook"]
    assert json.dumps(encode(decode(Run, data, "results.json")), sort_keys=True) == json.dumps(data, sort_keys=True)
