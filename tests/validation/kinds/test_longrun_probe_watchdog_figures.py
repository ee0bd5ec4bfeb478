"""The longrun kind's findings from hand-made trainer outputs (training.csv, status.json, .HALT, stack dumps) and
from a real process whose heartbeats stop while it lives: stalls and stack dumps, halted, the throughput drift and
the "holds" criterion against hand-computed figures, a run that ends early, and a training.csv missing or cut off.
The runner runs in-process; the launcher is replaced (decision_support.run_runbook), except for the hang, which the
real launcher watches."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from decision_support import run_runbook, write_csv
from validation.launch import attempt
from validation.launch.spec import LaunchResult

RUNBOOK = """\
name: long
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 30}
  window: 20
  warmup_steps: 6
phases:
  - name: stability
    steps:
      - {name: longrun, kind: longrun}
acceptance:
  - {name: healthy, expr: "longrun.status == 'passed' and not longrun.halted and longrun.stalls == 0", target: "-"}
  - {name: holds, expr: "longrun.throughput_drift >= -0.1", target: "-", severity: warn}
"""

# after the 6 warmup rows, 24 rows in thirds of 8: medians 1,000 and 880 tokens/s, a drift of 880 / 1,000 - 1 = -12%
SLOWING = [1200.0] * 6 + [1000.0] * 8 + [950.0] * 8 + [880.0] * 8


class Trainer:
    """A launcher that writes what a trainer run leaves (training.csv of `toks`, status.json, env.json, and with
    `halt` a .HALT) and reports the launch `launch_status`."""

    def __init__(self, toks, ended: str = "completed", steps: int | None = None, csv: str = "whole",
                 halt: bool = False, launch_status: str = "ok"):
        self.toks, self.ended, self.steps, self.csv = toks, ended, steps, csv
        self.halt, self.launch_status = halt, launch_status

    def __call__(self, spec) -> LaunchResult:
        out = Path(spec.trainer_out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.csv != "missing":
            write_csv(out / "training.csv", self.toks)
            if self.csv == "cut":  # the last row cut off mid-line, as a writer killed while writing leaves it
                text = (out / "training.csv").read_text()
                (out / "training.csv").write_text(text[:-12])
        (out / "status.json").write_text(json.dumps({"status": self.ended, "step": self.steps or len(self.toks),
                                                     "reason": "stopped by .HALT"}))
        (out / "env.json").write_text(json.dumps({"world_size": 1}))
        if self.halt:
            (out / ".HALT").write_text(json.dumps({"by": "user", "reason": "stop"}))
        log = Path(spec.step_dir) / "stdout.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("trainer\n")
        ok = self.launch_status == "ok"
        return LaunchResult(status=self.launch_status, returncode=0 if ok else 1, duration_s=1.0, argv=list(spec.argv),
                            log_path=log, rank_logs={}, reason="exited 0" if ok else "exited 1", excerpt=None,
                            stack_dumps=[], attempts=1)


def _longrun(monkeypatch, tmp_path, trainer) -> tuple[dict, dict]:
    results = run_runbook(monkeypatch, tmp_path, RUNBOOK, trainer)
    return results["steps"]["longrun"], {c["name"]: c["status"] for c in results["acceptance"]}


def test_a_run_slowing_down_has_the_hand_computed_drift_and_warns(monkeypatch, tmp_path):
    step, criteria = _longrun(monkeypatch, tmp_path, Trainer(SLOWING))
    m = step["metrics"]
    assert step["status"] == "passed", step.get("reason")
    assert m["throughput_drift"] == pytest.approx(-0.12)
    assert m["halted"] is False and m["stalls"] == 0 and m["stack_dumps"] == []
    assert criteria == {"healthy": "pass", "holds": "warn"}


def test_a_halted_run_fails_and_says_so(monkeypatch, tmp_path):
    step, criteria = _longrun(monkeypatch, tmp_path, Trainer(SLOWING[:20], ended="halted", halt=True))
    assert step["status"] == "failed" and "halted" in step["reason"]
    assert step["metrics"]["halted"] is True and step["metrics"]["stalls"] == 0
    assert criteria["healthy"] == "fail"


def test_a_halt_file_fails_a_run_that_completed(monkeypatch, tmp_path):
    step, _ = _longrun(monkeypatch, tmp_path, Trainer(SLOWING, halt=True))
    assert step["status"] == "failed" and step["reason"] == "the run was halted (.HALT)"
    assert step["metrics"]["halted"] is True


def test_a_run_that_crashed_early_keeps_its_figures(monkeypatch, tmp_path):
    # 14 rows: 8 after the warmup of 6, under the 9 a drift needs; the window is short (8 of 20)
    step, criteria = _longrun(monkeypatch, tmp_path, Trainer(SLOWING[:14], ended="crashed", launch_status="failed"))
    m = step["metrics"]
    assert step["status"] == "failed" and m["stalls"] == 0 and m["halted"] is False
    assert m["last_step"] == 14 and m["status"] == "short" and m["window"]["n"] == 8
    assert m.get("throughput_drift") is None
    assert criteria == {"healthy": "fail", "holds": "error"}


@pytest.mark.parametrize("csv, status, words", [("missing", "failed", "training.csv missing"),
                                                ("cut", "passed", "cut off mid-row")])
def test_a_training_csv_missing_or_cut_off(monkeypatch, tmp_path, csv, status, words):
    step, _ = _longrun(monkeypatch, tmp_path, Trainer(SLOWING, csv=csv, steps=30))
    assert step["status"] == status and words in step["reason"]
    drift = step["metrics"].get("throughput_drift")
    # cut: 29 rows, 23 after the warmup in thirds of 7: medians 1,000 and 880
    assert drift is None if csv == "missing" else drift == pytest.approx(-0.12)


STUB = """\
import json, os, signal, socket, sys, time
out = sys.argv[sys.argv.index("--out-dir") + 1]
os.makedirs(out, exist_ok=True)
def dump(signum, frame):
    with open(os.path.join(out, "stackdump_rank0.txt"), "w") as f:
        f.write("Thread 0x1 (most recent call first):\\n  File stub.py, in <module>\\n")
