"""A `comm` step's bandwidths are speed figures measured on a machine others may use: each of its launches (the torch
benchmark's one, nccl-tests' one per collective) is sampled like a trainer's, the step records what else used the
machine over each launch (results.json step "interference"), and a criterion on its bandwidths is then inconclusive
(INCOMPLETE, the report naming the disturbance and the command that measures the step again), whichever way it went,
while a count (how many sizes) still decides. The step whose peak all-reduce bus bandwidth is a key figure counts as
measured evidence too. Before, the comm step recorded no interference: a bandwidth measured beside a neighbour
using every core passed or failed its criterion (GO) without a word.

The launcher is faked (it writes what a launch leaves: the benchmark's comm.json or nccl-tests' table, and, when the
launch asks to be sampled, a telemetry.csv on a 2-core machine the launch uses whole, with or without a busy
neighbour)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # decision_support

from decision_support import judge, run_runbook  # noqa: E402

from validation.analysis import nccl_tests  # noqa: E402
from validation.launch.spec import LaunchResult  # noqa: E402
from validation.report.problems import open_problems  # noqa: E402
from validation.runbook.loader import load_runbook  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "tests" / "validation" / "fixtures" / "nccl_tests_all_reduce_8gpu.txt"
BUSY_TEXT = "other processes used 1.50 of 2 cores on average"

RUNBOOK = """\
name: bw
requirements: {{gpus: 0}}
defaults: {{nproc_per_node: 2, timeout_s: 60}}
phases:
  - name: comm
    steps:
      - {{name: c, kind: comm, {options}}}
acceptance:
{criteria}
"""
CRITERIA = """\
  - {name: "Bandwidth", expr: "c.all_reduce.busbw_gbps.max >= 1.0", target: ">= 1 GB/s"}
  - {name: "Sizes", expr: "c.all_reduce.sizes >= 2", target: ">= 2 sizes"}
"""
# all_reduce over 2 ranks: busbw = algbw x 2 (n - 1) / n = algbw = bytes / time
ROWS = [{"bytes": 4096, "time_s": 1e-4, "algbw_gbps": 0.04096, "busbw_gbps": 0.04096},
        {"bytes": 1048576, "time_s": 5e-4, "algbw_gbps": 2.097152, "busbw_gbps": 2.097152}]


def _telemetry(busy: bool) -> str:
    """Six samples a second apart ending now, on a 2-core machine the launch uses whole: another process used 1.5
    cores in each (contended: more than the 0 free cores + 0.25) or none."""
    other = 150.0 if busy else 0.0
    now = time.time()
    lines = ["time,node,sample,ncpu,step_cores,host_cpu_pct,other_cpu_pct,steal_pct,other_top"]
    lines += [f"{now - 5 + i:.3f},n0,{i},2,2,{190 + other:g},{'' if i == 0 else f'{other:g}'},0,"
              + ("python -c busy[9] 150%" if other and i else "") for i in range(6)]
    return "\n".join(lines) + "\n"


class FakeLauncher:
    """Replaces validation.execution.runner.launch: the torch benchmark writes comm.json with ROWS for every
    collective it is asked for; an nccl-tests program prints the format sample. `busy(spec)`: whether a busy
    neighbour shares the launch's samples (written only when the launch is sampled: LaunchSpec.telemetry_s)."""

    def __init__(self, busy):
        self.busy = busy
        self.launched = []

    def __call__(self, spec) -> LaunchResult:
        self.launched.append(spec)
        step_dir = Path(spec.step_dir)
        step_dir.mkdir(parents=True, exist_ok=True)
        log = step_dir / "stdout.log"
        argv = list(spec.argv)
        if argv[0] in nccl_tests.BINARIES.values():
            log.write_text(SAMPLE.read_text())
        else:
            kinds = argv[argv.index("--kinds") + 1].split(",")
            (step_dir / "comm.json").write_text(json.dumps({
                "world_size": 2, "backend": "gloo", "device": "cpu", "device_name": "cpu", "iters": 3, "warmup": 1,
                "compute_ms": 0, "threads": 1, "kinds": {k: ROWS for k in kinds}}))
            log.write_text("fake benchmark\n")
        if spec.telemetry_s:
            (step_dir / "telemetry.csv").write_text(_telemetry(self.busy(spec)))
        return LaunchResult(status="ok", returncode=0, duration_s=0.01, argv=argv, log_path=log, rank_logs={},
                            reason="exited 0", excerpt=None, stack_dumps=[], attempts=1)


