"""How a decision that kept its point while its comparison found a difference is worded
(validation.kinds._decision_view): a difference significant against a run-to-run noise "is significant but decides
nothing"; one found by block means of one run each with no run-to-run noise held to (the reason why it decided
nothing) "is ahead on block means alone", never "is significant"."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decision_support import FakeTrainer, run_runbook  # noqa: E402

from validation.kinds import get  # noqa: E402
from validation.kinds._decision_view import decision_blocks, kept_text  # noqa: E402
from validation.results.decision import Choice, ComparisonRecord, DecisionRecord  # noqa: E402
from validation.results.run import Step as StepRecord  # noqa: E402


def _kept(run_to_run: float | None) -> tuple[DecisionRecord, Choice]:
    """50 kept; 100 measured 5.3% ahead of it (p 0.001) on block means of one run each."""
    comp = ComparisonRecord(baseline="50", variant="100", metric="toks_per_s", method="blocks", mean_a=10_000.0,
                            mean_b=10_530.0, rel=0.053, ci_low=0.03, ci_high=0.076, p_value=0.001, significant=True,
                            verdict="better", run_to_run=run_to_run, run_to_run_df=4.0 if run_to_run else None)
    decision = DecisionRecord(winner=None, choice="50", default="50", kept_default=True, significant=False,
                              comparison=comp, comparisons=[comp], method="blocks", repeats=1, reason="why.")
    return decision, Choice("50", {"env.NSA_DDP_BUCKET_MB": "50"}, "why.", significant=False, kept_default=True)


def test_a_point_kept_without_a_run_to_run_noise_is_ahead_on_block_means_alone():
    decision, choice = _kept(None)
    headline = decision_blocks(decision, choice)[0].text
    assert headline == ("**Decision**: NSA_DDP_BUCKET_MB=50 kept, no winner: 100 +5.3% against 50 is ahead on block "
                        "means alone, which decides nothing (the reason below)")
    line = kept_text(StepRecord(decision=decision, choice=choice), "50")
    assert line == ("50 kept, no winner: 100 +5.3% against 50 is ahead on block means alone, which decides nothing "
                    "(see the decision)")
    from validation.kinds._decision_view import unkept_clause

    assert unkept_clause(decision) == "100 +5.3% against 50 is ahead on block means alone, which decides nothing"


def test_a_point_kept_beside_a_difference_held_to_a_run_to_run_noise_is_still_called_significant():
    decision, choice = _kept(0.01)
    headline = decision_blocks(decision, choice)[0].text
    assert headline == ("**Decision**: NSA_DDP_BUCKET_MB=50 kept, no winner: 100 +5.3% against 50 is significant but "
                        "decides nothing (the reason below)")
    from validation.kinds._decision_view import unkept_clause

    assert unkept_clause(decision) == "100 +5.3% against 50 is significant but decides nothing"
    nothing = DecisionRecord(choice="50", significant=False, comparison=None, comparisons=[], reason="r")
    assert unkept_clause(nothing) is None


RB = """\
name: noise
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 30}
  window: 25
  warmup_steps: 5
phases:
  - name: p
    steps:
      - name: sw
        kind: sweep
        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50, 100]}
        prefer: {env.NSA_DDP_BUCKET_MB: 50}
"""


def test_a_sweep_of_one_run_a_point_without_noise_words_its_kept_point_by_its_reason(monkeypatch, tmp_path):
    """One run a point, 100 launched 6% above 50 (1% step noise), no run-to-run noise measured or declared: 50 is
    kept because block means alone decide nothing, and the headline and summary line say 100 is ahead on block
    means alone, not that the difference is significant."""
    offsets = {"25": -0.03, "100": 0.06}
    trainer = FakeTrainer(lambda spec: 10_000.0 * (1 + offsets.get(spec.env.get("NSA_DDP_BUCKET_MB", ""), 0.0)),
                          cv=0.01)
    sw = run_runbook(monkeypatch, tmp_path, RB, trainer)["steps"]["sw"]
    impl = get("sweep")
    step = impl.read(sw)
    assert step.choice.label == "NSA_DDP_BUCKET_MB=50" and not step.choice.significant
    assert "no run-to-run noise measured or declared" in step.decision.reason
    headline = decision_blocks(step.decision, step.choice)[0].text
    line = impl.summary_line(step)
    for text in (headline, line):
        assert ("NSA_DDP_BUCKET_MB=100 +" in text and "against NSA_DDP_BUCKET_MB=50 is ahead on block means alone"
                in text), text
        assert "is significant" not in text, text
