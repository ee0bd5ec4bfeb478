"""The results.json codec (validation.results.codec): typed records decoded by their type hints and encoded back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from validation.kinds.pytest_suite import Result as PytestResult
from validation.kinds.sanitizer import Result as SanitizerResult
from validation.kinds.snapshot import Result as SnapshotResult
from validation.results.codec import absent, decode, encode
from validation.results.model import ResultsError

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


def test_lenient_decoding_takes_the_defaults_of_what_is_malformed():
    record = decode(Record, {"kind": "z", "count": "x", "rows": [{"name": 1, "value": "v"}], "by_name": 3},
                    lenient=True)
    assert record.kind is None and record.count is None and record.rows == [Row(None, None)] and record.by_name == {}
    assert decode(Record, None, lenient=True) == Record(None, None)


def test_encode_refuses_what_json_cannot_hold():
    with pytest.raises(ResultsError, match="NaN"):
        encode(Row("x", float("nan")))


@pytest.mark.parametrize("kind, result_type", [("pytest", PytestResult), ("sanitizer", SanitizerResult),
                                               ("snapshot", SnapshotResult)])
def test_a_kind_reads_and_writes_its_committed_results_through_the_codec(kind, result_type):
    """Every step of the kind in the committed runs decodes strictly into the kind's Result and encodes back to the
    same record (key order aside)."""
    seen = 0
    for path in sorted(REPO.glob("reports/**/results.json")):
        for name, step in json.loads(path.read_text()).get("steps", {}).items():
            if step.get("kind") != kind or not step.get("metrics"):
                continue
            result = decode(result_type, step["metrics"], f"{path}: steps.{name}.metrics")
            assert encode(result) == step["metrics"], (path, name)
            seen += 1
    assert seen >= 3
