"""A benchmark's JSON nested deeper than the readers of a step's metrics go (validation.kinds.bench.MAX_NESTING: the
non-finite scan, results.json's writer, criteria, the report's tables all recurse through it) fails its step naming
why, the way an unparseable file does, instead of ending the whole run with a RecursionError; a record nested up to
the bound keeps its figures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.kinds.bench import Bench, Options
from validation.results.codec import encode


def _run(tmp_path: Path, text: str):
    step_dir = tmp_path / "bench"
    step_dir.mkdir()

    def launch(spec, index, total):
        (step_dir / "bench.json").write_text(text)
        return SimpleNamespace(status="ok", reason="exited 0", returncode=0)

    ctx = SimpleNamespace(run_dir=tmp_path, launches=[SimpleNamespace(dir="bench")], launch=launch,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    result = Bench().run(Options(command=["b.py"]), ctx)
    return result, encode(result)  # what the runner writes into results.json


@pytest.mark.parametrize("text", [
    "[" * 500 + "]" * 500,  # lists: parsed by json, deeper than the non-finite scan recurses
    '{"a": ' * 900 + "1" + "}" * 900,  # objects: parsed by json, deeper than results.json's encoder recurses
    "[" * 5000 + "]" * 5000,  # deeper than json itself parses
], ids=["lists", "objects", "deeper-than-json-parses"])
def test_a_record_nested_too_deep_fails_its_step_naming_why(tmp_path, text):
    result, entry = _run(tmp_path, text)
    assert result.status == "failed"
    assert result.reason == "the benchmark's bench.json is nested deeper than 100 levels (lists and objects)"
    assert entry["metrics"] == {} and result.artifacts == []


def test_a_record_nested_to_the_bound_keeps_its_figures(tmp_path):
    depth = 100  # {"a": {"a": ... {"a": 1}}}: 100 objects, the documented bound
    result, entry = _run(tmp_path, '{"a": ' * depth + "1" + "}" * depth)
    assert result.status == "passed" and result.reason is None
    inner = entry["metrics"]
    for _ in range(depth - 1):
        inner = inner["a"]
    assert inner == {"a": 1}


@pytest.mark.parametrize("value, depth", [(3, 0), ("x", 0), ([], 1), ({}, 1), ([[1]], 2),
                                          ({"a": [1, {"b": []}], "c": 2}, 4), ([1, [2, [3]], {"k": 0}], 3)])
def test_nesting_counts_levels_of_lists_and_objects(value, depth):
    from validation.kinds.bench import MAX_NESTING, nesting

    assert MAX_NESTING == 100
    assert nesting(value) == depth


def test_a_benchmark_that_changes_its_directory_finds_its_json_under_a_relative_out(tmp_path, monkeypatch):
    """`--json` is absolute also for a relative --out: a benchmark that changed its directory before writing
    wrote to a path that no longer led into the run directory (FileNotFoundError, the step failed)."""
    import json as _json

    from validation.execution.runner import RunOptions, Runner
    from validation.runbook.loader import load_runbook

    code = ("import json, os, sys\nos.chdir('/')\n"
            "open(sys.argv[sys.argv.index('--json') + 1], 'w').write(json.dumps({'x': 1}))")
    rb = tmp_path / "rb.yaml"
    rb.write_text("name: t\nphases:\n  - name: p\n    steps:\n"
                  f"      - {{name: b, kind: bench, command: [-c, {_json.dumps(code)}]}}\n")
    monkeypatch.chdir(tmp_path)
    results = Runner(load_runbook(rb), Path("rel_run"), RunOptions(cwd=tmp_path)).run()
    assert results["steps"]["b"]["status"] == "passed", results["steps"]["b"]["reason"]
    assert results["steps"]["b"]["metrics"]["x"] == 1
