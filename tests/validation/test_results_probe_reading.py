"""Damaged results.json files and records (validation.results.store, model, codec): every one is refused with a
ResultsError naming the file and what is wrong (never a traceback, never a silent choice between two values), the
file is left as it was, and what write_results writes is what read_results reads."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validation.cli import app
from validation.results.codec import decode, encode
from validation.results.model import ResultsError, check_results
from validation.results.run import Run
from validation.results.store import RESULTS_JSON, read_results, write_results

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reuse_support import two_phase_runbook  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests/validation/fixtures/results_example.json"


@pytest.fixture
def example() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def _text(example: dict) -> str:
    return json.dumps(example, indent=2)


# each: (bytes of results.json made from the example's JSON text, what the message says is wrong)
DAMAGED = {
    "not UTF-8": (lambda t: t.encode().replace(b'"tool"', b'"tool\xff"', 1),
                  "unreadable (not UTF-8 text: byte 0xff at offset "),
    "a 5000-digit integer": (lambda t: t.replace('"schema_version": 1,', '"schema_version": 1, "n": ' + "7" * 5000
                                                 + ",", 1).encode(),
                             "unreadable (a number too long to read: "),
    "nested 100000 deep": (lambda t: t.replace('"tool":', '"deep": ' + "[" * 100_000 + "]" * 100_000 + ', "tool":',
                                               1).encode(),
                           "unreadable (its JSON is nested deeper than can be read)"),
    "a key given twice": (lambda t: t.replace('"verdict": ', '"verdict": "GO", "verdict": ', 1).encode(),
                          "unreadable (the key 'verdict' appears twice in one object: which value holds is not "
                          "known)"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_results_json_is_refused_naming_the_file_and_what_is_wrong(case, tmp_path, example):
    make, words = DAMAGED[case]
    data = make(_text(example))
    (tmp_path / RESULTS_JSON).write_bytes(data)
    with pytest.raises(ResultsError) as info:
        read_results(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / RESULTS_JSON}: {words}"), str(info.value)
    assert "\n" not in str(info.value)
    assert (tmp_path / RESULTS_JSON).read_bytes() == data


def test_report_and_resume_of_a_results_json_that_is_not_utf8_exit_2_in_one_line_and_keep_it(tmp_path, example, cli):
    """`report` and `run --resume` read the file first: one line naming it, exit 2, the file as it was and nothing
    launched (the runbook's steps are quick benchmark scripts). As a user runs it, in a process of its own (in the
    test's process the command would also see the children other tests of the worker left running)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    data = _text(example).encode().replace(b'"tool"', b'"tool\xff"', 1)
    (run_dir / RESULTS_JSON).write_bytes(data)
    runbook = two_phase_runbook(tmp_path)
    expected = f"nsa-validate: error: {run_dir / RESULTS_JSON}: unreadable (not UTF-8 text: byte 0xff at offset "
    for args in (["report", str(run_dir)], ["run", str(runbook), "--resume", str(run_dir)]):
        proc = cli(*args)
        output = (proc.stdout + proc.stderr).strip()
        assert proc.returncode == 2, (args, output)
        assert output.startswith(expected) and "\n" not in output, output
    assert (run_dir / RESULTS_JSON).read_bytes() == data
    assert sorted(p.name for p in run_dir.iterdir()) == [RESULTS_JSON]


def test_an_integer_beyond_a_floats_range_is_refused_where_a_report_would_read_it_as_a_number(tmp_path, example):
    """10**400 is valid JSON, but as a duration (or any figure) it has no float: the report's arithmetic would
    overflow. It is refused on read, naming the key, and `report` exits 2 in one line instead of a traceback."""
    example["steps"]["baseline"]["duration_s"] = 10 ** 400
    (tmp_path / RESULTS_JSON).write_text(json.dumps(example))
    with pytest.raises(ResultsError) as info:
        read_results(tmp_path)
    assert str(info.value) == (f"{tmp_path / RESULTS_JSON}: steps.baseline.duration_s: an integer of 1329 bits is "
                               "beyond a float's range (results.json holds finite numbers only)")
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and result.output.startswith("nsa-validate: error: "), result.output
    inside = copy.deepcopy(example)
    inside["steps"]["baseline"]["duration_s"] = 1.0
    inside["steps"]["baseline"]["metrics"]["huge"] = [-10 ** 400]
    with pytest.raises(ResultsError, match=r"steps\.baseline\.metrics\.huge\[0\]: an integer of 1329 bits"):
        check_results(inside, "r.json")
    inside["steps"]["baseline"]["metrics"]["huge"] = [2 ** 64]  # a large integer a float holds: kept
    check_results(inside, "r.json")


def _colliding(example: dict) -> dict:
    example["steps"]["baseline"]["metrics"]["by_rank"] = {1: 0.5, "1": 0.7}
    return example


def _deep(example: dict) -> dict:
    deep: list = []
    inner = deep
    for _ in range(5000):
        inner.append([])
        inner = inner[0]
    example["steps"]["baseline"]["metrics"]["deep"] = deep
    return example


@pytest.mark.parametrize("change, words", [
    (_colliding, "steps.baseline.metrics.by_rank['1']: keys 1 and '1' are both written as \"1\": the object would "
                 "hold that key twice"),
    (_deep, "a value nested deeper than can be checked"),
], ids=["keys written alike", "nested too deep"])
def test_write_results_refuses_what_read_results_could_not_read_back_and_keeps_the_file(change, words, tmp_path,
                                                                                      example):
    write_results(tmp_path, example)
    before = (tmp_path / RESULTS_JSON).read_bytes()
    with pytest.raises(ResultsError) as info:
        write_results(tmp_path, change(copy.deepcopy(example)))
    assert str(info.value).startswith(f"{tmp_path / RESULTS_JSON}: {words}"), str(info.value)
    assert (tmp_path / RESULTS_JSON).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULTS_JSON]
    example["steps"]["baseline"]["metrics"]["by_rank"] = {1: 0.5, 2: 0.7}  # integer keys alone: written, read back
    write_results(tmp_path, example)
    assert read_results(tmp_path)["steps"]["baseline"]["metrics"]["by_rank"] == {"1": 0.5, "2": 0.7}


