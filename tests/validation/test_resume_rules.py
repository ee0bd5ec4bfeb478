"""No run is ever overwritten, and a run cut off at any point never shows a verdict that contradicts its reason.

Real run directories, made by `nsa-validate run` with a runbook of two bench steps that take a fraction of a second
(each leaves a mark file when it runs; step `two` waits while a hold file exists, so a test can catch it
running):

- `--resume` of a run of another runbook (by name): exit 2 naming both, nothing run, nothing rewritten;
- `--resume` of a finished run: exit 2 "nothing to resume", unless `--rerun STEP` names steps to run again (each
  name checked: exit 2 naming it and the known steps); `--rerun` without `--resume`: exit 2;
- `--rerun two` runs only `two`, and results.json and the report say what was resumed, when and what it replaced;
- a runbook of the same name that changed warns, and runs only its new step;
- an orchestrator SIGKILLed during a resume leaves results.json INCOMPLETE with a reason that says so (never the
  earlier "... every required criterion holds") and no acceptance rows of the earlier attempt, and reports that say the
  same; a second resume finishes it and the report lists both resumes;
- a SIGTERM after a resume saved its verdict, while the plots are made, leaves the reports rendered from that
  results.json (never the earlier run's);
- piped (no terminal), a line is printed and flushed when a step starts, while it runs, and when it ends, with its
  elapsed time.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from validation.launch import interrupts
from validation.report import plots, render
from validation.results.store import RESULTS_JSON, read_results
from validation.run import RunRequest, run_runbook

REPO = Path(__file__).resolve().parents[2]


def write_runbook(path: Path, marks: Path, hold: Path, name: str = "resumable", extra_step: str = "") -> Path:
    marks.mkdir(exist_ok=True)

    def step(step_name: str, wait: bool) -> str:
        code = ("import json, os, pathlib, sys, time\n"
                + (f"while os.path.exists({str(hold)!r}): time.sleep(0.05)\n" if wait else "")
                + f"pathlib.Path({str(marks / step_name)!r}).touch()\n"
                + "open(sys.argv[2], 'w').write(json.dumps({'x': 1}))")
        return f"      - {{name: {step_name}, kind: bench, command: [-c, {json.dumps(code)}]}}\n"

    path.write_text(f"name: {name}\nphases:\n  - name: p\n    steps:\n" + step("one", False) + step("two", True)
                    + (step(extra_step, False) if extra_step else "")
                    + "acceptance:\n  - {name: one ran, expr: \"one.status == 'passed'\"}\n")
    return path


@pytest.fixture(scope="module")
def finished(cli, tmp_path_factory):
    """A finished GO run of the runbook `resumable` (copied per test by `case`)."""
    root = tmp_path_factory.mktemp("finished")
    runbook = write_runbook(root / "rb.yaml", root / "marks", root / "hold")
    proc = cli("run", runbook, "--out", root / "run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "run"


@pytest.fixture
def case(tmp_path, finished):
    """(runbook, run_dir, marks, hold): a copy of the finished run, its runbook (unchanged), its marks folder
    emptied and no hold file."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    root = finished.parent
    marks, hold = root / "marks", root / "hold"
    for mark in marks.iterdir():
        mark.unlink()
    hold.unlink(missing_ok=True)
    return root / "rb.yaml", run_dir, marks, hold


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in (RESULTS_JSON, "report.md", "report.html", "junit.xml")}


