"""Evidence before verdicts (validation.execution.evidence, validation.analysis.plausibility, validation.execution.acceptance): a performance
criterion on a disturbed step is inconclusive whichever way it went, and the run INCOMPLETE with the command that
runs those steps again; correctness still decides; a figure outside its physical range is an error, never a pass;
the open problems name both; a decision leaves disturbed runs out and recommends only a replicated effect."""

from __future__ import annotations

import pytest

from validation.execution.evidence import is_performance, rerun_command
from validation.analysis.plausibility import figure_problem, implausible
from validation.report.problems import open_problems
from validation.runbook.loader import load_runbook

from decision_support import judge
from validation.analysis.significance import decide
from validation import kinds as step_kinds

RUNBOOK = """\
name: ev
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - {name: baseline, kind: train}
      - {name: single, kind: train, nproc_per_node: 1}
acceptance:
  - {name: "Throughput floor", expr: "baseline.toks_per_s.mean >= 2000", target: ">= 2000"}
  - {name: "Loss falls", expr: "baseline.loss_drop >= 1.0", target: ">= 1"}
  - {name: "Steady", expr: "baseline.throughput_stable", target: "cv <= 0.15", severity: warn}
"""

QUIET = {"disturbed": False, "text": "no interference in 8 samples", "share": 0.0}
BUSY = {"disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 5 of 8 samples (62%)",
        "share": 0.625}


def _metrics(toks: float, interference: dict, cv: float = 0.05, world: int = 2) -> dict:
    return {"toks_per_s": {"mean": toks, "cv": cv, "n": 20}, "loss_drop": 2.5, "throughput_stable": cv <= 0.15,
            "world_size": world, "toks_per_s_per_gpu": toks / world, "interference": interference,
            "context": {"device": "cpu"}}


def _results(base: dict, single: dict | None = None) -> dict:
    steps = {"baseline": {"name": "baseline", "kind": "train", "status": "passed", "metrics": base, "runs": []},
             "single": {"name": "single", "kind": "train", "status": "passed", "runs": [],
                        "metrics": single or _metrics(4000.0, QUIET, world=1)}}
    for s in steps.values():
        from validation.analysis.interference import step_interference
        s["interference"] = step_interference(s)
    return {"runbook": {"name": "ev", "path": "runbooks/ev.yaml"}, "run_dir": "artifacts/validate/ev-1",
            "steps": steps, "acceptance": []}


@pytest.fixture
def rb(tmp_path):
    path = tmp_path / "ev.yaml"
    path.write_text(RUNBOOK)
    return load_runbook(path)


def test_undisturbed_evidence_decides_as_before(rb):
    crits, (word, reason) = judge(rb, _results(_metrics(5000.0, QUIET)))
    assert [c["status"] for c in crits.values()] == ["pass", "pass", "pass"] and word == "GO"
    crits, (word, _) = judge(rb, _results(_metrics(500.0, QUIET)))
    assert crits["Throughput floor"]["status"] == "fail" and word == "NO-GO"


@pytest.mark.parametrize("toks", [5000.0, 500.0], ids=["would-pass", "would-fail"])
def test_a_disturbed_step_neither_passes_nor_fails_a_performance_criterion(rb, toks):
    results = _results(_metrics(toks, BUSY))
    crits, (word, reason) = judge(rb, results)
    floor = crits["Throughput floor"]
    assert floor["status"] == "inconclusive"
    assert ("it held" if toks > 2000 else "it did not hold") in floor["detail"]
    assert "step baseline was disturbed: other processes used 1.40 of 2 cores" in floor["detail"]
    rerun = "nsa-validate run runbooks/ev.yaml --resume artifacts/validate/ev-1 --rerun baseline"
    assert floor["detail"].endswith(f"run again: {rerun}")
    assert crits["Loss falls"]["status"] == "pass"  # correctness still decides on a busy machine
    assert crits["Steady"]["status"] == "inconclusive"
    assert word == "INCOMPLETE" and "inconclusive: Throughput floor" in reason and rerun in reason
    assert results["evidence"]["disturbed"][0]["step"] == "baseline" and results["evidence"]["rerun"] == rerun
    # the open problems name the disturbance and the criterion, with the command
    problems = open_problems(results)
    assert any(p["severity"] == "DISTURBED" and p["where"] == "step baseline" and rerun in p["what"]
               for p in problems)
    assert any(p["severity"] == "INCONCLUSIVE" and p["where"] == "criterion Throughput floor" for p in problems)
    # the report states the thresholds once, under its open problems
    from validation.report import render
    md = render(results, "md")
    assert "Interference (what makes a step DISTURBED): a sample is contended when" in md