def _run(monkeypatch, tmp_path, busy, options="kinds: [all_reduce], sizes: [4096, 1048576]", criteria=CRITERIA):
    launcher = FakeLauncher(busy)
    tmp_path.mkdir(parents=True, exist_ok=True)
    results = run_runbook(monkeypatch, tmp_path, RUNBOOK.format(options=options, criteria=criteria), launcher)
    return results, launcher, {c["name"]: c for c in results["acceptance"]}


def test_the_torch_benchmark_measured_beside_a_busy_neighbour_decides_nothing_on_its_bandwidth(monkeypatch,
                                                                                                 tmp_path):
    results, launcher, crits = _run(monkeypatch, tmp_path, busy=lambda spec: True)
    (spec,) = launcher.launched
    assert spec.telemetry_s == 1.0  # sampled, as a trainer launch is
    step = results["steps"]["c"]
    assert step["status"] == "passed" and step["metrics"]["all_reduce"]["busbw_gbps"]["max"] == pytest.approx(2.097152)
    rec = step["interference"]
    assert rec["disturbed"] is True and rec["measured"] == 1 and BUSY_TEXT in rec["text"], rec
    # 2.1 GB/s would pass >= 1.0: measured while another process used the cores the launch needed, it decides nothing
    bw = crits["Bandwidth"]
    assert bw["status"] == "inconclusive", bw
    assert "was disturbed: " in bw["detail"] and BUSY_TEXT in bw["detail"] and "--rerun c" in bw["detail"], bw
    assert crits["Sizes"]["status"] == "pass"  # a count of sizes is no speed: it still decides
    assert results["verdict"] == "INCOMPLETE", results["verdict_reason"]
    assert "(disturbed: c)" in results["verdict_reason"]
    assert [d["step"] for d in results["evidence"]["disturbed"]] == ["c"]
    problems = open_problems(results)
    assert any(p["where"] == "criterion Bandwidth" and p["severity"] == "INCONCLUSIVE" for p in problems), problems
    assert any(p["where"] == "step c" and p["what"].startswith("measured while other work used") for p in problems)


def test_the_torch_benchmark_on_a_quiet_machine_decides_as_before(monkeypatch, tmp_path):
    results, _, crits = _run(monkeypatch, tmp_path, busy=lambda spec: False)
    rec = results["steps"]["c"]["interference"]
    assert rec["disturbed"] is False and rec["text"] == "no interference in 5 samples", rec
    assert crits["Bandwidth"]["status"] == "pass" and crits["Sizes"]["status"] == "pass"
    assert results["verdict"] == "GO" and results["evidence"]["disturbed"] == []
    results, _, crits = _run(monkeypatch, tmp_path / "slow", busy=lambda spec: False,
                             criteria=CRITERIA.replace(">= 1.0", ">= 5.0"))
    assert crits["Bandwidth"]["status"] == "fail" and results["verdict"] == "NO-GO"


