"""The README's test command runs the tests in two pytest-xdist workers (tests/conftest.py): a test marked
`exclusive` runs with no other test beside it, and the reliability figures printed at the end are every worker's.
Checked on a small generated suite that uses this suite's own conftest.py, in a pytest subprocess."""

from __future__ import annotations

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
    for name in ("conftest.py", "reliability_figures.py"):
        shutil.copy(HERE / name, root / name)
    (root / "spans_helper.py").write_text(SHARED)
    (root / "test_alone.py").write_text(
        "import pytest\nfrom spans_helper import _span\npytestmark = pytest.mark.exclusive\n"
        + "".join(f"def test_alone_{i}(tmp_path_factory):\n    _span('alone_{i}', tmp_path_factory, 0.8)\n"
                  for i in range(2)))
    for f in range(3):
        (root / f"test_shared_{f}.py").write_text(
            "from spans_helper import _span\n"
            + "".join(f"def test_{f}_{i}(tmp_path_factory, reliability):\n"
                      f"    reliability.record_inputs('parser{f}', 10)\n"
                      f"    _span('shared_{f}_{i}', tmp_path_factory)\n" for i in range(3)))


def test_an_exclusive_test_runs_alone_and_every_workers_figures_are_printed(tmp_path):
    root = tmp_path / "suite"
    root.mkdir()
    _write(root)
    base = tmp_path / "base"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p",
                           "no:cacheprovider", "--basetemp", str(base), str(root)],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "11 passed" in proc.stdout, proc.stdout[-2000:]
    spans = {p.name: tuple(map(float, p.read_text().split())) for p in (base / "spans").iterdir()}
    assert len(spans) == 11, sorted(spans)
    alone = [v for k, v in spans.items() if k.startswith("alone")]
    others = [v for k, v in spans.items() if k.startswith("shared")]
    # the shared tests did run side by side (two workers), but never beside an exclusive one
    assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(others) for b in others[i + 1:]), spans
    for a in alone:
        assert not [b for b in others if b[0] < a[1] and a[0] < b[1]], (a, spans)
    # 9 tests in three files, on two workers, each recorded 10 inputs: the controller prints them all
    assert "generated inputs tried: 90 (parser0 30, parser1 30, parser2 30)" in proc.stdout, proc.stdout[-2000:]
