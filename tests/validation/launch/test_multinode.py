"""Multi-node torchrun on loopback: two torchrun agents on this machine form one 2-node job (gloo), by c10d
rendezvous and by static node ranks; every node is recorded in env.json; a failing node fails the job with its
traceback and leaves no process behind."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from validation.launch import LaunchSpec, launch

ROOT = Path(__file__).resolve().parents[3]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _spec(tmp_path, rdzv="c10d", steps=5, env=None) -> LaunchSpec:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "nsa.training", "--config", "configs/tiny_cpu.yaml", "--ddp", "1", "--steps",
            str(steps), "--save-every", "100000", "--out-dir", str(out)]
    return LaunchSpec(argv=argv, env={**os.environ, "NSA_TB_DISABLE": "1", "OMP_NUM_THREADS": "1", **(env or {})},
                      cwd=ROOT, step_dir=tmp_path, nproc_per_node=1, nnodes=2, rdzv_backend=rdzv, timeout_s=180,
                      trainer_out_dir=out, stall_timeout_s=120, term_grace_s=5)


@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_two_local_agents_form_one_two_node_job(tmp_path, rdzv):
    result = launch(_spec(tmp_path, rdzv))
    assert result.status == "ok", result.reason
    agents = json.loads((tmp_path / "agents.json").read_text())["agents"]
    assert [a["name"] for a in agents] == ["node0", "node1"]
    flags = [" ".join(a["argv"]) for a in agents]
    if rdzv == "c10d":
        assert all("--rdzv-backend=c10d" in f and "--nnodes=2" in f for f in flags)
        assert len({a["argv"][a["argv"].index(next(x for x in a["argv"] if x.startswith("--rdzv-id")))]
                    for a in agents}) == 1  # one rendezvous id for the job
    else:
        assert "--node-rank=0" in flags[0] and "--node-rank=1" in flags[1]
    env = json.loads((tmp_path / "out" / "env.json").read_text())
    assert env["world_size"] == 2 and env["nnodes"] == 2
    assert sorted(n["node"] for n in env["nodes"]) == ["node0", "node1"]
    for rank in (0, 1):  # both ranks wrote heartbeats and the CSV has every step
        assert (tmp_path / "out" / f"heartbeat_rank{rank}.jsonl").stat().st_size > 0
    rows = (tmp_path / "out" / "training.csv").read_text().splitlines()
    assert len(rows) == 1 + 5
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.reliability
def test_a_failing_node_fails_the_job_with_its_traceback_and_nothing_is_left(tmp_path, reliability):
    result = launch(_spec(tmp_path, steps=50, env={"NSA_FAULT": "crash@3:1"}))
    left = _processes_mentioning(str(tmp_path))
    reliability.record_fault("2-node torchrun: NSA_FAULT crash on node1", "failed", result.status)
    reliability.record_orphans(len(left), 1)
    assert result.status == "failed"
    assert "NSA_FAULT injected crash at step 3 on rank 1" in (result.excerpt or "") + result.reason
    assert left == []


def test_an_agent_killed_is_named_and_its_signal_is_the_jobs_exit_code(tmp_path):
    """node1's agent is killed (SIGKILL: the OOM killer, say) and node0's fails at once because its peer went, both
    before the supervisor's next poll: the log names each with its exit code, and the job's exit code is the
    killed agent's (128 + 9), not its consequence's (1), whatever their order in the list."""
    import subprocess

    gone = tmp_path / "node1.pid"
    node1 = f"import os, pathlib; pathlib.Path({str(gone)!r}).write_text(str(os.getpid())); os.kill(os.getpid(), 9)"
    node0 = ("import pathlib, sys, time\n"
             f"p = pathlib.Path({str(gone)!r})\n"
             "def dead():\n"
             "    try:\n"
             "        pid = int(p.read_text())\n"
             "        return pathlib.Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] == 'Z'\n"
             "    except (OSError, ValueError, IndexError):\n"
             "        return False\n"
             "while not dead():\n"
             "    time.sleep(0.001)\n"
             "sys.exit(1)\n")
    spec = tmp_path / "agents.json"
    spec.write_text(json.dumps({"agents": [{"name": "node0", "argv": [sys.executable, "-c", node0]},
                                           {"name": "node1", "argv": [sys.executable, "-c", node1]}], "grace_s": 5}))
    proc = subprocess.run([sys.executable, "-m", "validation.launch.agents", str(spec)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert "[agents] node1 exited with -9 (killed by SIGKILL)" in proc.stderr, proc.stderr
    assert "[agents] node0 exited with 1" in proc.stderr
    assert proc.returncode == 128 + 9, proc.stderr
