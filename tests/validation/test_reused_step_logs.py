"""A criterion on the logs of a step taken from an earlier run (--reuse) reads that run's logs: this run's record
of the step keeps none of its files, so `not log_contains(kbench, "Traceback")` passed on an empty log whatever the
step had printed, and a positive check failed. The earlier run unreadable: the criterion errs, naming why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from validation.execution.acceptance import _logs, _namespace
from validation.results.run import read_run
from validation.runbook.expressions import compile_expression


def _runs(tmp_path: Path) -> tuple[dict, Path, Path]:
    earlier = tmp_path / "earlier"
    (earlier / "kbench").mkdir(parents=True)
    (earlier / "kbench" / "stdout.log").write_text("step 1\nTraceback (most recent call last):\n  boom\n")
    (earlier / "results.json").write_text(json.dumps({"steps": {"kbench": {
        "name": "kbench", "kind": "bench", "status": "passed", "artifacts": ["kbench/stdout.log"], "metrics": {}}}}))
    here = tmp_path / "here"
    here.mkdir()
    results = {"steps": {"kbench": {"name": "kbench", "kind": "bench", "status": "passed", "artifacts": [],
                                    "metrics": {}, "runs": [], "comparison": [],
                                    "reused": {"phase": "kernels", "from": str(earlier / "results.json")}}}}
    return results, earlier, here


def _evaluate(results: dict, run_dir: Path, text: str):
    return compile_expression(text).evaluate(_namespace(results), _logs(read_run(results), run_dir))


def test_a_reused_steps_logs_are_read_where_it_ran(tmp_path):
    results, _, here = _runs(tmp_path)
    assert _evaluate(results, here, 'not log_contains(kbench, "Traceback")').status == "fail"
    assert _evaluate(results, here, 'log_count(kbench, "step") == 1').status == "pass"


def test_a_reused_step_whose_earlier_run_is_gone_is_an_error_naming_it(tmp_path):
    results, earlier, here = _runs(tmp_path)
    shutil.rmtree(earlier)
    r = _evaluate(results, here, 'not log_contains(kbench, "Traceback")')
    assert r.status == "error" and "kbench was taken from" in r.detail and "cannot be read" in r.detail
