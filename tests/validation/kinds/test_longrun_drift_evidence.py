"""The longrun kind's throughput drift is performance evidence (README: evidence before verdicts): a criterion on
the drift of a long run measured under interference is inconclusive whichever way it went, as one on its window's
tokens/s or its stability is; the watchdog's findings (halted, stalls) still decide."""

from __future__ import annotations

import pytest

from validation import kinds as step_kinds
from validation.analysis.interference import step_interference
from validation.execution.acceptance import evaluate, verdict
from validation.execution.evidence import assess, is_performance
from validation.runbook.loader import load_runbook

RUNBOOK = """\
name: long
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: stability
    steps:
      - {name: longrun, kind: longrun}
acceptance:
  - {name: healthy, expr: "longrun.status == 'passed' and not longrun.halted and longrun.stalls == 0", target: "-"}
  - {name: holds, expr: "longrun.throughput_drift >= -0.1", target: "-"}
"""

QUIET = {"disturbed": False, "text": "no interference in 40 samples", "share": 0.0}
BUSY = {"disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 30 of 40 samples (75%)",
        "share": 0.75}


def _judge(tmp_path, drift: float, interference: dict) -> dict[str, str]:
    path = tmp_path / "long.yaml"
    path.write_text(RUNBOOK)
    rb = load_runbook(path)
    metrics = {"toks_per_s": {"mean": 1000.0, "cv": 0.05, "n": 50}, "throughput_stable": True,
               "throughput_drift": drift, "halted": False, "stalls": 0, "stack_dumps": [], "world_size": 1,
               "interference": interference, "context": {"device": "cpu"}}
    step = {"name": "longrun", "kind": "longrun", "status": "passed", "metrics": metrics, "runs": []}
    step["interference"] = step_interference(step)
    results = {"runbook": {"name": "long", "path": "runbooks/long.yaml"}, "run_dir": "artifacts/validate/long-1",
               "steps": {"longrun": step}, "acceptance": []}
    results["evidence"] = assess(rb, results, results["run_dir"])
    results["acceptance"] = evaluate(rb, results, results["run_dir"])
    return {c["name"]: c["status"] for c in results["acceptance"]} | {"verdict": verdict(results, False)[0]}


def test_the_drift_of_a_long_run_is_what_its_speed_is_measured_by():
    longrun = step_kinds.get("longrun")
    assert is_performance(longrun, ("throughput_drift",))
    assert is_performance(longrun, ("throughput_stable",)) and is_performance(longrun, ("toks_per_s", "mean"))
    assert not is_performance(longrun, ("halted",)) and not is_performance(longrun, ("stalls",))


@pytest.mark.parametrize("drift, quiet", [(-0.02, "pass"), (-0.25, "fail")], ids=["would-hold", "would-not-hold"])
def test_a_disturbed_long_run_neither_passes_nor_fails_on_its_drift(tmp_path, drift, quiet):
    # undisturbed, the drift decides: -2% holds (>= -10%), -25% does not
    crits = _judge(tmp_path, drift, QUIET)
    assert crits == {"healthy": "pass", "holds": quiet, "verdict": "GO" if quiet == "pass" else "NO-GO"}
    # a neighbour shared the machine: whatever the drift, it decides nothing; the watchdog's findings still do
    crits = _judge(tmp_path, drift, BUSY)
    assert crits == {"healthy": "pass", "holds": "inconclusive", "verdict": "INCOMPLETE"}


# A run of 30 one-second steps (warmup 6, window 20: steps 11-30). The drift compares the first third of the 24 steps
# after the warmup (steps 7-14) with the last (23-30). A neighbour takes the machine while steps 7-12 run: the run's
# first third reads 800 tokens/s (its median), though the run did 1,000 there, and it then slows to 880 tokens/s.
# Measured as if nothing had happened, the drift is 880 / 800 - 1 = +10% (it "holds"); the run slowed by 12%.
NEIGHBOUR = range(7, 13)
TOKS = [1200.0] * 6 + [800.0] * 6 + [1000.0] * 2 + [950.0] * 8 + [880.0] * 8
LONG_RUNBOOK = """\
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
  - {name: holds, expr: "longrun.throughput_drift >= -0.1", target: "-"}
"""


