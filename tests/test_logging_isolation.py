"""tests/conftest.py puts the root logger back after each test: a command's main() run in a test's own process
(nsa-train's sets logging.basicConfig(force=True) on the test's captured stdout) must not leave a handler on a
stream pytest has closed, where a later test's log record would print "--- Logging error ---" into the output that
test checks. The two tests run in this order, in one worker (the file is one unit under --dist loadfile)."""

from __future__ import annotations

import io
import logging


def test_a_command_leaves_a_root_handler_on_a_stream_that_is_then_closed():
    stream = io.StringIO()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=stream, force=True)
    logging.getLogger("validation.launch").info("launching")
    assert stream.getvalue() == "launching\n"
    stream.close()  # as pytest closes a test's captured stream


def test_the_next_test_logs_without_an_error_on_the_closed_stream(capsys):
    root = logging.getLogger()
    closed = [h for h in root.handlers if getattr(getattr(h, "stream", None), "closed", False)]
    assert closed == [], closed
    logging.getLogger("validation.launch").info("launching")
    assert "Logging error" not in capsys.readouterr().err
