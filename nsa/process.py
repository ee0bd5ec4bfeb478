"""The end of a command's process (nsa-train, nsa-validate) without the interpreter's teardown.

With torch loaded, the interpreter's teardown (freeing every module's objects before the process ends) took 0.7-0.95 s
of a core on a 2-core CPU machine: after nsa-train's last record in every rank of every launch, and after
nsa-validate's report. ``exit_without_teardown(code)`` ends the process as ``sys.exit(code)`` would, with the same
status and everything printed, but without that teardown; where it cannot be skipped safely (torch not loaded, or
a thread other than the main one, not a daemon, still running: the teardown would wait for it) it is sys.exit(code).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_status(code: object) -> int:
    """The process's exit status for sys.exit(code): None 0, an int itself, anything else 1 (printed to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def exit_without_teardown(code: object) -> None:
    """End the process as sys.exit(code) would: the atexit handlers run (logging's flush among them) and both standard
    streams are flushed, then os._exit. Everything a command writes is closed before it returns (nsa-train:
    Trainer._close, the heartbeat, distributed.shutdown; nsa-validate: results.json and the report files)."""
    if "torch" not in sys.modules or any(not t.daemon for t in threading.enumerate()
                                         if t is not threading.main_thread()):
        sys.exit(code)
    status = 1
    try:
        status = exit_status(code)
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it
                pass
        os._exit(status)
