"""The progress of `nsa-validate run` on the console (validation.report.progress): plain lines at least every
interval while a step runs when stdout is not a terminal (step, elapsed, the trainer's step, tokens/s, ETA; no ANSI
codes; nothing after the step ends), the live rich bar on a terminal."""

from __future__ import annotations

import io
import re
import threading
import time
from types import SimpleNamespace

from rich.console import Console
from rich.progress import Progress as Bars
from rich.progress import TimeElapsedColumn, TimeRemainingColumn

from validation.launch.spec import Progress
from validation.report.progress import LiveReporter, PlainReporter, display

ANSI = re.compile(r"\x1b\[")


def _step(steps=100, name="baseline"):
    return SimpleNamespace(phase="train", name=name, kind="train", launch=SimpleNamespace(args={"steps": steps}),
                           kind_impl=SimpleNamespace(summary_line=lambda result: " (1,234 tok/s mean)",
                                                     read=lambda result: result))


def _plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, highlight=False, soft_wrap=True)
    assert not console.is_terminal
    return console, out


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _bar(reporter: LiveReporter):
    """The running step's rich task."""
    return next(t for t in reporter.p.tasks if t.id == reporter.task)


def _running(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.lstrip().startswith("RUNNING")]


def test_a_line_names_the_step_elapsed_trainer_step_tokens_per_s_and_eta():
    console, out = _plain()
    clock = _Clock()
    reporter = PlainReporter(console, interval_s=3600, clock=clock)  # the timer never fires: ticks by hand
    step = _step()
    reporter.step_started(step, 1)
    reporter.launch_started(step, SimpleNamespace(argv=[], label=""), 0, 1)
    clock.now += 4
    reporter.launch_progress(step, Progress(4.0, None, None, "waiting"))
    reporter.tick()
    clock.now += 1
    reporter.launch_progress(step, Progress(5.0, 10, 1234.4, "running"))
    clock.now += 10
    reporter.launch_progress(step, Progress(15.0, 30, 1500.0, "running"))  # 20 steps in 10 s: 2 steps/s
    clock.now += 5
    reporter.tick()
    reporter.step_finished(step, {"status": "passed", "duration_s": 20.0})
    reporter.tick()  # after the step: nothing
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("  STARTED  train / baseline (train) at ")
    assert lines[1] == "  RUNNING  train / baseline: 4.0 s elapsed, waiting for the trainer's first heartbeat"
    # 70 steps left at 2 steps/s = 35 s from the last step seen, 5 s ago
    assert lines[2] == "  RUNNING  train / baseline: 20.0 s elapsed, step 30/100, 1,500 tok/s, ETA 30.0 s"
    assert lines[3] == "  PASSED   train / baseline in 20.0 s (1,234 tok/s mean)"
    assert len(lines) == 4
    assert not ANSI.search(out.getvalue())


def test_no_eta_until_the_step_number_moves_and_a_new_launch_starts_over():
    console, out = _plain()
    clock = _Clock()
    reporter = PlainReporter(console, interval_s=3600, clock=clock)
    step = _step(steps=50)
    reporter.step_started(step, 2)
    reporter.launch_started(step, SimpleNamespace(argv=[], label="a"), 0, 2)
    reporter.launch_progress(step, Progress(1.0, 5, 100.0, "running"))
    clock.now += 60
    reporter.tick()
    reporter.launch_progress(step, Progress(61.0, 45, 100.0, "running"))
    reporter.launch_started(step, SimpleNamespace(argv=[], label="b"), 1, 2)
    reporter.tick()
    reporter.launch_progress(step, Progress(2.0, 3, 90.0, "running"))
    reporter.tick()
    clock.now += 10
    reporter.launch_progress(step, Progress(12.0, 13, 90.0, "running"))  # 1 step/s, 37 steps left
    reporter.tick()
    reporter.launch_progress(step, Progress(12.0, 2, 80.0, "running"))  # launches side by side: start over
    reporter.tick()
    reporter.step_finished(step, {"status": "failed", "duration_s": 61.0, "reason": "exit 1"})
    running = _running(out.getvalue())
    assert running == ["  RUNNING  train / baseline: 1m 00s elapsed, launch 1/2 [a], step 5/50, 100 tok/s",
                       "  RUNNING  train / baseline: 1m 00s elapsed, launch 2/2 [b]",
                       "  RUNNING  train / baseline: 1m 00s elapsed, launch 2/2 [b], step 3/50, 90 tok/s",
                       "  RUNNING  train / baseline: 1m 10s elapsed, launch 2/2 [b], step 13/50, 90 tok/s, ETA 37.0 s",
                       "  RUNNING  train / baseline: 1m 10s elapsed, launch 2/2 [b], step 2/50, 80 tok/s"]
    assert out.getvalue().splitlines()[-1] == "  FAILED   train / baseline in 1m 01s (1,234 tok/s mean): exit 1"


def test_the_timer_prints_without_progress_events_and_never_after_the_step():
    console, out = _plain()
    reporter = PlainReporter(console, interval_s=0.02)
    step = _step(steps=None)  # e.g. a pytest step: no trainer steps, no heartbeats
    reporter.step_started(step, 1)
    deadline = time.monotonic() + 10
    while len(_running(out.getvalue())) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    reporter.step_finished(step, {"status": "passed", "duration_s": 0.1})
    text = out.getvalue()
    time.sleep(0.1)  # five intervals
    assert out.getvalue() == text  # nothing after the step's line
    assert len(_running(text)) >= 3 and text.splitlines()[-1].startswith("  PASSED ")
    assert all(re.fullmatch(r"  RUNNING  train / baseline: \d+\.\d s elapsed", ln) for ln in _running(text))
    assert not [t for t in threading.enumerate() if t.name == "nsav-progress"]


