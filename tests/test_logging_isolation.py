"""tests/conftest.py puts the root logger back after each test: a command's main() run in a test's own process
(nsa-train's sets logging.basicConfig(force=True) on the test's captured stdout) must not leave a handler on a
stream pytest has closed, where a later test's log record would print "--- Logging error ---" into the output that
test checks. The tests run in this order, in one worker (the file is one unit under --dist loadfile)."""

from __future__ import annotations

import io
import logging


def test_a_command_leaves_a_root_handler_on_a_stream_that_is_then_closed():
    stream = io.StringIO()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=stream, force=True)
    logging.getLogger("validation.launch").info("launching")
    assert stream.getvalue() == "launching\n"
    stream.close()  # as pytest closes a test's captured stream


def _logs_without_an_error(capsys) -> None:
    """No root handler is left on a closed stream, and a record at INFO prints no logging error."""
    root = logging.getLogger()
    closed = [h for h in root.handlers if getattr(getattr(h, "stream", None), "closed", False)]
    assert closed == [], closed
    logging.getLogger("validation.launch").info("launching")
    assert "Logging error" not in capsys.readouterr().err


def test_the_next_test_logs_without_an_error_on_the_closed_stream(capsys):
    _logs_without_an_error(capsys)


def test_nsa_trains_own_handler_is_put_back_too():
    # nsa-train's log handler is a StreamHandler subclass (it drops a stdout nobody reads): left on a closed stream
    # it broke a later test's output as basicConfig's did (a CI run, once the new file order met the two)
    import sys

    from nsa.training.cli import _setup_logging
    stream = io.StringIO()
    real, sys.stdout = sys.stdout, stream
    try:
        _setup_logging(0)
    finally:
        sys.stdout = real
    stream.close()


def test_the_next_test_logs_without_an_error_after_nsa_trains_handler(capsys):
    _logs_without_an_error(capsys)