def test_one_disturbed_nccl_tests_launch_disturbs_the_step_and_is_named(monkeypatch, tmp_path):
    """nccl-tests runs one program per collective: each launch is judged over its own samples and the step records
    each one, labelled with its collective (the second one here shared the machine)."""
    bin_dir = tmp_path / "bin"  # the programs are looked for on PATH before the step runs (never run: faked)
    bin_dir.mkdir()
    for name in ("all_reduce_perf", "broadcast_perf"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    options = f"source: nccl-tests, kinds: [all_reduce, broadcast], nproc_per_node: 8, env: {{PATH: '{bin_dir}'}}"
    criteria = CRITERIA.replace(">= 1.0", ">= 50").replace(">= 2 sizes", ">= 2")
    results, launcher, crits = _run(monkeypatch, tmp_path, busy=lambda spec: spec.argv[0] == "broadcast_perf",
                                    options=options, criteria=criteria)
    assert [s.telemetry_s for s in launcher.launched] == [1.0, 1.0]
    step = results["steps"]["c"]
    assert step["status"] == "passed", step["reason"]
    # the format sample's peak: 64 MiB in 1150 us over 8 ranks, x 2 x 7 / 8
    assert step["metrics"]["all_reduce"]["busbw_gbps"]["max"] == pytest.approx(67108864 / 1150e-6 / 1e9 * 1.75)
    rec = step["interference"]
    assert rec["disturbed"] is True and rec["measured"] == 2
    assert [(x["label"], x["disturbed"]) for x in rec["launches"]] == [("all_reduce", False), ("broadcast", True)]
    assert "1 of 2" in rec["text"] and "broadcast" in rec["text"] and BUSY_TEXT in rec["text"], rec["text"]
    assert crits["Bandwidth"]["status"] == "inconclusive" and crits["Sizes"]["status"] == "pass"
    assert results["verdict"] == "INCOMPLETE"
    quiet, _, crits = _run(monkeypatch, tmp_path / "quiet", busy=lambda spec: False, options=options,
                           criteria=criteria)
    assert quiet["steps"]["c"]["interference"]["disturbed"] is False
    assert crits["Bandwidth"]["status"] == "pass" and quiet["verdict"] == "GO"


# ------------------------------------------------------------------------------------------------ hand-built records
CRITERIA_ONLY_SIZES = '  - {name: "Sizes", expr: "c.all_reduce.sizes >= 2", target: ">= 2 sizes"}\n'
QUIET = {"disturbed": False, "measured": 1, "text": "no interference in 8 samples",
         "launches": [{"label": "", "disturbed": False, "text": "no interference in 8 samples"}]}
BUSY = {"disturbed": True, "measured": 1, "text": BUSY_TEXT + " in 6 of 8 samples (75%)",
        "launches": [{"label": "", "disturbed": True, "text": BUSY_TEXT + " in 6 of 8 samples (75%)"}]}


def _results(interference: dict) -> dict:
    table = [dict(r) for r in ROWS]
    metrics = {"world_size": 2, "backend": "gloo", "source": "torch",
               "all_reduce": {"table": table, "busbw_gbps": {"max": 2.097152, "median": 1.069056},
                              "algbw_gbps": {"max": 2.097152, "median": 1.069056}, "latency_us": 100.0, "sizes": 2}}
    step = {"name": "c", "kind": "comm", "status": "passed", "runs": [], "metrics": metrics,
            "interference": interference}
    return {"runbook": {"name": "bw", "path": "runbooks/bw.yaml"}, "run_dir": "artifacts/validate/bw-1",
            "steps": {"c": step}, "acceptance": []}


def _runbook(tmp_path, criteria: str):
    path = tmp_path / "bw.yaml"
    path.write_text(RUNBOOK.format(options="kinds: [all_reduce]", criteria=criteria))
    return load_runbook(path, cwd=str(REPO))


@pytest.mark.parametrize("limit, quiet_status", [(1.0, "pass"), (5.0, "fail")], ids=["would-pass", "would-fail"])
def test_a_criterion_on_a_disturbed_comm_steps_bandwidth_is_inconclusive(tmp_path, limit, quiet_status):
    rb = _runbook(tmp_path, CRITERIA.replace(">= 1.0", f">= {limit}"))
    crits, (word, _) = judge(rb, _results(QUIET))
    assert crits["Bandwidth"]["status"] == quiet_status and crits["Sizes"]["status"] == "pass"
    assert word == ("GO" if quiet_status == "pass" else "NO-GO")
    results = _results(BUSY)
    crits, (word, reason) = judge(rb, results)
    assert crits["Bandwidth"]["status"] == "inconclusive", crits["Bandwidth"]
    assert ("it held" if quiet_status == "pass" else "it did not hold") in crits["Bandwidth"]["detail"]
    assert crits["Sizes"]["status"] == "pass"
    assert word == "INCOMPLETE" and "(disturbed: c)" in reason and "--rerun c" in reason


def test_the_key_figures_comm_step_is_measured_evidence(tmp_path):
    """No criterion reads the comm step's bandwidth, yet the executive summary shows its peak all-reduce bus
    bandwidth: measured while other work used the machine, the report names that among its open problems."""
    rb = _runbook(tmp_path, CRITERIA_ONLY_SIZES)
    results = _results(BUSY)
    crits, (word, _) = judge(rb, results)
    assert crits["Sizes"]["status"] == "pass" and word == "GO"  # no required criterion stands on the bandwidth
    ev = results["evidence"]
    assert ev["measured"] == ["c"] and [d["step"] for d in ev["disturbed"]] == ["c"], ev
    assert ev["rerun"].endswith("--rerun c"), ev["rerun"]
    (item,) = [p for p in open_problems(results) if p["what"].startswith("measured while other work used")]
    assert item["where"] == "step c" and BUSY_TEXT in item["what"], item
    quiet = _results(QUIET)
    judge(rb, quiet)
    assert quiet["evidence"]["disturbed"] == [] and quiet["evidence"]["rerun"] is None
    one = _results(BUSY)  # one rank: the key figure is n/a (nothing moves between ranks), no evidence of speed
    one["steps"]["c"]["metrics"]["world_size"] = 1
    judge(rb, one)
    assert one["evidence"]["measured"] == [] and one["evidence"]["disturbed"] == []
