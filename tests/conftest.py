"""Root of both test suites (tests/nsa, tests/validation): the shared helper modules beside this file
(process_checks, reliability_figures) are importable from every test, and the reliability figures are printed
at the end of any session that recorded some. `python -m pytest -m reliability` runs just the tests that measure
them (reliability_figures.py says what each figure counts). The summary also counts the tests that skipped because
they need what only CI sets up (the Slurm test cluster, headless Chromium: their skip reasons name `.ci/run`, the
way to run every test).
"""

from __future__ import annotations

import logging
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Thread pools that wait for work asleep, not spinning, in every process of the session: set here, before this
# process loads torch or numpy, so that the pytest-xdist workers and every process a test starts (trainer ranks,
# `nsa-validate`, pytest and benchmark steps) inherit them. The README's test command runs two workers on a 2-core
# machine, so a second thread of any of them waits for a core another process holds; torch's OpenMP threads spin
# meanwhile (a one-process trainer run of 40 steps on 2 threads beside one busy process: 23.2 s of CPU and 19.2 s
# against 11.0 s and 11.8 s with OMP_WAIT_POLICY=PASSIVE; 10.1 s on one thread), and so do numpy's OpenBLAS threads
# (test_significance and test_compare beside one busy process: 159 s of CPU on two, 128 s on one). Neither changes
# the number of torch's threads, which the runs decide as the suite decides them (OMP_NUM_THREADS); a variable set
# already is kept.
SESSION_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_NUM_THREADS": "1"}
for _name, _value in SESSION_ENV.items():
    os.environ.setdefault(_name, _value)

from file_order import file_seconds, ordered  # noqa: E402
from reliability_figures import RECORDER  # noqa: E402


def pytest_configure(config):
    # pytest-xdist's --dist loadfile hands out files in the order pytest_collection_modifyitems leaves them (longest
    # first, file_order.py), not reordered by their number of tests
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _one_intra_op_thread()
    config.addinivalue_line(
        "markers", "reliability: measures a reliability figure (faults classified, generated inputs, orphans, "
                   "results lost); `python -m pytest -m reliability` prints them")


def _one_intra_op_thread() -> None:
    """In a pytest-xdist worker, torch computes on one thread. The README's test command runs two workers on a
    2-core machine; with torch's default of a thread per core each, the cores are oversubscribed and torch's many
    small ops wait for one (tests/nsa/test_model.py beside one busy process: 8.6 s on two threads, 4.5 s on one).
    This process only: the runs a test launches keep their own settings (OMP_NUM_THREADS, torchrun's)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands its reliability figures to the controller, which prints every worker's."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["reliability"] = RECORDER.to_json()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    data = getattr(node, "workeroutput", None) or {}
    if data.get("reliability"):
        RECORDER.merge(data["reliability"])


@pytest.fixture(autouse=True)
def _root_logger_put_back():
    """The root logger's handlers and level as they were before each test. A test that runs a command's main() in
    its own process (nsa-train's sets logging.basicConfig(force=True) on sys.stdout at INFO) leaves a root handler
    on that test's captured stream, which pytest closes after it; a later test in the same worker that logs at
    INFO (the launcher's "launching ...") then got "--- Logging error --- ValueError: I/O operation on closed
    file" in the output it checks (a CI run, when the file order put the two in one worker)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    def ours(handler) -> bool:  # basicConfig's and nsa-train's (a StreamHandler subclass), not pytest's own
        return isinstance(handler, logging.StreamHandler) and not type(handler).__module__.startswith("_pytest")

    yield
    for handler in list(root.handlers):
        if handler not in handlers and ours(handler):
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers and ours(handler):
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def reliability():
    """The session's recorder: record_fault(kind, expected, got), record_inputs(parser, n),
    record_orphans(found, checked), record_results(lost, checked)."""
    return RECORDER


def _cuda_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """`slow` tests (the kernels' full grids; end-to-end runs that repeat a covered path) run when a marker
    expression selects the tests (`-m slow`; `-m reliability` measures every reliability figure, the slow tests' too)
    and by default where a CUDA device is present (natively they take seconds); elsewhere (the interpreter on a CPU:
    minutes) the CI subset runs. The files go longest first (file_order.py), each file's tests in their order."""
    files = ordered(list(dict.fromkeys(item.nodeid.split("::")[0] for item in items)), file_seconds())
    rank = {path: i for i, path in enumerate(files)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a file's tests keep their order
    if (config.getoption("-m") or "").strip() or not any("slow" in item.keywords for item in items):
        return
    if _cuda_present():
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow (runs by default where a CUDA device is present)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


CI_SETUP = ".ci/run"  # what a skip names when the test needs what only CI sets up (Slurm test cluster, Chromium)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    needs_ci = [r for r in terminalreporter.stats.get("skipped", []) if CI_SETUP in _skip_reason(r)]
    if needs_ci:
        terminalreporter.write_line(
            f"{len(needs_ci)} test(s) skipped because they need the Slurm test cluster or headless Chromium (reasons "
            f"below); {CI_SETUP} (root, Debian) installs and starts both, then runs every test")
    figures = [value for status in ("passed", "failed") for r in terminalreporter.stats.get(status, [])
               for key, value in getattr(r, "user_properties", ()) if key == "figure" and r.when == "call"]
    if figures:  # a test's record_property("figure", text): a figure of the code the session measured
        terminalreporter.section("figures")
        for text in figures:
            terminalreporter.write_line(text)
    if RECORDER.any():
        terminalreporter.section("reliability figures")
        terminalreporter.write_line("Reliability figures:")
        for line in RECORDER.lines():
            terminalreporter.write_line(f"  {line}")
