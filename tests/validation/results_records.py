"""Complete results.json records for tests that write a synthetic run (validation.results.model): a test names the
keys it cares about and the rest get neutral values, so the record passes check_results as a real run's does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

from validation.results.model import SCHEMA_VERSION

WHEN = "2026-01-01T00:00:00+0000"
REPO = Path(__file__).resolve().parents[2]
COMMITTED_RUNS = sorted(REPO.glob("reports/**/results.json"))  # the runs committed under reports/
FIXTURE_RUNS = sorted(REPO.glob("tests/validation/fixtures/*.json"))  # the tests' hand-made runs


def committed_steps(kind: str, paths: list[Path] = COMMITTED_RUNS + FIXTURE_RUNS) -> Iterator[tuple[str, dict]]:
    """("<file>: steps.<name>", step) of every step of `kind` in the runs at `paths` (by default the committed runs
    and the fixtures), in file order."""
    for path in paths:
        data = json.loads(path.read_text())
        steps = data.get("steps") if isinstance(data, dict) else None
        for name, step in (steps or {}).items():
            if isinstance(step, dict) and step.get("kind") == kind:
                yield f"{path.relative_to(REPO)}: steps.{name}", step


def launch_run(partial: dict[str, Any] | None = None) -> dict[str, Any]:
    """A LaunchRun holding `partial`'s keys (label "run", passed, repeat 0, ... for those it lacks)."""
    partial = dict(partial or {})
    label = str(partial.get("label", "run"))
    return {"label": label, "params": {}, "status": "passed", "reason": None, "dir": label, "command": None,
            "metrics": {}, "repeat": 0, **partial}


def step_record(name: str, partial: dict[str, Any] | None = None) -> dict[str, Any]:
    """A StepResult named `name` holding `partial`'s keys (a passed train step for those it lacks); its runs are
    completed by launch_run."""
    partial = dict(partial or {})
    record = {"name": name, "phase": "main", "kind": "train", "title": name, "description": "", "status": "passed",
              "reason": None, "started": WHEN, "duration_s": 1.0, "dir": name, "command": None, "env": {},
              "metrics": {}, "runs": [], "winner": None, "comparison": [], "artifacts": [], "excerpt": None,
              "stack_dumps": [], "optional": False, **partial}
    record["runs"] = [launch_run(r) for r in record["runs"]]
    return record


def run_record(partial: dict[str, Any] | None = None) -> dict[str, Any]:
    """A RunResults holding `partial`'s keys (a finished GO run for those it lacks; a partial "runbook" is merged
    into a neutral one); its steps are completed by step_record and listed in one phase."""
    partial = copy.deepcopy(dict(partial or {}))
    steps = {name: step_record(name, step) for name, step in (partial.pop("steps", None) or {}).items()}
    runbook = {"name": "test", "description": "", "path": "runbook.yaml", "sha256": "0" * 64,
               **(partial.pop("runbook", None) or {})}
    return {"schema_version": SCHEMA_VERSION, "tool": {"name": "nsa-validate", "version": "0.0.0"},
            "runbook": runbook, "run_dir": "run", "started": WHEN, "finished": WHEN, "duration_s": 1.0,
            "verdict": "GO", "verdict_reason": "a synthetic record", "interrupted_by": None, "environment": {},
            "options": {"only": [], "skip": [], "set": []},
            "phases": [{"name": "main", "title": "Main", "description": "", "steps": list(steps)}],
            "steps": steps, "acceptance": [], "recommendations": {"env": {}, "notes": []}, "plots": [], **partial}
