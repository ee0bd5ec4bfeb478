"""The train kind's key figures (validation.kinds.train): the scaling efficiency is a train step's own (only this
kind writes scaling_efficiency; a benchmark's free-form JSON may hold a key of that name) or the multi-rank
baseline's per-GPU throughput over a single-process train step's; and the steps those figures use are the measured
evidence (key_figure_steps), never a single-process step no figure divides by."""

from __future__ import annotations

import sys
from pathlib import Path

from validation import kinds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decision_support import FakeTrainer, run_runbook  # noqa: E402


def _train(name: str, world: int, mean: float, per_gpu: float, status: str = "passed") -> dict:
    return {"name": name, "kind": "train", "status": status,
            "metrics": {"world_size": world, "toks_per_s": {"mean": mean, "stdev": 1.0, "n": 5},
                        "toks_per_s_per_gpu": per_gpu, "csv": f"{name}/out/training.csv"}}


def test_a_benchmark_figure_named_scaling_efficiency_is_not_the_scaling_key_figure():
    bench = {"name": "mybench", "kind": "bench", "status": "passed", "metrics": {"scaling_efficiency": 0.5}}
    steps = kinds.read_steps([bench, _train("baseline", 2, 1800.0, 900.0), _train("single", 1, 1000.0, 1000.0)])
    train = kinds.find("train")
    figure = next(f for f in train.key_figures(steps) if f.id == "scaling_efficiency")
    assert figure.raw == 900.0 / 1000.0  # the 2-rank baseline's per-GPU tokens/s over the single process's
    assert figure.steps == ("baseline", "single") and figure.value.startswith("0.90 (90% of linear; one launch each, no 95% interval)")
    assert train.key_figure_steps(steps) == ["baseline", "single"]


def test_a_train_steps_own_scaling_efficiency_is_the_figure():
    own = _train("two_nodes", 4, 3600.0, 900.0)
    own["metrics"].update(scaling_baseline="baseline", scaling_efficiency=0.75)
    steps = kinds.read_steps([_train("baseline", 2, 1800.0, 900.0), own, _train("single", 1, 1000.0, 1000.0)])
    train = kinds.find("train")
    figure = next(f for f in train.key_figures(steps) if f.id == "scaling_efficiency")
    assert (figure.raw, figure.steps) == (0.75, ("two_nodes",))
    assert train.key_figure_steps(steps) == ["baseline", "two_nodes"]


def test_a_single_process_step_no_figure_divides_by_is_not_measured_evidence(monkeypatch, tmp_path):
    """Both steps run on one rank: there is no scaling efficiency, so `warm`, which other work disturbed, is no
    figure's evidence: only the baseline is measured, and nothing is disturbed."""
    text = ("name: t\ndefaults: {nproc_per_node: 1, window: 5}\nphases:\n  - name: p\n    steps:\n"
            "      - {name: warm, kind: train, args: {steps: 10}}\n"
            "      - {name: baseline, kind: train, args: {steps: 10}}\n")
    trainer = FakeTrainer(lambda spec: 1000.0, busy=lambda spec: spec.step == "warm")
    results = run_runbook(monkeypatch, tmp_path, text, trainer)
    assert [results["steps"][s]["status"] for s in ("warm", "baseline")] == ["passed", "passed"]
    figures = kinds.find("train").key_figures(kinds.read_steps([results["steps"]["warm"],
                                                                results["steps"]["baseline"]]))
    assert [f.id for f in figures] == ["baseline_throughput"]
    assert results["evidence"]["measured"] == ["baseline"]
    assert results["evidence"]["disturbed"] == []


def test_a_baseline_that_did_not_pass_is_no_figure_whatever_rows_it_wrote():
    """A baseline that timed out after writing rows: its tokens/s was the run's headline figure, and the scaling
    efficiency divided by it, without a word of its status."""
    steps = kinds.read_steps([_train("baseline", 2, 1800.0, 900.0, status="timeout"),
                              _train("single", 1, 1000.0, 1000.0)])
    figures = {f.id: f for f in kinds.find("train").key_figures(steps)}
    assert figures["baseline_throughput"].value == "n/a (step timeout)"
    assert "scaling_efficiency" not in figures


def test_no_scaling_efficiency_against_a_baseline_that_did_not_pass(monkeypatch, tmp_path):
    """A step's scaling_baseline halted after writing rows: the efficiency divided by its throughput anyway."""
    import json

    class Halting(FakeTrainer):
        def __call__(self, spec):
            result = super().__call__(spec)
            if spec.step == "baseline":
                (Path(spec.trainer_out_dir) / "status.json").write_text(
                    json.dumps({"status": "halted", "reason": "a test halt", "step": 10}))
            return result

    text = ("name: t\ndefaults: {nproc_per_node: 1, window: 5}\nphases:\n  - name: p\n    steps:\n"
            "      - {name: baseline, kind: train, args: {steps: 10}}\n"
            "      - {name: more, kind: train, scaling_baseline: baseline, args: {steps: 10}}\n")
    results = run_runbook(monkeypatch, tmp_path, text, Halting(lambda spec: 1000.0))
    assert results["steps"]["baseline"]["status"] == "failed"
    assert results["steps"]["more"]["status"] == "passed"
    assert results["steps"]["more"]["metrics"].get("scaling_efficiency") is None
