"""What `nsa-validate` prints from a results.json or a path it is given is printed as its text
(validation.report.console: "a value never recolours or moves the cursor of the console or log it lands in"):
`compare`'s table and warnings name a runbook whose recorded name holds a terminal title (OSC) and a clear-screen
(CSI) sequence as its letters, and an error naming a path given with an escape sequence in it prints none either."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from validation.cli import app

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests/validation/fixtures/results_example.json"
ESCAPES = "\x1b]0;owned\x07\x1b[2J"


def test_compare_prints_a_recorded_runbook_name_as_text_never_its_escapes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    shutil.copy(EXAMPLE, a / "results.json")
    data = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["runbook"]["name"] = "other" + ESCAPES
    (b / "results.json").write_text(json.dumps(data), encoding="utf-8")
    result = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout and "\x1b" not in result.stderr
    assert "warning: different runbooks: cpu_smoke vs other" in result.stderr.splitlines()
    assert result.stdout.splitlines()[0] == f"B = {b} (runbook other, NO-GO) against A = {a} (runbook cpu_smoke, NO-GO)"


def test_an_error_naming_a_path_with_an_escape_sequence_prints_its_text(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run\x1b[31m")])
    assert result.exit_code == 2
    assert result.stderr == (f"nsa-validate: error: {tmp_path}/run/results.json: not found (is {tmp_path}/run a "
                             "validation run directory?)\n")