def test_a_figure_a_disturbed_step_left_undecided_is_inconclusive_not_an_error(rb):
    """A performance figure that is None because the step's disturbed launches left it undecided (a triage naming no
    culprit, an A/B with nothing left to compare): the criterion cannot be evaluated, and the disturbance, not a
    fault of the suite, says why; the same None from an undisturbed step is an error."""
    base = _metrics(5000.0, BUSY)
    base["toks_per_s"]["mean"] = None
    crits, (word, reason) = judge(rb, _results(base))
    floor = crits["Throughput floor"]
    assert floor["status"] == "inconclusive", floor
    assert floor["detail"].startswith("it could not be evaluated (") and "None" in floor["detail"]
    assert "step baseline was disturbed: other processes used 1.40 of 2 cores" in floor["detail"]
    assert "run again: nsa-validate run runbooks/ev.yaml" in floor["detail"]
    assert word == "INCOMPLETE" and "inconclusive: Throughput floor" in reason
    quiet = _metrics(5000.0, QUIET)
    quiet["toks_per_s"]["mean"] = None
    crits, (word, _) = judge(rb, _results(quiet))
    assert crits["Throughput floor"]["status"] == "error" and word == "NO-GO"


def test_a_failed_correctness_criterion_is_no_go_even_when_disturbed(rb):
    base = _metrics(5000.0, BUSY)
    base["loss_drop"] = 0.1
    crits, (word, reason) = judge(rb, _results(base))
    assert crits["Loss falls"]["status"] == "fail" and word == "NO-GO"
    assert "criteria inconclusive (disturbed evidence): Throughput floor" in reason


def test_a_figure_outside_its_physical_range_is_an_error_never_a_pass(rb, tmp_path):
    results = _results(_metrics(5000.0, QUIET, cv=0.8))
    crits, (word, _) = judge(rb, results)
    # no criterion reads the CV, but the step is measured evidence: the figure is an error among the open problems
    assert results["evidence"]["implausible"][0]["metric"] == "toks_per_s.cv"
    problems = open_problems(results)
    assert any(p["severity"] == "IMPLAUSIBLE" and "toks_per_s.cv = 0.8 is outside its physical range [0, 0.5]"
               in p["what"] for p in problems)
    assert any(p["where"] == "step baseline" and "throughput not stable" in p["what"] for p in problems)
    # a criterion reading the implausible figure itself is an error (NO-GO), unless a disturbance explains it
    path = tmp_path / "cv.yaml"
    path.write_text(RUNBOOK.replace('expr: "baseline.toks_per_s.mean >= 2000"', 'expr: "baseline.toks_per_s.cv <= 0.9"'))
    cv = load_runbook(path)
    crits, (word, _) = judge(cv, _results(_metrics(5000.0, QUIET, cv=0.8)))
    assert crits["Throughput floor"]["status"] == "error" and "outside [0, 0.5]" in crits["Throughput floor"]["detail"]
    assert word == "NO-GO"
    crits, (word, _) = judge(cv, _results(_metrics(5000.0, BUSY, cv=0.8)))
    assert crits["Throughput floor"]["status"] == "inconclusive" and word == "INCOMPLETE"


def test_an_impossible_scaling_efficiency_is_named_not_passed(rb):
    # the baseline's 2 ranks at 9,000 tokens/s each against one process at 604: "14.90 (1490% of linear)"
    results = _results(_metrics(18000.0, QUIET), _metrics(604.0, QUIET, world=1))
    judge(rb, results)
    bad = [b for b in results["evidence"]["implausible"] if b["metric"] == "Scaling efficiency"]
    assert bad and bad[0]["step"] == "baseline, single" and not bad[0]["disturbed"]
    from validation.report.view import build_view
    fig = next(f for f in build_view(results)["key_figures"] if f["label"] == "Scaling efficiency")
    assert fig["value"].startswith("14.90 (1490% of linear; one launch each, no 95% interval): NOT A RESULT")
    assert figure_problem("scaling_efficiency", 0.6) is None and "(0, 1.1]" in figure_problem(
        "scaling_efficiency", 14.9)
    assert figure_problem("scaling_efficiency", 0.0) is not None  # at or below 0
    # the same figure from a disturbed single-process step: inconclusive, with the disturbance
    results = _results(_metrics(18000.0, QUIET), _metrics(604.0, BUSY, world=1))
    judge(rb, results)
    bad = [b for b in results["evidence"]["implausible"] if b["metric"] == "Scaling efficiency"]
    assert bad[0]["disturbed"] and any(p["severity"] == "INCONCLUSIVE" and "Scaling efficiency" in p["what"]
                                       for p in open_problems(results))


