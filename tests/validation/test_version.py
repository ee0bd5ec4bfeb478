"""`nsa-validate --version`: the installed version and the git sha of the source tree it runs from ("unknown"
outside a git checkout, and for a package that merely lies inside some other checkout); it loads no torch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION_PY = REPO / "validation" / "version.py"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_version_prints_the_version_and_the_checkout_sha(cli):
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), flags=re.M)[1]
    try:
        sha = _git("rev-parse", "HEAD", cwd=REPO)
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=REPO))
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the tests do not run from a git checkout")
    expected = f"nsa-validate {version} (git {sha}" + (", with uncommitted changes" if dirty else "") + ")"
    assert proc.stdout == expected + "\n"
    assert len(sha) == 40


def _source_sha_of_a_copy(root: Path) -> list:
    """source_sha() of validation/version.py copied to root/pkg/validation/version.py."""
    package = root / "pkg" / "validation"
    package.mkdir(parents=True)
    shutil.copy(VERSION_PY, package / "version.py")
    code = "import json; from validation.version import source_sha; print(json.dumps(source_sha()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={"PATH": "/usr/bin:/bin",
                         "PYTHONPATH": str(root / "pkg")}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_sha_is_unknown_outside_a_checkout_and_inside_another_one(tmp_path):
    assert _source_sha_of_a_copy(tmp_path / "plain") == ["unknown", False]
    outer = tmp_path / "outer"
    outer.mkdir()
    _git("init", "-q", cwd=outer)
    (outer / "f").write_text("x\n")
    _git("add", "f", cwd=outer)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x", cwd=outer)
    # the package sits inside outer's checkout, but outer is not its source tree: no commit to claim
    assert _source_sha_of_a_copy(outer) == ["unknown", False]


def test_version_loads_no_torch():
    code = ("import sys; sys.argv = ['nsa-validate', '--version']\nfrom validation.cli import main\ntry:\n    main()\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


def _version_of_a_copy(root: Path, pyproject: str | None) -> str:
    """version() of validation/version.py copied to root/pkg/validation/version.py, beside `pyproject` as
    root/pkg/pyproject.toml (none if None), never installed there; run without site-packages (-S)."""
    package = root / "pkg" / "validation"
    package.mkdir(parents=True)
    shutil.copy(VERSION_PY, package / "version.py")
    if pyproject is not None:
        (root / "pkg" / "pyproject.toml").write_text(pyproject)
    code = "from validation.version import version; print(version())"
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=root, env={"PATH": "/usr/bin:/bin",
                         "PYTHONPATH": str(root / "pkg")}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_source_tree_that_was_never_installed_reports_its_own_version(tmp_path):
    """As on a GPU machine that runs the project from a copy on PYTHONPATH: the tree's pyproject.toml says which
    version runs (its report said "nsa-validate unknown"); another project's pyproject.toml, or none, does not."""
    ours = '[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "nsa-validate"  # the tool\nversion = "9.8.7"\n'
    assert _version_of_a_copy(tmp_path / "a", ours) == "9.8.7"
    assert _version_of_a_copy(tmp_path / "b", ours.replace('"nsa-validate"', '"other"')) == "unknown"
    assert _version_of_a_copy(tmp_path / "c", '[tool.x]\nname = "nsa-validate"\nversion = "1.0"\n') == "unknown"
    assert _version_of_a_copy(tmp_path / "d", None) == "unknown"
