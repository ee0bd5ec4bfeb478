"""A figure a step computes from another step's measurement is evidence of that other step too
(validation.execution.evidence, StepKind.derived_from): a train step's scaling efficiency divides its tokens/s by
its `scaling_baseline` step's, so when the baseline was measured while other work used the machine the efficiency
neither passes nor fails a criterion (inconclusive, the run INCOMPLETE with the command that runs the baseline
again with the step that computes the efficiency from it), whichever way it went, even though the step the criterion
names was measured undisturbed. Before, such a criterion decided on a figure whose denominator was disturbed: GO at
0.95, NO-GO at 0.50."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # decision_support, scaling_support

from decision_support import judge  # noqa: E402
from scaling_support import (BUSY, QUIET, REPO, SCALING_RUNBOOK, scaling_metrics, scaling_results,  # noqa: E402
                             scaling_runbook)

from validation import kinds as step_kinds  # noqa: E402
from validation.report.problems import open_problems  # noqa: E402

# one_node measured again, and two_nodes too: its efficiency is computed when it runs, and would otherwise still
# divide by one_node's disturbed tokens/s
RERUN = "nsa-validate run runbooks/sc.yaml --resume artifacts/validate/sc-1 --rerun one_node --rerun two_nodes"


def test_an_undisturbed_baseline_decides_as_before(tmp_path):
    rb = scaling_runbook(tmp_path)
    crits, (word, _) = judge(rb, scaling_results(0.95, scaling_metrics(16000.0, 8, QUIET)))
    assert crits["Scaling"]["status"] == "pass" and word == "GO"
    crits, (word, _) = judge(rb, scaling_results(0.50, scaling_metrics(16000.0, 8, QUIET)))
    assert crits["Scaling"]["status"] == "fail" and word == "NO-GO"


@pytest.mark.parametrize("efficiency", [0.95, 0.50], ids=["would-pass", "would-fail"])
def test_an_efficiency_over_a_disturbed_baseline_is_inconclusive(tmp_path, efficiency):
    rb = scaling_runbook(tmp_path)
    results = scaling_results(efficiency, scaling_metrics(16000.0, 8, BUSY))
    crits, (word, reason) = judge(rb, results)
    scaling = crits["Scaling"]
    assert scaling["status"] == "inconclusive", scaling
    assert ("it held" if efficiency > 0.85 else "it did not hold") in scaling["detail"]
    assert "one_node" in scaling["detail"] and "other processes used 1.40 of 2 cores" in scaling["detail"]
    assert scaling["detail"].endswith(f"run again: {RERUN}"), scaling["detail"]
    assert crits["Scaling bound"]["status"] == "inconclusive"  # the interval's bound divides by it too
    # what two_nodes measured of itself still decides: its own tokens/s, its loss
    assert crits["Own speed"]["status"] == "pass" and crits["Learns"]["status"] == "pass"
    assert word == "INCOMPLETE", (word, reason)
    assert "inconclusive: Scaling" in reason and "(disturbed: one_node)" in reason and RERUN in reason
    ev = results["evidence"]
    assert [d["step"] for d in ev["disturbed"]] == ["one_node"] and ev["rerun"] == RERUN
    assert any(p["severity"] == "INCONCLUSIVE" and p["where"] == "criterion Scaling" for p in open_problems(results))


def test_and_or_parts_on_an_efficiency_over_a_disturbed_baseline_are_unknown(tmp_path):
    """Three-valued logic: a known part decides whatever the efficiency holds, else the criterion is
    inconclusive."""
    text = SCALING_RUNBOOK.split("acceptance:")[0] + """acceptance:
  - {name: "And", expr: "two_nodes.scaling_efficiency >= 0.85 and two_nodes.loss_drop >= 1.0", target: "x"}
  - {name: "Or", expr: "two_nodes.scaling_efficiency >= 0.85 or two_nodes.loss_drop >= 1.0", target: "x"}
