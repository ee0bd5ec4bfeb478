"""One attempt of a launch on this machine (validation.launch.local.Run), on real processes: a launcher killed while
its child starts, an interrupt while the processes a finished child left behind are ended, a child that ends by
itself as the deadline passes, and commands no process can be started with. Every test ends what it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_checks import cmdline, pid_alive, wait_dead

from validation.launch import LaunchSpec, launch, local, sentinel

REPO = Path(__file__).resolve().parents[3]


def _spec(tmp_path: Path, argv: list[str], **kw) -> LaunchSpec:
    kw.setdefault("env", {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    kw.setdefault("timeout_s", 60.0)
    kw.setdefault("poll_s", 0.05)
    return LaunchSpec(argv=argv, cwd=tmp_path, step_dir=tmp_path / "step", **kw)


def _open_fds() -> list[str]:
    return sorted(os.listdir("/proc/self/fd"))


# nsa-validate (this script) is killed after it forked the child and before the child set its parent-death signal:
# the child, once re-parented, must still end. The window is widened by waiting, in the child, for the launcher to
# be gone before die_with_parent runs. With "installed", nsa-validate's own signal handlers are in place (as in
# `nsa-validate run`): the child starts with them (the one that holds signals back while it is started).
KILLED_WHILE_STARTING = r"""
import os, signal, sys, threading, time
from pathlib import Path
from validation.launch import LaunchSpec, interrupts, local

marker, mode = Path(sys.argv[1]), sys.argv[2]
me = os.getpid()
if mode == "installed":
    interrupts.install()
real = local.die_with_parent

def after_the_launcher_died(*args, **kwargs):
    marker.write_text(str(os.getpid()))
    t0 = time.monotonic()
    while os.getppid() == me and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    real(*args, **kwargs)

local.die_with_parent = after_the_launcher_died

def kill_me():
    while not marker.exists():
        time.sleep(0.01)
    os.kill(me, signal.SIGKILL)

threading.Thread(target=kill_me, daemon=True).start()
step = marker.parent / "step"
spec = LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(60)", str(marker)], cwd=marker.parent,
                  step_dir=step, env={"PATH": os.environ.get("PATH", "")}, timeout_s=60)
step.mkdir()
local.Run(spec, spec.argv, step / "stdout.log", time.time(), time.monotonic() + 60).execute()
"""


@pytest.mark.parametrize("mode", ["installed", "plain"])
def test_a_child_whose_launcher_died_before_its_parent_death_signal_was_set_ends(tmp_path, mode):
    marker = tmp_path / "child.pid"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = subprocess.run([sys.executable, "-c", KILLED_WHILE_STARTING, str(marker), mode], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
    assert launcher.returncode == -signal.SIGKILL, launcher.stderr[-2000:]
    child = int(marker.read_text())
    try:
        assert not wait_dead([child], timeout=5.0), "the launched child outlived its killed launcher"
    finally:
        if pid_alive(child) and str(marker) in cmdline(child):
            os.kill(child, signal.SIGKILL)
            wait_dead([child], timeout=5.0)


# A finished child leaves a process behind (in a session of its own, as a daemon would); that process, when the
# launcher first asks it to stop, sends one Ctrl-C to the launcher (this test process) and goes on running.
LEAVES_ONE_THAT_INTERRUPTS = r"""
import subprocess, sys
code = ("import os, signal, sys, time\n"
        "def once(s, f):\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    os.kill(int(sys.argv[1]), signal.SIGINT)\n"
        "signal.signal(signal.SIGTERM, once)\n"
        "print('PIDS', os.getpid(), flush=True)\n"
        "while True:\n"
        "    time.sleep(0.05)\n")
left = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]], stdout=subprocess.PIPE, text=True,
                        start_new_session=True)