def error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_resume_with_another_runbook_exits_2_naming_both_and_changes_nothing(cli, case, tmp_path):
    _, run_dir, marks, hold = case
    other = write_runbook(tmp_path / "other.yaml", marks, hold, name="other")
    before = snapshot(run_dir)
    proc = cli("run", other, "--resume", run_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = error_line(proc)
    assert line.startswith(f"nsa-validate: error: --resume {run_dir}: it holds a run of runbook 'resumable'")
    assert "not of 'other'" in line and str(other) in line
    assert snapshot(run_dir) == before and not list(marks.iterdir())


def test_resume_of_a_finished_run_exits_2_nothing_to_resume(cli, case):
    runbook, run_dir, marks, _ = case
    before = snapshot(run_dir)
    proc = cli("run", runbook, "--resume", run_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = error_line(proc)
    assert f"--resume {run_dir}: nothing to resume: the run finished (GO, " in line
    assert "--rerun STEP (steps: one, two)" in line
    assert snapshot(run_dir) == before and not list(marks.iterdir())


@pytest.mark.parametrize("args, expected", [
    (["--rerun", "three"], "nsa-validate: error: --rerun three: no step 'three' in {runbook} (steps: one, two)"),
    (["--rerun", "two", "--rerun", "thre"], "nsa-validate: error: --rerun thre: no step 'thre' in {runbook} "
                                            "(steps: one, two)"),
], ids=["unknown", "one-of-two-unknown"])
def test_rerun_of_an_unknown_step_exits_2_naming_it_and_the_steps(cli, case, args, expected):
    runbook, run_dir, marks, _ = case
    before = snapshot(run_dir)
    proc = cli("run", runbook, "--resume", run_dir, *args)
    assert proc.returncode == 2 and error_line(proc) == expected.format(runbook=runbook), proc.stderr
    assert snapshot(run_dir) == before and not list(marks.iterdir())


def test_rerun_without_resume_exits_2(cli, case, tmp_path):
    runbook, _, marks, _ = case
    proc = cli("run", runbook, "--out", tmp_path / "new", "--rerun", "two")
    assert proc.returncode == 2
    assert error_line(proc) == "nsa-validate: error: --rerun needs --resume RUN_DIR: the run whose steps to run again"
    assert not (tmp_path / "new").exists() and not list(marks.iterdir())


def test_rerun_runs_only_the_named_step_and_records_the_resume(cli, case):
    runbook, run_dir, marks, _ = case
    before = read_results(run_dir)
    proc = cli("run", runbook, "--resume", run_dir, "--rerun", "two")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in marks.iterdir()) == ["two"]
    after = read_results(run_dir)
    assert after["steps"]["one"] == before["steps"]["one"]
    assert after["steps"]["two"]["status"] == "passed" and after["steps"]["two"]["started"] >= \
        before["steps"]["two"]["started"]
    assert after["verdict"] == "GO" and after["verdict_reason"] == "2 step(s) passed and every required criterion holds"
    (entry,) = after["resumes"]
    assert entry["steps"] == ["two"] and entry["rerun"] == ["two"] and entry["runbook_changed"] is False
    assert entry["previous_state"] == "finished (GO)" and entry["previous_end"] == before["finished"]
    assert entry["replaced"]["two"]["status"] == "passed"
    assert entry["replaced"]["two"]["started"] == before["steps"]["two"]["started"]
    line = (f"finished (GO) at {before['finished']}, resumed at {entry['at']} with step two run again "
            "(it had passed)")
    assert f"resumed: {line}" in proc.stdout.splitlines()
    assert f"- **Resumed**: {line}" in (run_dir / "report.md").read_text().splitlines()
    assert f"<li><strong>Resumed</strong>: {line}</li>" in (run_dir / "report.html").read_text()


def test_changed_runbook_of_the_same_name_warns_and_runs_only_its_new_step(cli, case, tmp_path):
    _, run_dir, marks, hold = case
    changed = write_runbook(tmp_path / "changed.yaml", marks, hold, extra_step="three")
    proc = cli("run", changed, "--resume", run_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"warning: {changed} changed since {run_dir} was started; finished steps are kept as they are" \
        in proc.stderr.splitlines()
    assert sorted(p.name for p in marks.iterdir()) == ["three"]
    results = read_results(run_dir)
    (entry,) = results["resumes"]
    assert entry["steps"] == ["three"] and entry["runbook_changed"] is True
    # the gained step is in its phase, as the runbook now has it (not among "Other steps")
    assert [p["steps"] for p in results["phases"]] == [["one", "two", "three"]]
    assert "Other steps" not in (run_dir / "report.md").read_text()


def _wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _step_status(run_dir: Path, step: str) -> str | None:
    try:
        return json.loads((run_dir / RESULTS_JSON).read_text())["steps"][step]["status"]
    except (OSError, ValueError, KeyError):
        return None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.reliability
def test_killed_mid_resume_leaves_a_verdict_that_agrees_with_its_reason(cli, case, reliability):
    runbook, run_dir, marks, hold = case
    go = read_results(run_dir)
    assert go["verdict_reason"].endswith("every required criterion holds")
    hold.touch()
    proc = subprocess.Popen([sys.executable, "-m", "validation.cli", "run", str(runbook), "--resume", str(run_dir),
                             "--rerun", "two"], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(lambda: _step_status(run_dir, "two") == "running", "step two running")
        os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator and the step, as a lost machine would
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        hold.unlink(missing_ok=True)
    cut = read_results(run_dir)
    # the reports say what results.json says: rendered again from its first save (never the earlier GO)
    md = (run_dir / "report.md").read_text()
    assert "### Status: INCOMPLETE" in md and cut["verdict_reason"] in md and "criteria hold" not in md
    assert "criteria hold" not in (run_dir / "report.html").read_text()
    agrees = cut["verdict"] == "INCOMPLETE" and cut["verdict_reason"].startswith("not finished")
    reliability.record_fault("nsa-validate SIGKILL mid-resume", "INCOMPLETE, reason: not finished",
                             "INCOMPLETE, reason: not finished" if agrees else
                             f"{cut['verdict']}, reason: {cut['verdict_reason']}")
    assert cut["verdict"] == "INCOMPLETE"
    assert cut["verdict_reason"].startswith("not finished: the run (resumed at "), cut["verdict_reason"]
    assert "criteria hold" not in cut["verdict_reason"]
    assert cut["acceptance"] == [] and cut["recommendations"]["env"] == {}
    assert cut["steps"]["one"] == go["steps"]["one"]
    # continuing it runs the step that was cut off (nothing else) and records both resumes
    proc2 = cli("run", runbook, "--resume", run_dir)
    assert proc2.returncode == 0, proc2.stdout[-3000:] + proc2.stderr[-3000:]
    final = read_results(run_dir)
    reliability.record_results(lost=0 if final["steps"]["one"] == go["steps"]["one"] else 1, checked=1)
    assert final["verdict"] == "GO" and final["steps"]["two"]["status"] == "passed"
    assert sorted(p.name for p in marks.iterdir()) == ["two"]
    first, second = final["resumes"]
    assert first["steps"] == ["two"] and second["steps"] == ["two"] and second["rerun"] == []
    assert second["previous_state"].startswith("stopped without finishing")
    header = next(ln for ln in (run_dir / "report.md").read_text().splitlines() if ln.startswith("- **Resumed**"))
    assert "finished (GO) at" in header and "; then stopped without finishing" in header


def test_sigterm_after_the_verdict_lets_the_reports_finish_from_results_json(case, monkeypatch):
    """A SIGTERM that arrives after a resume saved its verdict, while the plots are being made: the plots and
    report.md, report.html and junit.xml are finished, whole, from the results.json saved (never the earlier run's
    reports; the signal cuts nothing short: validation.launch.interrupts.held), and the outcome is the interrupt."""
    runbook, run_dir, _, _ = case
    earlier = (run_dir / "report.md").read_text()
    assert "Resumed" not in earlier
    real = plots.make_plots
    calls = []

    def interrupted_once(results, where):
        calls.append(results.get("verdict"))
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)  # the handler nsa-validate installs raises Interrupted here
        return real(results, where)

    monkeypatch.setattr(plots, "make_plots", interrupted_once)
    handlers = {sig: signal.getsignal(sig) for sig in interrupts.HANDLED}
    try:
        interrupts.install()
        outcome = run_runbook(RunRequest(runbook=runbook, resume=run_dir, rerun=("two",), cwd=REPO))
    except KeyboardInterrupt as exc:  # (not re-raised: pytest would end the whole session)
        pytest.fail(f"the interrupt ({exc!r}) escaped run_runbook, its reports not written again")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        interrupts.reset()
    assert isinstance(outcome.interrupted, interrupts.Interrupted) and outcome.interrupted.name == "SIGTERM"
    assert outcome.interrupted_after_verdict and outcome.report_error is None
    assert calls == ["GO"]  # the signal came while plotting the saved verdict: the plotting went on to its end
    saved = read_results(run_dir)
    assert saved["verdict"] == "GO" and [e["steps"] for e in saved["resumes"]] == [["two"]]
    for fmt, name in (("md", "report.md"), ("html", "report.html"), ("junit", "junit.xml")):
        assert (run_dir / name).read_text() == render(saved, fmt, run_dir=run_dir), name
    assert "- **Resumed**: finished (GO) at" in (run_dir / "report.md").read_text()


def test_piped_output_prints_a_line_when_each_step_starts_and_ends(case, tmp_path):
    runbook, _, marks, hold = case
    run_dir = tmp_path / "piped"
    hold.touch()  # step two waits until its start line has been read from the pipe
    proc = subprocess.Popen([sys.executable, "-m", "validation.cli", "run", str(runbook), "--out", str(run_dir),
                             "--no-report"], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.time() + 60
        buffer = b""
        while not any(ln.startswith("  STARTED  p / two (bench) at ") for ln in lines):
            assert time.time() < deadline and proc.poll() is None, f"no start line for step two while it runs: {lines}"
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                buffer += os.read(proc.stdout.fileno(), 65536)
                *done, buffer = buffer.split(b"\n")
                lines += [ln.decode() for ln in done]
        assert not (marks / "two").exists()  # the line came while the step was still running
        hold.unlink()
        rest, _ = proc.communicate(timeout=60)
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines += (buffer + rest).decode().splitlines()
    assert proc.returncode == 0, lines
    order = [ln.split()[0] + " " + ln.split()[3] for ln in lines if ln.startswith("  ") and " p / " in ln]
    assert order == ["STARTED one", "PASSED one", "STARTED two", "PASSED two"], lines
    ended = next(ln for ln in lines if ln.startswith("  PASSED   p / two in "))
    took = float(ended.split(" in ")[1].split()[0])
    assert took == pytest.approx(read_results(run_dir)["steps"]["two"]["duration_s"], abs=0.051)
