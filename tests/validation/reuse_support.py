"""The two-phase runbook of fake benchmark steps (no torch) that the --reuse and --resume tests run and reuse: phase
`kernels` (step kbench, whose speed is an argument) and phase `rest` (step rbench)."""

from __future__ import annotations

from pathlib import Path

BENCH = """\
import argparse, json
p = argparse.ArgumentParser()
p.add_argument("--speed", type=float, default=2.0)
p.add_argument("--json")
a = p.parse_args()
open(a.json, "w").write(json.dumps({"speed": a.speed}))
"""


def two_phase_runbook(tmp: Path, speed: str = "3.0", name: str = "two_phases.yaml", rest_criterion: bool = True
                      ) -> Path:
    """tmp/name: runbook two_phases (kbench at `speed`; criteria on kbench and, with rest_criterion, on rbench)."""
    script = tmp / "fake_bench.py"
    script.write_text(BENCH)
    rest = '\n  - {name: fast_rest, expr: "rbench.speed >= 1", severity: fail}' if rest_criterion else ""
    path = tmp / name
    path.write_text(f"""\
name: two_phases
requirements: {{gpus: 0}}
defaults: {{timeout_s: 60}}
phases:
  - name: kernels
    steps:
      - {{name: kbench, kind: bench, command: [{script}, --speed, "{speed}"]}}
  - name: rest
    steps:
      - {{name: rbench, kind: bench, command: [{script}]}}
acceptance:
  - {{name: fast_kernels, expr: "kbench.speed >= 2", severity: fail}}{rest}
""")
    return path
