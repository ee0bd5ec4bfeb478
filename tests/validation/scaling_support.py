"""A two-step scaling run with a known truth for the evidence tests (no process is started): one_node measured on
8 ranks at 16,000 tokens/s, two_nodes on 16 ranks with its scaling efficiency computed from one_node's tokens/s
(StepKind.derived_from), and the runbook whose criteria read both."""

from __future__ import annotations

from pathlib import Path

from validation.analysis.interference import step_interference
from validation.runbook.loader import load_runbook

REPO = Path(__file__).resolve().parents[2]
SCALING_RUNBOOK = """\
name: sc
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - {name: one_node, kind: train}
      - {name: two_nodes, kind: train, scaling_baseline: one_node}
acceptance:
  - {name: "Scaling", expr: "two_nodes.scaling_efficiency >= 0.85", target: ">= 0.85"}
  - {name: "Scaling bound", expr: "two_nodes.scaling_efficiency_low >= 0.80", target: ">= 0.80", severity: warn}
  - {name: "Own speed", expr: "two_nodes.toks_per_s.mean >= 1000", target: ">= 1000"}
  - {name: "Learns", expr: "two_nodes.loss_drop >= 1.0", target: ">= 1"}
"""
QUIET = {"disturbed": False, "text": "no interference in 8 samples", "share": 0.0}
BUSY = {"disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 5 of 8 samples (62%)",
        "share": 0.625}


def scaling_metrics(toks: float, world: int, interference: dict, loss_drop: float = 2.5) -> dict:
    """A train step's metrics: `toks` tokens/s (cv 3%, 20 samples) on `world` ranks, measured under `interference`."""
    return {"toks_per_s": {"mean": toks, "cv": 0.03, "n": 20}, "loss_drop": loss_drop, "world_size": world,
            "toks_per_s_per_gpu": toks / world, "interference": interference, "context": {"device": "cpu"}}


def scaling_results(efficiency: float, base: dict, loss_drop: float = 2.5, low: float | None = None,
                    high: float | None = None) -> dict:
    """results.json of the run: one_node with the metrics `base`, two_nodes on 16 ranks at efficiency x 2 x 16,000
    tokens/s (30,400 for 0.95), measured undisturbed; the efficiency's interval [low, high] (default +/- 5%)."""
    two = scaling_metrics(efficiency * 2 * 16000.0, 16, QUIET, loss_drop)
    two.update(scaling_baseline="one_node", scaling_efficiency=efficiency,
               scaling_efficiency_low=efficiency * 0.95 if low is None else low,
               scaling_efficiency_high=efficiency * 1.05 if high is None else high,
               scaling_noise={"source": "declared", "sd": 0.02, "df": 9, "detail": "declared"})
    steps = {"one_node": {"name": "one_node", "kind": "train", "status": "passed", "runs": [], "metrics": base},
             "two_nodes": {"name": "two_nodes", "kind": "train", "status": "passed", "runs": [], "metrics": two}}
    for s in steps.values():
        s["interference"] = step_interference(s)
    return {"runbook": {"name": "sc", "path": "runbooks/sc.yaml"}, "run_dir": "artifacts/validate/sc-1",
            "steps": steps, "acceptance": []}


def scaling_runbook(tmp_path: Path, text: str = SCALING_RUNBOOK):
    """`text` written as tmp_path/sc.yaml and loaded from the repository's root."""
    path = tmp_path / "sc.yaml"
    path.write_text(text)
    return load_runbook(path, cwd=str(REPO))
