"""The life of `nsa-validate run` from start-up to its last report, at the moments a user can catch it: a signal
while nsa-validate starts up, before the run saved anything, during a step, while the reports are being written;
the commands it suggests afterwards (continue, run again, the report's "Next:") being ones the CLI takes and that
run what ran (its --set); and the checks every run and `--dry-run` make before anything is written.

Runs are of tiny `bench` steps (a Python one-liner each, well under a second); the signals are sent by the code under
test itself at the moment wanted (a step that signals nsa-validate, a patched function that raises the signal),
never on a timer. The signal handlers are installed in child processes, never in the pytest process.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validation.cli import app
from validation.results.run import read_run
from validation.results.store import read_results
from validation.run import RunRequest, forget_half_imported, run_runbook

REPO = Path(__file__).resolve().parents[2]
WRITE_JSON = "import json, sys; open(sys.argv[2], 'w').write(json.dumps({'x': 1}))"


def runbook(tmp_path: Path, one: str = WRITE_JSON, two: str = WRITE_JSON) -> Path:
    """Two bench steps in two phases, `one` and `two`, running the given Python one-liners."""
    path = tmp_path / "rb.yaml"
    path.write_text("name: life\nphases:\n"
                    f"  - name: a\n    steps:\n      - {{name: one, kind: bench, command: [-c, {json.dumps(one)}]}}\n"
                    f"  - name: b\n    steps:\n      - {{name: two, kind: bench, command: [-c, {json.dumps(two)}]}}\n")
    return path


# the step signals nsa-validate (its parent) the first time it runs, then waits to be ended
SIGINT_ONCE = ("import os, signal, sys, time, pathlib; mark = pathlib.Path('interrupted-once'); "
               "done = mark.exists(); mark.touch(); "
               "(os.kill(os.getppid(), signal.SIGINT), time.sleep(60)) if not done else None; "
               "open(sys.argv[2], 'w').write('{\"x\": 1}')")


def nsa_validate(tmp_path: Path, *args: str, before: str = "", ignore_sigint: bool = False,
                 ) -> subprocess.CompletedProcess:
    """`nsa-validate ARGS` in a child process, in `tmp_path`, with `before` (Python) run after validation.cli is
    imported and before its main() (to patch a function, or raise a signal); SIGINT ignored as a non-interactive
    shell's background job starts with it, when asked."""
    code = "import sys\nimport validation.cli as cli\n" + textwrap.dedent(before) + \
        "\nsys.argv = ['nsa-validate', *sys.argv[1:]]\ncli.main()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), COLUMNS="200")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600,
                          preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None)


def one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------ signals and reports

# A package whose import a signal cuts short, the way one cut `import matplotlib.style` short: its submodule is
# imported whole and keeps the package object it saw, which the signal leaves half built.
HALF = {
    "__init__.py": "from halfpkg import part\nimport signal\nsignal.raise_signal(signal.SIGINT)\nVALUE = 1\n",
    "part.py": "import halfpkg\n\n\ndef value():\n    return halfpkg.VALUE\n",
}


def half_package(where: Path) -> Path:
    (where / "halfpkg").mkdir(parents=True)
    for name, text in HALF.items():
        (where / "halfpkg" / name).write_text(text)
    return where


def test_a_sigint_while_the_reports_are_written_lets_them_finish_and_exits_130(tmp_path):
    """The SIGINT arrives after the verdict, inside an import the report writing makes: the import and the reports
    finish (the signal is held, not raised inside them), then the run ends as interrupted: 130, every report
    written, no traceback. (Raised there, it left the package half built and the reports written again failed on
    it: `module 'matplotlib' has no attribute 'get_data_path'`, exit 1, no report.)"""
    runbook(tmp_path)
    half_package(tmp_path / "lib")
    proc = nsa_validate(tmp_path, "run", "rb.yaml", "--out", "run", before=f"""
        sys.path.insert(0, {str(tmp_path / 'lib')!r})
        import validation.run as run
        real = run.write_all_reports
        def write_all_reports(run_dir, results, keep_plots=False):
            import halfpkg
            assert halfpkg.part.value() == 1
            return real(run_dir, results, keep_plots)
        run.write_all_reports = write_all_reports
        """)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "interrupted (SIGINT) after the run reached its verdict (GO)" in one_line(out)
    assert all((tmp_path / "run" / name).is_file() for name in ("report.md", "report.html", "junit.xml"))
    assert read_results(tmp_path / "run")["verdict"] == "GO"


