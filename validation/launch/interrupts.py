"""The signals that end a validation run: SIGINT, SIGTERM and SIGHUP, each an ``Interrupted`` in the main thread.

``install()`` (``nsa-validate run`` calls it first thing) sets one handler for the three signals, also for a SIGINT
the shell set to "ignore" (a background job of a non-interactive shell gets SIGINT ignored; Python then installs no
Ctrl-C handler of its own, so a SIGINT to such a run did nothing). The first signal raises ``Interrupted`` (a
``KeyboardInterrupt``, so every "end the processes, save, re-raise" path of the launcher and the runner handles it
as it handles Ctrl-C) carrying the signal; the run ends every launched process tree, records the running step as
interrupted and exits ``128 + signal`` (130 SIGINT, 129 SIGHUP, 143 SIGTERM). A second signal while that happens
does not interrupt the cleanup (results are still written): it only makes the launcher skip the rest of its
SIGTERM grace period and SIGKILL at once (``hurry()``). A third ends nsa-validate at once by the signal's default
action (the launched processes then go through their parent-death signal).

``deferred()`` holds the three signals back for a block (starting a child and recording its pid, submitting a Slurm
job and recording its id), then delivers the ones that came in. ``held()`` keeps the handler but lets the block run
to its end when the first signal comes in (writing the reports: an exception raised inside an import would leave
that module half imported, and every later use of it failing); the block then says which signal came.

``catch_early()`` (validation.cli calls it first thing, before its own imports) keeps a SIGINT that arrives while
nsa-validate starts up, before ``install()``, when the shell set SIGINT to "ignore": without it, ``kill -INT`` to a
background run in its first fraction of a second did nothing. ``install()`` then delivers it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import SimpleNamespace

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A SIGINT / SIGTERM / SIGHUP to nsa-validate; `signum`, `name` ("SIGTERM") and `exit_code` (128 + signum)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state = SimpleNamespace(first=None, count=0, holding=0)
_early: list[int] = []  # SIGINTs that came in before install() (catch_early)


def _handler(signum, frame):
    _state.count += 1
    if _state.first is None:
        _state.first = signum
        if not _state.holding:
            raise Interrupted(signum)
        return
    if _state.count >= 3:  # the user insists: go now, by the signal's own default action
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install() -> bool:
    """Handle SIGINT, SIGTERM and SIGHUP as described above (main thread only; False elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    reset()
    for sig in HANDLED:
        signal.signal(sig, _handler)
    early = list(_early)
    _early.clear()
    _deliver(early)  # SIGINTs sent while nsa-validate started up (catch_early): delivered now, each one
    return True


def catch_early() -> bool:
    """Keep a SIGINT the shell set to "ignore" (a background job of a non-interactive shell) that arrives before
    install(): install() delivers it, so the run ends as if it had come just after. Only where SIGINT is ignored
    (elsewhere Python's own Ctrl-C handler is in place from the start) and in the main thread; True when set."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, lambda signum, frame: _early.append(signum))
    return True


def installed() -> bool:
    return all(signal.getsignal(sig) is _handler for sig in HANDLED)


def reset() -> None:
    """Forget earlier signals (a new run; the tests)."""
    _state.first, _state.count, _state.holding = None, 0, 0


def received() -> int | None:
    """The first signal received since install(), or None."""
    return _state.first


def hurry() -> bool:
    """True once a second signal came in: ending processes should not wait out a grace period."""
    return _state.count >= 2


def describe(exc: BaseException | None) -> str:
    """"SIGTERM" for an Interrupted, "Ctrl-C" for a plain KeyboardInterrupt."""
    return exc.name if isinstance(exc, Interrupted) else "Ctrl-C"


def exit_code(exc: BaseException | None) -> int:
    """128 + the signal of an Interrupted; 130 (SIGINT) for a plain KeyboardInterrupt."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


@contextlib.contextmanager
def deferred():
    """Hold back SIGINT / SIGTERM / SIGHUP (main thread only) for the block; those that came in are delivered at
    its end, every one in the order it came (two signals are still two: the second hurries), to the handlers that
    were in place. Signals with no Python handler (default action, ignored) are left alone: holding them would
    change what they do."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    for sig in HANDLED:
        handler = signal.getsignal(sig)
        if callable(handler):
            previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _deliver(caught)


def _deliver(signums: list[int]) -> None:
    """Raise each of `signums` (signals held back), in the order they came, every one of them: a second signal must
    still count as a second (hurry()) and a third still end the process, also when the first one's handler raised.
    The first exception a handler raised is raised again once all are delivered."""
    first: BaseException | None = None
    for sig in signums:
        try:
            signal.raise_signal(sig)
        except BaseException as exc:  # Interrupted / KeyboardInterrupt from the first: deliver the rest, then raise
            if first is None:
                first = exc
    if first is not None:
        raise first


class Hold:
    """What came in during a held() block: `signum` (the first signal, None when none did)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def interrupt(self) -> Interrupted | None:
        """The Interrupted the signal would have raised, or None."""
        return None if self.signum is None else Interrupted(self.signum)

    def raise_it(self) -> None:
        """Raise that Interrupted now (after the block), if a signal came in."""
        if self.signum is not None:
            raise Interrupted(self.signum)


@contextlib.contextmanager
def held():
    """Run the block to its end even when the first SIGINT / SIGTERM / SIGHUP comes in meanwhile: the handler
    records it (received(), and the yielded Hold's `signum`) instead of raising. A second signal still hurries
    (hurry()) and a third still ends nsa-validate at once. With no handler installed (install()), nothing changes:
    Python's own Ctrl-C handler raises as usual."""
    hold = Hold()
    before = _state.first
    _state.holding += 1
    try:
        yield hold
    finally:
        _state.holding -= 1
        if before is None and _state.first is not None:
            hold.signum = _state.first
