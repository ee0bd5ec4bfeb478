"""What an A/B's decision says was chosen (validation.kinds.ab): the choice's and winner's params are the settings
the chosen side ran with, the baseline's own included (cpu_smoke's prefill baseline pins NSA_PREFILL_BATCHED "0"),
which the runner hands on as that step's winner (validation.execution.runner.chosen); a decision whose winner the
stability rule turned down records the baseline it kept; and a variant label can take neither the baseline's place
nor a key of the step's metrics."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from decision_support import FakeTrainer, run_ab_step, run_runbook
from validation.execution.runner import chosen
from validation.results.codec import decode
from validation.results.run import Step as StepRecord
from validation.runbook.loader import RunbookError, load_runbook

REPO = Path(__file__).resolve().parents[3]
RB = """\
name: t
requirements: {{gpus: 0, backend: gloo}}
defaults: {{config: configs/tiny_cpu.yaml, args: {{steps: 12}}, window: 10, warmup_steps: 2, nproc_per_node: 1}}
phases:
  - name: p
    steps:
      - name: prefill
        kind: ab
        baseline: {{env: {{NSA_PREFILL_BATCHED: "0"}}, args: {{seq_len: 96}}}}
        variants: {{{label}: {{env: {{NSA_PREFILL_BATCHED: "1"}}}}}}
        repeats: {repeats}
        recommend: true
"""
BASELINE_RAN_WITH = {"env.NSA_PREFILL_BATCHED": "0", "args.seq_len": 96}  # the runbook's baseline above


@pytest.fixture(scope="module", autouse=True)
def _libraries_loaded():
    """pandas (training.csv) and scipy (the statistics) load with a run's first use of them: once for the module,
    not inside the first test."""
    for name in ("pandas", "scipy.special"):
        importlib.import_module(name)


def _run(monkeypatch, tmp_path, levels, repeats, name):
    trainer = FakeTrainer(lambda spec: levels[spec.label], cv=0.01)
    results = run_runbook(monkeypatch, tmp_path, RB.format(label="batched", repeats=repeats), trainer, name)
    return results["steps"]["prefill"], trainer.launched


def test_a_baseline_that_wins_carries_the_settings_it_ran_with(monkeypatch, tmp_path):
    """Sequential prefill 20% faster in each of 2 interleaved repeats: the baseline is the significant winner, and
    its choice and winner recorded params {} (what the runner hands on as this step's winner) although every
    baseline launch ran with NSA_PREFILL_BATCHED=0 and --seq-len 96."""
    step, launched = _run(monkeypatch, tmp_path, {"baseline": 12_000.0, "batched": 10_000.0}, 2, "won")
    assert step["choice"]["label"] == "baseline" and step["choice"]["significant"] is True
    assert step["choice"]["params"] == BASELINE_RAN_WITH and step["winner"]["params"] == BASELINE_RAN_WITH
    ran = {(spec.env["NSA_PREFILL_BATCHED"], spec.argv[spec.argv.index("--seq-len") + 1])
           for spec in launched if spec.label == "baseline"}
    assert ran == {("0", "96")}
    assert chosen(decode(StepRecord, step, "steps.prefill", lenient=True)).params == BASELINE_RAN_WITH


def test_a_baseline_kept_without_a_difference_carries_the_settings_it_ran_with(monkeypatch, tmp_path):
    step, _ = _run(monkeypatch, tmp_path, {"baseline": 10_000.0, "batched": 10_000.0}, 2, "kept")
    assert step["choice"]["label"] == "baseline" and step["choice"]["kept_default"] is True
    assert step["choice"]["params"] == BASELINE_RAN_WITH and step["winner"] is None


def test_a_variant_that_wins_carries_its_own_settings(monkeypatch, tmp_path):
    step, _ = _run(monkeypatch, tmp_path, {"baseline": 10_000.0, "batched": 12_000.0}, 2, "variant")
    assert step["choice"]["label"] == "batched" and step["winner"]["params"] == {"env.NSA_PREFILL_BATCHED": "1"}


@pytest.mark.parametrize("label", ["baseline", "choice", "decided", "compared", "variants", "significant",
                                   "kept_default", "extra"])
def test_a_variant_label_cannot_take_the_baselines_place_or_a_metric_key(tmp_path, label):
    """`variants: {baseline: ...}` replaced the baseline: its settings (NSA_PREFILL_BATCHED=0) never ran, both
    launches ran the variant's, and the step compared the variant with itself. A variant named after one of the
    step's own metric keys lost its summary: `choice`/`decided` overwritten by the decision's, `compared`/`variants`
    dropped for the field of that name, `extra` dropped when the results are read back."""
    path = tmp_path / "rb.yaml"
    path.write_text(RB.format(label=label, repeats=2))
    with pytest.raises(RunbookError, match=rf"variants\.{label}: '{label}' cannot label a variant"):
        load_runbook(path, cwd=str(REPO))


def _measured_noise(monkeypatch, total=0.01):
    """A run-to-run variation of `total` measured in the run's earlier repeats: one run each is held to it (without
    one, block means alone decide nothing and the stability rule is never reached)."""
    from validation.analysis.significance.comparison import RunNoise
    from validation.kinds import ab as ab_mod

    noise = RunNoise(between=total, total=total, within=0.0, df=4.0, runs=6, groups=2, source="earlier (2 x 3 runs)")
    monkeypatch.setattr(ab_mod, "measured_run_noise", lambda *args, **kwargs: noise)


def test_an_ordinary_label_is_still_accepted(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(RB.format(label="baseline_batched", repeats=2))
    step = load_runbook(path, cwd=str(REPO)).steps()[0]
    assert list(step.variants) == ["baseline_batched"]


def test_a_winner_turned_down_as_unsteady_leaves_a_decision_record_that_names_the_baseline(monkeypatch, tmp_path):
    """One run each: batched measured 10x faster but its per-step throughput varied by 20% (throughput_stable
    false), so the step keeps the baseline. Its decision record still said choice batched, winner batched,
    significant, not kept_default: a record contradicting its own reason and the step's choice."""
    rng = np.random.default_rng(5)

    def collect(spec):
        return {"toks_per_s": {"mean": 10_000.0 if spec.label == "batched" else 1_000.0},
                "throughput_stable": spec.label != "batched",
                "interference": {"disturbed": False, "share": 0.0, "text": "no interference"}}

    def values(run):
        if run["label"] == "batched":
            return list(10_000.0 * (1 + 0.2 * rng.standard_normal(40)))
        return list(1_000.0 * (1 + 0.01 * rng.standard_normal(40)))

    _measured_noise(monkeypatch)  # one run each held to a run-to-run noise: the stability rule decides
    result = run_ab_step(monkeypatch, tmp_path, RB.format(label="batched", repeats=1), collect, values)
    d = result["decision"]
    assert "not stable, so the baseline is kept" in d["reason"] and d["method"] == "blocks"
    assert result["choice"]["label"] == "baseline" and result["winner"] is None
    assert (d["choice"], d["winner"], d["significant"], d["kept_default"]) == ("baseline", None, False, True)
    assert d["ranking"][0]["label"] == "batched"  # what the statistics found stays in the record
