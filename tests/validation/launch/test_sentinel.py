"""nsa-validate killed with SIGKILL while a `kind: pytest` step runs (validation.launch.sentinel): nothing the step
started outlives it, not pytest's ordinary child, not a child in a session of its own, not a `setsid` daemon; and a
--resume ends what an attempt left running when its sentinel was killed too (the launch ids in command.json).

Each case is one real run of a one-step runbook (a test file that starts three `sleep`s, writes their pids, then
waits) killed once the pids are written: a few seconds each. Every pid is ended in the end, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from process_checks import cmdline, orphans, pid_alive

from validation.launch import sentinel
from validation.launch.processes import end_launches, launch_processes

REPO = Path(__file__).resolve().parents[3]

HOLD = r'''
import json, os, subprocess, time
from pathlib import Path

PIDS = Path(__file__).with_name("pids.json")


def test_hold():
    if PIDS.exists():  # the attempt a --resume runs: nothing to hold
        return
    own_session = subprocess.Popen(["sleep", "301"], start_new_session=True)
    plain = subprocess.Popen(["sleep", "302"])  # in pytest's own process group
    daemon = subprocess.run(["sh", "-c", "setsid sleep 303 </dev/null >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True).stdout.split()[0]
    tmp = PIDS.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pids": [own_session.pid, plain.pid, int(daemon)], "pytest": os.getpid()}))
    tmp.rename(PIDS)
    time.sleep(300)
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "test_hold.py").write_text(HOLD)
    (tmp_path / "rb.yaml").write_text("name: hold\nphases:\n  - name: p\n    steps:\n"
                                      "      - {name: held, kind: pytest, tests: [test_hold.py], timeout_s: 600}\n")
    return tmp_path / "rb.yaml", tmp_path / "run"


def _run(tmp_path: Path, *args: str) -> subprocess.Popen:
    with open(tmp_path / "stderr.log", "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "validation.cli", "run", "rb.yaml", *args], cwd=tmp_path,
                                env=_env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def _held_pids(tmp_path: Path, proc: subprocess.Popen) -> tuple[list[int], int]:
    """The sleeps' pids and pytest's, once the held test wrote them (the run still going)."""
    path = tmp_path / "pids.json"
    deadline = time.monotonic() + 240
    while not path.exists():
        assert proc.poll() is None, (tmp_path / "stderr.log").read_text()
        assert time.monotonic() < deadline, "the held test never wrote its pids"
        time.sleep(0.1)
    data = json.loads(path.read_text())
    return data["pids"], data["pytest"]


def _sentinels(parent: int) -> list[int]:
    """The sentinel processes `parent` started."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and "validation.launch.sentinel" in cmdline(int(name)):
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                found.append(int(name))
    return found


def _end(pids: list[int]) -> None:
    for pid in pids:  # whatever the test found: nothing stays behind
        if pid_alive(pid) and cmdline(pid).startswith("sleep 30"):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.reliability
def test_sigkill_of_nsa_validate_during_a_pytest_step_ends_every_process_it_started(tmp_path):
    _setup(tmp_path)
    proc = _run(tmp_path, "--out", str(tmp_path / "run"))
    pids: list[int] = []
    try:
        pids, pytest_pid = _held_pids(tmp_path, proc)
        watching = _sentinels(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert orphans([*pids, pytest_pid, *watching], timeout=60) == [], (tmp_path / "stderr.log").read_text()
        assert watching, "no sentinel watched the run"
        assert "its sentinel ended" in (tmp_path / "stderr.log").read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        _end(pids)


@pytest.mark.reliability
def test_resume_ends_what_an_attempt_killed_with_its_sentinel_left_running(tmp_path):
    _setup(tmp_path)
    run_dir = tmp_path / "run"
    proc = _run(tmp_path, "--out", str(run_dir))
    pids: list[int] = []
    try:
        pids, _ = _held_pids(tmp_path, proc)
        for pid in _sentinels(proc.pid):  # the sentinel goes first: nothing ends the sleeps now
            os.kill(pid, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert all(pid_alive(p) for p in pids), "the leftovers this test needs are gone already"
        resumed = _run(tmp_path, "--resume", str(run_dir))
        assert resumed.wait(timeout=600) == 0, (tmp_path / "stderr.log").read_text()
        assert orphans(pids, timeout=30) == []
        err = (tmp_path / "stderr.log").read_text()
        ended = re.search(rf"ended \d+ process\(es\) an earlier attempt of {re.escape(str(run_dir))} left running: "
                          r"\[([\d, ]+)\]", err)
        assert ended and set(pids) <= {int(p) for p in ended.group(1).split(",")}, err
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        _end(pids)


def test_the_sentinel_protocol_and_the_search_by_launch_id(tmp_path):
    """What nsa-validate tells the sentinel (a launch started, a launch ended, a normal exit), and the processes a
    launch id finds: one carrying it in its environment, in a session of its own, found and ended; one without it
    left alone."""
    lines = ["+abc 123 456 2.5", "+def 7 -1 10", "-abc", "garbled", "+bad x y z"]
    assert sentinel.parse(lines) == ({"def": (7, None, 10.0)}, False)
    assert sentinel.parse(lines + ["q"])[1] is True
    launch_id = uuid.uuid4().hex  # this test's own: another run of it on the machine has another
    env = {**os.environ, "NSAV_LAUNCH_ID": f"outer,{launch_id}"}
    tagged = subprocess.Popen(["sleep", "304"], env=env, start_new_session=True)
    plain = subprocess.Popen(["sleep", "305"], start_new_session=True)
    try:
        assert set(launch_processes([launch_id])) == {tagged.pid}
        assert end_launches([launch_id], grace_s=5) == [tagged.pid]
        assert not pid_alive(tagged.pid) and pid_alive(plain.pid)  # (end_launches reaped its own child)
    finally:
        for p in (tagged, plain):
            p.kill()
            p.wait()
