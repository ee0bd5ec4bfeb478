"""The fault matrix (runbooks/faults_cpu.yaml) through the real CLI: every injected fault (crash, hang, NaN,
timeout, taken port, training.csv missing/empty/cut/garbled) classified truthfully, healthy steps unaffected,
nothing left running; and an orchestrator killed with SIGKILL recovers with --resume. Each test records what it
measured in the reliability figures (tests/reliability_figures.py)."""

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
from process_checks import heartbeat_pids, orphans

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.reliability

# step -> (the status it must end with, text its reason or traceback excerpt must hold)
EXPECTED = {
    "crash": ("failed", "NSA_FAULT injected crash at step 3 on rank 1"),
    "hang": ("hang", "stalled"),
    "nan": ("failed", "non-finite loss on 1 of 2 rank(s) at step 3"),
    "timeout": ("timeout", "timed out after 12s"),
    "port_clash": ("passed", ""),
    "csv_missing": ("failed", "training.csv missing"),
    "csv_empty": ("failed", "training.csv empty"),
    "csv_truncate": ("passed", "the last line was cut off mid-row and left out"),
    "csv_garble": ("failed", "training.csv damaged: 1 unparseable row(s) left out (first at line 4"),
}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["COLUMNS"] = "200"
    return env


def _classified(step: dict, needle: str) -> str:
    """What nsa-validate said about a step, in the form of EXPECTED: its status, and the needle if it said it."""
    said = f"{step['reason'] or ''}\n{step['excerpt'] or ''}"
    return f"{step['status']}: {needle}" if needle in said else f"{step['status']}: {said.strip()[:200]}"


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


def test_every_fault_is_classified_and_the_run_is_go(fault_run, reliability):
    run_dir, proc = fault_run
    results = json.loads((run_dir / "results.json").read_text())
    steps = {n: (s["status"], s["reason"]) for n, s in results["steps"].items()}
    wrong = {}
    for name, (status, needle) in EXPECTED.items():
        got = _classified(results["steps"][name], needle)
        if not reliability.record_fault(f"NSA_FAULT {name}" if name not in ("timeout", "port_clash") else name,
                                        f"{status}: {needle}", got):
            wrong[name] = got
    assert not wrong, wrong
    failed = [c for c in results["acceptance"] if c["status"] != "pass"]
    assert not failed, (failed, steps)
    assert proc.returncode == 0 and results["verdict"] == "GO", (results["verdict_reason"], steps)
    assert steps["crash"][0] == "failed" and steps["hang"][0] == "hang" and steps["nan"][0] == "failed"
    assert steps["timeout"][0] == "timeout" and steps["port_clash"][0] == "passed"
    assert "non-finite loss" in steps["nan"][1] and "step 3" in steps["nan"][1]
    # the hung ranks were asked for their stacks before they were ended, and the report names the crash
    assert results["steps"]["hang"]["stack_dumps"] and "rank 1" in steps["hang"][1], results["steps"]["hang"]
    # the clash was really met: the first attempt's log is kept next to the successful one
    assert list((run_dir / "port_clash").glob("stdout.attempt1.log"))
    report = (run_dir / "report.md").read_text()
    assert "NSA_FAULT injected crash at step 3 on rank 1" in report and "non-finite loss" in report
    for name in ("csv_missing", "csv_empty", "csv_truncate", "csv_garble"):
        assert results["steps"][name]["reason"] in report, name  # every reason reaches the report


def test_training_csv_faults_damaged_the_file_as_declared(fault_run):
    """The csv faults really happened (the verdicts above are about real damage, not a missing run)."""
    run_dir, _ = fault_run
    assert not (run_dir / "csv_missing" / "out" / "training.csv").exists()
    assert (run_dir / "csv_empty" / "out" / "training.csv").stat().st_size == 0
    cut = (run_dir / "csv_truncate" / "out" / "training.csv").read_bytes()
    assert not cut.endswith(b"\n") and cut.count(b"\n") == 8  # header + steps 1-7, then half of step 8's row
    garbled = (run_dir / "csv_garble" / "out" / "training.csv").read_text().splitlines()
    assert garbled[3].startswith("3,xxx") and len(garbled) == 9  # later rows were still written
    for name in ("csv_missing", "csv_empty", "csv_truncate", "csv_garble"):
        status = json.loads((run_dir / name / "out" / "status.json").read_text())
        assert status["status"] == "completed" and status["step"] == 8, (name, status)


def test_no_process_is_left_behind_and_earlier_results_are_intact(fault_run, reliability):
    run_dir, _ = fault_run
    pids = heartbeat_pids(run_dir)
    assert len(pids) >= 2 * 11  # 2 ranks x 11 trainer launches
    assert orphans(pids, cmdline_contains=str(run_dir)) == []
    results = json.loads((run_dir / "results.json").read_text())
    # every step kept a final result, and every file it names is on disk
    expected = [(name, None) for name in results["steps"]] + [
        (name, rel) for name, step in results["steps"].items() for rel in step["artifacts"]]
    lost = [(name, rel) for name, rel in expected
            if (rel is None and results["steps"][name]["status"] not in ("passed", "failed", "hang", "timeout"))
            or (rel is not None and not (run_dir / rel).exists())]
    reliability.record_results(lost=len(lost), checked=len(expected))
    assert not lost, lost
    before = results["steps"]["healthy_before"]
    assert before["status"] == "passed" and before["metrics"]["toks_per_s"]["n"] > 0
    assert (run_dir / before["metrics"]["csv"]).is_file()


def test_sigkill_of_the_orchestrator_then_resume(tmp_path, reliability):
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
    assert orphans(heartbeat_pids(run_dir / "second"), timeout=60, cmdline_contains=str(run_dir)) == []
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk["steps"]["first"]["status"] == "passed" and on_disk["steps"]["second"]["status"] == "running"
    first_csv = (run_dir / "first" / "out" / "training.csv").stat().st_mtime_ns
    resumed = subprocess.run([sys.executable, "-m", "validation.cli", "run", str(runbook), "--resume", str(run_dir),
                              "--set", "phases.p.steps.second.args.steps=4"], cwd=REPO, env=_env(),
                             capture_output=True, text=True, timeout=300)
    final = json.loads((run_dir / "results.json").read_text())
    reliability.record_fault("nsa-validate SIGKILL mid-step", "GO after --resume (exit 0)",
                             f"{final['verdict']} after --resume (exit {resumed.returncode})")
    kept = final["steps"]["first"] == on_disk["steps"]["first"] and \
        (run_dir / "first" / "out" / "training.csv").stat().st_mtime_ns == first_csv
    reliability.record_results(lost=0 if kept else 1, checked=1)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert final["verdict"] == "GO" and final["steps"]["second"]["status"] == "passed"
    assert kept, "the first step's result changed on --resume"
