"""The results.json codec (validation.results.codec): typed records decoded by their type hints and encoded back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from results_records import COMMITTED_RUNS, committed_steps
from validation import kinds
from validation.analysis.significance import compare_paired, decide
from validation.results.codec import absent, blank, decode, encode
from validation.results.model import ResultsError
from validation.results.decision import ComparisonRecord, DecisionRecord
from validation.results.trainer_launch import LaunchMetrics, LaunchRun, Problem, Startup, TrainingSummary

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    value: float | None = None


@dataclasses.dataclass(frozen=True)
class Record:
    kind: Literal["a", "b"]
    count: int
    rows: list[Row] = dataclasses.field(default_factory=list)
    by_name: dict[str, int] = dataclasses.field(default_factory=dict)
    note: str | None = absent()
    free: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def test_decode_and_encode_round_trip_with_extra_keys_and_absent_fields():
    data = {"kind": "a", "count": 3, "rows": [{"name": "x", "value": 1}, {"name": "y", "value": None}],
            "by_name": {"x": 1}, "free": {"any": [1, "json"]}, "theirs": {"kept": True}}
    record = decode(Record, data)
    assert record.rows == [Row("x", 1.0), Row("y", None)] and isinstance(record.rows[0].value, float)
    assert record.note is None and record.extra == {"theirs": {"kept": True}}
    assert encode(record) == data  # `note` held its default: left out; `theirs` written back
    assert list(encode(record)) == ["kind", "count", "rows", "by_name", "free", "theirs"]
    assert encode(dataclasses.replace(record, note="n"))["note"] == "n"


@pytest.mark.parametrize("data, message", [
    ({"kind": "c", "count": 1}, "Record.kind: expected one of 'a', 'b', got 'c'"),
    ({"kind": "a"}, "Record.count: missing"),
    ({"kind": "a", "count": True}, "Record.count: expected int, got bool"),
    ({"kind": "a", "count": 1, "rows": [{"name": 2}]}, r"Record.rows\[0\].name: expected str, got int"),
    ({"kind": "a", "count": 1, "by_name": {"x": "1"}}, "Record.by_name.x: expected int, got str"),
    ([], "Record: expected Record, got list"),
])
def test_a_malformed_record_names_the_key_path(data, message):
    with pytest.raises(ResultsError, match=message):
        decode(Record, data)


@dataclasses.dataclass(frozen=True)
class Series:
    floats: list[float] = dataclasses.field(default_factory=list)
    ints: tuple[int, ...] = ()
    names: list[str] = dataclasses.field(default_factory=list)
    flags: list[bool] = dataclasses.field(default_factory=list)
    either: list[int | float] = dataclasses.field(default_factory=list)


class _Float(float):
    """A float of another type (numpy's float64 is one): decoded as a plain float."""


@pytest.mark.parametrize("data, expected", [
    ({"floats": [1, 2.5, -3, 0.0], "ints": [1, 2], "names": ["a"], "flags": [True, False], "either": [1, 2.5]},
     Series([1.0, 2.5, -3.0, 0.0], (1, 2), ["a"], [True, False], [1, 2.5])),
    ({"floats": [_Float(1.5), 2 ** 1100 // 2 ** 1000]}, Series([1.5, float(2 ** 100)])),
    ({"floats": [], "ints": []}, Series()),
])
def test_a_series_decodes_as_its_values_would_one_by_one(data, expected):
    """Lists of plain scalars are decoded in one pass: ints in a float list become floats, a float subclass a float,
    each value as decoding it alone would give it."""
    got = decode(Series, data)
    assert got == expected
    assert all(type(v) is float for v in got.floats) and type(got.ints) is tuple
    assert [type(v) for v in got.either] == [type(v) for v in expected.either]
    for name, values in data.items():  # the same as each value decoded alone, as a one-item list
        assert getattr(got, name) == type(getattr(got, name))(
            v for x in values for v in getattr(decode(Series, {name: [x]}), name))


@pytest.mark.parametrize("data, message", [
    ({"floats": [1.0, float("nan")]}, r"Series.floats\[1\]: nan is not a finite number"),
    ({"floats": [1.0, float("inf")]}, r"Series.floats\[1\]: inf is not a finite number"),
    ({"floats": [1.0, 2 ** 1100]}, r"Series.floats\[1\]: an integer beyond a float's range"),
    ({"floats": [1.0, True]}, r"Series.floats\[1\]: expected float, got bool"),
    ({"ints": [1, 2.0]}, r"Series.ints\[1\]: expected int, got float"),
    ({"ints": [False]}, r"Series.ints\[0\]: expected int, got bool"),
    ({"names": ["a", 1]}, r"Series.names\[1\]: expected str, got int"),
    ({"flags": [1]}, r"Series.flags\[0\]: expected bool, got int"),
    ({"either": [1, "2"]}, r"Series.either\[1\]: expected int \| float, got str"),
])
def test_a_value_of_a_series_that_does_not_fit_is_named_by_its_index(data, message):
    with pytest.raises(ResultsError, match=message):
        decode(Series, data)
    assert decode(Series, data, lenient=True) == Series()  # lenient: the field's default


@dataclasses.dataclass(frozen=True)
class Unhashable:
    # a type hint that cannot be hashed (typing refuses one in a union): its shape is not cached, still decoded
    pair: Literal[[1, 2]] = dataclasses.field(default_factory=lambda: [1, 2])


def test_a_hint_that_cannot_be_hashed_is_still_decoded():
    assert decode(Unhashable, {"pair": [1, 2]}).pair == [1, 2]
    with pytest.raises(ResultsError, match=r"Unhashable.pair: expected"):
        decode(Unhashable, {"pair": [2, 1]})


@dataclasses.dataclass(frozen=True)
class Grouped:
    anchor: Row | None = absent()
    member: int | None = absent(beside="anchor")
    inner: Row | None = blank()


def test_a_field_beside_another_is_written_with_it_and_a_blank_record_is_an_empty_object():
    assert encode(Grouped()) == {"inner": {}}
    assert encode(Grouped(anchor=Row("x"))) == {"anchor": {"name": "x", "value": None}, "member": None, "inner": {}}
    assert encode(Grouped(member=3, inner=Row("y"))) == {"member": 3, "inner": {"name": "y", "value": None}}
    assert decode(Grouped, {"inner": {}}) == Grouped()
    grouped = {"anchor": {"name": "x", "value": None}, "member": None, "inner": {}}
    assert encode(decode(Grouped, grouped)) == grouped


def test_lenient_decoding_takes_the_defaults_of_what_is_malformed():
    record = decode(Record, {"kind": "z", "count": "x", "rows": [{"name": 1, "value": "v"}], "by_name": 3},
                    lenient=True)
    assert record.kind is None and record.count is None and record.rows == [Row(None, None)] and record.by_name == {}
    assert decode(Record, None, lenient=True) == Record(None, None)


@dataclasses.dataclass(frozen=True)
class Holder:
    row: Row | None = None


def test_a_damaged_record_in_an_optional_field_keeps_its_good_fields_when_lenient():
    """One malformed value inside a `Row | None` field: a report (lenient) keeps the row's other fields instead of
    losing the whole row; strict decoding still names the bad key; null stays None."""
    data = {"row": {"name": "a", "value": "not a number"}}
    assert decode(Holder, data, lenient=True) == Holder(Row("a", None))
    with pytest.raises(ResultsError, match="row"):
        decode(Holder, data)
    assert decode(Holder, {"row": None}, lenient=True) == Holder(None)
    assert decode(Holder, {"row": 3}, lenient=True) == Holder(None)  # not a record at all: the default


def test_encode_refuses_what_json_cannot_hold():
    with pytest.raises(ResultsError, match="NaN"):
        encode(Row("x", float("nan")))


@pytest.mark.parametrize("kind", [k.name for k in kinds.kinds()])
def test_every_committed_step_decodes_strictly_into_its_kinds_result_and_encodes_back_equal(kind):
    """A kind's Result is its whole step record: every committed step of the kind decodes strictly into it (no value
    of the wrong type, no key lost: undeclared ones are kept in `extra`) and encodes back to an equal record (key
    order aside: tests/validation/kinds/test_<kind>_result.py files check the orders each kind keeps)."""
    result_type = kinds.get(kind).result_type
    seen = 0
    for where, step in committed_steps(kind, COMMITTED_RUNS):
        assert encode(decode(result_type, step, where)) == step, where
        seen += 1
    assert seen >= 1, f"no committed run has a {kind} step"


TRAINER_KINDS = ("train", "longrun", "profile", "sweep", "ab", "scan", "triage", "parallelism", "scaling")


def _trainer_launches():
    """(where, metrics) of every trainer launch in the committed runs: a single-launch step's metrics, and every run
    (and superseded run) of a multi-launch step."""
    for path in sorted(REPO.glob("reports/**/results.json")):
        for name, step in json.loads(path.read_text()).get("steps", {}).items():
            if step.get("kind") not in TRAINER_KINDS:
                continue
            if step.get("kind") in ("train", "longrun", "profile") and step.get("metrics"):
                yield f"{path}: steps.{name}.metrics", step["metrics"]
            for key in ("runs", "superseded"):
                for i, run in enumerate(step.get(key) or []):
                    if isinstance(run, dict) and isinstance(run.get("metrics"), dict):
                        yield f"{path}: steps.{name}.{key}[{i}].metrics", run["metrics"]


def test_every_committed_trainer_launch_decodes_into_launch_metrics_and_encodes_back_unchanged():
    """Strictly decoded, and written back with the same keys in the same order, the same values and the same JSON
    number types (an int stays an int)."""
    seen = 0
    for where, m in _trainer_launches():
        record = decode(LaunchMetrics, m, where)
        assert json.dumps(encode(record)) == json.dumps(m), where
        seen += 1
    assert seen >= 40


def test_launch_metrics_keep_a_missing_file_a_problem_and_undeclared_keys():
    data = {"status": "missing", "window": {"last": 20}, "context": {}, "summary": {"problem": "not JSON"},
            "startup": {}, "halted": True}
    m = decode(LaunchMetrics, data, lenient=True)
    assert m.context is None and m.summary == Problem("not JSON") and m.startup is None
    assert m.toks_per_s is None and m.telemetry is None and m.extra == {"halted": True}
    out = encode(m)
    assert out["context"] == {} and out["summary"] == {"problem": "not JSON"} and out["startup"] == {}
    assert "toks_per_s" not in out and "gpu_util" not in out and out["halted"] is True
    full = decode(LaunchMetrics, {"summary": {"steps": 3, "memory_kind": "cuda"}, "startup": {"init_s": 1.5}})
    assert isinstance(full.summary, TrainingSummary) and full.summary.steps == 3
    assert isinstance(full.startup, Startup) and full.startup.init_s == 1.5


def test_every_committed_run_of_a_multi_launch_step_decodes_as_a_launch_run_and_encodes_back_unchanged():
    seen = 0
    for path in sorted(REPO.glob("reports/**/results.json")):
        for name, step in json.loads(path.read_text()).get("steps", {}).items():
            for key in ("runs", "superseded"):
                for i, run in enumerate(step.get(key) or []):
                    where = f"{path}: steps.{name}.{key}[{i}]"
                    assert json.dumps(encode(decode(LaunchRun, run, where))) == json.dumps(run), where
                    seen += 1
    assert seen >= 40


def test_the_decision_records_name_the_keys_the_analysis_writes_in_its_order():
    """ComparisonRecord and DecisionRecord are the JSON form of significance.Comparison.as_dict() and
    Decision.as_dict(): the same keys in the same order, and a decision as written encodes back unchanged."""
    comp = compare_paired([100.0, 102.0, 99.0], [110.0, 111.0, 108.0], baseline="a", variant="b")
    record_keys = [f.name for f in dataclasses.fields(ComparisonRecord) if f.name != "extra"]
    assert list(comp.as_dict()) == record_keys
    d = decide({"a": [100.0, 102.0, 99.0], "b": [110.0, 111.0, 108.0]}, default="a")
    written = d.as_dict()
    declared = [f.name for f in dataclasses.fields(DecisionRecord)]
    assert list(written) == declared[:len(written)]
    assert json.dumps(encode(decode(DecisionRecord, written))) == json.dumps(written)
    undecided = {"reason": "no decision: too few runs", "significant": False, "choice": None}
    assert encode(decode(DecisionRecord, undecided)) == undecided
