"""`nsa-validate plan` builds its rows as validation.runbook.plan's records (PlannedStep, PlannedLaunch): for every
runbook under runbooks/, the JSON `plan --json` prints decodes strictly into them and encodes back to the same JSON,
and the text `plan` prints is the same whether text_lines is handed the records or their JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation.results.codec import decode, encode
from validation.runbook.loader import load_runbook
from validation.runbook.plan import PlannedStep, describe, planned, text_lines

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted(REPO.glob("runbooks/*.yaml")), ids=lambda p: p.name)
def test_the_plan_is_its_records_and_their_json_alike(path):
    rb = load_runbook(path)
    skipped = {step.name: "not here" for step in list(rb.steps())[::2]}
    rows = describe(rb, skipped)
    steps = planned(rb, skipped)
    assert [decode(PlannedStep, r, f"plan[{i}]") for i, r in enumerate(rows)] == steps
    assert json.dumps(encode(steps)) == json.dumps(rows)
    assert text_lines(rb, rows) == text_lines(rb, steps)
    assert rows and all(set(r) == {"phase", "step", "kind", "skip", "notes", "jobs", "launches"} for r in rows)
