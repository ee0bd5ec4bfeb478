"""How a run ends its processes, counted: every signal that reaches nsa-validate counts (held back or not), and every
process it ends is asked to stop once (SIGTERM), not once per way it can be reached nor once per poll, so that its
own cleanup (a checkpoint, a launched nsa-validate's grace period) is not cut short. Real processes, cleaned up in
a finally; the signal handlers are installed in child processes, never in the pytest process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from process_checks import pid_alive

from validation.launch import processes
from validation.launch.processes import ProcessTree, end_launches

REPO = Path(__file__).resolve().parents[3]


def _python(code: str, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, **kw)


# raise_signal runs the Python handler before the next line, so each line sees what the signals left
HELD_BACK = r"""
import json, signal
from validation.launch import interrupts
seen = {}
assert interrupts.catch_early()          # SIGINT is ignored, as in a background job of a non-interactive shell
signal.raise_signal(signal.SIGINT)       # two kill -INT while nsa-validate starts up
signal.raise_signal(signal.SIGINT)
try:
    interrupts.install()
except interrupts.Interrupted as exc:
    seen["early"] = [exc.name, interrupts.hurry()]
interrupts.reset()
try:
    with interrupts.deferred():          # a SIGTERM, then a SIGINT, while a child is started and recorded
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
except interrupts.Interrupted as exc:
    seen["deferred"] = [exc.name, interrupts.hurry()]
print(json.dumps(seen), flush=True)
interrupts.reset()
with interrupts.deferred():              # three signals: the third ends the process at once, by that signal
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.raise_signal(sig)
print("still alive", flush=True)
"""


def test_every_signal_held_back_counts_the_second_hurries_and_the_third_ends_the_process():
    proc = _python(HELD_BACK, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines = proc.stdout.splitlines()
    assert lines, proc.stderr[-2000:]
    # the first signal is the one raised; the second, held back with it, is a second signal: hurry
    assert json.loads(lines[0]) == {"early": ["SIGINT", True], "deferred": ["SIGTERM", True]}, proc.stderr[-2000:]
    assert "still alive" not in proc.stdout and proc.returncode == -signal.SIGHUP, proc.stderr[-2000:]


# A process that takes its time to clean up after a SIGTERM (as the trainer saves a checkpoint): it counts the
# SIGTERMs it gets until it is done, then writes the count and exits by itself, well within the grace period.
CLEANS_UP = r"""
import signal, sys, time
got = [0]
signal.signal(signal.SIGTERM, lambda s, f: got.__setitem__(0, got[0] + 1))
print("ready", flush=True)
while not got[0]:
    time.sleep(0.01)
time.sleep(0.4)                           # the cleanup
open(sys.argv[1], "w").write(str(got[0]))
"""


def test_ending_a_launch_asks_each_process_once_and_lets_it_finish_its_cleanup(tmp_path):
    launch_id = uuid.uuid4().hex
    count = tmp_path / "sigterms"
    env = {**os.environ, "NSAV_LAUNCH_ID": launch_id}
    child = subprocess.Popen([sys.executable, "-c", CLEANS_UP, str(count)], env=env, stdout=subprocess.PIPE,
                             start_new_session=True)
    try:
        assert child.stdout.readline() == b"ready\n"
        found = end_launches([launch_id], grace_s=20)
        assert found == [child.pid]
        assert count.read_text() == "1"  # one SIGTERM, not one per 50 ms poll of the sweep
        assert child.wait(timeout=5) == 0 and not pid_alive(child.pid)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()


# A launch's root leads its session and group; one child stays in that group, another leads a session of its own.
TREE = r"""
import subprocess, sys, time
ign = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
kids = [subprocess.Popen([sys.executable, "-c", ign], stdout=subprocess.PIPE),
        subprocess.Popen([sys.executable, "-c", ign], stdout=subprocess.PIPE, start_new_session=True)]
for k in kids:
    k.stdout.readline()
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(60)
"""


def _pgrp(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])


def test_a_launched_tree_gets_one_sigterm_per_process(monkeypatch):
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    kids: list[int] = []
    try:
        kids = [int(p) for p in root.stdout.readline().split()]
        tree = ProcessTree(root, uuid.uuid4().hex, time.time())
        members = [root.pid, *kids]
        assert set(members) <= set(tree.refresh())
        groups = {pid: _pgrp(pid) for pid in members}
        assert groups[kids[0]] == root.pid and groups[kids[1]] == kids[1]
        calls: list[tuple[str, int]] = []  # recorded, not sent: nothing changes while the test counts
        monkeypatch.setattr(processes.os, "kill", lambda pid, sig: calls.append(("pid", pid)))
        monkeypatch.setattr(processes.os, "killpg", lambda pgid, sig: calls.append(("group", pgid)))
        sent = tree.signal(signal.SIGTERM)
        reached = {pid: calls.count(("pid", pid)) + calls.count(("group", groups[pid])) for pid in members}
        assert reached == {pid: 1 for pid in members}, calls  # a process group's signal reaches its members too
        assert {pid for pid, _, _ in sent} == set(members)  # each counts as asked: the grace period asks no more
        calls.clear()
        tree.signal(signal.SIGTERM, only_new=sent)
        assert calls == []
    finally:
        monkeypatch.undo()
        for pgid in {root.pid, *kids[1:]}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        root.wait()
        root.stdout.close()
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in kids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(pid_alive(p) for p in kids)


def test_an_interrupt_during_the_first_sigterm_still_ends_the_tree():
    """A Ctrl-C that lands while end_processes sends its first SIGTERM: the tree is still ended (SIGKILL after the
    interrupt) before the interrupt is raised again, as for one during the grace period; it went straight up and
    left the process running."""
    root = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert root.stdout.readline().strip() == "up"
        tree = ProcessTree(root, uuid.uuid4().hex, time.time())
        real = tree.signal
        first = []

        def interrupted(sig, only_new=None):
            if sig == signal.SIGTERM and not first:
                first.append(sig)
                raise KeyboardInterrupt  # as a first Ctrl-C does, raised from inside the signal handler
            return real(sig, only_new=only_new)

        tree.signal = interrupted
        try:
            processes.end_processes(tree, grace_s=5.0)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the interrupt was not raised again")
        assert root.poll() is not None and root.returncode == -signal.SIGKILL
    finally:
        if root.poll() is None:
            os.killpg(root.pid, signal.SIGKILL)
            root.wait()
        root.stdout.close()
