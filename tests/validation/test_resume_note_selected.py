"""A resume lists, in its record and its note, the steps it runs: a step that --only or --skip leaves out is not
among them, although it has no result yet (the earlier attempt was interrupted before it)."""

from __future__ import annotations

import json
from pathlib import Path

from validation.results.store import read_results, resume_note
from validation.run import RunRequest, run_runbook

REPO = Path(__file__).resolve().parents[2]


def _runbook(tmp_path: Path) -> Path:
    def step(name: str) -> str:
        code = "import json, sys; open(sys.argv[2], 'w').write(json.dumps({'x': 1}))"
        return f"      - {{name: {name}, kind: bench, command: [-c, {json.dumps(code)}]}}\n"

    path = tmp_path / "rb.yaml"
    path.write_text("name: sel\nphases:\n"
                    + "".join(f"  - name: p{i}\n    steps:\n" + step(n) for i, n in enumerate(("one", "two", "three"))))
    return path


def test_a_resume_names_only_the_steps_it_runs(tmp_path):
    runbook, run_dir = _runbook(tmp_path), tmp_path / "run"
    run_runbook(RunRequest(runbook=runbook, out=run_dir, cwd=REPO))
    # as an attempt interrupted after `one` leaves its results.json: `two` and `three` without a result
    results = json.loads((run_dir / "results.json").read_text())
    for name in ("two", "three"):
        results["steps"][name]["status"] = "pending"
    results.update(finished=None, verdict="INCOMPLETE", interrupted_by="SIGINT")
    (run_dir / "results.json").write_text(json.dumps(results))

    after = run_runbook(RunRequest(runbook=runbook, resume=run_dir, only=("p1",), cwd=REPO)).results
    assert after["steps"]["two"]["status"] == "passed"
    (entry,) = read_results(run_dir)["resumes"]
    assert entry["steps"] == ["two"]
    note = resume_note(after)
    assert "two" in note and "three" not in note, note
