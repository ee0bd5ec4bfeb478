"""Every figure the suite reports or gates on that has a physical range is checked against it
(validation.analysis.plausibility): utilisation, memory, loss, norms, shares, bandwidths and, where the device's peak
is known, throughput against what the device can do at MFU 1. A figure outside its range is never passed by a
criterion, a decision over runs that measured one recommends nothing and is no key finding, and the report names it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from validation.analysis import plausibility
from validation.analysis.plausibility import implausible, implausible_reads, peak_ceiling
from validation.execution.acceptance import evaluate, recommendations
from validation.execution.evidence import runs_implausible
from validation.report import findings
from validation.report.problems import open_problems
from validation.runbook.loader import load_runbook

from decision_support import judge

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"

QUIET = {"disturbed": False, "text": "no interference in 8 samples", "share": 0.0}
# an H100-like device: 1e15 FLOP/s peak, 1e9 FLOPs a token, 2 ranks: at most 2e6 tokens/s (1e6 a GPU), 2,000 TFLOP/s
GPU = {"peak_flops": 1e15, "flops_per_token": 1e9, "world_size": 2, "device": "cuda"}

RUNBOOK = """\
name: ev
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - {name: baseline, kind: train}
acceptance:
  - {name: "Throughput floor", expr: "baseline.toks_per_s.mean >= 1000000", target: ">= 1e6"}
  - {name: "Loss falls", expr: "baseline.loss_drop >= 1.0", target: ">= 1"}