def test_an_import_an_interrupt_cut_short_is_forgotten_and_imported_again_whole(tmp_path, monkeypatch):
    """forget_half_imported: the submodule a cut-short import left behind (holding the half-built package) is
    forgotten, so the next import builds both again, whole; modules imported before are kept."""
    where = half_package(tmp_path)
    (where / "halfpkg" / "__init__.py").write_text(
        "from halfpkg import part\nimport os\nif not os.path.exists(os.environ['HALF_DONE']):\n"
        "    open(os.environ['HALF_DONE'], 'w').close()\n    raise KeyboardInterrupt\nVALUE = 1\n")
    monkeypatch.setenv("HALF_DONE", str(tmp_path / "done"))
    monkeypatch.syspath_prepend(str(where))
    before = set(sys.modules)
    try:
        with pytest.raises(KeyboardInterrupt):
            importlib.import_module("halfpkg")
        assert "halfpkg.part" in sys.modules and "halfpkg" not in sys.modules  # what the cut-short import left
        assert forget_half_imported(before) == ["halfpkg.part"]
        halfpkg = importlib.import_module("halfpkg")
        assert halfpkg.part.value() == 1
        assert set(before) <= set(sys.modules)
    finally:
        for name in ("halfpkg", "halfpkg.part"):
            sys.modules.pop(name, None)


def test_reports_that_cannot_be_written_after_an_interrupt_are_one_message_and_the_signal_s_exit_code(tmp_path):
    """A SIGINT during a step, and the reports written again afterwards fail on something the interrupt left (a
    module it cut short): one message naming the error, that results.json is whole and the command that writes the
    reports from it; the exit code is still 130, never a traceback."""
    runbook(tmp_path, one=SIGINT_ONCE)
    proc = nsa_validate(tmp_path, "run", "rb.yaml", "--out", "run", before="""
        import validation.run as run
        def write_all_reports(run_dir, results, keep_plots=False):
            raise AttributeError("module 'matplotlib' has no attribute 'get_data_path'")
        run.write_all_reports = write_all_reports
        """)
    out = one_line(proc.stdout + proc.stderr)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    assert ("the reports could not be written after the interrupt (AttributeError: module 'matplotlib' has no "
            "attribute 'get_data_path'); run/results.json is whole, and `nsa-validate report run --write` writes "
            "them from it") in out
    saved = read_results(tmp_path / "run")
    assert saved["interrupted_by"] == "SIGINT" and saved["steps"]["one"]["status"] == "interrupted"


def test_an_interrupt_before_the_first_save_leaves_nothing_and_says_to_start_again(tmp_path):
    """Ctrl-C after the run directory was made but before its first results.json: the directories the run made
    are removed again, and the message says nothing was saved and how to start again (not `--resume`, which
    would find nothing to continue)."""
    runbook(tmp_path)
    proc = nsa_validate(tmp_path, "run", "rb.yaml", "--out", "new/deeper/run", "--set",
                        "phases.a.steps.one.title=first step", before="""
        import signal
        import validation.launch.environment as environment
        def probe(cwd):
            signal.raise_signal(signal.SIGINT)
        environment.probe = probe
        """)
    out = one_line(proc.stdout + proc.stderr)
    assert proc.returncode == 130, out
    assert ("interrupted (SIGINT) before the run saved anything: nothing was saved (the empty run directory "
            "new/deeper/run was removed); start it again with nsa-validate run rb.yaml --out new/deeper/run --set "
            "'phases.a.steps.one.title=first step'") in out
    assert "--resume" not in out and not (tmp_path / "new").exists()


def test_a_sigint_while_nsa_validate_starts_up_is_kept_not_lost(tmp_path):
    """A background job's SIGINT is ignored until nsa-validate installs its handlers; one that arrives while it
    starts up (here: right after validation.cli was imported) is kept and ends the run before anything runs."""
    runbook(tmp_path)
    proc = nsa_validate(tmp_path, "run", "rb.yaml", "--out", "run", ignore_sigint=True, before="""
        import signal
        signal.raise_signal(signal.SIGINT)
        """)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "interrupted (SIGINT)" in proc.stderr and not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------ suggested commands

def test_the_continue_command_after_an_interrupt_runs_what_ran(tmp_path):
    """The command printed after an interrupt carries the run's --only and --set, shell-quoted; run as printed, it
    continues the run with them and the resume records its own --set."""
    runbook(tmp_path, one=SIGINT_ONCE)
    title = "phases.a.steps.one.title=first step"
    proc = nsa_validate(tmp_path, "run", "rb.yaml", "--out", "my run", "--only", "a", "--set", title, "--no-report")
    out = one_line(proc.stderr)
    assert proc.returncode == 130, out
    again = f"nsa-validate run rb.yaml --resume 'my run' --only a --set '{title}' --no-report"
    assert f"continue with {again}" in out
    resumed = nsa_validate(tmp_path, *shlex.split(again)[1:])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr  # phase b left out again (--only a)
    assert "warning:" not in resumed.stderr  # the same --set: nothing to warn about
    results = read_results(tmp_path / "my run")
    assert results["steps"]["one"]["status"] == "passed" and results["steps"]["two"]["status"] == "skipped"
    assert results["resumes"][-1]["options"] == {"only": ["a"], "skip": [], "set": [title]}
    assert results["steps"]["one"]["title"] == "first step"


