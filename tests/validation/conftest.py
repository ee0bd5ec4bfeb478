"""Fixtures shared by the tests of validation/: `cli` runs the nsa-validate command line as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m validation.cli ARGS` in the repository root, with the caller's NSA_* variables removed (a runbook's
    settings are the only toggles), `env` added and a wide terminal (COLUMNS=200, so console lines do not wrap)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    full_env.update(env or {})
    full_env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "validation.cli", *map(str, args)], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def cli():
    """run_cli: `cli("run", runbook, "--out", run_dir)` -> the CompletedProcess (stdout, stderr, returncode)."""
    return run_cli
