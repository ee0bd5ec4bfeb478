"""The train, longrun, profile and scaling kinds' step records (each kind's Result, validation.results.codec): every
step of each in the committed runs (reports/**/results.json) decodes strictly into its Result and encodes back to
the same JSON, numbers of the same JSON type; the hand-made example (tests/validation/fixtures/results_example.json,
older than some keys a trainer launch's metrics always hold now) decodes strictly and encodes back every key it has
unchanged. A damaged step reads leniently and still renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation import kinds
from validation.results.codec import decode, encode

REPO = Path(__file__).resolve().parents[3]
COMMITTED = sorted(REPO.glob("reports/**/results.json"))
FIXTURES = sorted(REPO.glob("tests/validation/fixtures/*.json"))
KINDS = ("train", "longrun", "profile")


def _steps(kind: str, paths=COMMITTED):
    for path in paths:
        data = json.loads(path.read_text())
        steps = data.get("steps") if isinstance(data, dict) else None
        for name, step in (steps or {}).items():
            if isinstance(step, dict) and step.get("kind") == kind:
                yield f"{path.relative_to(REPO)}: steps.{name}", step


@pytest.mark.parametrize("kind", KINDS)
def test_every_committed_step_of_the_kind_decodes_strictly_into_its_result_and_encodes_back_unchanged(kind):
    impl = kinds.get(kind)
    seen = 0
    for where, step in _steps(kind):
        result = decode(impl.result_type, step, where)
        assert json.dumps(encode(result)) == json.dumps(step), where
        assert impl.read(step) == result, where  # the report's lenient reading of a sound record: the same record
        seen += 1
    assert seen >= 1


def _holds(encoded, written, where: str) -> None:
    """Every key of `written` is in `encoded` with the same value (lists item by item)."""
    if isinstance(written, dict):
        assert isinstance(encoded, dict), where
        for key, value in written.items():
            assert key in encoded, f"{where}.{key}"
            _holds(encoded[key], value, f"{where}.{key}")
    elif isinstance(written, list):
        assert isinstance(encoded, list) and len(encoded) == len(written), where
        for i, (a, b) in enumerate(zip(encoded, written)):
            _holds(a, b, f"{where}[{i}]")
    else:
        assert json.dumps(encoded) == json.dumps(written), where


@pytest.mark.parametrize("kind", KINDS)
def test_every_step_of_the_kind_in_the_fixtures_decodes_strictly_and_keeps_its_keys(kind):
    impl = kinds.get(kind)
    seen = 0
    for where, step in _steps(kind, FIXTURES):
        _holds(encode(decode(impl.result_type, step, where)), step, where)
        seen += 1
    assert seen >= 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damaged", [{}, {"metrics": None}, {"metrics": [1]}, {"status": 3, "runs": "x"},
                                     {"metrics": {"toks_per_s": "fast", "window": 2, "summary": [],
                                                  "profile": {"top_ops": [None, {"name": 1, "total_ms": "x"}]},
                                                  "strong": {"rows": [None, {"world_size": "two"}]}}}])
def test_a_damaged_step_of_the_kind_still_reads_and_renders(kind, damaged):
    from validation.report.renderer import blocks_markdown

    impl = kinds.get(kind)
    result = impl.read({"name": "s", "kind": kind, **damaged})
    assert isinstance(result, impl.result_type)
    blocks_markdown(impl.blocks(result))
    impl.summary_line(result), impl.trainer_runs(result), impl.view(result, {"name": "s"})
    impl.key_figures([result]), impl.key_figure_steps([result])
