"""The scaling step's reduction against hand-computed figures: speedup and efficiency per world size from the runs'
tokens/s, and the device the runs trained on, as env.json names it (a GPU by its own name, not "cuda")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from validation import kinds
from validation.results.codec import encode

REPO = Path(__file__).resolve().parents[3]
RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5, batch_size: 4}, nproc_per_node: 1}
phases:
  - name: p
    steps:
      - {name: sc, kind: scaling, world_sizes: [1, 2, 4], modes: [strong, weak]}
"""


def _run(tmp_path, monkeypatch, device, toks):
    from validation.kinds import scaling
    from validation.kinds.trainer import Runs
    from validation.runbook.loader import load_runbook
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun, RunContext, Stat

    path = tmp_path / "rb.yaml"
    path.write_text(RB)
    step = load_runbook(path, cwd=str(REPO)).step("sc")
    kind = kinds.get("scaling")
    specs = kind.launches(step, {}, tmp_path / "run")
    runs = [LaunchRun(label=s.label, params=dict(s.params), status="passed", reason=None, dir=s.dir,
                      command=["torchrun"], repeat=s.repeat,
                      metrics=LaunchMetrics(toks_per_s=Stat(mean=toks[s.label]), context=RunContext(device=device)))
            for s in specs]
    monkeypatch.setattr(scaling, "run_all", lambda ctx: Runs(runs))
    ctx = SimpleNamespace(step=step, launches=specs, run_dir=tmp_path / "run", save=lambda partial=None: None)
    return encode(kind.run(step.options, ctx))["metrics"]


TOKS = {"strong_n1": 1000.0, "strong_n2": 1600.0, "strong_n4": 2000.0,
        "weak_n1": 1000.0, "weak_n2": 1900.0, "weak_n4": 3400.0}


@pytest.mark.parametrize("device", ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "cuda:0"])
def test_a_gpu_run_is_a_gpu_step_whatever_the_device_is_called(tmp_path, monkeypatch, device):
    """env.json names a GPU by its name ("NVIDIA H200"): the step is on cuda and carries no CPU core-sharing note."""
    m = _run(tmp_path, monkeypatch, device, TOKS)
    assert m["device"] == "cuda"
    assert "note" not in m


def test_a_cpu_run_carries_the_core_sharing_note(tmp_path, monkeypatch):
    m = _run(tmp_path, monkeypatch, "cpu", TOKS)
    assert m["device"] == "cpu" and "share this machine" in m["note"]


def test_speedup_and_efficiency_by_hand(tmp_path, monkeypatch):
    """S(n) = X(n) / X(1), E(n) = S(n) / n; min and last over the world sizes beyond the base."""
    m = _run(tmp_path, monkeypatch, "NVIDIA H200", TOKS)
    strong = {r["world_size"]: (r["speedup"], r["efficiency"], r["batch_per_rank"]) for r in m["strong"]["rows"]}
    # global batch by default: batch_size 4 x the largest world size 4 = 16 sequences, split over the ranks
    assert strong == {1: (1.0, 1.0, 16), 2: (pytest.approx(1.6), pytest.approx(0.8), 8),
                      4: (pytest.approx(2.0), pytest.approx(0.5), 4)}
    assert m["strong"]["efficiency"] == {"min": pytest.approx(0.5), "last": pytest.approx(0.5)}
    weak = {r["world_size"]: (r["speedup"], r["efficiency"]) for r in m["weak"]["rows"]}
    assert weak == {1: (1.0, 1.0), 2: (pytest.approx(1.9), pytest.approx(0.95)),
                    4: (pytest.approx(3.4), pytest.approx(0.85))}
    assert m["weak"]["efficiency"] == {"min": pytest.approx(0.85), "last": pytest.approx(0.85)}
