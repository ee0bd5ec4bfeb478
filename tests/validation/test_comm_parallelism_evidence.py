"""Small evidence gaps of the `comm` and `parallelism` step kinds: the key figure of the comm steps comes from the one
with the most ranks (a one-rank step measures only the calls' overhead), a parallelism run whose summary.json has no
world size makes its prediction unavailable (said why) rather than stopping the analysis, a profiler trace without a
ProfilerStep range gives no per-step communication figure, and a parallelism step's per-strategy communication share
is range-checked (a share of the step time, in [0, 1]) and named among the open problems when outside it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from validation import kinds as registry
from validation.analysis.parallelism import exposed_comm
from validation.analysis.plausibility import implausible, range_of
from validation.kinds.comm import Comm
from validation.kinds.parallelism import Strategy
from validation.kinds.parallelism.analysis import figures
from validation.kinds.parallelism.records import RunInfo
from validation.report.problems import open_problems
from validation.results.codec import decode
from validation.results.trainer_launch import LaunchRun

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "reports/examples/parallelism_cpu/results.json"


def _example() -> dict:
    return json.loads(EXAMPLE.read_text())


# ---------------------------------------------------------------------------------------------- comm key figure
def _comm_steps(first_ranks: int, second_ranks: int) -> list:
    comm = _example()["steps"]["comm"]
    one, two = copy.deepcopy(comm), copy.deepcopy(comm)
    one["name"], one["metrics"]["world_size"] = "c_one", first_ranks
    two["name"], two["metrics"]["world_size"] = "c_two", second_ranks
    return registry.read_steps([one, two])


def test_the_comm_key_figure_comes_from_the_step_with_the_most_ranks():
    """A one-rank comm step listed before a two-rank one: the key figure is the two-rank step's peak bus bandwidth,
    naming that step, not "n/a (one rank)"."""
    steps = _comm_steps(1, 2)
    peak = steps[1].metrics.all_reduce.busbw_gbps.max
    assert peak and peak > 0
    (fig,) = Comm().key_figures(steps)
    assert fig.steps == ("c_two",) and "n/a" not in fig.value and "GB/s" in fig.value, fig
    assert "step `c_two`" in fig.note and "2 ranks" in fig.note, fig.note
    assert Comm().key_figure_steps(steps) == ["c_two"]


def test_the_comm_key_figure_prefers_more_ranks_and_keeps_the_first_of_equals():
    steps = _comm_steps(2, 4)
    (fig,) = Comm().key_figures(steps)
    assert fig.steps == ("c_two",) and "4 ranks" in fig.note
    steps = _comm_steps(2, 2)
    (fig,) = Comm().key_figures(steps)
    assert fig.steps == ("c_one",)
    only_one = _comm_steps(1, 1)  # every step at one rank: n/a, as before
    (fig,) = Comm().key_figures(only_one)
    assert fig.value == "n/a (one rank)" and fig.steps == ("c_one",) and Comm().key_figure_steps(only_one) == []


# ---------------------------------------------------------------------------------------------- world size unknown
def _run_and_info(world_size=None):
    per_step = [{"kind": "all_reduce", "calls": 1, "bytes": 65536, "sizes": [65536]}]
    summary = {"schema": 1, "steps": 10, "avg_step_time_excl_first_s": 0.2, "comm_share": 0.2,
               "comm": {"counted_by": "ddp_comm_hook", "per_step": per_step}}
    if world_size is not None:
        summary["world_size"] = world_size
    run = decode(LaunchRun, {"label": "ddp", "status": "passed", "repeat": 0,
                             "metrics": {"toks_per_s": {"mean": 100.0}}})
    return run, decode(RunInfo, {"summary": summary}, lenient=True)


TABLES = {"all_reduce": [{"bytes": 4096, "time_s": 1e-4, "algbw_gbps": 0.04096, "busbw_gbps": 0.04096},
                         {"bytes": 1048576, "time_s": 5e-4, "algbw_gbps": 2.097152, "busbw_gbps": 2.097152}]}


def test_a_summary_without_world_size_makes_the_prediction_unavailable_not_a_crash():
    run, info = _run_and_info()
    for comm_world in (None, 2):
        f = figures("ddp", Strategy(strategy="ddp"), [run], [info], TABLES, "comm step 'comm'", comm_world)
        assert f.comm_predicted_s is None and f.comm_predicted_by_kind is None
        assert f.comm_prediction.startswith("not available") and "world size" in f.comm_prediction, f.comm_prediction
        assert "None" not in f.comm_prediction, f.comm_prediction
        assert f.passed == 1 and f.comm_share == 0.2  # the rest of the strategy's figures stand
    run, info = _run_and_info(2)  # with a world size the tables predict, as before
    f = figures("ddp", Strategy(strategy="ddp"), [run], [info], TABLES, "comm step 'comm'", 2)
    assert f.comm_predicted_s is not None and f.comm_predicted_s > 0 and f.comm_prediction == "from comm step 'comm'"


# ---------------------------------------------------------------------------------------------- per-step comm
def _x(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_a_trace_without_profiler_steps_gives_no_per_step_figure():
    """200 us of gloo work, 50 of them beside compute: the trace's totals stand, its per-step figures are unknown
    without a ProfilerStep range (the whole trace is not one step), and the source says why."""
    events = [_x("aten::mm", 0, 100), _x("gloo:all_reduce", 50, 200, tid=7, cat="user_annotation")]
    out = exposed_comm(events)
    assert out["comm_s"] == 200e-6 and out["exposed_s"] == 150e-6
    assert out["steps"] == 0 and out["per_step_comm_s"] is None and out["per_step_exposed_s"] is None, out
    assert "ProfilerStep" in out["source"], out["source"]
    stepped = exposed_comm([_x("ProfilerStep#5", 0, 1000, cat="user_annotation"), *events])
    assert stepped["steps"] == 1 and stepped["per_step_exposed_s"] == 150e-6
    run, info = _run_and_info(2)
    info = decode(RunInfo, {"summary": {"schema": 1, "world_size": 2, "steps": 10}, "trace": out}, lenient=True)
    f = figures("ddp", Strategy(strategy="ddp"), [run], [info], None, "n/a")
    assert f.exposed_comm_s is None and f.profiled_comm_s is None and "ProfilerStep" in f.exposed_source


# ---------------------------------------------------------------------------------------------- comm_share range
def test_a_strategys_comm_share_is_range_checked():
    assert range_of("strategies.ddp.comm_share") is not None
    (bad,) = implausible({"strategies": {"ddp": {"comm_share": 1.5}, "fsdp": {"comm_share": 0.4}}})
    assert bad["metric"] == "strategies.ddp.comm_share" and bad["range"] == "[0, 1]", bad
    assert implausible({"strategies": {"ddp": {"comm_share": -0.1}}})
    assert implausible({"strategies": {"ddp": {"comm_share": 1.0}}}) == []


def test_an_out_of_range_comm_share_is_an_open_problem():
    results = _example()
    assert not [p for p in open_problems(copy.deepcopy(results)) if "comm_share" in p["what"]]
    results["steps"]["parallelism"]["metrics"]["strategies"]["fsdp"]["comm_share"] = 1.7
    found = [p for p in open_problems(results) if "comm_share" in p["what"]]
    assert len(found) == 1 and found[0]["where"] == "step parallelism" and found[0]["severity"] == "IMPLAUSIBLE", found
    assert "strategies.fsdp.comm_share = 1.7 is outside its physical range [0, 1]" in found[0]["what"], found