"""
    rb = scaling_runbook(tmp_path, text)
    busy = scaling_metrics(16000.0, 8, BUSY)
    crits, (word, _) = judge(rb, scaling_results(0.95, busy, loss_drop=0.1))  # the loss did not fall: "And" fails
    assert crits["And"]["status"] == "fail" and word == "NO-GO"
    crits, _ = judge(rb, scaling_results(0.50, busy, loss_drop=2.5))  # the loss fell: "Or" holds
    assert crits["Or"]["status"] == "pass"
    crits, (word, _) = judge(rb, scaling_results(0.50, busy, loss_drop=2.5))
    assert crits["And"]["status"] == "inconclusive" and word == "INCOMPLETE"
    crits, _ = judge(rb, scaling_results(0.95, busy, loss_drop=0.1))
    assert crits["Or"]["status"] == "inconclusive"


def test_an_impossible_own_efficiency_over_a_disturbed_baseline_is_explained_by_it(tmp_path):
    """The executive summary's scaling efficiency of two_nodes (14.9: outside (0, 1.1]) divides by one_node's
    tokens/s: measured disturbed, a disturbance explains it (inconclusive), not a bug in the measurement."""
    rb = scaling_runbook(tmp_path)
    results = scaling_results(14.9, scaling_metrics(16000.0, 8, BUSY))
    crits, (word, _) = judge(rb, results)
    bad = {b["metric"]: b["disturbed"] for b in results["evidence"]["implausible"] if b["step"] == "two_nodes"}
    assert bad == {"scaling_efficiency": True, "scaling_efficiency_low": True, "Scaling efficiency": True}, bad
    assert crits["Scaling"]["status"] == "inconclusive" and word == "INCOMPLETE"  # not an error: explained


def test_running_a_disturbed_baseline_again_runs_the_step_computing_from_it_too(tmp_path):
    """A criterion on one_node's own tokens/s, measured disturbed: the command that runs one_node again runs
    two_nodes too, whose efficiency would otherwise keep dividing by the disturbed figure."""
    rb = scaling_runbook(tmp_path, SCALING_RUNBOOK.replace('expr: "two_nodes.toks_per_s.mean >= 1000"',
                                            'expr: "one_node.toks_per_s.mean >= 1000"'))
    crits, (word, reason) = judge(rb, scaling_results(0.95, scaling_metrics(16000.0, 8, BUSY)))
    assert crits["Own speed"]["detail"].endswith(f"run again: {RERUN}"), crits["Own speed"]["detail"]
    assert word == "INCOMPLETE" and "(disturbed: one_node)" in reason and RERUN in reason


def test_the_open_problem_of_a_disturbed_baseline_reruns_the_step_computing_from_it_too(tmp_path):
    """The report's DISTURBED open problem for one_node: its command runs two_nodes again too."""
    from validation.execution.evidence import assess
    from validation.report.problems import open_problems

    rb = scaling_runbook(tmp_path, SCALING_RUNBOOK)
    results = scaling_results(0.95, scaling_metrics(16000.0, 8, BUSY))
    results["evidence"] = assess(rb, results, str(tmp_path))
    (item,) = [p for p in open_problems(results) if p["what"].startswith("measured while other work used")]
    assert item["where"] == "step one_node" and "--rerun one_node --rerun two_nodes" in item["what"], item


def test_the_train_kind_names_the_baseline_of_its_scaling_figures_only():
    train = step_kinds.get("train")
    record = scaling_results(0.95, scaling_metrics(16000.0, 8, QUIET))["steps"]["two_nodes"]
    for key in ("scaling_efficiency", "scaling_efficiency_low", "scaling_efficiency_high"):
        assert train.derived_from(train.read(record), (key,)) == ["one_node"]
    assert train.derived_from(train.read(record), ()) == ["one_node"]  # the step as a whole holds them
    assert train.derived_from(train.read(record), ("toks_per_s", "mean")) == []
    assert train.derived_from(train.read(record), ("loss_drop",)) == []
    alone = scaling_results(0.95, scaling_metrics(16000.0, 8, QUIET))["steps"]["one_node"]
    none = scaling_results(0.95, scaling_metrics(16000.0, 8, QUIET))["steps"]["two_nodes"]
    none["metrics"]["scaling_efficiency"] = None  # the baseline did not pass: its tokens/s was not used
    assert train.derived_from(train.read(none), ("scaling_efficiency",)) == []
    assert train.derived_from(train.read(alone), ("scaling_efficiency",)) == []
    assert step_kinds.get("pytest").derived_from(step_kinds.get("pytest").read({}), ("failed",)) == []


PAR_RUNBOOK = """\
name: sc
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - {name: bw, kind: comm}
      - {name: par, kind: parallelism, strategies: [ddp], comm: bw}
acceptance:
  - {name: "Predicted", expr: "par.strategies.ddp.comm_predicted_s <= 0.05", target: "<= 0.05 s"}
  - {name: "Measured", expr: "par.strategies.ddp.comm_time_s <= 0.05", target: "<= 0.05 s"}
"""


def _par_results(comm_interference: dict) -> dict:
    """A comm step whose record says it was (or was not) measured under interference, and a parallelism step
    whose collectives' time its tables predicted (0.04 s), measured undisturbed (0.03 s)."""
    ddp = {"strategy": "ddp", "runs": 1, "passed": 1, "toks_per_s": 1000.0, "comm_time_s": 0.03,
           "comm_predicted_s": 0.04, "comm_prediction": "from comm step 'bw'"}
    steps = {"bw": {"name": "bw", "kind": "comm", "status": "passed", "runs": [], "metrics": {"world_size": 2},
                    "interference": comm_interference},
             "par": {"name": "par", "kind": "parallelism", "status": "passed", "runs": [],
                     "metrics": {"strategies": {"ddp": ddp}, "comm_step": "bw"}}}
    return {"runbook": {"name": "sc", "path": "runbooks/sc.yaml"}, "run_dir": "artifacts/validate/sc-1",
            "steps": steps, "acceptance": []}