def test_declared_ranges():
    assert [b["metric"] for b in implausible({"mfu": {"mean": 1.2}, "step_time_s": {"min": -0.1},
                                              "toks_per_s": {"cv": 0.4, "mean": 10.0}, "time_to_first_step_s": 3})] \
        == ["mfu.mean", "step_time_s.min"]
    assert implausible({"scaling_efficiency": 1.1}) == [] and implausible({"scaling_efficiency": 1.11})


def test_performance_metrics_are_what_speed_is_measured_by():
    train = step_kinds.get("train")
    assert is_performance(train, ("toks_per_s", "mean")) and is_performance(train, ("throughput_stable",))
    assert not is_performance(train, ("loss_drop",)) and not is_performance(train, ("compression",))
    sweep = step_kinds.get("sweep")
    assert is_performance(sweep, ("decided",)) and is_performance(sweep, ("runs", "x=1", "toks_per_s", "mean"))
    assert not is_performance(step_kinds.get("pytest"), ("failed",))
    assert is_performance(step_kinds.get("bench"), ("ranges_speedup_min",))
    assert not is_performance(step_kinds.get("profile"), ("toks_per_s", "mean"))  # a trace, not a measurement
    assert rerun_command("runbooks/a b.yaml", "runs/x", ["s1", "s2", "s1"]) == (
        "nsa-validate run 'runbooks/a b.yaml' --resume runs/x --rerun s1 --rerun s2")


def test_a_decision_leaves_disturbed_runs_out_and_recommends_only_what_replicated():
    fast, slow = [[1300.0 + i for i in range(20)]], [[1000.0 + i for i in range(20)]]
    # 3 repeats, 30% apart in each: significant, replicated, recommendable
    runs = {"a": [1000.0, 1010.0, 990.0], "b": [1300.0, 1320.0, 1290.0]}
    d = decide(runs, default="a")
    assert d.winner == "b" and d.replicated and d.recommendable and "ahead in every one of 3 interleaved blocks" in \
        d.recommendation
    # the last of 3 blocks of 9 repeats went the other way: significant on average, not replicated: no winner
    odd = {"a": [1000.0] * 9, "b": [1400.0, 1410.0, 1390.0, 1400.0, 1405.0, 1395.0, 1400.0, 800.0, 800.0]}
    d = decide(odd, default="a")
    assert d.winner is None and not d.recommendable and "not in every interleaved block" in d.reason
    # a disturbed run is left out as a failed one would be, and the decision says so
    d = decide(runs, default="a", disturbed={"b": [False, True, False]})
    assert d.disturbed_runs == (("b", 1),) and "left out because other work used the machine" in d.reason
    assert d.repeats == 2
    # one run per variant: a winner for what later steps run with, never a recommendation
    d = decide({"a": slow, "b": fast}, default="a")
    assert d.winner == "b" and d.replicated is None and not d.recommendable
    assert "one run per variant" in d.recommendation


def test_the_command_that_runs_disturbed_steps_again_repeats_the_set_they_ran_with(rb):
    """"run again:" (the criterion, the verdict's reason and the evidence record) runs the disturbed steps with the
    --set they ran with, shell-quoted: the run's own, or those of the resume that ran them last."""
    results = _results(_metrics(5000.0, BUSY))
    results["options"] = {"only": [], "skip": [], "set": ["defaults.args.steps=14", "steps.baseline.window=6"]}
    crits, (word, reason) = judge(rb, results)
    rerun = ("nsa-validate run runbooks/ev.yaml --resume artifacts/validate/ev-1 --rerun baseline "
             "--set defaults.args.steps=14 --set steps.baseline.window=6")
    assert crits["Throughput floor"]["detail"].endswith(f"run again: {rerun}")
    assert word == "INCOMPLETE" and rerun in reason and results["evidence"]["rerun"] == rerun
    results["resumes"] = [{"at": "t", "previous_end": None, "previous_state": "interrupted by SIGINT",
                           "steps": ["baseline"], "rerun": [], "replaced": {}, "runbook_changed": False,
                           "options": {"only": [], "skip": [], "set": ["defaults.env.NSA_X=a b"]}}]
    crits, (word, reason) = judge(rb, results)
    assert reason.endswith("--rerun baseline --set 'defaults.env.NSA_X=a b'; nothing evaluated failed"), reason
    assert rerun_command("r b.yaml", "run dir", ["x", "x"], ["k=v w"]) == \
        "nsa-validate run 'r b.yaml' --resume 'run dir' --rerun x --set 'k=v w'"
