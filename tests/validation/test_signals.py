"""Signals to `nsa-validate run` while a 2-rank torchrun run is held at each start-up stage: nothing is left running.

The ranks are held with NSA_FAULT=wait@STAGE[:RANK] (nsa.training.safety.wait_at): each rank writes
out_dir/fault_stage_rank{r}.json at every stage it reaches, so the test knows the stage was reached (and every
rank's pid) before it sends the signal. Stages:

    imports     both ranks just started, before `python -m nsa.training` imports torch (wait@imports)
    pg_before   both ranks before process-group setup (wait@pg_init)
    pg_inside   rank 1 held before process-group setup, rank 0 inside init_process_group waiting for it
                (wait@pg_init:1)
    training    both ranks training (heartbeat steps), no fault

A covering set of stage x signal cases rather than all twelve (each is a real run of a few seconds): every stage
and every signal at least once, SIGTERM and SIGHUP at two stages each, SIGINT to a background run (SIGINT
ignored, as a non-interactive shell's `cmd &` leaves it) and one case through two local torchrun agents
(nnodes 2). One case also has a finished step before the held one and resumes afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_checks import heartbeat_pids, naming, orphans

REPO = Path(__file__).resolve().parents[2]

FAULTS = {"imports": "wait@imports", "pg_before": "wait@pg_init", "pg_inside": "wait@pg_init:1", "training": ""}
CASES = [  # (stage, signal, nnodes)
    ("imports", "SIGTERM", 1),
    ("pg_before", "SIGHUP", 2),
    ("pg_inside", "SIGTERM", 1),
    ("pg_inside", "SIGINT", 1),
    ("training", "SIGHUP", 1),
]


def runbook(tmp_path: Path, stage: str, nnodes: int, first: bool) -> Path:
    nproc = 2 // nnodes
    held = (f"      - {{name: held, kind: train, nnodes: {nnodes}, nproc_per_node: {nproc}, "
            f"env: {{NSA_FAULT: \"{FAULTS[stage]}\"}}}}\n")
    path = tmp_path / "signals.yaml"
    path.write_text(f"""\
name: signals
requirements: {{gpus: 0, backend: gloo}}
defaults:
  config: configs/tiny_cpu.yaml
  env: {{NSA_TB_DISABLE: "1", OMP_NUM_THREADS: "1"}}
  args: {{steps: 1000000, save_every: 1000000, ddp: 1, pg-timeout: 120}}
  timeout_s: 240
  stall_timeout_s: 200
  window: 2
  warmup_steps: 1
phases:
  - name: p
    steps:
{"      - {name: first, kind: train, nproc_per_node: 1, args: {ddp: 0, steps: 2}}" + chr(10) if first else ""}{held}""")
    return path


def stage_reached(out: Path, stage: str) -> dict[int, dict] | None:
    """{rank: marker} once both ranks show the stage (training: a step heartbeat from each rank), else None."""
    if stage == "training":
        recs = {}
        for r in (0, 1):
            path = out / f"heartbeat_rank{r}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            steps = [json.loads(x) for x in lines if '"msg": "step"' in x or '"msg":"step"' in x]
            if not steps:
                return None
            recs[r] = {"pid": steps[-1]["pid"], "step": steps[-1]["step"]}
        return recs
    want = {"imports": ("imports", "imports"), "pg_before": ("pg_init", "pg_init"),
            "pg_inside": ("pg_init", "pg_init")}[stage]
    marks = {}
    for r in (0, 1):
        try:
            marks[r] = json.loads((out / f"fault_stage_rank{r}.json").read_text())
        except (OSError, ValueError):
            return None
        if marks[r]["stage"] != want[r]:
            return None
    if stage == "pg_inside" and not (marks[1]["waiting"] and not marks[0]["waiting"]):
        return None
    return marks


def rank_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.reliability
@pytest.mark.parametrize("stage, signame, nnodes", CASES, ids=[f"{s}-{g}" + ("-2nodes" if n > 1 else "")
                                                               for s, g, n in CASES])
def test_a_signal_at_each_stage_ends_every_process_of_the_run(tmp_path, reliability, stage, signame, nnodes):
    sig = getattr(signal, signame)
    resume = stage == "pg_inside" and signame == "SIGTERM"
    rb = runbook(tmp_path, stage, nnodes, first=resume)
    run_dir = tmp_path / "run"
    out = run_dir / "held" / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")

    def background():  # a non-interactive shell's `nsa-validate run ... &`: SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "validation.cli", "run", str(rb), "--out", str(run_dir),
                             "--no-report"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=background)
    pids = []
    try:
        deadline = time.monotonic() + 150
        marks = None
        while time.monotonic() < deadline and proc.poll() is None:
            marks = stage_reached(out, stage)
            if marks:
                break
            time.sleep(0.1)
        assert marks, f"stage {stage} never reached: {proc.poll()} {proc.stderr.read() if proc.poll() else ''}"
        pids = sorted(m["pid"] for m in marks.values())
        if stage == "pg_inside":  # rank 0 is inside init_process_group, waiting for rank 1 (not running)
            time.sleep(1.0)
            assert rank_state(pids[0] if marks[0]["pid"] == pids[0] else pids[1]) in ("S", "D")
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in naming(str(run_dir)):  # whatever the test itself must not leave on the machine
            os.kill(pid, signal.SIGKILL)
    results = json.loads((run_dir / "results.json").read_text())
    held = results["steps"]["held"]
    expected = f"exit {128 + sig}, held interrupted ({signame}), no process left"
    left = orphans(pids + heartbeat_pids(out), timeout=5, cmdline_contains=str(run_dir))
    got = f"exit {proc.returncode}, held {held['status']} ({signame if signame in (held['reason'] or '') else held['reason']})"
    got += ", no process left" if not left else f", {len(left)} process(es) left"
    reliability.record_fault(f"{signame} to nsa-validate, 2 ranks at {stage}" + (" (2 nodes)" if nnodes > 1 else ""),
                             expected, got)
    assert proc.returncode == 128 + sig, stdout[-2000:] + stderr[-2000:]
    assert held["status"] == "interrupted" and held["reason"] == f"interrupted ({signame})"
    assert results["verdict"] == "INCOMPLETE" and results["interrupted_by"] == signame
    assert f"interrupted ({signame})" in stderr
    assert not left, f"left running: {left}"
    if resume:  # the finished step is kept; --resume runs only the interrupted one
        assert results["steps"]["first"]["status"] == "passed"
        first = results["steps"]["first"]
        resumed = subprocess.run([sys.executable, "-m", "validation.cli", "run", str(rb), "--resume", str(run_dir),
                                  "--no-report", "--set", "steps.held.args.steps=2", "--set",
                                  'steps.held.env.NSA_FAULT=""'], cwd=REPO, env=env, capture_output=True,
                                 text=True, timeout=240)
        final = json.loads((run_dir / "results.json").read_text())
        reliability.record_results(lost=int(final["steps"]["first"] != first), checked=1)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        assert final["verdict"] == "GO" and final["steps"]["held"]["status"] == "passed"
        assert final["steps"]["first"] == first