def test_a_resume_runs_with_its_own_set_records_it_and_warns_when_it_differs(tmp_path):
    path, run_dir = runbook(tmp_path), tmp_path / "run"
    first = ("phases.a.steps.one.title=first title", "phases.b.steps.two.title=second title")
    run_runbook(RunRequest(path, out=run_dir, overrides=first, no_report=True, cwd=tmp_path))
    warnings: list[str] = []
    run_runbook(RunRequest(path, resume=run_dir, rerun=("one",), no_report=True, cwd=tmp_path), warn=warnings.append)
    results = read_results(run_dir)
    assert results["options"]["set"] == list(first) and results["resumes"][-1]["options"]["set"] == []
    assert results["steps"]["one"]["title"] == "one" and results["steps"]["two"]["title"] == "second title"
    assert (f"{run_dir} last ran with --set 'phases.a.steps.one.title=first title' --set 'phases.b.steps.two.title="
            "second title', this resume with no --set: a resume runs with the --set it is given") in " ".join(warnings)
    run = read_run(results)  # the --set each step ran with last: what a command running it again repeats
    assert run.overrides(["one"]) == [] and run.overrides(["two"]) == list(first) and run.overrides() == []


def test_the_report_s_next_command_is_one_the_cli_takes(tmp_path, monkeypatch):
    """A finished NO-GO run: the conclusion's "Next:" command runs the failed step again into the run (a plain
    --resume of a finished run is refused, exit 2), with the run's --set, its paths shell-quoted; the CLI takes it."""
    path = runbook(tmp_path, two="import sys; sys.exit(1)")
    run_dir = tmp_path / "my runs" / "r 1"
    title = "phases.a.steps.one.title=first step"
    outcome = run_runbook(RunRequest(path, out=run_dir, overrides=(title,), cwd=tmp_path))
    assert outcome.verdict == "NO-GO"
    nxt = next(line for line in (run_dir / "report.md").read_text().splitlines() if line.startswith("Next:"))
    command = re.findall(r"`(nsa-validate run [^`]+)`", nxt)
    assert command == [f"nsa-validate run {shlex.quote(str(path))} --resume {shlex.quote(str(run_dir))} --rerun two "
                       f"--set '{title}'"], nxt
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*shlex.split(command[0])[1:], "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "b / two (bench)\n" in result.output and "its result in" in result.output


# ------------------------------------------------------------------------------------------ checks before a run

@pytest.mark.parametrize("out", ["afile", "afile/run"], ids=["a-file", "under-a-file"])
def test_dry_run_refuses_an_out_the_run_would_refuse(tmp_path, monkeypatch, out):
    """--dry-run --out PATH checks PATH as the run does: a regular file there, or on the way, is exit 2 naming
    it (the message the run itself ends with), and nothing is written."""
    runbook(tmp_path)
    (tmp_path / "afile").write_text("not a directory\n")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for extra in (["--dry-run"], []):
        result = CliRunner().invoke(app, ["run", "rb.yaml", "--out", out, "--no-report", *extra])
        assert result.exit_code == 2, result.output
        assert f"nsa-validate: error: cannot write {out}: Not a directory [ENOTDIR]" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("args, message", [
    (["run", "rb.yaml", "--only", "a", "--skip", "a", "--dry-run"],
     "--only a and --skip a: a phase is either selected or skipped, not both"),
    (["run", "rb.yaml", "--resume", "done", "--out", "elsewhere", "--rerun", "one"],
     "--out elsewhere and --resume done: a resumed run stays in its own directory"),
    (["plan", "/dev/null"], "runbook /dev/null: not a regular file (a device, pipe or socket)"),
    (["plan", "."], "runbook .: not a regular file (a directory)"),
    (["run", ".", "--dry-run"], "runbook .: not a regular file (a directory)"),
    (["list", "--runs", "missing"], "--runs missing: no such directory"),
    (["list", "--runbooks", "rb.yaml"], "--runbooks rb.yaml: not a directory"),
], ids=["only-and-skip", "resume-and-out", "plan-dev-null", "plan-directory", "run-directory", "list-runs",
        "list-runbooks"])
def test_contradictory_or_impossible_input_is_exit_2_naming_it(tmp_path, monkeypatch, args, message):
    path = runbook(tmp_path)
    run_runbook(RunRequest(path, out=tmp_path / "done", no_report=True, cwd=tmp_path))
    monkeypatch.chdir(tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in one_line(result.output)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
