"""Rough edges of `report --against`, `compare` and `run` (--dry-run, an interrupt): a run compared with itself is
said to be one (compare) or refused (report/run --against), an --out on a pseudo-filesystem fails its dry run as the
run would, and an interrupted run says that it writes its reports again before it does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from validation.execution.runner import Reporter
from validation.launch.interrupts import Interrupted
from validation.run import RunError, RunRequest, check_writable, compare_run_dirs, prepare, report_run, run_runbook

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "reports" / "examples" / "cpu_smoke"


@pytest.fixture
def run_and_link(tmp_path):
    """A finished run directory (a copy of the cpu_smoke example) and a symlink to it."""
    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE, run_dir)
    link = tmp_path / "link"
    link.symlink_to(run_dir, target_is_directory=True)
    return run_dir, link


def test_compare_of_one_run_through_two_paths_says_it_compares_the_run_with_itself(run_and_link, tmp_path):
    run_dir, link = run_and_link
    out, lines = compare_run_dirs(run_dir, link)
    assert out["same_run"] is True and out["exit_code"] == 0
    assert any(line.startswith("A and B are the same run") for line in lines), lines
    assert not any("same run" in w for w in out["warnings"])  # the warnings keep naming what differs only
    copy = tmp_path / "copy"  # the same files in another directory: another run, nothing said
    shutil.copytree(EXAMPLE, copy)
    out, lines = compare_run_dirs(run_dir, copy)
    assert out["same_run"] is False and not any("same run" in line for line in lines)


def test_the_compare_command_warns_on_stderr_when_both_sides_are_one_run(run_and_link):
    run_dir, link = run_and_link
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["COLUMNS"] = "200"
    proc = subprocess.run([sys.executable, "-m", "validation.cli", "compare", str(run_dir), f"{link}/."], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr  # still allowed: a probe of the statistics
    said = [line for line in proc.stderr.splitlines() if "one run directory" in line]
    assert len(said) == 1 and said[0].startswith("warning: "), proc.stderr
    assert "A and B are the same run" in proc.stdout


def test_report_against_the_run_itself_is_refused_and_changes_nothing(run_and_link):
    run_dir, link = run_and_link
    before = (run_dir / "results.json").read_bytes()
    for against in (run_dir, link):
        with pytest.raises(RunError, match="itself") as caught:
            report_run(run_dir, fmt="json", against=against)
        assert str(against) in str(caught.value) and "\n" not in str(caught.value)
    assert (run_dir / "results.json").read_bytes() == before
    assert "performance_analysis" not in json.loads(before)


def test_a_resumed_run_against_its_own_directory_is_refused(run_and_link):
    run_dir, link = run_and_link
    request = RunRequest(runbook=REPO / "runbooks" / "cpu_smoke.yaml", resume=run_dir, against=link,
                         rerun=("baseline",), cwd=REPO)
    with pytest.raises(RunError, match=f"--against {link} is {run_dir} itself"):
        prepare(request)


@pytest.mark.skipif(not os.path.isfile("/proc/self/status") or not os.path.isdir("/proc"),
                    reason="needs /proc mounted")
def test_an_out_on_a_pseudo_filesystem_fails_the_check_the_dry_run_makes(tmp_path):
    with pytest.raises(RunError) as caught:
        check_writable(Path("/proc/nsa-validate-out"))
    if os.geteuid() == 0:  # root passes os.access: only a directory really made tells (the run's own error)
        assert str(caught.value) == "cannot write /proc/nsa-validate-out: No such file or directory [ENOENT]"
    else:
        assert str(caught.value).startswith("cannot write /proc")
    check_writable(tmp_path / "a" / "b")  # a real directory passes, and is left as it was
    assert list(tmp_path.iterdir()) == []


def _thin_runbook(tmp_path: Path) -> Path:
    def step(name):
        code = "import json, sys; open(sys.argv[2], 'w').write(json.dumps({'x': 1}))"
        return f"      - {{name: {name}, kind: bench, command: [-c, {json.dumps(code)}]}}\n"

    path = tmp_path / "rb.yaml"
    path.write_text("name: thin\nphases:\n  - name: a\n    steps:\n" + step("one")
                    + "  - name: b\n    steps:\n" + step("two"))
    return path


class _TermBeforeTwo(Reporter):
    """A SIGTERM as step two begins (after step one was saved)."""

    def step_started(self, step, launches):
        if step.name == "two":
            raise Interrupted(signal.SIGTERM)


@pytest.mark.parametrize("no_report", [False, True])
def test_an_interrupted_run_says_it_writes_the_reports_again_before_it_does(tmp_path, no_report):
    run_dir = tmp_path / "run"
    said: list[tuple[str, bool]] = []

    def say(message):
        said.append((message, (run_dir / "report.md").exists()))

    class Shown:
        def __enter__(self):
            return _TermBeforeTwo()

        def __exit__(self, *exc):
            return False

    outcome = run_runbook(RunRequest(_thin_runbook(tmp_path), out=run_dir, cwd=tmp_path, no_report=no_report),
                          Shown, say=say)
    assert outcome.interrupted is not None and (run_dir / "results.json").is_file()
    if no_report:  # results.json only: nothing to wait for, nothing said
        assert said == []
    else:
        assert said == [(f"writing the reports from {run_dir / 'results.json'} ...", False)]
        assert (run_dir / "report.md").is_file()
