"""validation/cli.py stays the thin door the design asks for: DESIGN.md's layout gives it "cli.py  parse, call one
function, print (<= 250 lines)", and "The CLI parses options, calls one function and prints". What is not parsing
or printing lives in the library (validation.run, validation.report.console, validation.kinds); this test fails
when the module grows past the design's 250 lines."""

from __future__ import annotations

from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "validation" / "cli.py"
DESIGN_MAX_LINES = 250


def test_the_cli_module_is_at_most_250_lines():
    lines = CLI.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= DESIGN_MAX_LINES, (
        f"{CLI.name} is {len(lines)} lines, the design allows {DESIGN_MAX_LINES}: move what is not parsing or "
        "printing into the library")
