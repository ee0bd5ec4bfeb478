"""The longrun kind's .HALT and stack dumps are its own launch's: files an earlier launch left in the trainer's
directory (a rerun whose trainer died before it moved them to previous_runs/) are read as absent, as collect()
reads the trainer's other files (decision_support.FakeTrainer: no process is started)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from decision_support import FakeTrainer, run_runbook

RUNBOOK = """\
name: long
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 30}
  window: 20
  warmup_steps: 5
phases:
  - name: stability
    steps:
      - {name: longrun, kind: longrun}
"""


class LeavesEarlierFiles(FakeTrainer):
    """Before the launch writes its own files, the directory holds an earlier launch's .HALT and stack dump (an hour
    old); with `fresh`, the launch itself writes them too."""

    def __init__(self, fresh: bool):
        super().__init__(lambda spec: 10_000.0, cv=0.02)
        self.fresh = fresh

    def __call__(self, spec):
        out = Path(spec.trainer_out_dir)
        out.mkdir(parents=True, exist_ok=True)
        old = time.time() - 3600
        for name, text in ((".HALT", "halted by an earlier watchdog\n"), ("stackdump_0.txt", "Thread 1\n")):
            (out / name).write_text(text)
            os.utime(out / name, (old, old))
        result = super().__call__(spec)
        if self.fresh:
            (out / ".HALT").write_text("halted\n")
            (out / "stackdump_1.txt").write_text("Thread 2\n")
        return result


def test_an_earlier_launchs_halt_and_stack_dump_are_not_this_launchs(monkeypatch, tmp_path):
    results = run_runbook(monkeypatch, tmp_path, RUNBOOK, LeavesEarlierFiles(fresh=False))
    step = results["steps"]["longrun"]
    assert step["status"] == "passed", step.get("reason")
    assert step["metrics"]["halted"] is False and step["metrics"]["stack_dumps"] == []


def test_this_launchs_halt_and_stack_dump_count(monkeypatch, tmp_path):
    results = run_runbook(monkeypatch, tmp_path, RUNBOOK, LeavesEarlierFiles(fresh=True))
    step = results["steps"]["longrun"]
    assert step["status"] == "failed" and ".HALT" in step["reason"]
    assert step["metrics"]["halted"] is True
    assert [Path(p).name for p in step["metrics"]["stack_dumps"]] == ["stackdump_1.txt"]
