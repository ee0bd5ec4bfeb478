"""The bench kind's reduction of its benchmark's JSON (validation.kinds.bench): the figures as written; a file that is
missing, empty, cut off or holds no figures fails the step with a reason naming which; an earlier attempt's
bench.json in the step directory (--resume, --rerun) is never read as this launch's; `best` picks per group the
record with the largest (smallest) finite figure, leaving out failed cases."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.kinds.bench import Best, Bench, Options, best_records


def _run(tmp_path: Path, writes: str | None, old: str | None = None, status: str = "ok", best: Best | None = None):
    step_dir = tmp_path / "bench"
    step_dir.mkdir()
    if old is not None:
        (step_dir / "bench.json").write_text(old)

    def launch(spec, index, total):
        if writes is not None:
            (step_dir / "bench.json").write_text(writes)
        return SimpleNamespace(status=status, reason="exited 0" if status == "ok" else "exit code 1", returncode=0)

    ctx = SimpleNamespace(run_dir=tmp_path, launches=[SimpleNamespace(dir="bench")], launch=launch,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    return Bench().run(Options(command=["b.py"], best=best), ctx)


def test_the_figures_are_the_json_as_written(tmp_path):
    result = _run(tmp_path, json.dumps({"speedup_min": 1.7, "by_seq_len": [{"seq_len": 64, "speedup": 1.7}]}))
    assert result.status == "passed" and result.reason is None
    assert result.metrics == {"speedup_min": 1.7, "by_seq_len": [{"seq_len": 64, "speedup": 1.7}]}


@pytest.mark.parametrize("text, words", [
    (None, "wrote no JSON"),
    ("", "is empty"),
    ('{"speedup_min": 1.7, "by_seq', "not valid JSON"),
    ("{}", "holds no figures"),
    ("[]", "holds no figures"),
])
def test_a_missing_empty_cut_or_empty_file_fails_naming_what_is_wrong(tmp_path, text, words):
    result = _run(tmp_path, text)
    assert result.status == "failed" and words in result.reason
    assert result.artifacts == []


def test_a_cut_off_file_names_where_it_ends(tmp_path):
    result = _run(tmp_path, '{"a": 1,\n "b": ')
    assert "bench.json" in result.reason and "line 2" in result.reason


def test_an_earlier_attempts_json_is_never_this_launchs(tmp_path):
    old = json.dumps({"speedup_min": 9.9})
    result = _run(tmp_path, None, old=old)  # this launch exited 0 and wrote nothing
    assert result.status == "failed" and "wrote no JSON" in result.reason
    assert "speedup_min" not in result.metrics
    assert (tmp_path / "bench" / "bench.prev1.json").read_text() == old  # kept, renamed


def test_a_failed_launch_keeps_its_status_and_reason(tmp_path):
    result = _run(tmp_path, json.dumps({"x": 1}), status="failed")
    assert (result.status, result.reason) == ("failed", "exit code 1")


def test_best_picks_per_group_the_largest_finite_figure_of_the_cases_that_ran(tmp_path):
    rows = [{"model": "nsa", "toks_per_s": 100.0}, {"model": "nsa", "toks_per_s": 300.0},
            {"model": "nsa", "toks_per_s": 900.0, "error": "OOM"}, {"model": "nsa", "toks_per_s": float("nan")},
            {"model": "dense", "toks_per_s": 250.0}, {"model": "dense", "toks_per_s": True}, {"toks_per_s": 1e9}]
    most = best_records(rows, Best(by="model", field="toks_per_s"))
    assert {k: v["toks_per_s"] for k, v in most.items()} == {"nsa": 300.0, "dense": 250.0}
    least = best_records(rows, Best(by="model", field="toks_per_s", largest=False))
    assert {k: v["toks_per_s"] for k, v in least.items()} == {"nsa": 100.0, "dense": 250.0}
    m = _run(tmp_path, json.dumps(rows), best=Best(by="model", field="toks_per_s")).metrics
    assert m["best"]["nsa"]["toks_per_s"] == 300.0 and len(m["results"]) == len(rows)
