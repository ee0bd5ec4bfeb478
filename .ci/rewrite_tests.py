"""Writes, once, the bytecode that every pytest process of the suite would otherwise make anew from tests/ sources.

pytest rewrites the asserts of each test module and conftest.py it imports (that is what lets a failing assert show
its operands) and caches the result as __pycache__/<name>.<cache tag>-pytest-<version>.pyc beside the source; with
PYTHONDONTWRITEBYTECODE set (as on these machines) it never writes that cache, but it reads it when it is there. So
each of the README command's two workers rewrote all ~400 test modules at collection (about 20 s of a core each on
the slower 2-core machine: the collection's CPU 35 s with rewriting, 16 s with --assert=plain), and each pytest a
test starts rewrote the modules it ran. This writes the cache pytest itself would write (its own functions, with
the default assertion-pass hook off, as this project's ini leaves it), spread over the cores, and the tests' helper
modules' ordinary bytecode beside it. pytest also rewrites the modules of every installed pytest plugin (a
distribution with a pytest11 entry point: hypothesis, pytest-xdist, ...; 97 of them imported, about 1.5 s of every
pytest process): their cache is written too, where pytest would write it (beside them in site-packages; a folder
that cannot be written is counted and left). pytest checks each cached file against its source's mtime and size, as
Python does, so an edited test is rewritten again. A pytest whose internals differ only loses the speed-up: this
says so and exits 0.

Usage: python .ci/rewrite_tests.py [--tests-only] [ROOT ...]   (default: tests; --tests-only: no plugin modules)
"""

from __future__ import annotations

import compileall
import fnmatch
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

TEST_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")  # pytest's default python_files, and every conftest


class _Quiet:
    """The assertion state's trace, for _write_pyc's error reports: none."""

    @staticmethod
    def trace(*_args) -> None:
        return None


def _rewrite(path: str) -> str | None:
    """Writes `path`'s rewritten pyc where pytest looks for it; None, or what went wrong."""
    from _pytest.assertion import rewrite

    fn = Path(path)
    try:
        stat, code = rewrite._rewrite_test(fn, None)
        cache = rewrite.get_cache_dir(fn)
        cache.mkdir(parents=True, exist_ok=True)
        if not rewrite._write_pyc(_Quiet(), code, stat, cache / (fn.name[:-3] + rewrite.PYC_TAIL)):
            return f"{path}: not written"
    except (OSError, SyntaxError, AttributeError, TypeError) as exc:
        return f"{path}: {type(exc).__name__}: {exc}"
    return None


def sources(roots: list[Path]) -> tuple[list[str], list[str]]:
    """(test modules and conftests pytest rewrites, the other modules), sorted."""
    tests, helpers = [], []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            (tests if any(fnmatch.fnmatch(path.name, p) for p in TEST_PATTERNS) else helpers).append(str(path))
    return tests, helpers


def plugin_sources() -> list[str]:
    """The Python files of every installed distribution that registers a pytest plugin (a pytest11 entry point):
    the modules pytest marks for rewriting at start-up (_pytest.config: _mark_plugins_for_rewrite)."""
    import importlib.metadata

    files = set()
    for dist in importlib.metadata.distributions():
        if any(ep.group == "pytest11" for ep in dist.entry_points):
            for file in dist.files or []:
                if str(file).endswith(".py"):
                    path = Path(dist.locate_file(file))
                    if path.is_file():
                        files.add(str(path))
    return sorted(files)


def main(argv: list[str]) -> int:
    tests_only = "--tests-only" in argv
    roots = [Path(a) for a in argv if a != "--tests-only"] or [Path("tests")]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        print(f"rewrite_tests: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        from _pytest.assertion import rewrite
        for name in ("_rewrite_test", "_write_pyc", "get_cache_dir", "PYC_TAIL"):  # what _rewrite uses
            getattr(rewrite, name)
    except (ImportError, AttributeError) as exc:
        print(f"rewrite_tests: pytest's rewrite cache not written ({exc}); each pytest rewrites the tests itself")
        return 0
    tests, helpers = sources(roots)
    plugins = [] if tests_only else plugin_sources()
    with ProcessPoolExecutor(max_workers=max(1, min(len(os.sched_getaffinity(0)), 8))) as pool:
        problems = [p for p in pool.map(_rewrite, tests, chunksize=8) if p]
        plugin_problems = [p for p in pool.map(_rewrite, plugins, chunksize=8) if p]
    for path in helpers:
        compileall.compile_file(path, quiet=2)
    for problem in problems[:3]:  # a pytest whose internals differ fails every file the same way
        print(f"rewrite_tests: {problem}")
    if len(problems) > 3:
        print(f"rewrite_tests: ... and {len(problems) - 3} more")
    print(f"rewrite_tests: {len(tests) - len(problems)} of {len(tests)} test modules rewritten, "
          f"{len(helpers)} helper modules compiled, {len(plugins) - len(plugin_problems)} of {len(plugins)} "
          f"pytest plugin modules rewritten" + (f" (first left: {plugin_problems[0]})" if plugin_problems else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