def test_a_collectives_time_predicted_from_a_disturbed_comm_step_is_inconclusive(tmp_path):
    rb = scaling_runbook(tmp_path, PAR_RUNBOOK)
    crits, (word, _) = judge(rb, _par_results({"disturbed": False, "text": "no interference in 1 launch"}))
    assert crits["Predicted"]["status"] == "pass" and word == "GO"
    busy = {"disturbed": True, "text": BUSY["text"], "launches": [{"label": "", "disturbed": True, "text": "x"}]}
    results = _par_results(busy)
    crits, (word, reason) = judge(rb, results)
    assert crits["Predicted"]["status"] == "inconclusive", crits["Predicted"]
    assert "computed from what step bw measured" in crits["Predicted"]["detail"]
    assert crits["Measured"]["status"] == "pass"  # what the parallelism step measured itself
    assert word == "INCOMPLETE" and "(disturbed: bw)" in reason and "--rerun bw --rerun par" in reason
    par = step_kinds.get("parallelism")
    record = par.read(results["steps"]["par"])
    assert par.derived_from(record, ("strategies", "ddp", "comm_predicted_s")) == ["bw"]
    assert par.derived_from(record, ("strategies", "ddp", "comm_time_s")) == []
    assert par.derived_from(record, ("recommendation",)) == []


DAMAGED = ({}, {"metrics": None}, {"metrics": [1]}, {"status": 3, "runs": "x"},
           {"metrics": {"scaling_baseline": 3, "scaling_efficiency": "x"}},
           {"metrics": {"scaling_baseline": ["a"], "scaling_efficiency": 0.9}},
           {"metrics": {"strategies": [1, 2], "comm_step": "bw"}},
           {"metrics": {"strategies": {"ddp": None, "fsdp": {"comm_predicted_s": "x"}}, "comm_step": 5}},
           {"metrics": {"strategies": {"ddp": {"comm_predicted_s": 0.1}}, "comm_step": "bw"}})


@pytest.mark.parametrize("kind", step_kinds.names())
def test_every_kind_answers_derived_from_for_a_damaged_step(kind):
    impl = step_kinds.get(kind)
    for damaged in DAMAGED:
        step = impl.read({"name": "s", "kind": kind, **damaged})
        for path in [(), ("scaling_efficiency",), ("strategies", "ddp", "comm_predicted_s"), ("strategies", 0),
                     ("runs", "x", "toks_per_s")]:
            found = impl.derived_from(step, path)
            assert isinstance(found, list) and all(isinstance(n, str) for n in found), (damaged, path, found)


def test_a_users_rerun_of_a_baseline_also_runs_the_step_computing_from_it(monkeypatch, tmp_path):
    """`--resume RUN --rerun one_node`: two_nodes divides by one_node's tokens/s, so it runs again too (said in a
    warning); left out by --skip, it keeps its figure and a warning says it stands on the earlier measurement."""
    from decision_support import FakeTrainer, run_runbook
    from validation.run import RunRequest, prepare

    text = SCALING_RUNBOOK.replace("  - name: p\n    steps:\n      - {name: one_node, kind: train}\n",
                           "  - name: p\n    steps:\n      - {name: one_node, kind: train}\n  - name: q\n    steps:\n")
    text = text.replace("defaults: {config: configs/tiny_cpu.yaml}",
                        f"defaults: {{config: {REPO / 'configs' / 'tiny_cpu.yaml'}}}")
    results = run_runbook(monkeypatch, tmp_path, text, FakeTrainer(lambda spec: 1000.0, cv=0.01))
    assert results["steps"]["two_nodes"]["metrics"]["scaling_efficiency"] is not None
    run_dir, runbook = tmp_path / "run", tmp_path / "rb.yaml"
    said: list[str] = []
    prepared = prepare(RunRequest(runbook=runbook, resume=run_dir, rerun=("one_node",), cwd=REPO), said.append)
    assert prepared.options.rerun == ("one_node", "two_nodes")
    assert any(w.startswith("--rerun one_node also runs two_nodes again") for w in said), said
    said.clear()
    prepared = prepare(RunRequest(runbook=runbook, resume=run_dir, rerun=("one_node",), skip=("q",), cwd=REPO),
                       said.append)
    assert prepared.options.rerun == ("one_node",)
    assert any("keeps standing on the earlier measurement" in w for w in said), said
