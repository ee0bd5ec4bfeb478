"""How a launch retries and stops (validation.launch.attempt, validation.launch.agents), on a stand-in for torchrun:
``spec.wrapper`` runs a tiny Python script in front of the torchrun command line, which records the command line it
got and exits at once, as a torchrun whose port was taken does (or as another failure does). No torch, no training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from validation.launch import LaunchSpec, launch
from validation.launch import attempt as attempt_module
from validation.launch.slurm import SlurmRun

REPO = Path(__file__).resolve().parents[3]

CLASH_LINE = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
              "address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")

# The stand-in torchrun: records its command line (one JSON line per start in $CALLS), prints which port it was given,
# then behaves as $MODE says.
FAKE_TORCHRUN = r"""
import json, os, sys, time
args = sys.argv[1:]
port = next(a.split("=", 1)[1] for a in args if a.startswith(("--master-port=", "--rdzv-endpoint=")))
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps(args) + "\n")
if os.environ.get("STOP_FILE"):
    open(os.environ["STOP_FILE"], "w").close()  # the caller is told to stop while this attempt runs
print("started on", port, flush=True)
mode = os.environ["MODE"]
clash = os.environ["CLASH_LINE"].format(port=port)
if mode == "clash":
    print(clash, file=sys.stderr)
elif mode == "rank_clash":  # a rank's own output (torchrun's tee prefix): the rank failed, not torchrun's port
    print("[default0]:" + clash, file=sys.stderr)
    print("[default0]:Traceback (most recent call last):", file=sys.stderr)
elif mode == "summary_clash":  # the workers ran and one failed: torchrun's failure summary follows
    print(clash, file=sys.stderr)
    print("Root" + " Cause (first observed failure):", file=sys.stderr)  # not in this source: agents print it
elif mode == "error":
    print("RuntimeError: CUDA out of memory", file=sys.stderr)
elif mode == "hang":
    time.sleep(60)
elif mode == "ok":
    sys.exit(0)
