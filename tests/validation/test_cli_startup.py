"""nsa-validate starts light: `import validation.cli` loads no torch, and the commands that need neither the trainer
nor the statistics (--help, list, kinds, plan of a CPU runbook, report in Markdown) load none of torch, pandas,
matplotlib or scipy. benchmarks/bench_startup.py times them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "pandas", "matplotlib", "scipy")

AUDIT = """\
import json, sys
argv = json.loads(sys.argv[1])
if argv is None:
    import validation.cli
else:
    sys.argv = ["nsa-validate", *argv]
    from validation.cli import main
    try:
        main()
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr)
"""


def loaded(argv: list[str] | None) -> list[str]:
    """The heavy modules loaded by `nsa-validate ARGV` (None: by `import validation.cli` alone)."""
    proc = subprocess.run([sys.executable, "-c", AUDIT.format(heavy=HEAVY), json.dumps(argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_import_validation_cli_does_not_import_torch():
    assert "torch" not in loaded(None)
    assert loaded(None) == []


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["kinds"], ["plan", "runbooks/cpu_smoke.yaml"],
                                  ["report", "RUN_DIR", "--format", "md"]],
                         ids=["help", "list", "kinds", "plan", "report"])
def test_light_commands_load_no_torch_pandas_or_matplotlib(argv, tmp_path):
    if "RUN_DIR" in argv:
        (tmp_path / "results.json").write_text((REPO / "tests/validation/fixtures/results_example.json").read_text())
        argv = [str(tmp_path) if a == "RUN_DIR" else a for a in argv]
    assert loaded(argv) == []
