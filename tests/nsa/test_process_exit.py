"""nsa.process.exit_without_teardown, the end of nsa-train's and nsa-validate's processes: the exit status and every
line printed as sys.exit would leave them, the atexit handlers run, and the interpreter's teardown (0.7-0.95 s of a
core with torch loaded) skipped; a thread still running is waited for as sys.exit waits for it.

Each case is a process of its own, with an object only the teardown frees and stdout a pipe (block-buffered:
PYTHONUNBUFFERED unset). The fast path needs torch loaded: where a command itself does not import it, the probe puts
a stand-in into sys.modules (importing torch costs seconds; the condition is only whether it is there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """\
import atexit, sys, threading, time, types

class FreedAtTeardown:
    def __del__(self):
        sys.stderr.write("interpreter teardown\\n")

kept = FreedAtTeardown()
if {torch!r}:
    sys.modules.setdefault("torch", types.ModuleType("torch"))
if {thread!r}:
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread done"))).start()
atexit.register(lambda: print("atexit handler ran"))
print("printed before the end")
{end}
"""


def run_probe(end: str, *args: str, torch: bool = True, thread: bool = False,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """PROBE ending with the code `end` (sys.argv[1:] = args), in a process of its own; `env` added to this one's
    (NSA_* and PYTHONUNBUFFERED left out). torch=False for code that imports the real torch itself."""
    full = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED" and not k.startswith("NSA_")}
    full["PYTHONPATH"] = str(REPO) + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", PROBE.format(torch=torch, thread=thread, end=end), *args], cwd=REPO,
                          env={**full, **(env or {})}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("code,status", [(0, 0), (3, 3), (None, 0), ("'a message'", 1)])
def test_the_status_output_and_atexit_handlers_are_kept_and_the_teardown_skipped(code, status):
    proc = run_probe(f"from nsa.process import exit_without_teardown\nexit_without_teardown({code})")
    assert proc.returncode == status, proc.stderr
    assert proc.stdout.splitlines() == ["printed before the end", "atexit handler ran"]
    assert "interpreter teardown" not in proc.stderr
    assert ("a message" in proc.stderr) == (status == 1) and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("torch,thread", [(False, False), (True, True)], ids=["no-torch", "thread-running"])
def test_without_torch_or_with_a_thread_running_it_is_sys_exit(torch, thread):
    """Without torch the teardown is short, so sys.exit; a thread still running (not a daemon) is waited for, as
    sys.exit waits for it, before the process ends (its line is printed)."""
    proc = run_probe("from nsa.process import exit_without_teardown\nexit_without_teardown(5)", torch=torch,
                     thread=thread)
    assert proc.returncode == 5, proc.stderr
    assert "interpreter teardown" in proc.stderr
    assert ("thread done" in proc.stdout.splitlines()) == thread and "atexit handler ran" in proc.stdout


@pytest.mark.parametrize("args,status,said", [
    (["plan", "runbooks/cpu_smoke.yaml"], 0, "baseline"),
    (["run", "no/such/runbook.yaml"], 2, "no/such/runbook.yaml"),
], ids=["plan-exit-0", "bad-runbook-exit-2"])
def test_nsa_validate_ends_through_it(args, status, said):
    """nsa-validate's main: typer's SystemExit ends the process without the teardown, its status kept."""
    proc = run_probe("sys.argv = ['nsa-validate', *sys.argv[1:]]\nfrom validation.cli import main\nmain()", *args)
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert said in proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "atexit handler ran"
    assert "interpreter teardown" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