sys.exit(1)
"""


def _spec(tmp_path: Path, mode: str, **kw) -> LaunchSpec:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CALLS": str(tmp_path / "calls.jsonl"), "MODE": mode,
           "CLASH_LINE": CLASH_LINE, **kw.pop("extra_env", {})}
    kw.setdefault("torchrun", True)
    kw.setdefault("timeout_s", 60.0)
    kw.setdefault("poll_s", 0.1)
    return LaunchSpec(argv=[sys.executable, "-c", "print('the command')"], env=env, cwd=REPO,
                      step_dir=tmp_path / "step", wrapper=[sys.executable, "-c", FAKE_TORCHRUN], **kw)


def _calls(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _flag(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))


def test_port_clashes_are_retried_at_most_port_retries_times_each_on_a_fresh_port_with_its_own_files(tmp_path):
    given = 29999
    result = launch(_spec(tmp_path, "clash", master_port=given, port_retries=2))
    calls = _calls(tmp_path)
    ports = [int(_flag(c, "master-port")) for c in calls]
    assert result.status == "failed" and result.attempts == 3 == len(calls)  # port_retries + 1 attempts, no more
    assert ports[0] == given and len(set(ports)) == 3 and result.master_port == ports[-1]
    step = tmp_path / "step"
    for n, port in enumerate(ports[:-1], start=1):  # each earlier attempt's output stays in its own file
        text = (step / f"stdout.attempt{n}.log").read_text()
        assert f"started on {port}\n" in text and f"port {port} is in use" in text
        assert sum(f"started on {p}\n" in text for p in ports) == 1
    last = result.log_path.read_text()
    assert result.log_path == step / "stdout.log" and f"started on {ports[-1]}\n" in last
    assert sum(f"started on {p}\n" in last for p in ports) == 1
    cmd = json.loads((step / "command.json").read_text())
    assert cmd["attempt"] == 3 and cmd["master_port"] == ports[-1] and cmd["argv"] == result.argv


def test_a_clash_retried_once_then_a_clean_attempt_is_ok_on_the_second_port(tmp_path):
    # the first attempt clashes (its script says so), the second finds the port free
    script = FAKE_TORCHRUN.replace('mode = os.environ["MODE"]',
                                   'mode = "clash" if len(open(os.environ["CALLS"]).readlines()) == 1 else "ok"')
    spec = _spec(tmp_path, "unused", port_retries=3)
    spec.wrapper = [sys.executable, "-c", script]
    result = launch(spec)
    calls = _calls(tmp_path)
    assert result.status == "ok" and result.attempts == 2 == len(calls)
    assert result.master_port == int(_flag(calls[1], "master-port")) != int(_flag(calls[0], "master-port"))


@pytest.mark.parametrize("mode, kw", [
    ("error", {}),  # a real error (out of memory): a failure, not a clash
    ("rank_clash", {}),  # "address already in use" in a rank's output: the rank failed
    ("summary_clash", {}),  # the workers ran (torchrun's failure summary): never a port clash
    ("hang", {"timeout_s": 0.5, "term_grace_s": 1.0}),  # a timeout
    ("clash", {"torchrun": False}),  # not under torchrun: the command's own words about a port
])
def test_failures_other_than_torchruns_port_clash_are_never_retried(tmp_path, mode, kw):
    spec = _spec(tmp_path, mode, port_retries=3, **kw)
    if not spec.uses_torchrun:  # the command itself prints the clash line
        spec.wrapper = []
        spec.argv = [sys.executable, "-c", FAKE_TORCHRUN, "--master-port=1234"]
    result = launch(spec)
    assert result.attempts == 1 and len(_calls(tmp_path)) == 1
    assert result.status == ("timeout" if mode == "hang" else "failed")
    assert not list((tmp_path / "step").glob("stdout.attempt*.log"))


def test_a_stop_asked_for_while_a_clashing_attempt_runs_starts_no_further_attempt(tmp_path):
    # Launches side by side (validation.execution.runner) are stopped by their on_progress raising. An attempt that
    # clashes before its first poll never calls it: the launch must ask before it starts the next attempt.
    stop = tmp_path / "stop"
    seen = []

    def progress(p):
        seen.append(p)
        if stop.exists():
            raise KeyboardInterrupt

    spec = _spec(tmp_path, "clash", port_retries=3, poll_s=5.0, on_progress=progress,
                 extra_env={"STOP_FILE": str(stop)})
    with pytest.raises(KeyboardInterrupt):
        launch(spec)
    assert len(_calls(tmp_path)) == 1  # no attempt after the stop
    log = (tmp_path / "step" / "stdout.log").read_text()  # the one attempt's log stays the launch's log
    assert "EADDRINUSE" in log and "not retried: interrupted (Ctrl-C to the launcher)" in log
    assert seen and seen[-1].step is None and seen[-1].state == "running"


def test_a_multi_node_launch_at_a_given_rendezvous_endpoint_records_that_port_and_is_not_retried(tmp_path):
    # torchrun_prefix puts the given endpoint on every agent's command line whatever master_port says; a clash
    # there is not retried (every attempt would use the same endpoint)
    result = launch(_spec(tmp_path, "clash", nnodes=2, rdzv_endpoint="127.0.0.1:29777", master_port=29999,
                          port_retries=2))
    calls = _calls(tmp_path)
    assert result.status == "failed" and result.attempts == 1 and len(calls) == 2  # one attempt, two agents
    assert {_flag(c, "rdzv-endpoint") for c in calls} == {"127.0.0.1:29777"}
    assert result.master_port == 29777
    assert json.loads((tmp_path / "step" / "command.json").read_text())["master_port"] == 29777


def test_each_multi_node_retry_gets_a_fresh_port_and_its_own_rendezvous_id(tmp_path):
    result = launch(_spec(tmp_path, "clash", nnodes=2, port_retries=1))
    calls = _calls(tmp_path)
    assert result.status == "failed" and result.attempts == 2 and len(calls) == 4  # two attempts of two agents
    endpoints = [_flag(c, "rdzv-endpoint") for c in calls]
    ids = [_flag(c, "rdzv-id") for c in calls]
    first, second = (endpoints[:2], ids[:2]), (endpoints[2:], ids[2:])
    for eps, rids in (first, second):  # the agents of one attempt form one job
        assert len(set(eps)) == 1 and len(set(rids)) == 1
    assert first[0][0] != second[0][0] and first[1][0] != second[1][0]
    assert second[0][0] == f"127.0.0.1:{result.master_port}"
    for c in calls:  # c10d rendezvous of two nodes, no static node rank
        assert "--nnodes=2" in c and "--rdzv-backend=c10d" in c and not any(a.startswith("--node-rank") for a in c)


def test_a_slurm_jobs_port_clash_is_noted_with_the_jobs_port_not_none(tmp_path, monkeypatch):
    # a Slurm job's port is set inside the job (validation.launch.sbatch.rdzv_port_expr): the launcher has none
    class ClashingJob(SlurmRun):
        def execute(self):
            self.status, self.returncode = "failed", 1
            with open(self.log_path, "a") as f:
                f.write(CLASH_LINE.format(port=29512) + "\n")

    monkeypatch.setattr(attempt_module, "SlurmRun", ClashingJob)
    result = launch(_spec(tmp_path, "clash", launcher="slurm", nnodes=2, port_retries=1))
    assert result.attempts == 2 and result.master_port is None
    note = [line for line in (tmp_path / "step" / "stdout.attempt1.log").read_text().splitlines()
            if "retrying on a fresh port" in line]
    assert len(note) == 1 and "the job's rendezvous port is in use" in note[0] and "None" not in note[0]


AGENTS_DRIVER = r"""
import os, signal, subprocess, sys
from validation.launch import agents
agents.STOP_GRACE_S = 1.0
real = subprocess.Popen
started = []

class Popen(real):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        started.append(self.pid)
        if len(started) == 1:  # the job is told to stop while its agents are being started
            os.kill(os.getpid(), signal.SIGTERM)

agents.subprocess.Popen = Popen
code = agents.main([sys.argv[1]])
print("PIDS", *started, flush=True)
sys.exit(code)
"""


def test_a_signal_while_the_agents_start_reaches_the_agent_being_started_and_no_further_agent_starts(tmp_path):
    marker = tmp_path / "node1_started"
    sleeper = "import time; time.sleep(30)"
    agents = {"agents": [{"name": "node0", "argv": [sys.executable, "-c", sleeper]},
                         {"name": "node1", "argv": [sys.executable, "-c",
                                                    f"open({str(marker)!r}, 'w').close(); {sleeper}"]}],
              "grace_s": 30}
    path = tmp_path / "agents.json"
    path.write_text(json.dumps(agents))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", AGENTS_DRIVER, str(path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert not marker.exists(), proc.stderr  # node1 was never started
    assert "node0 exited with -15 (killed by SIGTERM)" in proc.stderr, proc.stderr  # the signal reached node0
    assert "node1 and the agents after it are not started" in proc.stderr
    assert proc.returncode == 128 + signal.SIGTERM
    pids = [int(p) for p in next(line for line in proc.stdout.splitlines() if line.startswith("PIDS")).split()[1:]]
    assert len(pids) == 1 and not Path(f"/proc/{pids[0]}").exists()
