"""Progress of `nsa-validate run` on the console while its steps run: the reporters of the runner's hooks
(validation.execution.runner.Reporter: run_started, step_started, launch_started, launch_progress, step_finished, ...).

    display(console)  the progress display `run` opens (validation.run.run_runbook's `display`): LiveReporter
                      on a terminal, PlainReporter elsewhere; nothing of it outlives the `with`
    LiveReporter      a terminal: a live rich progress bar (phase / step, the trainer's step and tokens/s from
                      its heartbeats, the running launch's elapsed time and ETA); one line when each step ends
    PlainReporter     a pipe, `| tee`, a CI log, Slurm output (where no live display shows): plain lines, no
                      ANSI codes: one when a step starts, one at least every PLAIN_PROGRESS_S while it runs
                      (step, elapsed time, the trainer's last step and tokens/s, an ETA when it can be
                      computed), one when it ends

The runner calls the hooks with a lock held (one call at a time); launch_progress comes at every poll of a
launch (validation.launch: about once a second), carrying the rank-0 heartbeat's step and tokens/s of a trainer
launch. The plain lines come from a timer thread of their own, not from those calls: a step whose launches
report nothing (one still starting, one between launches, a kind that launches nothing) still prints.
Only rich is imported here (validation.cli's start-up stays light).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from validation.formatting import finite, fmt_duration, printable
from validation.report.console import print_line, print_text
from validation.results.codec import decode
from validation.results.run import Step as StepRecord

if TYPE_CHECKING:
    from validation.runbook.model import Step

# A plain progress line at least this often while a step runs: whoever reads a CI log, a tee'd file or Slurm
# output sees within half a minute that the step is alive and how far it got (and a CI job that ends silent jobs
# is never silent for long), while an hour-long step writes 120 lines, not one per heartbeat poll (every second).
PLAIN_PROGRESS_S = 30.0
_STATES = {"waiting": "waiting for the trainer's first heartbeat", "stalled": "heartbeats stalled"}


def _run_header(console: Console, runbook, run_dir, resumed: str | None) -> None:
    print_text(console, Text.assemble((printable(runbook.name), "bold"), f" -> {printable(run_dir)}"))
    if resumed:
        print_line(console, f"resumed: {resumed}")


def _trainer_steps(step: Step) -> int | None:
    """The trainer steps each launch of `step` runs (its `steps` arg), or None (not a trainer step, or unknown)."""
    steps = step.launch.args.get("steps")
    return int(steps) if isinstance(steps, int) and not isinstance(steps, bool) else None


def _launch_steps(planned) -> int | None:
    """The trainer steps one launch runs, from its argv's `--steps N` (a variant's own args: an A/B's batched arm
    runs 40 where the step's args say 10), or None."""
    argv = [str(a) for a in planned.argv or ()]
    for flag, value in zip(argv, argv[1:]):
        if flag == "--steps" and value.isdigit():
            return int(value)
    return next((int(a.partition("=")[2]) for a in argv if a.startswith("--steps=") and
                 a.partition("=")[2].isdigit()), None)


def _tokens_per_s(value) -> float | None:
    """A heartbeat's tokens/s when it is one (a finite number above 0), else None."""
    rate = finite(value)
    return rate if rate is not None and rate > 0 else None


def _print_finished(console: Console, step: Step, result) -> None:
    """The line that ends a step: its status (coloured on a terminal), name, elapsed time, summary and reason."""
    record = decode(StepRecord, result, f"steps.{step.name}", lenient=True)
    colour = {"passed": "green", "skipped": "yellow"}.get(str(record.status), "red")
    reason = f": {record.reason}" if record.reason else ""
    extra = step.kind_impl.summary_line(step.kind_impl.read(result))
    took = f" in {fmt_duration(record.duration_s)}" if record.status != "skipped" and \
        record.duration_s is not None else ""
    print_text(console, Text.assemble("  ", (f"{printable(str(record.status)).upper():8}", colour), " ",
                                      printable(f"{step.phase} / {step.name}{took}{extra}{reason}")))


