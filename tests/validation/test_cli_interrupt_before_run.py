"""`nsa-validate run` interrupted before its runner began (while the runbook and the files it names are checked):
the message says nothing was launched or saved and gives the command that starts the run again, so that no one
looks for a run directory to --resume; interrupted once the runner began, it leaves the telling to the runner."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# validation.cli with run_runbook replaced, then the console script's main() on the given argv
STUB = """
import sys
import validation.cli as cli

WHEN = sys.argv[-1]

def stub(request, display, warn, say=None):
    if WHEN == 'began':
        with display():
            raise KeyboardInterrupt
    raise KeyboardInterrupt

cli.run_runbook = stub
sys.argv = ['nsa-validate', *sys.argv[1:-1]]
cli.main()
"""


def _run(tmp_path: Path, when: str) -> subprocess.CompletedProcess:
    out = tmp_path / "run dir"
    return subprocess.run([sys.executable, "-c", STUB, "run", "runbooks/cpu_smoke.yaml", "--out", str(out),
                           "--set", "steps.baseline.args.steps=30", when],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_an_interrupt_before_the_run_began_says_nothing_was_saved_and_how_to_start_again(tmp_path):
    proc = _run(tmp_path, "before")
    assert proc.returncode == 130, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("interrupted (Ctrl-C) before the run began: nothing was launched or saved"), lines
    assert lines[0].endswith(f"run it again with nsa-validate run runbooks/cpu_smoke.yaml --out '{tmp_path}/run dir' "
                             "--set steps.baseline.args.steps=30"), lines
    assert "--resume" not in lines[0]
    assert not (tmp_path / "run dir").exists()


def test_an_interrupt_once_the_run_began_claims_nothing_about_what_was_saved(tmp_path):
    proc = _run(tmp_path, "began")
    assert proc.returncode == 130, proc.stderr
    assert "interrupted (Ctrl-C)" in proc.stderr and "nothing was" not in proc.stderr, proc.stderr
