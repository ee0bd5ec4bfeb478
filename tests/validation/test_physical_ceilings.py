"""The ceilings of figures that have one beyond their sign (validation.analysis.plausibility): a process tree's CPU
above the cores of its nodes, a collective's bandwidth between ranks above the fastest GPU link, a speed-up at most
0, in lists too (a scaling step's rows, a benchmark's records, a comm table); every such figure of every step is an
open problem, whether or not a criterion reads its step and however the step ended; and `compare` / `--against`
never compares a launch with one, on either side."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from decision_support import judge, write_csv
from validation.analysis.plausibility import implausible
from validation.report.compare import compare_runs, performance_analysis
from validation.report.problems import open_problems
from validation.runbook.loader import load_runbook

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "reports/examples/cpu_smoke/results.json"
PARALLELISM = REPO / "reports/examples/parallelism_cpu/results.json"


def _names(metrics: dict) -> list[str]:
    return [b["metric"] for b in implausible(metrics)]


# ------------------------------------------------------------------------------------------ CPU
def test_cpu_utilisation_above_the_cores_of_the_launchs_nodes_is_out_of_range():
    # 2 CPUs a node: 200% at most, 220% with the sampler's rounding of a tick per process
    one = {"interference": {"ncpu": 2.0}, "telemetry": {"nodes": ["n0"]}}
    assert _names({**one, "cpu_util": {"mean": 187.3, "max": 219.0}}) == []
    found = implausible({**one, "cpu_util": {"mean": 390.0, "min": 380.0, "max": 400.0}})
    assert [b["metric"] for b in found] == ["cpu_util.mean", "cpu_util.min", "cpu_util.max"]
    assert found[0]["range"] == "[0, 220.0]" and "the 2 cores of its 1 node" in found[0]["reason"]
    # two nodes sampled: their CPU is summed, and so are their cores
    two = {"interference": {"ncpu": 2.0}, "telemetry": {"nodes": ["n0", "n1"]}, "cpu_util": {"mean": 390.0}}
    assert _names(two) == []
    assert _names({**two, "telemetry": {}, "nnodes": 2}) == []
    # the cores unknown: only the sign is checked
    assert _names({"cpu_util": {"mean": 5000.0}}) == []


# ------------------------------------------------------------------------------------------ bandwidth
def test_a_bandwidth_between_ranks_above_the_fastest_gpu_link_is_out_of_range():
    # at two ranks at most 1,800 GB/s, NVLink 6's rate each way: an all-reduce's busbw is 2(n-1)/n = 1 x its link
    row = {"bytes": 1 << 30, "time_s": 1e-4, "algbw_gbps": 10737.4, "busbw_gbps": 10737.4}
    comm = {"world_size": 2, "backend": "nccl", "all_reduce": {
        "table": [{"bytes": 8192, "time_s": 1e-5, "algbw_gbps": 0.82, "busbw_gbps": 0.82}, row],
        "busbw_gbps": {"max": 10737.4, "median": 5369.1}, "algbw_gbps": {"max": 10737.4, "median": 900.0}}}
    assert _names(comm) == ["all_reduce.table.1.algbw_gbps", "all_reduce.table.1.busbw_gbps",
                            "all_reduce.busbw_gbps.max", "all_reduce.busbw_gbps.median", "all_reduce.algbw_gbps.max"]
    h100 = copy.deepcopy(comm)  # an 8 x H100 all-reduce as nccl-tests reports it: within the range
    h100["all_reduce"] = {"busbw_gbps": {"max": 480.0, "median": 300.0}, "algbw_gbps": {"max": 274.0}}
    assert _names(h100) == []
    assert implausible(comm)[0]["range"] == "[0, 1,800.0]"
    # one rank: nothing moves between ranks; the figures are the calls' own overhead, not a link's
    assert _names({**comm, "world_size": 1}) == []


def test_a_bandwidth_above_what_the_devices_own_link_carries_is_out_of_range():
    # an H200 SXM's NVLink 4 carries 900 GB/s in both directions together (data sheet): 450 each way. An all-reduce's
    # busbw at 8 ranks reaches at most 2 x 7/8 of it (787.5 GB/s, reduction in the switch), its algbw the link's 450
    h200 = {"world_size": 8, "backend": "nccl", "device_name": "NVIDIA H200",
            "all_reduce": {"busbw_gbps": {"max": 1000.0, "median": 480.0}, "algbw_gbps": {"max": 571.4}}}
    found = implausible(h200)
    assert [b["metric"] for b in found] == ["all_reduce.busbw_gbps.max", "all_reduce.algbw_gbps.max"]
    assert found[0]["range"] == "[0, 787.5]" and "NVIDIA H200" in found[0]["reason"]
    assert found[1]["range"] == "[0, 450.0]"
    # what 8 H100s really reach with NVLS (about 480 GB/s busbw) stays in range on its own device's ceiling
    h100 = {**h200, "device_name": "NVIDIA H100 80GB HBM3",
            "all_reduce": {"busbw_gbps": {"max": 480.0, "median": 300.0}, "algbw_gbps": {"max": 274.0}}}
    assert _names(h100) == []
    # PCIe 4.0 x16 parts (no NVLink): 32 GB/s each way, 56 for an all-reduce's busbw at 8 ranks
    l40s = {**h200, "device_name": "NVIDIA L40S", "all_reduce": {"busbw_gbps": {"max": 70.0}}}
    assert _names(l40s) == ["all_reduce.busbw_gbps.max"]
    # the device unknown (another GPU, a gloo run on CPUs): the fastest link's ceiling, as before
    for unknown in ("NVIDIA RTX A1000", "cpu", None):
        assert _names({**h200, "device_name": unknown}) == []


def test_a_collective_without_reduction_moves_at_most_one_links_rate():
    # nccl-tests' busbw is the bytes a rank's own link carries per second (PERFORMANCE.md): an all-gather's rank
    # receives (n-1)/n of its output, a reduce-scatter's sends (n-1)/n of its input, a broadcast's receives all of it.
    # Hand figures, 8 H100s (450 GB/s each way): 1.1 x the link is impossible for them, possible for an all-reduce
    over = 1.1 * 450.0
    for kind in ("all_gather", "reduce_scatter", "broadcast"):
        launch = {"world_size": 8, "device_name": "NVIDIA H100 80GB HBM3", kind: {"busbw_gbps": {"max": over}}}
        found = implausible(launch)
        assert [b["metric"] for b in found] == [f"{kind}.busbw_gbps.max"], kind
        assert found[0]["range"] == "[0, 450.0]"
    all_reduce = {"world_size": 8, "device_name": "NVIDIA H100 80GB HBM3", "all_reduce": {"busbw_gbps": {"max": over}}}
    assert _names(all_reduce) == []
    # algbw = busbw / the bus factor: an all-gather's algbw may reach n/(n-1) x the link (8/7 x 450 = 514.3 at 8),
    # a broadcast's and an all-reduce's only the link
    gather = {"world_size": 8, "device_name": "NVIDIA H100 80GB HBM3", "all_gather": {"algbw_gbps": {"max": 500.0}}}
    assert _names(gather) == []
    for kind in ("broadcast", "all_reduce"):
        launch = {"world_size": 8, "device_name": "NVIDIA H100 80GB HBM3", kind: {"algbw_gbps": {"max": 500.0}}}
        assert _names(launch) == [f"{kind}.algbw_gbps.max"], kind
    # world size unknown: the largest share any world size gives (an all-reduce's busbw and an all-gather's algbw
    # twice the link, at two ranks)
    unknown_n = {"device_name": "NVIDIA H100 80GB HBM3", "all_reduce": {"busbw_gbps": {"max": 880.0}},
                 "all_gather": {"algbw_gbps": {"max": 880.0}, "busbw_gbps": {"max": 460.0}}}
    assert _names(unknown_n) == ["all_gather.busbw_gbps.max"]


# ------------------------------------------------------------------------------------------ speed-ups and lists
def test_a_speedup_at_most_zero_is_out_of_range_in_a_benchmarks_records_too():
    bench = {"ranges_speedup_min": 0.0, "forward_speedup_min": 1.29,
             "by_seq_len": [{"seq_len": 1024, "ranges_speedup": 63.2, "forward_speedup": -1.3}]}
    found = {b["metric"]: b for b in implausible(bench)}
    assert sorted(found) == ["by_seq_len.0.forward_speedup", "ranges_speedup_min"]
    assert found["ranges_speedup_min"]["range"] == "(0, inf)"


def test_a_scaling_steps_rows_are_checked():
    metrics = {"strong": {"rows": [{"world_size": 1, "speedup": 1.0, "efficiency": 1.0},
                                   {"world_size": 2, "speedup": 9.0, "efficiency": 4.5}],
                          "efficiency": {"min": 0.9, "last": 0.9}}}
    assert _names(metrics) == ["strong.rows.1.efficiency"]


# ------------------------------------------------------------------------------------------ open problems
@pytest.fixture()
def smoke():
    return (load_runbook(REPO / "runbooks/cpu_smoke.yaml", cwd=str(REPO)),
            copy.deepcopy(json.loads(SMOKE.read_text(encoding="utf-8"))))


def _implausible_problems(results: dict) -> list[tuple[str, str]]:
    return [(p["where"], p["what"]) for p in open_problems(results) if p["severity"] == "IMPLAUSIBLE"]


def test_an_intact_run_has_no_implausible_problem(smoke):
    rb, results = smoke
    judge(rb, results)
    assert _implausible_problems(results) == []


def test_an_impossible_figure_of_a_step_nothing_reads_is_an_open_problem(smoke):
    rb, results = smoke
    results["steps"]["sdpa_audit"]["metrics"]["mfu"] = {"mean": 3.0, "n": 20}
    judge(rb, results)
    assert "sdpa_audit" not in results["evidence"]["measured"]  # no criterion, decision or key figure reads it
    (problem,) = _implausible_problems(results)
    assert problem[0] == "step sdpa_audit" and problem[1].startswith("mfu.mean = 3 is outside its physical range [0, 1]")


@pytest.mark.parametrize("status", ["timeout", "error"])
def test_an_impossible_figure_of_a_step_that_did_not_end_well_is_an_open_problem(smoke, status):
    rb, results = smoke
    step = results["steps"]["single"]
    step["status"], step["reason"] = status, f"the launch ended: {status}"
    step["metrics"]["toks_per_s"]["cv"] = 0.9
    judge(rb, results)
    problems = _implausible_problems(results)
    assert [w for w, _ in problems] == ["step single"] and "toks_per_s.cv = 0.9" in problems[0][1]


def test_a_steps_own_figures_beside_its_runs_and_a_run_without_evidence_are_open_problems():
    results = json.loads(PARALLELISM.read_text(encoding="utf-8"))
    results.pop("evidence", None)  # a run written before results.json recorded its evidence: judged when read
    assert _implausible_problems(results) == []
    results["steps"]["scaling"]["metrics"]["weak"]["rows"][1]["efficiency"] = 3.0
    (problem,) = _implausible_problems(results)
    assert problem[0] == "step scaling" and problem[1].startswith("weak.rows.1.efficiency = 3 is outside")


def test_a_judged_figure_is_listed_once(smoke):
    rb, results = smoke
    results["steps"]["baseline"]["metrics"]["mfu"] = {"mean": 3.0, "n": 20}
    judge(rb, results)
    assert [w for w, _ in _implausible_problems(results)] == ["step baseline"]


# ------------------------------------------------------------------------------------------ compare, --against
def _run(tmp_path: Path, name: str, level: float, **metrics) -> tuple[dict, Path]:
    where = tmp_path / name
    write_csv(where / "baseline/out/training.csv", [level + (i % 5) for i in range(20)])
    launch = {"csv": "baseline/out/training.csv", "window": {"last": 20, "warmup": 0}, **metrics}
    return {"runbook": {"name": "rb"}, "verdict": "GO", "environment": {"host": "a"},
            "steps": {"baseline": {"name": "baseline", "kind": "train", "status": "passed", "runs": [],
                                   "metrics": launch}}}, where


def test_compare_and_against_never_compare_a_launch_with_an_impossible_figure(tmp_path):
    earlier, earlier_dir = _run(tmp_path, "a", 5000.0, mfu={"mean": 3.0, "n": 20})  # MFU 3: no result
    now, now_dir = _run(tmp_path, "b", 1000.0, mfu={"mean": 0.6, "n": 20})
    out = compare_runs(earlier, now, earlier_dir, now_dir)
    (row,) = out["rows"]
    assert row["verdict"] == "inconclusive" and row["tested"] is False and not row["significant"]
    assert "A: mfu.mean = 3 outside [0, 1]" in row["note"] and out["exit_code"] == 0
    assert any("outside its physical range" in w for w in out["warnings"])
    pa = performance_analysis(now, earlier, now_dir, earlier_dir)
    assert pa["exit_code"] == 0 and pa["key_finding"]["step"] is None
    # the same two runs with a plausible earlier figure: the 80% slowdown is a regression
    earlier["steps"]["baseline"]["metrics"]["mfu"]["mean"] = 0.9
    assert compare_runs(earlier, now, earlier_dir, now_dir)["exit_code"] == 1
