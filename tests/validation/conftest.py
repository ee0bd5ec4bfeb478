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
    argv = [sys.executable, "-m", "validation.cli", *map(str, args)]
    with subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM first: the CLI ends every process it launched (a SIGKILL would leave its trainers running,
            # loading the machine under the tests after this one), then says what it kept
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture(scope="session")
def cli():
    """run_cli: `cli("run", runbook, "--out", run_dir)` -> the CompletedProcess (stdout, stderr, returncode)."""
    return run_cli
