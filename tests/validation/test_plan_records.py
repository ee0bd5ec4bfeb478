"""`nsa-validate plan` builds its rows as validation.runbook.plan's records (PlannedStep, PlannedLaunch): for every
runbook under runbooks/, the JSON `plan --json` prints decodes strictly into them and encodes back to the same JSON,
and the text `plan` prints is the same whether text_lines is handed the records or their JSON."""

from __future__ import annotations

import json
import shlex
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


def test_the_plan_text_is_a_command_a_shell_runs_as_planned(tmp_path):
    """`plan` calls its lines the exact argv: an env value or an argument with a space or a shell character is quoted
    (it printed `FOO_X=a b`, which a shell reads as FOO_X=a and a command b)."""
    rb_text = (REPO / "runbooks" / "cpu_smoke.yaml").read_text().replace(
        "NSA_TB_DISABLE: \"1\"", "NSA_TB_DISABLE: \"1\"\n    FOO_X: \"a b; c\"", 1)
    assert "FOO_X" in rb_text
    path = tmp_path / "cpu_smoke.yaml"
    path.write_text(rb_text)
    rb = load_runbook(path)
    steps = planned(rb, {})
    lines = [line for line, _ in text_lines(rb, steps) if "FOO_X=" in line and "nsa.training" in line]
    assert lines
    words = shlex.split(lines[0].strip())
    assert "FOO_X=a b; c" in words and words[words.index("FOO_X=a b; c") + 1] != "c"