class LiveReporter:
    """A terminal: rich progress (phase, step, live tokens/s from the heartbeats, the running launch's elapsed time
    and ETA), and one line when each step ends with its status and elapsed time."""

    def __init__(self, progress: Progress, console: Console):
        self.p, self.console = progress, console
        self.total = self.task = None
        self.resumed: str | None = None  # a resumed run: what was resumed (validation.results.store.resume_note)

    def run_resumed(self, note: str) -> None:
        self.resumed = note

    def run_started(self, runbook, run_dir, steps) -> None:
        _run_header(self.console, runbook, run_dir, self.resumed)
        self.total = self.p.add_task("run", total=len(steps), info="")
        self.task = self.p.add_task("step", total=None, info="")

    def _new_task(self, step: Step, info: str) -> None:
        """A fresh bar for the running launch: its own clock, no rate carried over from an earlier one, and not
        finished (a rich task that once reached its total stays finished: its elapsed time frozen, its ETA 0)."""
        if self.task is not None:
            self.p.remove_task(self.task)
        self.task = self.p.add_task(f"{step.phase} / {step.name}", total=_trainer_steps(step), info=info)

    def step_started(self, step: Step, launches: int) -> None:
        self._new_task(step, f"{step.kind}")

    def launch_started(self, step: Step, planned, index: int, total: int) -> None:
        label = f" [{planned.label}]" if planned.label else ""
        self._new_task(step, f"{step.kind}{label} {index + 1}/{total}")

    def launch_progress(self, step: Step, progress) -> None:
        parts = []
        if progress.step is not None:
            parts.append(f"step {progress.step}")
            self.p.update(self.task, completed=progress.step)
        tps = _tokens_per_s(progress.toks_per_s)
        if tps is not None:
            parts.append(f"{tps:,.0f} tok/s")
        self.p.update(self.task, info=" | ".join(parts) or progress.state)

    def step_finished(self, step: Step, result) -> None:
        _print_finished(self.console, step, result)
        self.p.advance(self.total)

    def run_finished(self, results) -> None:
        pass


