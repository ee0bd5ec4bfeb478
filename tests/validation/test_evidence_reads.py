"""The run's closing bookkeeping (validation.execution.evidence.assess, validation.execution.acceptance.evaluate)
reads each step's results.json record as its kind's record (StepKind.read: a lenient decode of every launch's
metrics, what costs) a bounded number of times, however many kinds ask for key figures and however many criteria
read a figure computed from another step (StepKind.derived_from): once per pass, not once per kind and question.
Before, measured_steps read every step twice per registered kind (key_figure_steps, then key_figures), assess once
more per kind, and every criterion's derived read was decoded twice (the reads left undecided, then the judgement):
a run's finishing took seconds of decoding for a dozen steps. What they decide is unchanged (asserted
beside)."""

from __future__ import annotations

import collections

from scaling_support import BUSY, scaling_metrics, scaling_results, scaling_runbook

from validation import kinds as step_kinds
from validation.execution import evidence
from validation.execution.acceptance import evaluate
from validation.kinds.base import StepKind


def _results(base_interference: dict) -> dict:
    """one_node at 16,000 tokens/s on 8 ranks; two_nodes on 16 ranks at 0.95 of twice that, computed from it."""
    return scaling_results(0.95, scaling_metrics(16000.0, 8, base_interference), low=0.90, high=1.0)


def _counting(monkeypatch) -> collections.Counter:
    """Count StepKind.read of a results.json entry (a dict: a record already read is returned as it is), by step."""
    counts: collections.Counter = collections.Counter()
    original = StepKind.read

    def read(self, entry):
        if isinstance(entry, dict):
            counts[entry.get("name")] += 1
        return original(self, entry)

    monkeypatch.setattr(StepKind, "read", read)
    return counts


def test_assess_reads_each_step_a_few_times_not_once_per_kind(tmp_path, monkeypatch):
    rb = scaling_runbook(tmp_path)
    results = _results(BUSY)
    counts = _counting(monkeypatch)
    got = evidence.assess(rb, results, "artifacts/validate/sc-1")
    assert len(step_kinds.kinds()) > 10  # the bound below is far under one read per kind
    # once for measured_steps' key figures, once for assess's, once for the figures computed from another step
    assert set(counts) == {"one_node", "two_nodes"} and max(counts.values()) <= 3, counts
    # and what it found is as before: the disturbed baseline, measured because the efficiency divides by it
    assert [d["step"] for d in got["disturbed"]] == ["one_node"]
    assert got["measured"] == ["one_node", "two_nodes"]
    assert "--rerun one_node --rerun two_nodes" in got["rerun"]


def test_evaluate_reads_each_step_once_for_every_derived_read(tmp_path, monkeypatch):
    rb = scaling_runbook(tmp_path)
    results = _results(BUSY)
    results["evidence"] = evidence.assess(rb, results, "artifacts/validate/sc-1")
    counts = _counting(monkeypatch)
    rows = {c["name"]: c["status"] for c in evaluate(rb, results, tmp_path)}
    # four criteria read two_nodes (two of them a figure computed from one_node): one read of each step in all
    assert max(counts.values()) == 1, counts
    assert rows == {"Scaling": "inconclusive", "Scaling bound": "inconclusive", "Own speed": "pass",
                    "Learns": "pass"}

