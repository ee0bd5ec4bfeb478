"""The version of nsa-validate and the git commit of the source tree it runs from (`nsa-validate --version`,
results.json "tool").

The version is the source tree's (pyproject.toml `version`, beside the package in a checkout or a copy on
PYTHONPATH, installed or not), else the installed distribution's, "unknown" when neither names one. The git sha is HEAD of the checkout whose root holds this package (an
editable install or a clone on PYTHONPATH), "unknown" outside one: a package copied into site-packages reports no
commit, even when site-packages itself lies inside some other git checkout.

Only the standard library is imported here (the CLI's start-up stays light).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
from pathlib import Path

DISTRIBUTION = "nsa-validate"
UNKNOWN = "unknown"
SOURCE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding validation/ (and nsa/)
# What a run's source digest covers (source_digest): the code, its tests, benchmarks, runbooks and configs, and the
# project file; not reports/ or the docs, so that committing a run's report leaves the digest of its source as it was.
DIGEST_DIRS = ("nsa", "validation", "tests", "benchmarks", "runbooks", "configs")
DIGEST_FILES = ("pyproject.toml",)
DIGEST_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".j2", ".json", ".cfg", ".sh", ".txt", ".css", ".js")


def _source_tree_version(root: Path) -> str | None:
    """The `version` of root/pyproject.toml's [project] table when that project is this distribution, else None.
    Read line by line (tomllib is Python 3.11+): `name = "..."` and `version = "..."` as pyproject.toml writes them."""
    try:
        lines = (root / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    table, name, found = None, None, None
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            table = line
        elif table == "[project]" and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            text = value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else None
            if key == "name":
                name = text
            elif key == "version":
                found = text
    return found if name == DISTRIBUTION else None


def version() -> str:
    """The version of the source tree this package runs from (its pyproject.toml, at the root of a checkout or of a
    copy on PYTHONPATH, installed or not: what runs is that tree), else the installed distribution's, else
    "unknown"."""
    found = _source_tree_version(SOURCE_ROOT)
    if found:
        return found
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_sha() -> tuple[str, bool]:
    """(HEAD's sha of the checkout this package runs from, whether tracked files differ from it); ("unknown",
    False) when the package does not sit at the root of a git checkout."""
    top = _git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != SOURCE_ROOT:
        return UNKNOWN, False
    sha = _git("rev-parse", "HEAD")
    if not sha:
        return UNKNOWN, False
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return sha, bool(changes)


def source_digest(root: Path | None = None) -> str:
    """sha256 of the source tree a run runs from: every file under DIGEST_DIRS with a DIGEST_SUFFIXES suffix
    (caches left out), and DIGEST_FILES, each as its path relative to `root` (SOURCE_ROOT) and its bytes, in path
    order. Two trees with the same digest run the same code, tests, benchmarks and runbooks, in a git checkout or
    in a copy without .git (as on a GPU machine): what `nsa-validate run --reuse` compares (validation.results.reuse)."""
    root = Path(root or SOURCE_ROOT)
    files = [root / name for name in DIGEST_FILES if (root / name).is_file()]
    for top in DIGEST_DIRS:
        for folder, dirs, names in os.walk(root / top):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            files += [Path(folder) / n for n in names if n.endswith(DIGEST_SUFFIXES)]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda f: f.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        digest.update(b"%d:%s:%d:" % (len(rel), rel, len(data)))
        digest.update(data)
    return digest.hexdigest()


def version_line() -> str:
    """"nsa-validate 0.1.0 (git 12f074b...)": what `nsa-validate --version` prints."""
    sha, modified = source_sha()
    where = f"git {sha}" + (", with uncommitted changes" if modified else "")
    if sha == UNKNOWN:
        where = "git sha unknown: not running from a git checkout"
    return f"{DISTRIBUTION} {version()} ({where})"
