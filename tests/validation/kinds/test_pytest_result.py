"""The pytest kind's Result (validation.kinds.pytest): every committed pytest step record decodes strictly into it and
encodes back unchanged (the whole step entry: its frame, metrics and artifacts, the step's and the metrics' keys in
the same order, numbers of the same JSON type; a file's record in the order FileResult declares, which the committed
runs, written before the metrics were typed, do not share); its metrics are typed (the counts, a FileResult per file
with isolate: file)."""

from __future__ import annotations

import json

from validation.kinds import get
from validation.kinds.pytest import FileResult, Metrics, Result, isolated_metrics, junit_counts
from validation.results.codec import decode, encode
from results_records import committed_steps


def test_every_committed_pytest_step_decodes_strictly_and_encodes_back_unchanged():
    seen = isolated = 0
    for where, step in committed_steps("pytest"):
        result = decode(Result, step, where)
        out = encode(result)
        assert json.dumps(out, sort_keys=True) == json.dumps(step, sort_keys=True), where
        assert list(out) == list(step) and list(out["metrics"]) == list(step["metrics"]), where
        assert isinstance(result.metrics, Metrics) and result.metrics.total, where
        assert all(isinstance(f, FileResult) for f in result.metrics.files), where
        assert get("pytest").read(step) == result
        isolated += bool(result.metrics.files)
        seen += 1
    assert seen >= 3 and isolated >= 1


def test_the_metrics_encode_as_the_dict_writer_wrote_them(tmp_path):
    """A run in one process writes the counts and the JUnit time; without a JUnit file, zeros and no time; with a
    process per file also the files, files_failed and died; a step that never ran writes {} (blank metrics)."""
    assert encode(junit_counts(tmp_path / "missing.xml")) == {"passed": 0, "failed": 0, "skipped": 0, "errors": 0,
                                                              "total": 0}
    (tmp_path / "pytest.xml").write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" '
                                         'time="1.25"/></testsuites>')
    assert encode(junit_counts(tmp_path / "pytest.xml")) == {"passed": 1, "failed": 1, "skipped": 1, "errors": 0,
                                                             "total": 3, "duration_s": 1.25}
    one = FileResult(file="t.py", status="passed", returncode=0, duration_s=0.5, passed=2, failed=0, skipped=0,
                     errors=0, total=2)
    m = encode(isolated_metrics([one]))
    assert list(m) == ["passed", "failed", "skipped", "errors", "total", "duration_s", "files", "files_failed", "died"]
    assert m["files"] == [encode(one)] and "started" not in m["files"][0]
    assert encode(Result())["metrics"] == {} and decode(Result, {"metrics": {}}).metrics is None


def test_the_report_reads_a_damaged_step_leniently():
    kind = get("pytest")
    assert kind.read({"metrics": {"passed": "x", "files": [{"file": "a.py", "status": "died", "total": []}]}}) \
        .metrics.files[0].total is None
    assert kind.blocks(kind.read({"metrics": [1]}))  # not a record: the counts table, empty
    assert kind.blocks(kind.read(None))
