"""The deciding kinds' step records (sweep, ab, triage): every committed step of each, in the committed runs and the
test fixtures, decodes strictly into its kind's Result (a validation.results.run.Step whose metrics are typed) and
encodes back to the same record, every key with the same value and number type (in the committed runs, which this
version wrote, each value's keys in the same order too; the fixtures keep some of an older writer's order), and its
kind's report hooks read the Result as they read the step's JSON."""

from __future__ import annotations

import json

import pytest

from validation.kinds import get
from validation.results.codec import decode, encode, written
from results_records import committed_steps

KINDS = ("sweep", "ab", "triage")


def _sorted(step: dict, where: str) -> str:
    """The step's JSON, keys sorted; a fixture's runs without their launch metrics: the trainer launch's record
    (validation.results.trainer_launch.LaunchMetrics, every kind's), whose writer added keys since the fixtures were
    made (tests/validation/test_codec.py checks the committed runs' launches)."""
    if not where.startswith("reports/"):
        step = {**step, "runs": [{k: v for k, v in run.items() if k != "metrics"} for run in step["runs"]]}
    return json.dumps(step, sort_keys=True)


@pytest.mark.parametrize("kind", KINDS)
def test_every_committed_step_decodes_strictly_into_the_kinds_result_and_encodes_back_unchanged(kind):
    result_type = get(kind).result_type
    seen = 0
    for where, step in committed_steps(kind):
        result = decode(result_type, step, where)
        assert isinstance(result.metrics, type(result_type().metrics)), where
        out = encode(result)
        assert _sorted(out, where) == _sorted(step, where), where
        if where.startswith("reports/"):  # what this version writes: every value's keys in their order too
            for key, value in out.items():
                assert json.dumps(value) == json.dumps(step[key]), (where, key)
        assert get(kind).read(step) == result  # the report's lenient reading of a sound record: the same record
        seen += 1
    assert seen >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_the_report_hooks_read_a_result_as_they_read_its_json(kind):
    impl = get(kind)
    for _, step in committed_steps(kind):
        result = impl.read(step)
        assert impl.summary_line(result) == impl.summary_line(step)
        assert [str(b) for b in impl.blocks(result)] == [str(b) for b in impl.blocks(step)]
        assert impl.comparisons(result) == impl.comparisons(step)
        assert impl.trainer_launches(result) == impl.trainer_launches(step)


def test_a_decision_that_was_never_computed_leaves_its_figures_out_of_the_sweeps_metrics():
    from validation.kinds.sweep import Metrics

    undecided = {"points": 2, "runs": 2, "passed": 0, "repeats": 1, "winner": None, "decided": False,
                 "significant": False, "choice": None, "kept_default": False, "selection": "no decision: x"}
    assert encode(decode(Metrics, undecided)) == undecided
    nothing_compared = {**undecided, "method": None, "noise_floor": None, "recommended_repeats": None}
    assert written(decode(Metrics, nothing_compared)) == nothing_compared


def test_a_triage_that_never_ranked_has_no_verdict_and_one_that_did_names_or_nulls_its_culprit():
    from validation.kinds.triage import Metrics, Result, UNRANKED, ranked

    assert "culprit" not in encode(Metrics()) and Metrics().culprit == UNRANKED
    assert ranked(Result()) is None and ranked(decode(Result, {"metrics": {"reason": "x"}}, lenient=True)) is None
    unnamed = Result(metrics=Metrics(culprit=None, reason="no ranking: too few runs"))
    assert ranked(unnamed) == unnamed.metrics and encode(unnamed.metrics)["culprit"] is None
    # a null culprit without a ranking (results written before an unranked triage left the key out) compared nothing
    assert get("triage").summary_line(unnamed) == " no culprit named, nothing compared"
    none_named = Result(metrics=Metrics(culprit=None, ranking=["a"], reason="no suspect changes toks_per_s"))
    assert get("triage").summary_line(none_named) == " no culprit (no suspect improves it significantly)"
