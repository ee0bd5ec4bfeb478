"""A step `--rerun` names that then does not run after all keeps its earlier result: set back to pending, it was
skipped when a step before it stopped the run (on_failure: stop) or the winner it uses was missing, and what it had
measured was lost (nothing already computed is lost). The resume record names it (not_rerun, with why), the console
says so, and the report's resume line does."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from validation.execution.runner import Reporter
from validation.launch import environment
from validation.results.store import read_results
from validation.run import RunRequest, not_run, prepare, run_runbook

REPO = Path(__file__).resolve().parents[2]


def _runbook(tmp_path: Path) -> tuple[Path, Path]:
    """Steps `one` (on_failure: stop; fails while the file `broken` exists) and `two` (writes its figure, a count
    of its runs), two bench steps of a fraction of a second."""
    broken, count = tmp_path / "broken", tmp_path / "count"

    def step(name: str, code: str, extra: str = "") -> str:
        return f"      - {{name: {name}, kind: bench, command: [-c, {json.dumps(code)}]{extra}}}\n"

    one = (f"import json, os, sys\nif os.path.exists({str(broken)!r}): sys.exit('broken')\n"
           "open(sys.argv[2], 'w').write(json.dumps({'x': 1}))")
    two = (f"import json, pathlib, sys\np = pathlib.Path({str(count)!r})\nn = int(p.read_text() if p.exists() else 0) + 1\n"
           "p.write_text(str(n))\nopen(sys.argv[2], 'w').write(json.dumps({'runs': n}))")
    path = tmp_path / "rb.yaml"
    path.write_text("name: keep\nphases:\n  - name: p\n    steps:\n" + step("one", one, ", on_failure: stop")
                    + step("two", two))
    return path, broken


class _Seen(Reporter):
    """The step results the runner shows as each step ends (what the console prints)."""

    def __init__(self):
        self.finished: dict[str, dict] = {}

    def step_finished(self, step, result) -> None:
        self.finished[step.name] = dict(result)


def test_a_rerun_step_that_a_stop_keeps_from_running_keeps_its_earlier_result(tmp_path):
    runbook, broken = _runbook(tmp_path)
    run_dir = tmp_path / "run"
    first = run_runbook(RunRequest(runbook=runbook, out=run_dir, cwd=REPO)).results
    assert first["steps"]["two"]["status"] == "passed" and first["steps"]["two"]["metrics"]["runs"] == 1

    broken.touch()  # `one` now fails, and stops the run before `two`
    seen = _Seen()

    @contextmanager
    def display():
        yield seen

    after = run_runbook(RunRequest(runbook=runbook, resume=run_dir, rerun=("one", "two"), cwd=REPO), display).results
    assert after["steps"]["one"]["status"] == "failed"
    two = after["steps"]["two"]
    assert two == first["steps"]["two"]  # what it measured is still there, as measured
    assert read_results(run_dir)["steps"]["two"] == first["steps"]["two"]
    (entry,) = after["resumes"]
    assert list(entry["not_rerun"]) == ["two"] and "one" in entry["not_rerun"]["two"]
    assert "one" not in entry["not_rerun"]
    shown = seen.finished["two"]  # the console says it was skipped, and that its earlier result stays
    assert shown["status"] == "skipped" and shown["reason"].startswith("not run again (")
    assert shown["reason"].endswith("its earlier result (passed) kept")
    report = (run_dir / "report.md").read_text()
    assert "two not run again (" in report and "its earlier result (passed) kept" in report



def test_a_rerun_step_this_machine_cannot_run_keeps_its_result_and_the_dry_run_says_so(tmp_path, monkeypatch):
    runbook, _ = _runbook(tmp_path)
    run_dir = tmp_path / "run"
    first = run_runbook(RunRequest(runbook=runbook, out=run_dir, cwd=REPO)).results
    assert first["steps"]["two"]["status"] == "passed"

    # the machine no longer has what `two` needs (as a GPU step on a machine whose GPU went away)
    monkeypatch.setattr(environment, "unmet_for",
                        lambda step, env: "needs 8 GPU(s), this machine has 0" if step.name == "two" else None)
    request = RunRequest(runbook=runbook, resume=run_dir, rerun=("two",), cwd=REPO)
    planned = not_run(prepare(request, lambda message: None))  # what `run --dry-run` shows
    assert planned["two"] == "needs 8 GPU(s), this machine has 0; its earlier result (passed) is kept"
    after = run_runbook(request).results
    assert after["steps"]["two"] == first["steps"]["two"]
    assert after["resumes"][-1]["not_rerun"] == {"two": "needs 8 GPU(s), this machine has 0"}


def test_a_rerun_step_an_interrupt_came_before_keeps_its_earlier_result_and_is_named_to_run_again(tmp_path):
    """`--resume --rerun one --rerun two`, Ctrl-C once `one` has run again, before `two` starts: `two` was set back
    to pending at the start and its measured result lost; it keeps it (not_rerun says the interrupt came first), and
    the command printed to continue runs it again (--rerun two)."""
    runbook, _ = _runbook(tmp_path)
    run_dir = tmp_path / "run"
    first = run_runbook(RunRequest(runbook=runbook, out=run_dir, cwd=REPO)).results

    class Interrupting(Reporter):
        def step_finished(self, step, result) -> None:
            if step.name == "one":
                raise KeyboardInterrupt  # as a Ctrl-C between the two steps

    @contextmanager
    def display():
        yield Interrupting()

    request = RunRequest(runbook=runbook, resume=run_dir, rerun=("one", "two"), cwd=REPO)
    outcome = run_runbook(request, display)
    assert outcome.interrupted is not None
    saved = read_results(run_dir)
    assert saved["steps"]["two"] == first["steps"]["two"]  # what it measured is still there
    assert saved["steps"]["one"]["status"] == "passed"
    assert saved["resumes"][-1]["not_rerun"] == {"two": "the run was interrupted before it ran again"}
    text = outcome.interrupt_text(request)
    assert "two not reached: its earlier results kept" in text and "--rerun two" in text
    assert "--rerun one" not in text  # it ran again: a plain --resume keeps its new result