class Neighboured:
    """A launcher that writes a trainer's files for TOKS (one-second steps, the first logged 5 s after the process
    started at unix time 1000, so step k runs over (1003 + k, 1004 + k]) and a telemetry.csv sampled every second
    on a 2-core machine the launch uses whole, another process taking 1.5 cores while the steps `busy` ran."""

    def __init__(self, busy):
        self.busy = busy

    def __call__(self, spec):
        import json
        from pathlib import Path

        from validation.launch.spec import LaunchResult

        out, step_dir = Path(spec.trainer_out_dir), Path(spec.step_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows = ["step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"]
        rows += [f"{k},{5 - k * 0.01:.2f},0.001,{v},1.0,1.0,1.0,1.5" for k, v in enumerate(TOKS, start=1)]
        (out / "training.csv").write_text("\n".join(rows) + "\n")
        (out / "status.json").write_text(json.dumps({"status": "completed", "step": len(TOKS)}))
        (out / "env.json").write_text(json.dumps({"world_size": 1}))
        marks = {"process_start": 0.0, "imports_done": 2.0, "setup_done": 3.0, "first_logged_step": 5.0}
        (out / "timeline.json").write_text(json.dumps({
            "schema": 1, "process_start_source": "test", "process_start_unix": 1000.0, "world_size": 1,
            "milestones": marks, "ranks": None, "slowest": None, "time_to_first_step_s": 5.0}))
        lines = ["time,node,sample,ncpu,step_cores,host_cpu_pct,other_cpu_pct,steal_pct,other_top"]
        for i, t in enumerate(range(1000, 1036)):
            other = 150.0 if t - 1004 in self.busy else 0.0  # the sample at t covers (t - 1, t]: step t - 1004
            lines.append(f"{t},n0,{i},2,2,{190 + other:g},{'' if i == 0 else f'{other:g}'},0,"
                         + ("python -c busy[9] 99%" if other else ""))
        step_dir.mkdir(parents=True, exist_ok=True)
        (step_dir / "telemetry.csv").write_text("\n".join(lines) + "\n")
        log = step_dir / "stdout.log"
        log.write_text("trainer\n")
        return LaunchResult(status="ok", returncode=0, duration_s=1.0, argv=list(spec.argv), log_path=log,
                            rank_logs={}, reason="exited 0", excerpt=None, stack_dumps=[], attempts=1)


def _run(monkeypatch, tmp_path, busy) -> tuple[dict, dict[str, str]]:
    from validation.execution import runner
    from validation.launch import environment

    monkeypatch.setattr(runner, "launch", Neighboured(busy))
    monkeypatch.setattr(environment, "probe", lambda cwd=None: {
        "git_sha": "x", "host": "h", "platform": "p", "python": "3", "torch": "t", "cuda": None, "nccl": None,
        "gpus": [], "gpu_count": 0, "cpu_count": 2, "packages": {}})
    path = tmp_path / "rb.yaml"
    path.write_text(LONG_RUNBOOK)
    results = runner.Runner(load_runbook(path), tmp_path / "run", runner.RunOptions(cwd=tmp_path)).run()
    return results["steps"]["longrun"], {c["name"]: c["status"] for c in results["acceptance"]}


def test_a_neighbour_in_the_first_third_of_a_long_run_leaves_its_drift_inconclusive(monkeypatch, tmp_path):
    step, crits = _run(monkeypatch, tmp_path, NEIGHBOUR)
    m = step["metrics"]
    assert m["throughput_drift"] == pytest.approx(880.0 / 800.0 - 1.0)  # the figure the neighbour bent
    assert m["window"]["first_step"] == 11  # the window saw 2 of the 6 busy seconds: 2 of its 20 samples, 10%
    assert step["interference"]["disturbed"] is True
    assert "first third of the run (steps 7-14)" in step["interference"]["text"]
    assert crits == {"healthy": "pass", "holds": "inconclusive"}


def test_a_quiet_long_run_decides_on_its_drift(monkeypatch, tmp_path):
    step, crits = _run(monkeypatch, tmp_path, range(0))
    assert step["interference"]["disturbed"] is False
    assert crits == {"healthy": "pass", "holds": "pass"}
