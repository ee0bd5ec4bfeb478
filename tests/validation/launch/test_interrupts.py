"""validation.launch.interrupts and the race-free end of a launch (validation.launch.processes), on plain Python
children: no torch, a few seconds in all. The signal handlers and the subreaper are set in child processes, never
in the pytest process itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from process_checks import orphans, pid_alive

from validation.launch import LaunchSpec, launch
from validation.launch.interrupts import Interrupted, describe, exit_code

REPO = Path(__file__).resolve().parents[3]


def run_script(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGHUP, 129), (signal.SIGTERM, 143)])
def test_an_interrupt_carries_its_signal_and_exit_code(sig, code):
    exc = Interrupted(sig)
    assert isinstance(exc, KeyboardInterrupt)
    assert (exc.signum, exc.name, exc.exit_code) == (sig, signal.Signals(sig).name, code)
    assert describe(exc) == signal.Signals(sig).name and exit_code(exc) == code
    assert describe(KeyboardInterrupt()) == "Ctrl-C" and exit_code(KeyboardInterrupt()) == 130


HANDLERS = r"""
import json, os, signal, sys, time
from validation.launch import interrupts
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN   # as a background job of a non-interactive shell
interrupts.install()
seen = []
# raise_signal: delivered to this thread before it returns, and its Python handler runs before the next line, so
# each line below sees the state the signal left (no waiting on the clock)
try:
    with interrupts.deferred():          # held back while a child would be started and recorded
        signal.raise_signal(signal.SIGTERM)
        seen.append("block finished")
    seen.append("not interrupted")
except interrupts.Interrupted as exc:
    seen.append(exc.name)
signal.raise_signal(signal.SIGINT)       # a second signal: no exception, the cleanup goes on, only faster
seen += ["hurry" if interrupts.hurry() else "no hurry", interrupts.received()]
print(json.dumps(seen), flush=True)
signal.raise_signal(signal.SIGHUP)       # a third: nsa-validate goes at once, by the signal itself
time.sleep(20)                           # a safety net only: the process is gone before this line runs
print("still alive", flush=True)
"""


def test_signals_raise_once_are_held_while_a_child_is_started_and_a_third_ends_the_process():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", HANDLERS], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines = proc.stdout.splitlines()
    assert lines and json.loads(lines[0]) == ["block finished", "SIGTERM", "hurry", int(signal.SIGTERM)], \
        proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGHUP and "still alive" not in proc.stdout


# A launcher that is killed (SIGKILL, as nsa-validate's parent-death signal kills a torchrun agent) right after
# it started a worker in a session of its own, with an environment that does not carry the launch's id, and that
# ignores SIGTERM: neither the process tree (by parent, group, session) nor the environment search can find it
# once its parent is gone. As a subreaper, the orchestrator still has it below itself.
ORPHAN = r"""
import json, os, signal, subprocess, sys, time
from validation.launch.processes import become_subreaper, descendants, end_descendants
assert become_subreaper()
middle = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys
w = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
                     start_new_session=True, env={"PATH": "/usr/bin:/bin"})
