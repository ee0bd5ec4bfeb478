"""What a sweep step says about the point it keeps (validation.kinds.sweep), checked against the raw training.csv
files its launches wrote: the executive summary's throughput of the kept point is the window mean of that point's
runs that passed (a crashed run's partial window is no measurement of the point), and a point kept because it was
the only one measured is never called the runbook's preference."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from decision_support import FakeTrainer, run_runbook
from validation.kinds import get

RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 30}, nproc_per_node: 1, window: 20, warmup_steps: 5}
phases:
  - name: p
    steps:
      - name: sw
        kind: sweep
        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}
        repeats: %d
"""


class CrashingTrainer(FakeTrainer):
    """A FakeTrainer whose launches picked by `crashed(spec)` write their training.csv and then end crashed
    (status.json), as a rank dying late in the run leaves them."""

    def __init__(self, level, crashed, **kw):
        super().__init__(level, **kw)
        self.crashed = crashed

    def __call__(self, spec):
        result = super().__call__(spec)
        if self.crashed(spec):
            (Path(spec.trainer_out_dir) / "status.json").write_text(
                json.dumps({"status": "crashed", "reason": "RuntimeError: boom", "step": 30}))
        return result


def _window_mean(path: Path, warmup: int = 5, last: int = 20) -> float:
    """Tokens/s (tokens over time) of the rows the runbook's window names (the last 20 after the first 5), by hand."""
    with open(path, newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["step"]))
    window = rows[warmup:][-last:]
    assert [int(r["step"]) for r in window] == list(range(11, 31))
    return len(window) / sum(1 / float(r["toks_per_s"]) for r in window)  # its tokens over its time


def test_the_kept_points_throughput_figure_is_the_mean_of_its_passed_runs_only(monkeypatch, tmp_path):
    """The default point (25, the matrix's first) is kept; its second repeat crashed after running at half speed.
    The key figure's tokens/s is the mean of its two passed runs' windows (about 1,000), not of all three
    (about 833)."""
    def level(spec):
        if "=25" in spec.label:
            return 500.0 if spec.repeat == 1 else 1000.0
        return 1010.0

    trainer = CrashingTrainer(level, lambda spec: "=25" in spec.label and spec.repeat == 1, cv=0.01)
    results = run_runbook(monkeypatch, tmp_path, RB % 3, trainer)
    step = results["steps"]["sw"]
    assert step["choice"]["label"] == "NSA_DDP_BUCKET_MB=25" and step["choice"]["kept_default"]
    kept = [r for r in step["runs"] if r["label"] == "NSA_DDP_BUCKET_MB=25"]
    assert sorted(r["status"] for r in kept) == ["failed", "passed", "passed"]
    run_dir = Path(results["run_dir"])
    passed = [_window_mean(run_dir / r["metrics"]["csv"]) for r in kept if r["status"] == "passed"]
    expected = sum(passed) / len(passed)
    sweep = get("sweep")
    figures = sweep.key_figures([sweep.read(step)])
    assert len(figures) == 1
    shown = re.search(r"step `sw`, ([\d,.]+) tokens/s", figures[0].note)
    assert shown is not None, figures[0].note
    assert abs(float(shown.group(1).replace(",", "")) - expected) <= 0.051  # shown to one decimal
    assert 990 < expected < 1010



def test_the_kept_points_throughput_figure_leaves_out_its_disturbed_runs(monkeypatch, tmp_path):
    """Of the kept point's passed runs, one measured while other work used the machine (its interference record
    says disturbed): the figure is the undisturbed runs' mean (about 1,000), not one pulled down by the slow run
    (about 833); with every run disturbed, the figure says so."""
    def level(spec):
        if "=25" in spec.label:
            return 500.0 if spec.repeat == 1 else 1000.0
        return 1010.0

    results = run_runbook(monkeypatch, tmp_path, RB % 3, FakeTrainer(level, cv=0.01))
    step = results["steps"]["sw"]
    kept = [r for r in step["runs"] if r["label"] == "NSA_DDP_BUCKET_MB=25"]
    assert len(kept) == 3 and all(r["status"] == "passed" for r in kept)
    slow = next(r for r in kept if r["repeat"] == 1)
    slow["metrics"]["interference"] = {"disturbed": True, "text": "other processes used 1.4 of 2 cores"}
    run_dir = Path(results["run_dir"])
    quiet = [_window_mean(run_dir / r["metrics"]["csv"]) for r in kept if r is not slow]
    sweep = get("sweep")
    note = sweep.key_figures([sweep.read(step)])[0].note
    shown = re.search(r"step `sw`, ([\d,.]+) tokens/s", note)
    assert shown is not None and "interference" not in note, note
    assert abs(float(shown.group(1).replace(",", "")) - sum(quiet) / len(quiet)) <= 0.051
    for r in kept:
        r["metrics"]["interference"] = {"disturbed": True, "text": "other processes used 1.4 of 2 cores"}
    assert "(measured under interference)" in sweep.key_figures([sweep.read(step)])[0].note

def test_a_point_kept_because_it_alone_was_measured_is_not_called_preferred(monkeypatch, tmp_path):
    """The matrix's first point (the default) crashed in its only run: the other point is kept as the only point
    measured (nothing compared). The runbook states no preference, so the summary line must not say "preferred"."""
    trainer = CrashingTrainer(lambda spec: 1000.0, lambda spec: "=25" in spec.label, cv=0.01)
    step = run_runbook(monkeypatch, tmp_path, RB % 1, trainer)["steps"]["sw"]
    assert step["choice"]["label"] == "NSA_DDP_BUCKET_MB=50" and not step["choice"]["kept_default"]
    assert step["decision"]["comparisons"] == [] and step["decision"]["default_source"] == "first"
    line = get("sweep").summary_line(step)
    assert "nothing compared" in line and "NSA_DDP_BUCKET_MB=50 kept" in line
    assert "preferred" not in line and "the only point measured" in line
