"""A pytest plugin the `pytest` step loads (``-p validation.kinds.pytest.progress --nsav-progress FILE``) when it
runs each test file in its own process (`isolate: file`): one JSON line per event, written as it happens, so that a
process that dies (an illegal memory access, SIGSEGV, os._exit) leaves behind which tests had passed and which one
was running. JUnit XML is only written at the end of a session, so it says nothing about a process that died.

    {"event": "start", "nodeid": "tests/x.py::test_a"}
    {"event": "report", "nodeid": "tests/x.py::test_a", "when": "call", "outcome": "passed"}

``read_progress`` folds the file into per-test outcomes and the test that was running. The file is line-buffered
(one write per line): a line written before the process died is in the file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from validation.results.codec import decode

OPTION = "--nsav-progress"
_file = None


def pytest_addoption(parser):
    parser.addoption(OPTION, default=None, help="nsa-validate: write one JSON line per test event to this file")


def pytest_configure(config):
    global _file
    path = config.getoption(OPTION)
    # a pytest-xdist worker (`-n N` in pytest_args) writes nothing: the controller receives every worker's events
    # (its pytest_runtest_logstart and _logreport) and is the file's one writer; a worker opening the file as well
    # would cut it short and overwrite the controller's lines with its own
    if path and _file is None and not hasattr(config, "workerinput"):
        # "w": a step run again in the same directory (--resume, --rerun) starts a fresh record; an earlier
        # attempt's lines would count its tests as this run's
        _file = open(path, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the whole session


def pytest_unconfigure(config):
    global _file
    if _file is not None:
        _file.close()
        _file = None


def _write(record: dict) -> None:
    if _file is not None:
        _file.write(json.dumps(record) + "\n")


@dataclasses.dataclass(frozen=True)
class Event:
    """One line of the file, as read back (leniently: a damaged value is None)."""
    event: str | None = None  # "start" or "report"
    nodeid: str | None = None
    when: str | None = None  # a report's phase: setup, call, teardown
    outcome: str | None = None  # a report's: passed, failed, skipped


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    _write({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome})


def read_progress(path: Path) -> tuple[dict[str, str], str | None]:
    """({nodeid: "passed" | "failed" | "skipped" | "error"} of the tests that finished, the nodeid of the one that
    started and did not finish, or None; with pytest-xdist, where several run at once, those that did not finish,
    in the order they started, joined by ", "). A failure in setup or teardown is an error, as JUnit counts it."""
    outcomes: dict[str, str] = {}
    running: dict[str, None] = {}  # started, not finished, in start order
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}, None
    for line in lines:
        try:
            event = decode(Event, json.loads(line), "progress", lenient=True)
        except ValueError:
            continue  # a line cut short by the process dying
        nodeid = event.nodeid
        if nodeid is None:
            continue
        if event.event == "start":
            running.pop(nodeid, None)
            running[nodeid] = None
            continue
        when, outcome = event.when, event.outcome
        if outcome == "failed":
            outcomes[nodeid] = "failed" if when == "call" else "error"
        elif outcome == "skipped" and outcomes.get(nodeid) not in ("failed", "error"):
            outcomes[nodeid] = "skipped"
        elif outcome == "passed" and when == "call" and nodeid not in outcomes:
            outcomes[nodeid] = "passed"
        if when == "teardown":
            outcomes.setdefault(nodeid, "passed")
            running.pop(nodeid, None)
    return outcomes, ", ".join(running) or None
