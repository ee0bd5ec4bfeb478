"""validation.run.run_runbook: one call runs a runbook end to end and returns a RunOutcome; it prints nothing
(progress goes to the reporter its display opens, warnings to `warn`) and every invalid request is one RunError.
The CLI's own behaviour over it is covered by test_cli*.py, test_resume_rules.py, test_signals.py and others."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from validation.results.store import read_results
from validation.run import RunError, RunOutcome, RunRequest, run_runbook
from validation.execution.runner import Reporter


def runbook(tmp_path: Path, marks: Path) -> Path:
    """Two tiny bench steps in two phases; each leaves a file in `marks` when it runs."""
    marks.mkdir(exist_ok=True)

    def step(name):
        code = (f"import json, pathlib, sys; pathlib.Path({str(marks / name)!r}).touch(); "
                "open(sys.argv[2], 'w').write(json.dumps({'x': 1}))")
        return f"      - {{name: {name}, kind: bench, command: [-c, {json.dumps(code)}]}}\n"

    path = tmp_path / "rb.yaml"
    path.write_text("name: thin\nphases:\n  - name: a\n    steps:\n" + step("one")
                    + "  - name: b\n    steps:\n" + step("two"))
    return path


class Recorder(Reporter):
    def __init__(self):
        self.events: list[tuple[str, str]] = []

    def run_resumed(self, note):
        self.events.append(("resumed", note))

    def step_finished(self, step, result):
        self.events.append((step.name, result["status"]))


def test_a_run_and_its_resume_come_back_as_outcomes(tmp_path):
    marks, run_dir = tmp_path / "marks", tmp_path / "run"
    path = runbook(tmp_path, marks)
    recorder, warnings = Recorder(), []
    display = lambda: contextlib.nullcontext(recorder)  # noqa: E731
    outcome = run_runbook(RunRequest(path, out=run_dir, cwd=tmp_path), display, warnings.append)
    assert isinstance(outcome, RunOutcome) and outcome.interrupted is None and outcome.run_dir == run_dir
    assert outcome.verdict == "GO" == read_results(run_dir)["verdict"]
    assert recorder.events == [("one", "passed"), ("two", "passed")] and warnings == []
    assert run_dir / "report.md" in outcome.report_paths and all(p.is_file() for p in outcome.report_paths)
    assert sorted(p.name for p in marks.iterdir()) == ["one", "two"]

    for mark in marks.iterdir():
        mark.unlink()
    recorder.events.clear()
    path.write_text(path.read_text() + "# changed\n")
    again = run_runbook(RunRequest(path, resume=run_dir, rerun=("two",), no_report=True, cwd=tmp_path), display,
                        warnings.append)
    assert again.verdict == "GO" and again.report_paths == () and again.run_dir == run_dir
    assert [m.name for m in marks.iterdir()] == ["two"]  # step one kept, step two run again
    assert recorder.events[0][0] == "resumed" and "two run again" in recorder.events[0][1]
    assert recorder.events[1:] == [("two", "passed")]
    assert warnings == [f"{path} changed since {run_dir} was started; finished steps are kept as they are"]


@pytest.mark.parametrize("request_of, message", [
    (lambda p, d: RunRequest(p, out=d, only=("c",)), "no phase 'c' in {path} (phases: a, b)"),
    (lambda p, d: RunRequest(p, out=d, rerun=("one",)), "--rerun needs --resume RUN_DIR: the run whose steps to run "
                                                        "again"),
    (lambda p, d: RunRequest(p, out=d, against=d / "missing"), "--against: "),
    (lambda p, d: RunRequest(p, out=d, overrides=("nope.x=1",)), "nope"),
], ids=["phase", "rerun", "against", "set"])
def test_an_invalid_request_is_one_run_error_and_runs_nothing(tmp_path, request_of, message):
    marks, run_dir = tmp_path / "marks", tmp_path / "run"
    path = runbook(tmp_path, marks)
    with pytest.raises(RunError) as caught:
        run_runbook(request_of(path, run_dir))
    assert message.format(path=path) in str(caught.value) and "\n" not in str(caught.value)
    assert list(marks.iterdir()) == [] and not (run_dir / "results.json").exists()


def test_a_run_directory_holding_a_run_is_refused(tmp_path):
    marks, run_dir = tmp_path / "marks", tmp_path / "run"
    path = runbook(tmp_path, marks)
    run_runbook(RunRequest(path, out=run_dir, only=("a",), no_report=True, cwd=tmp_path))
    with pytest.raises(RunError, match=f"{run_dir} already holds a run: use --resume {run_dir} to continue it"):
        run_runbook(RunRequest(path, out=run_dir, cwd=tmp_path))
    assert [m.name for m in marks.iterdir()] == ["one"]


def test_a_dry_run_makes_the_checks_of_a_run_says_what_would_not_run_and_writes_nothing(tmp_path, monkeypatch):
    """`run --dry-run`: the same checks as a run (prepare), then the plan with each step that would not run and why
    (--skip, --only, its result kept from the run --resume continues); nothing launched, nothing
    written; an invalid request exits 2 naming it, as run does."""
    from typer.testing import CliRunner

    from validation.cli import app

    marks, run_dir = tmp_path / "marks", tmp_path / "run"
    path = runbook(tmp_path, marks)
    monkeypatch.chdir(tmp_path)

    def dry(*args):
        result = CliRunner().invoke(app, ["run", str(path), *map(str, args), "--dry-run"])
        return result.exit_code, result.output

    code, out = dry("--out", run_dir, "--skip", "b")
    assert code == 0 and "a / one (bench)\n" in out and "b / two (bench)  SKIPPED here: phase b skipped (--skip)" in out
    assert f"the run would write {run_dir}" in out and "[-c, " not in out
    assert not run_dir.exists() and list(marks.iterdir()) == []
    code, out = dry("--out", run_dir, "--only", "b")
    assert code == 0 and "a / one (bench)  SKIPPED here: phase a not selected (--only b)" in out
    code, out = dry("--out", run_dir, "--skip", "c")
    assert code == 2 and "no phase 'c' in" in out and not run_dir.exists()

    run_runbook(RunRequest(path, out=run_dir, only=("a",), no_report=True, cwd=tmp_path))
    (marks / "one").unlink()
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    code, out = dry("--out", run_dir)
    assert code == 2 and f"{run_dir} already holds a run" in out
    code, out = dry("--resume", run_dir)
    assert code == 2 and "nothing to resume: the run finished" in out
    code, out = dry("--resume", run_dir, "--rerun", "one")
    assert code == 0 and "a / one (bench)\n" in out and f"the run would continue {run_dir}" in out
    assert f"b / two (bench)  SKIPPED here: its result in {run_dir} is kept (--resume; --rerun two runs it" in out
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before and list(marks.iterdir()) == []


def test_report_write_keeps_the_plots_of_a_copy_without_its_csvs(tmp_path):
    """`report --write` on a run directory copied without its bulky files (reports/examples keep results.json, the
    reports and the plots, not the training.csv files): the plots it cannot draw again stay, as recorded; a plot
    whose PNG is gone too is dropped; a plot drawn again is the new record."""
    import shutil

    from validation.run import kept_plots, report_run

    example = Path(__file__).resolve().parents[2] / "reports" / "examples" / "cpu_smoke"
    run_dir = tmp_path / "run"
    shutil.copytree(example, run_dir)
    before = read_results(run_dir)["plots"]
    assert len(before) > 3 and not list(run_dir.rglob("training.csv"))
    (run_dir / before[0]["path"]).unlink()
    text, written = report_run(run_dir, write=True)
    after = read_results(run_dir)["plots"]
    assert text is None and run_dir / "report.md" in written
    assert after == before[1:]
    assert all((run_dir / p["path"]).is_file() for p in after)
    redrawn = {"title": "new", "path": before[2]["path"], "step": "x"}
    extra = {"title": "extra", "path": "plots/extra.png", "step": "y"}
    assert kept_plots(before, [redrawn, extra], run_dir) == [*before[1:2], redrawn, *before[3:], extra]