class PlainReporter:
    """No terminal: plain lines that a log keeps. `STARTED` when a step starts; `RUNNING` at least every
    `interval_s` while it runs, from a timer thread (`tick`), with the elapsed time, the trainer's last step (of
    its `steps`), tokens/s and an ETA; the status when it ends. The ETA is of the running launch (the whole step
    when it has one launch): its remaining steps at the rate of the steps seen since the first the trainer timed
    (one seen with tokens/s, or else the first it moved to: the step of its boot heartbeat, 0 or a resume's
    checkpoint step, comes before its start-up, whose minutes are no training steps); none until the step number
    has moved from there, or when it moves backwards (a new launch, or launches side by side) until it moves again.
    Nothing prints for a step after its step_finished, nor after close()."""

    def __init__(self, console: Console, interval_s: float = PLAIN_PROGRESS_S,
                 clock: Callable[[], float] = time.monotonic):
        self.console, self.interval_s, self.clock = console, interval_s, clock
        self.resumed: str | None = None
        self._lock = threading.Lock()  # the timer thread and the runner's calls
        self._step: Step | None = None  # the running step (None: none; the timer prints nothing)
        self._timer: tuple[threading.Thread, threading.Event] | None = None
        self._t0 = 0.0
        self._launches, self._launch = 1, 0
        self._label: str | None = None  # the running launch's label
        self._total: int | None = None  # trainer steps per launch
        self._last: int | None = None  # the trainer's last step, with when it was first seen
        self._last_t = 0.0
        self._first: tuple[int, float] | None = None  # the first step seen in this launch, and when
        self._tps: float | None = None
        self._state: str | None = None

    def run_resumed(self, note: str) -> None:
        self.resumed = note

    def run_started(self, runbook, run_dir, steps) -> None:
        _run_header(self.console, runbook, run_dir, self.resumed)

    def step_started(self, step: Step, launches: int) -> None:
        self._stop_timer()
        with self._lock:
            self._step, self._t0 = step, self.clock()
            self._launches, self._launch, self._total = launches, 0, _trainer_steps(step)
            self._label = None
            self._new_launch()
            runs = f", {launches} launches" if launches > 1 else ""
            print_line(self.console, f"  {'STARTED':8} {step.phase} / {step.name} ({step.kind}{runs}) at "
                                     f"{time.strftime('%H:%M:%S')}")
        ended = threading.Event()
        thread = threading.Thread(target=self._run_timer, args=(ended,), name="nsav-progress", daemon=True)
        self._timer = (thread, ended)
        thread.start()

    def launch_started(self, step: Step, planned, index: int, total: int) -> None:
        with self._lock:
            self._launch, self._launches = index, max(total, 1)
            self._label = printable(planned.label) if planned.label else None
            self._total = _launch_steps(planned) or _trainer_steps(step)
            self._new_launch()

    def launch_progress(self, step: Step, progress) -> None:
        with self._lock:
            now = self.clock()
            self._state = progress.state
            tps = _tokens_per_s(progress.toks_per_s)
            if tps is not None:
                self._tps = tps
            if progress.step is None or progress.step == self._last:
                return
            moved = self._last is not None  # from a step seen before
            if moved and progress.step < self._last:  # another launch's steps: start over
                self._first = None
            self._last, self._last_t = progress.step, now
            if self._first is None and (tps is not None or moved):  # a step the trainer timed, or moved to: training
                self._first = (progress.step, now)

    def step_finished(self, step: Step, result) -> None:
        with self._lock:
            self._step = None  # from here on the timer prints nothing
            _print_finished(self.console, step, result)
        self._stop_timer()

    def run_finished(self, results) -> None:
        self.close()

    def close(self) -> None:
        """Stop the timer (the run ended, or was interrupted during a step): nothing prints after this."""
        with self._lock:
            self._step = None
        self._stop_timer()

    def tick(self) -> None:
        """Print the running step's line now (the timer calls this every `interval_s`); nothing without one."""
        with self._lock:
            if self._step is not None:
                print_line(self.console, self._line())

    def _line(self) -> str:
        """`  RUNNING  phase / step: 2m 30s elapsed, launch 2/3 [label], step 120/200, 1,234 tok/s, ETA 1m 40s`."""
        step, now = self._step, self.clock()
        parts = [f"{fmt_duration(now - self._t0)} elapsed"]
        if self._launches > 1:  # its label: a retry's count starts again at 1 (a retry runs only some launches)
            parts.append(f"launch {self._launch + 1}/{self._launches}" + (f" [{self._label}]" if self._label else ""))
        if self._last is not None:
            parts.append(f"step {self._last}" + (f"/{self._total}" if self._total else ""))
        elif self._state in _STATES:
            parts.append(_STATES[self._state])
        if self._tps:
            parts.append(f"{self._tps:,.0f} tok/s")
        eta = self._eta(now)
        if eta is not None:
            parts.append(f"ETA {fmt_duration(eta)}")
        return f"  {'RUNNING':8} {step.phase} / {step.name}: " + ", ".join(parts)

    def _eta(self, now: float) -> float | None:
        if self._total is None or self._first is None or self._last is None:
            return None
        first, first_t = self._first
        done = self._last - first
        if done <= 0 or self._last_t <= first_t:
            return None
        rate = done / (self._last_t - first_t)  # trainer steps per second
        return max(0.0, (self._total - self._last) / rate - (now - self._last_t))

    def _new_launch(self) -> None:
        self._last, self._first, self._tps, self._state = None, None, None, None

    def _run_timer(self, ended: threading.Event) -> None:
        while not ended.wait(self.interval_s):
            self.tick()

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            thread, ended = timer
            ended.set()
            if thread is not threading.current_thread():
                thread.join()


@contextlib.contextmanager
def display(console: Console, interval_s: float | None = None) -> Iterator[LiveReporter | PlainReporter]:
    """The progress display of a run on `console`: a LiveReporter on a terminal that draws (not TERM=dumb, where
    rich draws no live display: a step would run in silence), else a PlainReporter printing a line at least every
    `interval_s` (default PLAIN_PROGRESS_S) while a step runs; its timer ends with the `with`."""
    if console.is_terminal and not console.is_dumb_terminal:
        # markup=False: a label such as "[tests/test_x.py]" or "[lr=0.001]" is text, not a rich style tag
        with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                      TextColumn("{task.fields[info]}", markup=False), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=console, transient=True) as progress:
            yield LiveReporter(progress, console)
        return
    reporter = PlainReporter(console, PLAIN_PROGRESS_S if interval_s is None else interval_s)
    try:
        yield reporter
    finally:
        reporter.close()
