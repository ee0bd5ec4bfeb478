"""A daemon a launch starts by a double fork is re-parented out of the launch's process tree before any sample can
see it there; it still carries the launch's id (LAUNCH_ID_VAR), so the launch's telemetry (TreeProbe: its CPU, RSS,
process count and the GPUs its processes hold) counts it, and a process of another launch is not counted.

Real processes: each root shell double-forks a `sleep` and then waits; every process is ended in a finally block.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
import uuid

from process_checks import cmdline, pid_alive

from validation.contracts import TELEMETRY_COLUMNS
from validation.launch.processes import descendants
from validation.launch.spec import LAUNCH_ID_VAR
from validation.launch.telemetry import Sampler, TreeProbe

# the inner shell starts the daemon in the background and exits at once: the daemon is orphaned (double fork)
DOUBLE_FORK = ("sh -c 'setsid sleep 297 </dev/null >/dev/null 2>&1 & echo $!'; exec sleep 60")


def _start(launch_id: str, procs: list[subprocess.Popen], daemons: list[int]) -> tuple[subprocess.Popen, int]:
    """A root carrying `launch_id` and the pid of the daemon it double-forked (already re-parented); both are added
    to `procs` and `daemons` as soon as they are known, for the cleanup."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), LAUNCH_ID_VAR: launch_id}
    root = subprocess.Popen(["sh", "-c", DOUBLE_FORK], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    procs.append(root)
    daemon = int(root.stdout.readline())
    daemons.append(daemon)
    # ready once the intermediate shell is gone (the root went on to exec its sleep) and the daemon runs its sleep
    deadline = time.monotonic() + 30
    while not (cmdline(root.pid).startswith("sleep 60") and cmdline(daemon).startswith("sleep 297")):
        assert time.monotonic() < deadline, "the double fork did not complete"
        time.sleep(0.02)
    return root, daemon


def _end(procs: list[subprocess.Popen], daemons: list[int]) -> None:
    for pid in daemons:
        if pid_alive(pid) and "sleep 297" in cmdline(pid):  # also while it is still `setsid` before its exec
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_double_forked_daemon_of_the_launch_is_counted_and_another_launchs_is_not():
    procs, daemons = [], []
    try:
        mine, other = uuid.uuid4().hex, uuid.uuid4().hex
        root, daemon = _start(mine, procs, daemons)
        _start(other, procs, daemons)
        assert pid_alive(daemon) and daemon not in descendants(root.pid)  # out of the root's tree by parent pid
        probe = TreeProbe(root.pid, launch_id=mine)
        row = probe.sample()
        assert probe.last_pids == {root.pid, daemon}
        assert row["procs"] == 2
        row = probe.sample()  # the second sample: the same members, the environment not read again
        assert probe.last_pids == {root.pid, daemon} and row["procs"] == 2
    finally:
        _end(procs, daemons)


def test_the_launch_sampler_writes_the_daemon_into_the_process_count(tmp_path):
    procs, daemons = [], []
    try:
        launch_id = uuid.uuid4().hex
        root, daemon = _start(launch_id, procs, daemons)
        sampler = Sampler(tmp_path / "telemetry.csv", root.pid, 0.5, gpus=False, launch_id=launch_id)
        with open(sampler.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(TELEMETRY_COLUMNS))
            writer.writeheader()
            sampler._sample(writer, time.time(), 0.0)
        with open(sampler.path, encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        assert [r["procs"] for r in rows] == ["2"]
        assert sampler.tree.last_pids == {root.pid, daemon}
    finally:
        _end(procs, daemons)
