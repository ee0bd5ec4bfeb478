"""The README's test command runs the tests in two pytest-xdist workers (tests/conftest.py), side by side: the files
go out longest first by their recorded seconds (file_order.py), the reliability figures printed at the end are
every worker's, and the workers and the processes their tests start wait for work asleep (conftest.SESSION_ENV),
keeping a value set before the session. Checked on a small generated suite that uses this suite's own conftest.py,
in a pytest subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytest.importorskip("xdist")

SHARED = """
import time
from pathlib import Path

def _span(name, tmp_path_factory, seconds=0.4):
    start = time.time()
    time.sleep(seconds)
    out = Path(tmp_path_factory.getbasetemp()).parent / "spans"
    out.mkdir(exist_ok=True)
    (out / name).write_text(f"{start} {time.time()}")
"""


def _write(root: Path) -> None:
    for name in ("conftest.py", "reliability_figures.py", "file_order.py"):
        shutil.copy(HERE / name, root / name)
    (root / "spans_helper.py").write_text(SHARED)
    # one test, the longest file: pytest-xdist on its own would hand it out last (fewest tests)
    (root / "test_long.py").write_text("from spans_helper import _span\n"
                                       "def test_long(tmp_path_factory):\n    _span('long', tmp_path_factory, 1.2)\n")
    seconds = {"test_long.py": 1.2, "test_shared_0.py": 1.2, "test_shared_1.py": 1.2, "test_shared_2.py": 1.2}
    seconds["test_long.py"] = 9.0
    (root / "file_durations.json").write_text(json.dumps({"source": "test", "seconds": seconds}))
    for f in range(3):
        (root / f"test_shared_{f}.py").write_text(
            "from spans_helper import _span\n"
            + "".join(f"def test_{f}_{i}(tmp_path_factory, reliability):\n"
                      f"    reliability.record_inputs('parser{f}', 10)\n"
                      f"    _span('shared_{f}_{i}', tmp_path_factory)\n" for i in range(3)))
    (root / "test_env.py").write_text(ENV_TEST)


ENV_TEST = """
import json, os, subprocess, sys
from pathlib import Path

NAMES = ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS")

def test_env(tmp_path_factory):
    code = "import json, os; print(json.dumps({n: os.environ.get(n) for n in %r}))" % (NAMES,)
    child = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    seen = {"worker": {n: os.environ.get(n) for n in NAMES}, "child": child,
            "xdist": os.environ.get("PYTEST_XDIST_WORKER")}
    (Path(tmp_path_factory.getbasetemp()).parent / "env.json").write_text(json.dumps(seen))
"""


def test_tests_run_side_by_side_longest_file_first_and_every_workers_figures_are_printed(tmp_path):
    root = tmp_path / "suite"
    root.mkdir()
    _write(root)
    base = tmp_path / "base"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS")}
    env["OPENBLAS_NUM_THREADS"] = "3"  # set before the session: kept
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p",
                           "no:cacheprovider", "--basetemp", str(base), str(root)],
                          cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "11 passed" in proc.stdout, proc.stdout[-2000:]
    seen = json.loads((base / "env.json").read_text())
    assert seen["xdist"] and seen["worker"] == seen["child"] == {"OMP_WAIT_POLICY": "PASSIVE",
                                                                 "OPENBLAS_NUM_THREADS": "3"}, seen
    (base / "env.json").unlink()
    named = {p.name: tuple(map(float, p.read_text().split())) for p in (base / "spans").iterdir()}
    assert len(named) == 10, sorted(named)
    spans = list(named.values())
    # the tests did run side by side (two workers)
    assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1:]), spans
    # the longest file went out first: it started before any other test had finished
    long_start = named["long"][0]
    assert all(long_start < end for name, (_, end) in named.items() if name != "long"), named
    # 9 tests in three files, on two workers, each recorded 10 inputs: the controller prints them all
    assert "generated inputs tried: 90 (parser0 30, parser1 30, parser2 30)" in proc.stdout, proc.stdout[-2000:]