print(left.stdout.readline(), end="", flush=True)
"""


def test_an_interrupt_while_left_behind_processes_are_ended_stops_the_telemetry_and_closes_the_launch(
        tmp_path, monkeypatch):
    samplers, forgotten = [], []

    class Recorded(local.Sampler):
        def start(self):
            samplers.append(self)
            return super().start()

    monkeypatch.setattr(local, "Sampler", Recorded)
    monkeypatch.setattr(sentinel, "forget", forgotten.append)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    spec = _spec(tmp_path, [sys.executable, "-c", LEAVES_ONE_THAT_INTERRUPTS, str(os.getpid())], telemetry_s=30.0,
                 term_grace_s=1.0)
    step = tmp_path / "step"
    try:
        step.mkdir()
        run = local.Run(spec, spec.argv, step / "stdout.log", time.time(), time.monotonic() + 60)
        with pytest.raises(KeyboardInterrupt):
            run.execute()
        left = _pids(step / "stdout.log")
        assert len(left) == 1 and not wait_dead(left, timeout=5.0), "a process left behind still runs"
        assert len(samplers) == 1
        assert not samplers[0]._thread.is_alive(), "the telemetry sampler still runs after the launch raised"
        assert forgotten == [run.launch_id]
        assert run.returncode == 0
        text = (step / "stdout.log").read_text()
        assert "left behind" in text and "interrupted (Ctrl-C to the launcher)" in text
    finally:
        signal.signal(signal.SIGINT, previous)
        for sampler in samplers:
            sampler.stop()
        for pid in _pids(step / "stdout.log"):
            if pid_alive(pid) and "signal.SIGINT" in cmdline(pid):
                os.kill(pid, signal.SIGKILL)


def _pids(log_path: Path) -> list[int]:
    try:
        text = log_path.read_text()
    except OSError:
        return []
    return [int(x) for line in text.splitlines() if line.startswith("PIDS ") for x in line.split()[1:]]


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_a_child_that_exits_by_itself_as_the_deadline_passes_is_not_a_timeout(tmp_path):
    """The child exits with 0 while the launcher is busy between two polls (its caller's progress display), and
    the deadline passes meanwhile: nothing ended it, so its result is its own exit (ok), not a timeout."""
    holder = {}

    def on_progress(progress):  # returns once the child has exited (a zombie not yet reaped) and the deadline passed
        run = holder["run"]
        t0 = time.monotonic()
        while (_state(run.pid) != "Z" or time.monotonic() < run.deadline) and time.monotonic() - t0 < 10:
            time.sleep(0.01)

    spec = _spec(tmp_path, [sys.executable, "-c", "import time; time.sleep(0.3)"], on_progress=on_progress)
    step = tmp_path / "step"
    step.mkdir()
    run = local.Run(spec, spec.argv, step / "stdout.log", time.time(), time.monotonic() + 0.15)
    holder["run"] = run
    run.execute()
    assert (run.status, run.returncode, run.how_ended) == ("ok", 0, "")


@pytest.mark.parametrize("argv, env, culprit", [
    (["echo", "a\0b"], {}, "(argument 1)"),
    (["echo", "x"], {"NSA_BAD": "a\0b"}, "(environment variable 'NSA_BAD')"),
    (["echo", "x"], {"A=B": "1"}, "(environment variable 'A=B')"),
    (["echo", "\ud800"], {}, "(argument 1)"),
])
def test_a_command_no_process_can_be_started_with_is_an_error_result(tmp_path, argv, env, culprit):
    before = _open_fds()
    result = launch(_spec(tmp_path, argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}))
    assert result.status == "error" and result.returncode is None and result.pid is None, result
    assert result.reason.startswith("could not start 'echo'") and result.reason.endswith(culprit), result.reason
    assert f"could not start 'echo' in {tmp_path}" in result.log_path.read_text()
    assert _open_fds() == before


@pytest.mark.parametrize("argv", [["__no_such_program__"], ["/"]])
def test_a_missing_or_unexecutable_program_is_an_error_result_without_open_files(tmp_path, argv):
    before = _open_fds()
    result = launch(_spec(tmp_path, argv))
    assert result.status == "error" and result.returncode is None, result
    assert "could not start" in result.log_path.read_text()
    assert _open_fds() == before