print(w.pid, flush=True)
import time; time.sleep(600)
'''], stdout=subprocess.PIPE, text=True)
worker = int(middle.stdout.readline())
middle.kill(); middle.wait()
deadline = time.time() + 10
while time.time() < deadline and worker not in descendants():
    time.sleep(0.05)
ppid = int(open(f"/proc/{worker}/stat").read().rsplit(")", 1)[1].split()[1])
found = end_descendants(grace_s=0.5)
gone = not os.path.exists(f"/proc/{worker}")   # reaped too: not even a zombie is left
print(json.dumps({"me": os.getpid(), "worker": worker, "ppid": ppid, "found": found, "gone": gone}), flush=True)
"""


def test_an_orphan_without_the_launch_id_is_reparented_to_the_orchestrator_and_swept(reliability):
    proc = run_script(ORPHAN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["ppid"] == got["me"], "the orphan went to PID 1, not to the subreaper"
    assert got["worker"] in got["found"] and got["gone"]
    assert orphans([got["worker"]], timeout=1) == []


# A root that, when asked to stop, starts one more process (like a torchrun agent still starting its workers)
# and then ignores further requests. The late process must get its own SIGTERM during the grace period (it writes
# a file when it does), not only the SIGKILL at its end. It starts with SIGTERM blocked, so one that arrives
# before its handler is installed waits for it instead of ending it unseen. The root ends once the late process
# has ended, so the launch ends on states (the late process handled its SIGTERM, then the root went), however long
# the late process takes to start: the grace period is only a safety net, never the thing waited for.
LATE = r"""
import os, signal, subprocess, sys, time
marker = sys.argv[1]
def on_term(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    late = subprocess.Popen([sys.executable, "-c", f'''
import signal, sys, time
def bye(s, f):
    open({marker!r}, "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("LATE", flush=True)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
time.sleep(600)
'''], start_new_session=True, preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))
    late.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("READY", flush=True)
time.sleep(600)
"""


def _end_when_ready(tmp_path: Path, script: str, term_grace_s: float) -> str:
    """Launch `script` (it prints READY, then on SIGTERM starts a late process that writes "SIGTERM" into the marker
    file when it gets its own), interrupt the launch once READY is in its log; the log, checked: the late process
    ran, got its SIGTERM before any SIGKILL, and nothing is left. term_grace_s: a safety net for a launcher that
    never signals the late process (then the SIGKILL ends both, and the test fails after it)."""
    marker = tmp_path / "late_got_sigterm"
    state = {}

    def on_progress(p):
        if "READY" in (tmp_path / "step" / "stdout.log").read_text() and not state:
            state["sent"] = True
            raise KeyboardInterrupt

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    spec = LaunchSpec(argv=[sys.executable, "-c", script, str(marker)], env=env, cwd=REPO, step_dir=tmp_path / "step",
                      timeout_s=600, poll_s=0.1, term_grace_s=term_grace_s, on_progress=on_progress)
    with pytest.raises(KeyboardInterrupt):
        launch(spec)
    log = (tmp_path / "step" / "stdout.log").read_text()
    assert "LATE" in log
    assert marker.is_file() and marker.read_text() == "SIGTERM", \
        "the late process was not asked to stop before the SIGKILL"
    assert "processes ended (SIGTERM)" in log, log[-2000:]  # every process went on its SIGTERM: none was killed
    assert not any(pid_alive(p) for p in orphans(cmdline_contains=str(marker), timeout=2))
    return log


def test_a_process_started_while_the_launch_is_being_ended_gets_sigterm_too(tmp_path):
    _end_when_ready(tmp_path, LATE, term_grace_s=120.0)


# The same late process, with the window in which a SIGTERM is lost held open: the child of fork runs with its
# parent's dispositions (here SIGTERM ignored) until it calls exec, so the SIGTERM the launcher sends it as a new
# member is discarded. In CI on a loaded machine that window was long enough for the test above to lose its
# SIGTERM (then the late process ran until the SIGKILL at the end of the grace period). After exec it runs another
# program, which the launcher must see as one never asked to stop: it blocks SIGTERM across exec, so the second
# request waits for its handler.
FORK_THEN_EXEC = r"""
import os, signal, sys, time
marker = sys.argv[1]
LATE = '''
import signal, sys, time
def bye(s, f):
    open(sys.argv[1], "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("LATE", flush=True)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
time.sleep(600)
'''
def on_term(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        time.sleep(1.5)  # between fork and exec: the launcher's SIGTERM to this new member is ignored
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        os.execv(sys.executable, [sys.executable, "-c", LATE, marker])
    os.waitpid(pid, 0)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("READY", flush=True)
time.sleep(600)
"""


def test_a_process_that_calls_exec_after_its_sigterm_is_asked_again(tmp_path):
    _end_when_ready(tmp_path, FORK_THEN_EXEC, term_grace_s=30.0)


# validation.launch.session.guarded, in a child process (it installs the handlers and becomes a subreaper): the
# body's exit code, a process the body left running ended by the final sweep and reported, an interrupt before
# the runner took over turned into its exit code.
GUARDED = r"""
import json, os, subprocess, sys, time
from validation.launch import session
told = {"left": [], "interrupt": None}
def body():
    if sys.argv[1] == "leave":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        time.sleep(0.3)
        return 7
    raise KeyboardInterrupt
code = session.guarded(body, on_interrupt=lambda exc: told.update(interrupt=type(exc).__name__),
                       on_left=lambda pids: told["left"].extend(pids))
print(json.dumps({"code": code, **told}))
"""


@pytest.mark.parametrize("what, code", [("leave", 7), ("interrupt", 130)])
def test_guarded_returns_the_code_and_sweeps_what_the_body_left(what, code):
    proc = run_script(GUARDED, what)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["code"] == code
    if what == "leave":
        assert len(got["left"]) == 1 and not pid_alive(got["left"][0])
    else:
        assert got["interrupt"] == "KeyboardInterrupt" and got["left"] == []
