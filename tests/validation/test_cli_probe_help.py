"""`--help` is the manual (validation/cli.py): each command's usage line and options name what they take the way
README.md's command lines do (`nsa-validate report RUN_DIR --format md|html|json|junit`, `compare RUN_A RUN_B`,
`--set KEY=VALUE`, `--resume RUN_DIR`, `--rerun STEP`, `--reuse PHASE` or `PHASE=RUN_DIR`), never the parser's
type names (`<list[str]>` read as "give a list" for an option that takes one phase, step or key per use)."""

from __future__ import annotations

import re

import pytest

# command -> (the usage line's arguments, the options' value names), as README.md writes them
MANUAL = {
    "run": (["RUNBOOK"], {"--out": "RUN_DIR", "--only": "PHASE", "--skip": "PHASE", "--resume": "RUN_DIR",
                          "--rerun": "STEP", "--set": "KEY=VALUE", "--against": "RUN_DIR",
                          "--reuse": "PHASE[=RUN_DIR]"}),
    "plan": (["RUNBOOK"], {"--set": "KEY=VALUE"}),
    "report": (["RUN_DIR"], {"--format": "md|html|json|junit", "--against": "EARLIER"}),
    "compare": (["RUN_A", "RUN_B"], {}),
}


@pytest.mark.parametrize("command", sorted(MANUAL))
def test_help_names_what_each_argument_and_option_takes(cli, command):
    proc = cli(command, "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    usage = proc.stdout.splitlines()[0]
    arguments, options = MANUAL[command]
    assert re.findall(r"\b[A-Z][A-Z_]+\b", usage.split("[OPTIONS]", 1)[1]) == arguments, usage
    for option, value in options.items():
        assert re.search(rf"^\s+{re.escape(option)} {re.escape(value)}\s", proc.stdout, re.M), (option, proc.stdout)
    assert "list[" not in proc.stdout and "<path>" not in usage, proc.stdout