"""


def _launch(toks: float, **extra) -> dict:
    return {"toks_per_s": {"mean": toks, "cv": 0.02, "n": 20}, "loss_drop": 2.0, "world_size": 2,
            "toks_per_s_per_gpu": toks / 2, "tflops_per_s": toks * 1e9 / 1e12, "interference": QUIET,
            "context": dict(GPU), **extra}


def _results(metrics: dict) -> dict:
    step = {"name": "baseline", "kind": "train", "status": "passed", "metrics": metrics, "runs": []}
    return {"runbook": {"name": "ev", "path": "runbooks/ev.yaml"}, "run_dir": "artifacts/validate/ev-1",
            "steps": {"baseline": step}, "acceptance": []}


@pytest.fixture
def rb(tmp_path):
    path = tmp_path / "ev.yaml"
    path.write_text(RUNBOOK)
    return load_runbook(path)


# ------------------------------------------------------------------------------------------ the declared ranges
@pytest.mark.parametrize("metrics, bad", [
    ({"gpu_util": {"mean": 100.0, "min": 0.0}}, []),
    ({"gpu_util": {"mean": 130.0, "max": 150.0}}, ["gpu_util.mean", "gpu_util.max"]),
    ({"gpu_util": {"min": -1.0}}, ["gpu_util.min"]),
    ({"mem_alloc_gb": {"max": -0.5}, "mem_reserved_gb": {"mean": -1.0}, "mem_peak_gb": -2.0},
     ["mem_alloc_gb.max", "mem_reserved_gb.mean", "mem_peak_gb"]),
    ({"gpu_mem_used_gb": {"mean": -1.0}, "rss_gb": {"max": -0.1}}, ["gpu_mem_used_gb.mean", "rss_gb.max"]),
    ({"loss": {"mean": -0.01}, "first_loss": 10.4, "final_loss": -1.0}, ["loss.mean", "final_loss"]),
    ({"grad_norm": {"min": -3.0}, "toks_per_s_per_node": -5.0}, ["grad_norm.min", "toks_per_s_per_node"]),
    ({"summary": {"tokens_per_s": -1.0, "samples_per_s": -2.0, "comm_share": 0.5, "peak_mem_alloc_gb": -1.0}},
     ["summary.tokens_per_s", "summary.samples_per_s", "summary.peak_mem_alloc_gb"]),
    ({"power_w": {"mean": -10.0}, "sm_clock_mhz": {"min": -1.0}, "cpu_util": {"mean": 187.3}},
     ["power_w.mean", "sm_clock_mhz.min"]),
    ({"interference": {"share": 1.25}}, ["interference.share"]),
    ({"all_reduce": {"busbw_gbps": {"max": -1.0, "median": 3.0}, "algbw_gbps": {"median": -2.0}}},
     ["all_reduce.busbw_gbps.max", "all_reduce.algbw_gbps.median"]),
], ids=["util-edge", "util-over-100", "util-negative", "memory", "telemetry-memory", "loss", "norm-node",
        "summary", "power-clock", "interference-share", "bandwidth"])
def test_every_figure_with_a_physical_range_is_checked(metrics, bad):
    assert [b["metric"] for b in implausible(metrics)] == bad


def test_throughput_above_what_the_device_can_do_at_its_peak_is_out_of_range():
    # ceiling: 2 x 1e15 / 1e9 = 2e6 tokens/s; per GPU 1e6; 2 x 1,000 = 2,000 TFLOP/s
    at_peak = _launch(2e6)
    assert implausible(at_peak) == []  # MFU exactly 1: at the edge, not beyond it
    over = _launch(2.5e6, toks_per_s_per_gpu=1.25e6)
    found = {b["metric"]: b for b in implausible(over)}
    assert sorted(found) == ["tflops_per_s", "toks_per_s.mean", "toks_per_s_per_gpu"]
    assert found["toks_per_s.mean"]["range"] == "[0, 2,000,000.0]"
    assert found["toks_per_s_per_gpu"]["range"] == "[0, 1,000,000.0]"
    assert found["tflops_per_s"]["range"] == "[0, 2,000.0]"
    assert "no device does more FLOP/s than its peak (2 x 1,000 TFLOP/s at 1e+09 FLOPs a token" in \
        found["toks_per_s.mean"]["reason"]
    # a single step's tokens/s above the peak is out of range too; the context's world size wins over the launch's
    assert [b["metric"] for b in implausible({"toks_per_s": {"max": 2.1e6}, "context": dict(GPU)})] \
        == ["toks_per_s.max"]
    # no ceiling where the peak is unknown (a CPU) or the FLOPs a token are
    assert implausible(_launch(9e9, context={**GPU, "peak_flops": None})) == []
    assert peak_ceiling({"context": {**GPU, "flops_per_token": None}}, "toks_per_s.mean") is None
    assert peak_ceiling(over, "loss.mean") is None
    # a criterion's read of the figure is judged against the same ceiling, in a run's metrics as in a step's
    ns = {"base": over, "sweep": {"runs": {"x=1": over}}}
    assert implausible_reads(ns, [("base", ("toks_per_s", "mean"))])
    assert implausible_reads(ns, [("sweep", ("runs", "x=1", "toks_per_s", "mean"))])
    assert implausible_reads({"base": at_peak}, [("base", ("toks_per_s", "mean"))]) == []


# ------------------------------------------------------------------------------------------ criteria and verdicts
def test_a_throughput_criterion_on_a_figure_beyond_the_device_peak_is_an_error_not_a_pass(rb):
    crits, (word, _) = judge(rb, _results(_launch(1.5e6)))  # MFU 0.75: a result
    assert crits["Throughput floor"]["status"] == "pass" and word == "GO"
    results = _results(_launch(3e6))  # MFU 1.5: the tokens/s are a bug in the measurement
    crits, (word, _) = judge(rb, results)
    floor = crits["Throughput floor"]
    assert floor["status"] == "error" and word == "NO-GO"
    assert "baseline.toks_per_s.mean = 3,000,000.0 outside [0, 2,000,000.0]" in floor["detail"]
    assert crits["Loss falls"]["status"] == "pass"
    assert {b["metric"] for b in results["evidence"]["implausible"]} == {
        "toks_per_s.mean", "toks_per_s_per_gpu", "tflops_per_s"}
    assert any(p["severity"] == "IMPLAUSIBLE" and "toks_per_s.mean = 3,000,000.0 is outside its physical range"
               in p["what"] for p in open_problems(results))


@pytest.fixture()
def smoke():
    """The committed cpu_smoke run and its runbook, the batched prefill runs recording an MFU of 3."""
    results = copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))
    for run in results["steps"]["prefill"]["runs"]:
        if run["label"] == "batched":
            run["metrics"]["mfu"] = {"mean": 3.0, "n": 20}
    return load_runbook(REPO / "runbooks/cpu_smoke.yaml", cwd=str(REPO)), results


def test_a_decision_over_runs_with_an_impossible_figure_is_no_key_finding(smoke):
    _, results = smoke
    assert runs_implausible(results["steps"]["prefill"]) == [
        "runs.batched.mfu.mean = 3 outside [0, 1]: no device does more FLOP/s than its peak"]
    comps = findings.comparisons(results)
    prefill = [c for c in comps if c.step == "prefill"]
    assert prefill and not any(c.significant for c in prefill)
    finding = findings.key_finding(comps)
    assert "prefill" not in (finding["step"] or "") and finding["text"].startswith("none: ")
    assert "1 step left out, prefill: a figure of the runs is outside its physical range" in finding["text"]
    row = next(r for r in findings.comparison_rows(comps) if r["step"] == "prefill")
    assert row["verdict"].startswith("NOT A RESULT") and not row["significant"]
    assert not any(r["source"] == "measured" for r in findings.recommendation_rows(results, comps))


def test_a_decision_over_runs_with_an_impossible_figure_recommends_nothing(smoke):
    rb, results = smoke
    notes = recommendations(rb, results)["notes"]
    prefill = next(n for n in notes if n.startswith("prefill: "))
    assert prefill.startswith("prefill: no recommendation: a figure of its runs is outside its physical range")
    assert "runs.batched.mfu.mean = 3 outside [0, 1]" in prefill and "a bug in the measurement" in prefill


def test_an_impossible_figure_of_disturbed_runs_is_said_to_be_measured_under_interference(smoke):
    """The same decision, its evidence disturbed (its runs measured while other work used the machine): the note
    says so, not that the measurement has a bug."""
    rb, results = smoke
    results["steps"]["prefill"]["interference"] = {"disturbed": True, "text": "other processes used 1.6 of 2 cores"}
    prefill = next(n for n in recommendations(rb, results)["notes"] if n.startswith("prefill: "))
    assert "outside its physical range, measured while other work used the machine, not a result" in prefill
    assert "bug" not in prefill


def test_a_criterion_on_a_decision_over_runs_with_an_impossible_figure_is_an_error(smoke):
    rb, results = smoke
    results["steps"]["bucket_sweep"]["runs"][0]["metrics"]["toks_per_s"]["cv"] = 0.8
    rows = {c["name"]: c for c in evaluate(rb, results, EXAMPLE.parent)}
    decided = rows["Bucket size decided"]
    assert decided["status"] == "error", decided
    assert "bucket_sweep.runs." in decided["detail"] and "toks_per_s.cv = 0.8 outside [0, 0.5]" in decided["detail"]
    assert rows["Loss falls"]["status"] == "pass"  # another step's correctness criterion is untouched


def test_a_step_time_of_zero_is_outside_its_range():
    """A training step's time of 0 (a window's step_time_s.min, a summary's min step time) passed the range '>= 0'
    beside a tokens/s computed without it; a step takes time: 0 is outside, a tiny positive time inside."""
    from validation.analysis.plausibility import range_of

    for name in ("step_time_s.min", "step_time_s.mean", "summary.min_step_time_s",
                 "summary.avg_step_time_excl_first_s"):
        rng = range_of(name)
        assert rng is not None and not rng.holds(0.0) and rng.holds(1e-6), name
    assert range_of("summary.comm_time_s").holds(0.0)  # no communication at all (one rank) is a time of 0


def test_every_declared_range_is_found_for_a_figure_at_its_pattern_and_only_there():
    """_range_for looks a path up among the patterns of its length and last key (plausibility._by_end): for every
    declared pattern a figure there ("<i>" an index, "<label>" a name) gets the first range declared for it (as a
    scan of every range in order finds it), and a figure one key longer or with another last key gets none of them."""
    def first_declared(path):
        for r in plausibility.RANGES:
            parts = r.pattern.split(".")
            if len(parts) == len(path) and all(plausibility._matches(p, k) for p, k in zip(parts, path)):
                return r
        return None

    for r in plausibility.RANGES:
        path = tuple(3 if p == "<i>" else "gpu0" if p == "<label>" else p for p in r.pattern.split("."))
        found, declared = plausibility._range_for(path), first_declared(path)
        # (a ceiling may tighten the range found: peak, CPU and bandwidth ceilings; its pattern stays)
        assert found is not None and found.pattern == declared.pattern and found.low >= declared.low, r.pattern
        for other in (path + ("x",), path[:-1] + ("not_a_figure",)):
            assert plausibility._range_for(other) == first_declared(other) is None, other


def test_a_range_whose_pattern_ends_in_a_placeholder_is_refused():
    """The lookup by last key cannot find such a range, so declaring one is an error (also under python -O)."""
    with pytest.raises(ValueError, match="ends in a placeholder.*rows.<i>"):
        plausibility._by_end((plausibility.Range("rows.<i>", 0.0, None),))
    assert plausibility._by_end((plausibility.Range("rows.<i>.speedup", 0.0, None),))