@dataclasses.dataclass(frozen=True)
class Figures:
    mean: float
    cv: float | None = None
    values: list[float] = dataclasses.field(default_factory=list)


@pytest.mark.parametrize("data, where, shown", [
    ({"mean": math.nan}, "f.mean", "nan"),
    ({"mean": 1, "cv": math.inf}, "f.cv", "inf"),
    ({"mean": 1, "values": [2, -math.inf]}, r"f.values\[1\]", "-inf"),
    ({"mean": 10 ** 400}, "f.mean", "an integer beyond a float's range"),
], ids=["nan", "inf in an optional", "-inf in a list", "huge int"])
def test_strict_decoding_refuses_a_figure_that_is_not_finite_and_lenient_decoding_drops_it(data, where, shown):
    """results.json holds finite numbers only (validation.results.model): a strict decode names the key path
    instead of returning a record that encode then cannot write; a report's lenient decode takes the default."""
    with pytest.raises(ResultsError, match=f"^{where}: {shown} is not a finite number"):
        decode(Figures, data, "f")
    lenient = decode(Figures, data, "f", lenient=True)
    assert all(v is None or math.isfinite(v) for v in [lenient.mean, lenient.cv, *lenient.values])
    encode(lenient)
    with pytest.raises(ResultsError, match=r"^results\.duration_s: nan is not a finite number"):
        decode(Run, {"duration_s": math.nan}, "results")


def test_the_run_listing_shows_a_damaged_results_json_as_unreadable(tmp_path):
    """`nsa-validate runs` lists every run directory; one whose results.json is nested deeper than Python's parser
    goes was a RecursionError traceback, one with bytes that are not UTF-8 the same as any unreadable file."""
    from validation.run import list_runs
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "bytes").mkdir()
    (tmp_path / "bytes" / "results.json").write_bytes(b'{"runbook": {"name": "\xff"}}')
    rows = {path.name: verdict for path, _, verdict, _ in list_runs(tmp_path)}
    assert rows == {"deep": "unreadable", "bytes": "unreadable"}
