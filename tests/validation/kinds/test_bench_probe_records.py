"""The bench kind against records as benchmarks really write them (validation.kinds.bench): Python's json writes a
NaN or an infinity as the bare words NaN / Infinity (bench_loss.py's rel diffs, bench_startup.py's load average),
which results.json cannot hold: each becomes null and is named, and a criterion reading it is an error; a file cut
inside a UTF-8 character, or a value that is no record, fails the step naming what is wrong instead of ending the
run; a benchmark that exits non-zero after writing its record (bench_attention.py, bench_train.py with a failed
case) keeps its figures and the file they came from."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.kinds.bench import Bench, Best, Options, finite_figures
from validation.results.codec import encode
from validation.runbook.expressions import compile_expression


def _run(tmp_path: Path, writes: bytes, status: str = "ok", best: Best | None = None):
    step_dir = tmp_path / "bench"
    step_dir.mkdir()

    def launch(spec, index, total):
        (step_dir / "bench.json").write_bytes(writes)
        return SimpleNamespace(status=status, reason="exited 0" if status == "ok" else "exit code 1", returncode=0)

    ctx = SimpleNamespace(run_dir=tmp_path, launches=[SimpleNamespace(dir="bench")], launch=launch,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    return Bench().run(Options(command=["b.py"], best=best), ctx)


def test_nan_and_infinity_become_null_named_and_a_criterion_on_them_is_an_error(tmp_path):
    record = {"device": "cpu", "by_seq_len": [{"seq_len": 64, "ranges_speedup": -math.inf},
                                              {"seq_len": 128, "ranges_speedup": 2.5}],
              "ranges_speedup_min": math.inf, "load": math.nan}
    text = json.dumps(record)  # the benchmarks' writer: allow_nan is json's default
    assert "Infinity" in text and "NaN" in text
    text = text.replace('"seq_len": 128', '"seq_len": 128, "huge": 1e999')  # a literal beyond a float's range
    result = _run(tmp_path, text.encode())
    assert result.status == "passed"
    assert result.metrics == {"device": "cpu", "ranges_speedup_min": None, "load": None,
                              "by_seq_len": [{"seq_len": 64, "ranges_speedup": None},
                                             {"seq_len": 128, "huge": None, "ranges_speedup": 2.5}]}
    assert result.notes == ["bench.json holds 4 figures that are not a finite number, recorded as null: "
                            "by_seq_len[0].ranges_speedup (-Infinity), by_seq_len[1].huge (Infinity), "
                            "ranges_speedup_min (Infinity), load (NaN)"]
    entry = encode(result)  # what results.json holds: no NaN or infinity, so nothing raises
    assert entry["metrics"]["ranges_speedup_min"] is None
    verdict = compile_expression("sel_perf.ranges_speedup_min > 1").evaluate({"sel_perf": entry["metrics"]})
    assert verdict.status == "error"


def test_a_list_record_with_a_nan_figure_keeps_its_rows_and_best_leaves_it_out(tmp_path):
    rows = [{"model": "nsa", "mode": "eager", "toks_per_s": math.nan},
            {"model": "nsa", "mode": "graphs", "toks_per_s": 120.0},
            {"model": "dense", "mode": "eager", "toks_per_s": 200.0}]
    result = _run(tmp_path, json.dumps(rows).encode(), best=Best(by="model", field="toks_per_s"))
    assert result.metrics["results"][0]["toks_per_s"] is None and len(result.metrics["results"]) == 3
    assert {k: v["mode"] for k, v in result.metrics["best"].items()} == {"nsa": "graphs", "dense": "eager"}
    assert result.notes == ["bench.json holds 1 figure that is not a finite number, recorded as null: "
                            "results[0].toks_per_s (NaN)"]
    encode(result)


def test_finite_figures_leave_a_finite_record_as_it_is():
    record = {"a": 1, "b": [1.5, {"c": None, "d": True, "e": "NaN"}], "f": -0.0}
    assert finite_figures(record) == (record, [])


def test_a_file_cut_inside_a_utf8_character_fails_naming_it(tmp_path):
    cut = '{"note": "5×"}'.encode()[:-3]  # ends on the first byte of "×"
    result = _run(tmp_path, cut)
    assert result.status == "failed" and "bench.json is not valid JSON" in result.reason
    assert "utf-8" in result.reason and result.artifacts == []


@pytest.mark.parametrize("text", ["42", '"fast"', "true", "1.5"])
def test_a_value_that_is_no_record_fails(tmp_path, text):
    result = _run(tmp_path, text.encode())
    assert result.status == "failed" and "is no record" in result.reason and text in result.reason
    assert result.metrics == {} and result.artifacts == []


def test_a_benchmark_that_exits_non_zero_after_writing_keeps_its_record_and_file(tmp_path):
    record = {"shape": "m7c", "results": [{"path": "dense", "seq_len": 2048, "toks_per_s": 1.1e6},
                                          {"path": "nsa-triton", "seq_len": 65536, "error": "out of memory"}],
              "checks": []}
    result = _run(tmp_path, json.dumps(record).encode(), status="failed")
    assert (result.status, result.reason) == ("failed", "exit code 1")
    assert result.metrics == record
    assert result.artifacts == ["bench/bench.json"]
