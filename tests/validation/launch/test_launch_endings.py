"""How a launch on this machine ends, on real short processes: the step's log keeps every byte the child wrote
(undecodable bytes and a last line without a newline included) with the launcher's notes on lines of their own; a
timeout and a Ctrl-C leave no descendant behind (one in a session of its own that ignores SIGTERM included) and
record the exit code and the reason; the run's sentinel names the nsa-validate that is gone. Every test ends what
it started and bounds each wait.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_checks import pid_alive, wait_dead

from validation.launch import LaunchSpec, launch
from validation.launch.diagnosis import NOTE_PREFIX

REPO = Path(__file__).resolve().parents[3]

# the child's helpers: `rec` appends a pid to DIR/pids, `term_ignorer` starts a grandchild in a session of its own
# that ignores SIGTERM (it writes DIR/ignoring once it does) and carries no launch id (a cleared environment)
HELPERS = r'''
import os, signal, subprocess, sys, time
d = sys.argv[1]
def rec(pid):
    with open(d + "/pids", "a") as f:
        f.write(f"{pid}\n")
def term_ignorer():
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1] + '/ignoring', 'w').close(); time.sleep(30)")
    g = subprocess.Popen([sys.executable, "-c", code, d], env={}, start_new_session=True)
    rec(g.pid)
    while not os.path.exists(d + "/ignoring"):
        time.sleep(0.01)
rec(os.getpid())
'''


@pytest.fixture(autouse=True)
def _bounded():
    """Nothing here may hang: a test still running after 15 s fails (SIGALRM) instead of blocking the suite."""
    def expired(signum, frame):
        raise TimeoutError("still running after 15 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(15)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _spec(tmp_path: Path, code: str, **kw) -> LaunchSpec:
    kw.setdefault("timeout_s", 20.0)
    return LaunchSpec(argv=[sys.executable, "-c", HELPERS + code, str(tmp_path)], cwd=tmp_path,
                      step_dir=tmp_path / "step", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                      poll_s=0.05, term_grace_s=0.3, **kw)


def _pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _end(pids: list[int]) -> None:
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def _notes_on_their_own_lines(log: bytes, child_bytes: bytes) -> None:
    """The log is the child's bytes, a newline, then launcher notes only, each a whole line."""
    assert log.startswith(child_bytes + b"\n"), log
    rest = log[len(child_bytes) + 1:]
    assert rest.endswith(b"\n") and rest, log
    for line in rest[:-1].split(b"\n"):
        assert line.startswith(NOTE_PREFIX.encode()), log


def test_a_last_line_without_newline_stays_the_reason_and_the_notes_start_their_own_lines(tmp_path):
    # the child's last words have no newline, and it leaves a process behind: the launcher notes that it ends it
    code = r'''
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
rec(g.pid)
sys.stderr.write("RuntimeError: disk full")
sys.stderr.flush()
sys.exit(3)
'''
    try:
        result = launch(_spec(tmp_path, code))
        assert (result.status, result.returncode) == ("failed", 3)
        assert result.reason == "exit code 3: RuntimeError: disk full"  # not the note that followed on that line
        log = result.log_path.read_bytes()
        _notes_on_their_own_lines(log, b"RuntimeError: disk full")
        assert b"process(es) left behind" in log and log.endswith(b"failed: exit code 3: RuntimeError: disk full\n")
        assert wait_dead(_pids(tmp_path), timeout=2.0) == []
    finally:
        _end(_pids(tmp_path))


def test_a_timeout_keeps_undecodable_bytes_and_ends_a_grandchild_that_ignores_sigterm(tmp_path):
    raw = b"\xff\xfe\x00half a line \x80\x81"
    code = r'''
term_ignorer()
os.write(1, %r)
open(d + "/ready", "w").close()
time.sleep(30)
''' % raw

    def until_ready(progress):  # a slow start-up cannot make the deadline come before the child is set up
        deadline = time.monotonic() + 10
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    try:
        result = launch(_spec(tmp_path, code, timeout_s=1.0, on_progress=until_ready))
        assert result.status == "timeout" and result.returncode in (-signal.SIGTERM, -signal.SIGKILL)
        assert result.reason == "timed out after 1s; processes ended with SIGKILL"  # the grandchild needed it
        _notes_on_their_own_lines(result.log_path.read_bytes(), raw)
        pids = _pids(tmp_path)
        assert len(pids) == 2 and [p for p in pids if pid_alive(p)] == []
    finally:
        _end(_pids(tmp_path))


