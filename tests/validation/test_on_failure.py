"""on_failure: continue | stop. By default a failed step does not stop the run; with stop, the steps after it are
recorded as skipped with the reason, nothing of theirs runs, and the verdict is computed as usual.

The steps are tiny `bench` steps (a Python one-liner), so each run takes a second or two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation.results.store import read_results
from validation.runbook.loader import RunbookError, load_runbook
from validation.execution.runner import RunOptions, Runner

REPO = Path(__file__).resolve().parents[2]


def bench(name: str, code: str, **extra) -> str:
    """A bench step running `code`; the script gets ["--json", PATH] as sys.argv[1:]."""
    fields = ", ".join([f"name: {name}", "kind: bench", f"command: [-c, {json.dumps(code)}]"]
                       + [f"{k}: {v}" for k, v in extra.items()])
    return "      - {" + fields + "}\n"


def ok(marker: Path) -> str:
    """Code that leaves `marker` behind (so a test can tell it ran) and writes its JSON."""
    return (f"import json, pathlib, sys; pathlib.Path({str(marker)!r}).touch(); "
            "open(sys.argv[2], 'w').write(json.dumps({'x': 1}))")


FAIL = "import sys; sys.exit(3)"


def write_runbook(tmp_path: Path, steps_p1: str, steps_p2: str, defaults: str = "", acceptance: str = "") -> Path:
    path = tmp_path / "rb.yaml"
    path.write_text("name: stopping\n"
                    + (f"defaults:\n{defaults}" if defaults else "")
                    + "phases:\n  - name: p1\n    steps:\n" + steps_p1
                    + "  - name: p2\n    steps:\n" + steps_p2 + acceptance)
    return path


def test_stop_skips_the_remaining_steps_with_the_reason(cli, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    path = write_runbook(
        tmp_path,
        bench("first", ok(marks / "first")) + bench("bad", FAIL, on_failure="stop") + bench("later", ok(marks / "later")),
        bench("last", ok(marks / "last")),
        acceptance="acceptance:\n  - {name: later ran, expr: \"later.status == 'passed'\"}\n")
    run_dir = tmp_path / "run"
    proc = cli("run", path, "--out", run_dir)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = read_results(run_dir)
    steps = results["steps"]
    assert steps["first"]["status"] == "passed" and steps["bad"]["status"] == "failed"
    for name in ("later", "last"):
        assert steps[name]["status"] == "skipped", steps[name]
        assert steps[name]["reason"] == "not run: step bad failed and on_failure is stop"
        assert steps[name]["command"] is None and not (run_dir / name).exists()
    assert sorted(p.name for p in marks.iterdir()) == ["first"]  # nothing after the stop ran
    # the verdict as usual: a required step failed; the criterion on a step that did not run is not evidence
    assert results["verdict"] == "NO-GO" and "bad failed" in results["verdict_reason"]
    assert results["acceptance"][0]["status"] == "skipped"
    assert "not run: step bad failed and on_failure is stop" in (run_dir / "report.md").read_text()


def test_continue_is_the_default(cli, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    path = write_runbook(tmp_path, bench("bad", FAIL) + bench("later", ok(marks / "later")),
                         bench("last", ok(marks / "last")))
    proc = cli("run", path, "--out", tmp_path / "run", "--no-report")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = read_results(tmp_path / "run")["steps"]
    assert [steps[n]["status"] for n in ("bad", "later", "last")] == ["failed", "passed", "passed"]
    assert sorted(p.name for p in marks.iterdir()) == ["last", "later"]


def test_defaults_stop_a_step_may_continue_and_a_timeout_stops(cli, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    path = write_runbook(
        tmp_path,
        bench("tolerated", FAIL, on_failure="continue", optional="true")
        + bench("slow", "import time; time.sleep(60)", timeout_s=1),
        bench("never", ok(marks / "never")),
        defaults="  on_failure: stop\n")
    proc = cli("run", path, "--out", tmp_path / "run", "--no-report")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = read_results(tmp_path / "run")["steps"]
    assert steps["tolerated"]["status"] == "failed" and steps["slow"]["status"] == "timeout"
    assert steps["never"]["status"] == "skipped"
    assert steps["never"]["reason"] == "not run: step slow timed out and on_failure is stop"
    assert not list(marks.iterdir())


def test_resume_after_a_stop_that_was_saved_runs_nothing_more(tmp_path):
    """An interruption between the failed step's save and the skips: --resume still honours the stop."""
    marks = tmp_path / "marks"
    marks.mkdir()
    path = write_runbook(tmp_path, bench("bad", FAIL, on_failure="stop"), bench("later", ok(marks / "later")))
    rb = load_runbook(path)
    run_dir = tmp_path / "run"
    runner = Runner(rb, run_dir, RunOptions(cwd=REPO))
    previous = runner.results
    previous["steps"]["bad"].update(status="failed", reason="exit code 3")  # as saved before an interruption
    results = Runner(rb, run_dir, RunOptions(cwd=REPO), previous=previous).run()
    assert results["steps"]["later"]["status"] == "skipped"
    assert results["steps"]["later"]["reason"] == "not run: step bad failed and on_failure is stop"
    assert not list(marks.iterdir())
    assert read_results(run_dir)["steps"]["later"]["status"] == "skipped"


@pytest.mark.parametrize("where, value, needle", [
    ("step", "halt", "phases[0].steps[0].on_failure: 'halt' is not one of continue, stop"),
    ("step", "true", "phases[0].steps[0].on_failure: must be a string"),
    ("defaults", "abort", "defaults.on_failure: 'abort' is not one of continue, stop"),
])
def test_on_failure_values_are_checked_naming_file_line_and_key(tmp_path, where, value, needle):
    step = bench("a", FAIL, **({"on_failure": value} if where == "step" else {}))
    path = write_runbook(tmp_path, step, bench("b", FAIL),
                         defaults=f"  on_failure: {value}\n" if where == "defaults" else "")
    with pytest.raises(RunbookError) as info:
        load_runbook(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "on_failure" in text)
    assert str(info.value).startswith(f"{path}:{line}: {needle}"), str(info.value)


def test_on_failure_can_be_set_from_the_command_line(tmp_path):
    path = write_runbook(tmp_path, bench("a", FAIL), bench("b", FAIL))
    rb = load_runbook(path, ["defaults.on_failure=stop", "phases.p2.steps.b.on_failure=continue"])
    assert [s.on_failure for s in rb.steps()] == ["stop", "continue"]
    assert [s.on_failure for s in load_runbook(path).steps()] == ["continue", "continue"]
