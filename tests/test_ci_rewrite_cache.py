""".ci/rewrite_tests.py: the assertion-rewritten bytecode it writes is what pytest reads instead of rewriting, with
PYTHONDONTWRITEBYTECODE set, and an edited test is rewritten again."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "rewrite_tests.py"

TEST = "def test_sum():\n    x = [1, 2]\n    assert sum(x) == 4\n"
HELPER = "VALUE = 3\n"


def _pytest(folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DEBUG": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:randomly", "--rootdir", str(folder), str(folder / "test_one.py")],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_pytest_reads_the_written_cache_and_rewrites_an_edited_test(tmp_path):
    (tmp_path / "test_one.py").write_text(TEST)
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "conftest.py").write_text("")
    before = _pytest(tmp_path)
    assert f"found cached rewritten pyc for {tmp_path / 'test_one.py'}" not in before.stderr
    assert not list(tmp_path.glob("__pycache__/test_one.*-pytest-*.pyc"))  # pytest itself wrote nothing

    done = subprocess.run([sys.executable, str(SCRIPT), "--tests-only", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2 of 2 test modules rewritten, 1 helper modules compiled, 0 of 0 pytest plugin" in done.stdout
    assert len(list(tmp_path.glob("__pycache__/test_one.*-pytest-*.pyc"))) == 1
    assert len(list(tmp_path.glob("__pycache__/helper.*.pyc"))) == 1

    cached = _pytest(tmp_path)
    assert f"found cached rewritten pyc for {tmp_path / 'test_one.py'}" in cached.stderr
    # the cached code is the rewritten one: the failing assert still shows its operands
    assert "assert 3 == 4" in cached.stdout and "where 3 = sum([1, 2])" in cached.stdout

    (tmp_path / "test_one.py").write_text(TEST.replace("== 4", "== 5  # edited"))
    edited = _pytest(tmp_path)
    assert f"found cached rewritten pyc for {tmp_path / 'test_one.py'}" not in edited.stderr
    assert "assert 3 == 5" in edited.stdout


def test_the_plugin_modules_are_those_pytest_marks_for_rewriting():
    """Every module of a distribution with a pytest11 entry point (pytest-xdist's here), nothing else."""
    spec = importlib.util.spec_from_file_location("rewrite_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugins = module.plugin_sources()
    import xdist.plugin
    assert str(Path(xdist.plugin.__file__).resolve()) in {str(Path(p).resolve()) for p in plugins}
    assert not [p for p in plugins if "/torch/" in p or "/nsa/" in p]


def test_a_missing_folder_is_named():
    done = subprocess.run([sys.executable, str(SCRIPT), "no/such/folder"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "no such folder: no/such/folder" in done.stderr