# nsa-validate in miniature: the signal handlers, the subreaper and the sentinel (session.guarded), one launch
DRIVER = r'''
import os, sys
from pathlib import Path
from validation.launch import LaunchSpec, launch, session
d = Path(sys.argv[1])
spec = LaunchSpec(argv=[sys.executable, "-c", sys.argv[2], str(d)], cwd=d, step_dir=d / "step",
                  env={"PATH": os.environ["PATH"]}, timeout_s=30, poll_s=0.05, term_grace_s=0.3)
def body():
    launch(spec)
    return 0
print("exit", session.guarded(body, on_interrupt=lambda exc: print("interrupted", exc, flush=True)), flush=True)
'''


def test_ctrl_c_ends_every_descendant_and_records_the_exit_code_on_lines_of_their_own(tmp_path):
    code = r'''
term_ignorer()
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
rec(g.pid)
sys.stdout.write("step 7 of 10")
sys.stdout.flush()
open(d + "/ready", "w").close()
time.sleep(30)
'''
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), HELPERS + code], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert (tmp_path / "ready").exists()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0 and out.decode().splitlines()[-2:] == ["interrupted SIGINT", "exit 130"], out
        pids = _pids(tmp_path)
        assert len(pids) == 3 and [p for p in pids if pid_alive(p)] == []
        log = (tmp_path / "step" / "stdout.log").read_bytes()
        _notes_on_their_own_lines(log, b"step 7 of 10")
        assert re.search(rb"processes ended \(SIG(TERM|KILL)\); exit code -(9|15)\n$", log), log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        _end(_pids(tmp_path))


# nsa-validate killed at once after its first launch started: its sentinel may start running only after it is gone
KILLED_AT_ONCE = r'''
import os, signal, subprocess, sys, uuid
from validation.launch import sentinel
from validation.launch.processes import start_ticks
from validation.launch.spec import LAUNCH_ID_VAR
launch_id = uuid.uuid4().hex
child = subprocess.Popen(["sleep", "30"], env={**os.environ, LAUNCH_ID_VAR: launch_id}, start_new_session=True)
print(child.pid, flush=True)
sentinel.enable()
sentinel.watch(launch_id, child.pid, start_ticks(child.pid), 0.2)
os.kill(os.getpid(), signal.SIGKILL)
'''


def test_the_sentinel_names_the_nsa_validate_that_is_gone(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_AT_ONCE], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    child = None
    try:
        out, err = proc.communicate(timeout=10)  # the sentinel holds stderr until it is done
        child = int(out.split()[0])
        assert proc.returncode == -signal.SIGKILL
        assert f"nsa-validate (pid {proc.pid}) is gone: its sentinel ended 1 process(es)" in err.decode(), err
        assert wait_dead([child], timeout=2.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if child is not None:
            _end([child])


def test_a_child_that_exits_while_the_deadline_is_being_acted_on_keeps_its_own_status(tmp_path, monkeypatch):
    """The deadline passes with the child still running; it exits by itself (0) before the launcher has read the
    process table to end it: nothing ended it, so its result is its own exit (ok), not a timeout."""
    from validation.launch import local

    real = local.end_processes

    def after_the_child_exited(tree, grace_s):  # the child's exit lands in the window, widened
        deadline = time.monotonic() + 5
        while pid_alive(tree.root.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return real(tree, grace_s)

    monkeypatch.setattr(local, "end_processes", after_the_child_exited)
    spec = _spec(tmp_path, "time.sleep(0.4)\n")
    step = tmp_path / "step"
    step.mkdir()
    run = local.Run(spec, spec.argv, step / "stdout.log", time.time(), time.monotonic() + 0.1)
    run.execute()
    assert (run.status, run.returncode, run.how_ended) == ("ok", 0, "")


def test_a_stopped_process_gets_to_run_its_sigterm_handler_within_the_grace_period(tmp_path):
    """A child stopped by SIGSTOP (or a Ctrl-Z) got SIGTERM but no SIGCONT: it stayed stopped for the whole grace
    period and was SIGKILLed without its cleanup. It now runs its handler and ends by SIGTERM's request."""
    import uuid

    from validation.launch import processes

    done = tmp_path / "cleaned"
    code = ("import os, signal, sys\n"
            f"def bye(*_):\n    open({str(done)!r}, 'w').write('ok')\n    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)\n"
            "import time\ntime.sleep(30)\n")
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert root.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 5
        while Path(f"/proc/{root.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the child did not stop"
            time.sleep(0.01)
        tree = processes.ProcessTree(root, uuid.uuid4().hex, time.time())
        assert processes.end_processes(tree, grace_s=3.0) == "SIGTERM"
        assert done.read_text() == "ok" and root.returncode == 0
    finally:
        if root.poll() is None:
            root.send_signal(signal.SIGKILL)
            root.wait()
        root.stdout.close()
