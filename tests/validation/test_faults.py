"""The fault matrix (runbooks/faults_cpu.yaml) through the real CLI: every injected fault classified truthfully,
healthy steps unaffected, nothing left running; and an orchestrator killed with SIGKILL recovers with --resume."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["COLUMNS"] = "200"
    return env


def _trainer_pids(run_dir: Path) -> list[int]:
    pids = []
    for hb in run_dir.glob("**/heartbeat_rank*.jsonl"):
        for line in hb.read_text().splitlines():
            if line.strip():
                pids.append(json.loads(line)["pid"])
    return sorted(set(pids))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_dead(pids, timeout=10.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("faults") / "run"
    with socket.socket() as busy:  # the port_clash step's master port is taken for the whole run
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        busy.bind(("127.0.0.1", 29517))
        busy.listen(1)
        proc = subprocess.run([sys.executable, "-m", "validation.cli", "run", "runbooks/faults_cpu.yaml", "--out",
                               str(run_dir)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    return run_dir, proc


def test_every_fault_is_classified_and_the_run_is_go(fault_run):
    run_dir, proc = fault_run
    results = json.loads((run_dir / "results.json").read_text())
    steps = {n: (s["status"], s["reason"]) for n, s in results["steps"].items()}
    failed = [c for c in results["acceptance"] if c["status"] != "pass"]
    assert not failed, (failed, steps)
    assert proc.returncode == 0 and results["verdict"] == "GO", (results["verdict_reason"], steps)
    assert steps["crash"][0] == "failed" and steps["hang"][0] == "hang" and steps["nan"][0] == "failed"
    assert steps["timeout"][0] == "timeout" and steps["port_clash"][0] == "passed"
    assert "non-finite loss" in steps["nan"][1] and "step 3" in steps["nan"][1]
    # the clash was really met: the first attempt's log is kept next to the successful one
    assert list((run_dir / "port_clash").glob("stdout.attempt1.log"))
    report = (run_dir / "report.md").read_text()
    assert "NSA_FAULT injected crash at step 3 on rank 1" in report and "non-finite loss" in report


def test_no_process_is_left_behind_and_earlier_results_are_intact(fault_run):
    run_dir, _ = fault_run
    pids = _trainer_pids(run_dir)
    assert len(pids) >= 12  # 2 ranks x 6 launches at least
    assert _wait_dead(pids) == []
    results = json.loads((run_dir / "results.json").read_text())
    before = results["steps"]["healthy_before"]
    assert before["status"] == "passed" and before["metrics"]["toks_per_s"]["n"] > 0
    assert (run_dir / before["metrics"]["csv"]).is_file()


def test_sigkill_of_the_orchestrator_then_resume(tmp_path):
    runbook = tmp_path / "rb.yaml"
    runbook.write_text("""\
name: killed
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  env: {NSA_TB_DISABLE: "1"}
  args: {steps: 5, save_every: 100000}
  nproc_per_node: 2
  timeout_s: 120
  stall_timeout_s: 60
  window: 2
  warmup_steps: 1
phases:
  - name: p
    steps:
      - {name: first, kind: train, args: {ddp: 1}}
      - {name: second, kind: train, args: {ddp: 1, steps: 1000000}}
""")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "validation.cli", "run", str(runbook), "--out", str(run_dir)],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        hb = run_dir / "second" / "out" / "heartbeat_rank1.jsonl"
        while time.time() < deadline and not (hb.exists() and '"step"' in hb.read_text()):
            time.sleep(0.2)
        assert hb.exists(), "the second step never started"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # the trainer of the killed run is ended too (it dies with its parent), not left training
    assert _wait_dead(_trainer_pids(run_dir / "second"), timeout=60) == []
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk["steps"]["first"]["status"] == "passed" and on_disk["steps"]["second"]["status"] == "running"
    first_csv = (run_dir / "first" / "out" / "training.csv").stat().st_mtime_ns
    resumed = subprocess.run([sys.executable, "-m", "validation.cli", "run", str(runbook), "--resume", str(run_dir),
                              "--set", "phases.p.steps.second.args.steps=4"], cwd=REPO, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    final = json.loads((run_dir / "results.json").read_text())
    assert final["verdict"] == "GO" and final["steps"]["second"]["status"] == "passed"
    assert (run_dir / "first" / "out" / "training.csv").stat().st_mtime_ns == first_csv
