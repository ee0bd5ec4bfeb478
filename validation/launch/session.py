"""What a command that launches processes sets up around itself, and the sweep after it: `nsa-validate run`.

``guarded(body)`` installs the signal handlers (validation.launch.interrupts: SIGINT, SIGTERM and SIGHUP become an
``Interrupted`` KeyboardInterrupt, also a SIGINT a background shell set to "ignore", and one that came while
nsa-validate started up: interrupts.catch_early), makes this process the subreaper of whatever its launches leave
orphaned (validation.launch.processes.become_subreaper), has the first launch start the run's sentinel
(validation.launch.sentinel: it ends what the launches left running should this process be killed), runs ``body()``,
stops the sentinel and then ends whatever is still running below this process (the final sweep), sweeping again if
a signal cut the first sweep short. An interrupt before the runner took over (while the runbook is read, say)
becomes its exit code.
"""

from __future__ import annotations

from typing import Callable

from validation.launch import interrupts, sentinel
from validation.launch.processes import become_subreaper, end_descendants


def guarded(body: Callable[[], int], on_interrupt: Callable[[BaseException], None] = lambda exc: None,
            on_left: Callable[[list[int]], None] = lambda pids: None) -> int:
    """body()'s exit code, or 128 + N for signal N that reached here (on_interrupt(exc) is told) or cut the final
    sweep short; on_left(pids) when the final sweep ended processes still running. Any other exception passes
    through once the sweep is done."""
    code: int | None = None
    try:
        interrupts.install()  # before anything runs; a SIGINT kept while starting up (catch_early) is raised here
        become_subreaper()  # whatever a launch leaves orphaned stays below this process, for the final sweep
        sentinel.enable()  # from the first launch on: should this process be killed, it ends what they left
        code = body()
    except KeyboardInterrupt as exc:
        on_interrupt(exc)
        code = interrupts.exit_code(exc)
    finally:
        for _ in range(2):  # this process exits normally: its sentinel goes first, ending nothing
            try:
                sentinel.stop()
                break
            except KeyboardInterrupt as exc:
                code = interrupts.exit_code(exc)
        for _ in range(2):  # a first signal during the sweep interrupts it: sweep again (later ones do not)
            try:
                left = end_descendants()
                if left:
                    on_left(left)
                break
            except KeyboardInterrupt as exc:
                code = interrupts.exit_code(exc)
    return code