signal.signal(signal.SIGUSR1, dump)
with open(os.path.join(out, "training.csv"), "w") as f:
    f.write("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\\n")
    for i, toks in enumerate(TOKS):
        f.write(f"{i + 1},5.0,0.001,{toks},{4096 / toks},1.0,1.0,1.5\\n")
fd = os.open(os.path.join(out, "heartbeat_rank0.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
for i in range(len(TOKS)):
    os.write(fd, (json.dumps({"ts": time.time(), "rank": 0, "pid": os.getpid(), "host": socket.gethostname(),
                              "step": i + 1, "msg": "step", "toks_per_s": TOKS[i]}) + "\\n").encode())
time.sleep(60)  # alive, silent
"""


def test_heartbeats_that_stop_while_the_process_lives_are_one_stall_with_its_stack_dump(monkeypatch, tmp_path):
    toks = [1200.0] * 6 + [1000.0] * 3 + [950.0] * 3 + [880.0] * 3  # 9 after the warmup: medians 1,000 and 880
    stub = tmp_path / "stub.py"
    stub.write_text(STUB.replace("TOKS", repr(toks)))

    def launch(spec):
        argv = [sys.executable, str(stub), "--out-dir", str(spec.trainer_out_dir)]
        return attempt.launch(dataclasses.replace(spec, argv=argv, torchrun=False, stall_timeout_s=0.5, poll_s=0.1,
                                                  term_grace_s=2.0, telemetry_s=None, timeout_s=60.0))

    step, criteria = _longrun(monkeypatch, tmp_path, launch)
    m = step["metrics"]
    assert step["status"] == "hang", step.get("reason")
    assert m["stalls"] == 1 and m["halted"] is False
    assert m["stack_dumps"] == ["longrun/out/stackdump_rank0.txt"] == step["stack_dumps"]
    assert m["last_step"] == 15 and m["throughput_drift"] == pytest.approx(-0.12)
    assert criteria["healthy"] == "fail"
