"""A sweep's `select: {goal}` (validation.kinds.sweep) where the runbook states none: the selected metric's better
direction (validation.analysis.stats.METRIC_DIRECTIONS), so that a sweep selecting on step time picks the fastest
point, never the slowest. Synthetic launches (decision_support.FakeTrainer): step time is 4,096 tokens over each
step's tokens/s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decision_support import FakeTrainer, run_runbook  # noqa: E402

from validation.runbook.loader import load_runbook  # noqa: E402

REPO = Path(__file__).resolve().parents[3]

RB = """\
name: goal
requirements: {{gpus: 0, backend: gloo}}
compare: {{launch_sd: 0.02, pairs: 20}}
defaults:
  config: configs/tiny_cpu.yaml
  args: {{steps: 30}}
  window: 25
  warmup_steps: 5
phases:
  - name: p
    steps:
      - name: sw
        kind: sweep
        matrix: {{env.NSA_DDP_BUCKET_MB: [25, 50, 100]}}
        select: {select}
        prefer: {{env.NSA_DDP_BUCKET_MB: 50}}
"""


@pytest.mark.parametrize("select, goal", [("{metric: step_time_s}", "min"), ("{metric: loss}", "min"),
                                          ("{metric: mem_reserved_gb}", "min"), ("{metric: toks_per_s}", "max"),
                                          ("{metric: mfu}", "max"), ("{metric: grad_norm}", "max"),
                                          ("{metric: step_time_s, goal: max}", "max"),
                                          ("{metric: toks_per_s, goal: min}", "min")])
def test_the_goal_defaults_to_the_metrics_better_direction(tmp_path, select, goal):
    path = tmp_path / "rb.yaml"
    path.write_text(RB.format(select=select))
    assert load_runbook(path, cwd=str(REPO)).step("sw").options.select_goal == goal


def test_a_sweep_on_step_time_without_a_goal_picks_the_fastest_point(monkeypatch, tmp_path):
    """100 runs 30% more tokens a second (a step time 23% shorter): selecting on step_time_s it is the winner."""
    trainer = FakeTrainer(lambda spec: 13_000.0 if spec.env.get("NSA_DDP_BUCKET_MB") == "100" else 10_000.0,
                          cv=0.01)
    sw = run_runbook(monkeypatch, tmp_path, RB.format(select="{metric: step_time_s}"), trainer)["steps"]["sw"]
    d = sw["decision"]
    assert d["ranking"][0]["label"] == "NSA_DDP_BUCKET_MB=100"
    assert d["winner"] == "NSA_DDP_BUCKET_MB=100" and d["significant"] is True
    assert d["comparison"]["rel"] < -0.2 and d["comparison"]["verdict"] == "better"
    assert sw["winner"]["params"] == {"env.NSA_DDP_BUCKET_MB": "100"}