def test_the_display_ends_its_timer_when_a_run_stops_inside_a_step():
    console, out = _plain()
    with display(console, interval_s=0.02) as reporter:  # e.g. Ctrl-C: no step_finished comes
        assert isinstance(reporter, PlainReporter)
        reporter.step_started(_step(), 1)
        time.sleep(0.05)
    text = out.getvalue()
    time.sleep(0.1)
    assert out.getvalue() == text
    assert not [t for t in threading.enumerate() if t.name == "nsav-progress"]


def test_a_terminal_keeps_the_live_bar_and_prints_no_plain_lines():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, _environ={"TERM": "xterm-256color"})
    step = _step()
    with display(console, interval_s=0.02) as reporter:
        assert isinstance(reporter, LiveReporter)
        reporter.run_started(SimpleNamespace(name="smoke"), "/tmp/run", [step])
        reporter.step_started(step, 1)
        reporter.launch_started(step, SimpleNamespace(argv=[], label=""), 0, 1)
        reporter.launch_progress(step, Progress(1.0, 7, 1234.0, "running"))
        task = _bar(reporter)
        assert (task.description, task.completed, task.total) == ("train / baseline", 7, 100)
        assert task.fields["info"] == "step 7 | 1,234 tok/s"
        time.sleep(0.05)
        reporter.step_finished(step, {"status": "passed", "duration_s": 1.0})
    text = out.getvalue()
    assert "STARTED" not in text and "RUNNING" not in text
    assert "PASSED" in text and ANSI.search(text)  # the live display's own cursor and colour codes


def test_a_dumb_terminal_gets_the_plain_lines():
    # rich draws no live display on TERM=dumb (an editor's shell): a step ran in silence until it ended
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, _environ={"TERM": "dumb"})
    step = _step()
    with display(console, interval_s=0.02) as reporter:
        assert isinstance(reporter, PlainReporter)
        reporter.run_started(SimpleNamespace(name="smoke"), "/tmp/run", [step])
        reporter.step_started(step, 1)
        reporter.step_finished(step, {"status": "passed", "duration_s": 1.0})
    text = out.getvalue()
    assert "STARTED" in text and "PASSED" in text


def test_a_terminal_bar_starts_afresh_for_each_step_and_launch():
    # a trainer launch that reached its steps left the bar finished: every later step's and launch's elapsed time
    # frozen and its ETA 0, and a step without trainer steps kept the earlier step's total
    clock = _Clock()
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    bars = Bars(TimeElapsedColumn(), TimeRemainingColumn(), console=console, get_time=clock, auto_refresh=False)
    reporter = LiveReporter(bars, console)
    first, second, tests = _step(name="first"), _step(name="second"), _step(steps=None, name="tests")
    reporter.run_started(SimpleNamespace(name="smoke"), "/tmp/run", [first, second, tests])

    def steps(step, upto, start=1):  # one trainer step a second
        for n in range(start, upto + 1):
            clock.now += 1
            reporter.launch_progress(step, Progress(float(n), n, 1000.0, "running"))

    reporter.step_started(first, 2)
    reporter.launch_started(first, SimpleNamespace(argv=[], label="a"), 0, 2)
    steps(first, 100)
    assert _bar(reporter).finished
    clock.now += 5
    reporter.launch_started(first, SimpleNamespace(argv=[], label="b"), 1, 2)
    steps(first, 10)
    bar = _bar(reporter)
    assert not bar.finished and bar.elapsed == 10 and bar.completed == 10 and bar.total == 100
    assert bar.time_remaining == 90  # 90 steps left at one a second
    steps(first, 100, start=11)
    reporter.step_finished(first, {"status": "passed", "duration_s": 205.0})
    clock.now += 3
    reporter.step_started(second, 1)
    reporter.launch_started(second, SimpleNamespace(argv=[], label=""), 0, 1)
    clock.now += 4
    bar = _bar(reporter)
    assert (bar.description, bar.completed, bar.total, bar.elapsed, bar.finished) == (
        "train / second", 0, 100, 4, False)
    steps(second, 100)
    reporter.step_finished(second, {"status": "passed", "duration_s": 104.0})
    reporter.step_started(tests, 1)
    reporter.launch_started(tests, SimpleNamespace(argv=[], label=""), 0, 1)
    clock.now += 2
    bar = _bar(reporter)
    assert (bar.description, bar.total, bar.elapsed, bar.finished) == ("train / tests", None, 2, False)
    assert len(bars.tasks) == 2  # the run's bar and the running step's


def test_a_reason_with_escape_sequences_ends_the_step_as_plain_text():
    console, out = _plain()
    reporter = PlainReporter(console, interval_s=3600)
    step = _step()
    reporter.step_started(step, 1)
    reporter.step_finished(step, {"status": "failed", "duration_s": 2.0,
                                  "reason": "exit 1: \x1b[31mRuntimeError\x1b[0m: boom"})
    assert out.getvalue().splitlines()[-1] == "  FAILED   train / baseline in 2.0 s (1,234 tok/s mean): exit 1: " \
                                              "RuntimeError: boom"
    assert not ANSI.search(out.getvalue())
