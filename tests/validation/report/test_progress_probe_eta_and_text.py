"""The console progress of `nsa-validate run` against hand-computed figures and rich's documented behaviour: the plain
lines' ETA of a trainer launch (its start-up is no training), which tokens/s figures a line shows, and text that
looks like rich markup or an emoji code printed as it is (step lines, the run's header, tables, the live bar)."""

from __future__ import annotations

import io
import threading
from types import SimpleNamespace

import pytest
from rich.console import Console

from validation.launch.spec import Progress
from validation.report.console import make_console, print_line, print_table, table_lines
from validation.report.progress import LiveReporter, PlainReporter, display

from test_progress import _Clock, _plain  # a plain (non-terminal) console and a clock the test moves

# text rich would read as markup, emoji codes (":x:" is U+274C, ":ok:" U+1F197) and a trailing backslash (which
# rich.markup.escape doubles)
TRICKY = "[red]x[/] [link=https://e.org]y[/link] [tests/test_a.py] a:x:b :ok: C:\\runs\\"


def _step(steps=100, name="baseline"):
    return SimpleNamespace(phase="train", name=name, kind="train", launch=SimpleNamespace(args={"steps": steps}),
                           kind_impl=SimpleNamespace(summary_line=lambda result: "", read=lambda result: result))


def _running_after(series, steps=100) -> str:
    """The RUNNING line after `series`: (seconds since the previous event, trainer step, tokens/s) heartbeats,
    each one poll of the launch; the line is printed at the last one's time."""
    console, out = _plain()
    clock = _Clock()
    reporter = PlainReporter(console, interval_s=3600, clock=clock)
    step = _step(steps=steps)
    reporter.step_started(step, 1)
    reporter.launch_started(step, SimpleNamespace(argv=[], label=""), 0, 1)
    for wait, trainer_step, tps in series:
        clock.now += wait
        reporter.launch_progress(step, Progress(clock.now - 1000.0, trainer_step, tps, "running"))
    reporter.tick()
    reporter.close()
    return next(ln for ln in out.getvalue().splitlines() if ln.lstrip().startswith("RUNNING"))


def test_the_eta_leaves_out_the_trainers_start_up():
    # the trainer's boot heartbeat (step 0, no tokens/s yet) comes before a 60 s start-up (model, compile, data);
    # then one step a second: step 10 at 70 s, step 20 at 80 s. 80 steps left at 1 step/s: 80 s. Counting from the
    # boot heartbeat gave 20 steps in 80 s, 0.25 step/s: 320 s (5m 20s).
    line = _running_after([(0, 0, None), (70, 10, 1000.0), (10, 20, 1000.0)])
    assert line.endswith("step 20/100, 1,000 tok/s, ETA 1m 20s")


def test_the_eta_of_a_resumed_trainer_counts_from_its_first_timed_step():
    # a resume boots at its checkpoint's step 500 of 1000, starts up for 60 s, then runs 1 step/s: 480 steps left
    # at step 520: 8m 00s (from the boot heartbeat: 20 steps in 80 s, 32m 00s)
    line = _running_after([(0, 500, None), (70, 510, 2000.0), (10, 520, 2000.0)], steps=1000)
    assert line.endswith("step 520/1000, 2,000 tok/s, ETA 8m 00s")
    # without tokens/s in its heartbeats, the first step it moves to starts the count: 10 at 70 s, 20 at 80 s
    assert _running_after([(0, 500, None), (70, 510, None), (10, 520, None)], steps=1000).endswith(
        "step 520/1000, ETA 8m 00s")



def test_a_launch_that_runs_its_own_steps_shows_them_as_its_total():
    """An A/B's variant with its own `args.steps` (cpu_smoke's batched arm: 40, the step's args 10): its launch's
    argv says --steps 40, and the line says step 30/40 with its ETA, not step 30/10."""
    console, out = _plain()
    clock = _Clock()
    reporter = PlainReporter(console, interval_s=3600, clock=clock)
    step = _step(steps=10)
    reporter.step_started(step, 2)
    reporter.launch_started(step, SimpleNamespace(label="batched", argv=["python", "-m", "nsa.training", "--steps",
                                                                          "40", "--seq-len", "96"]), 1, 2)
    for wait, trainer_step in ((0, 0), (5, 10), (10, 30)):
        clock.now += wait
        reporter.launch_progress(step, Progress(clock.now - 1000.0, trainer_step, 500.0, "running"))
    reporter.tick()
    reporter.close()
    line = next(ln for ln in out.getvalue().splitlines() if ln.lstrip().startswith("RUNNING"))
    assert line.endswith("step 30/40, 500 tok/s, ETA 5.0 s"), line

def test_the_eta_needs_a_move_after_the_first_timed_step_and_a_known_total():
    # one timed step seen: no rate yet
    assert "ETA" not in _running_after([(0, 0, None), (70, 10, 1000.0)])
    # steps that move with no time between them: no rate
    assert "ETA" not in _running_after([(5, 10, 1000.0), (0, 30, 1000.0)])
    # unknown total: the step without "/total" and no ETA
    assert _running_after([(5, 10, 1000.0), (10, 30, 1000.0)], steps=None).endswith("step 30, 1,000 tok/s")
    # 2 steps/s from step 10 at 5 s to 30 at 15 s, then 5 s more: 70 steps left = 35 s - 5 s = 30 s
    assert _running_after([(5, 10, 1000.0), (10, 30, 1000.0), (5, 30, 1000.0)]).endswith("ETA 30.0 s")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -5.0, 0.0])
def test_a_tokens_per_s_that_is_no_rate_is_not_shown(bad):
    # a figure that is no rate is left out of the plain line and the live bar (it showed "nan tok/s"), and the last
    # real figure stays
    line = _running_after([(5, 10, bad), (10, 30, bad)])
    assert line.endswith(": 15.0 s elapsed, step 30/100") and "tok/s" not in line
    assert _running_after([(5, 10, 1234.0), (10, 30, bad)]).endswith("step 30/100, 1,234 tok/s, ETA 35.0 s")
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with display(console) as reporter:
        assert isinstance(reporter, LiveReporter)
        step = _step()
        reporter.run_started(SimpleNamespace(name="smoke"), "/tmp/run", [step])
        reporter.step_started(step, 1)
        reporter.launch_progress(step, Progress(1.0, 7, bad, "running"))
        task = next(t for t in reporter.p.tasks if t.id == reporter.task)
        assert task.fields["info"] == "step 7"


def test_plain_lines_print_markup_and_emoji_codes_as_they_are():
    console, out = _plain()
    reporter = PlainReporter(console, interval_s=3600)
    step = _step()
    reporter.run_resumed(f"kept {TRICKY}")
    reporter.run_started(SimpleNamespace(name="smoke :ok:"), f"/tmp/{TRICKY}", [step])
    reporter.step_started(step, 1)
    reporter.step_finished(step, {"status": "failed", "duration_s": 2.0, "reason": f"exit 1: {TRICKY}"})
    lines = out.getvalue().splitlines()
    assert lines[0] == f"smoke :ok: -> /tmp/{TRICKY}"
    assert lines[1] == f"resumed: kept {TRICKY}"
    assert lines[-1] == f"  FAILED   train / baseline in 2.0 s: exit 1: {TRICKY}"
    assert "\x1b" not in out.getvalue()


def test_tables_and_lines_print_markup_and_emoji_codes_as_they_are():
    console, out = _plain()
    print_line(console, TRICKY)
    print_table(console, ("step", "reason"), [(":x:", TRICKY)], title=f"runs under /tmp/{TRICKY}")
    assert out.getvalue().splitlines() == [TRICKY, f"runs under /tmp/{TRICKY}", "step  reason",
                                           f":x:   {TRICKY}"]
    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, width=200, color_system=None)
    print_line(terminal, TRICKY, style="red")
    print_table(terminal, ("step", "reason"), [(":x:", TRICKY), ("ok", "PASS")], title=f"runs under {TRICKY}")
    lines = out.getvalue().splitlines()
    assert lines[0] == TRICKY
    assert lines[1].strip() == f"runs under {TRICKY}"
    cells = [[c.strip() for c in ln.split("│")[1:-1]] for ln in lines if ln.startswith("│")]
    assert cells == [[":x:", TRICKY], ["ok", "PASS"]]


def test_table_lines_pad_wide_characters_by_their_width_on_screen():
    # "日本" takes 4 terminal cells, "é" written as e + a combining acute accent 1: the next column starts at the
    # same place on every line
    lines = table_lines(("name", "value", "x"), [("日本", "e\u0301t\u00e9", "1"), ("ab", "zz", "2")])
    assert lines == ["name  value  x",
                     "日本  e\u0301t\u00e9    1",
                     "ab    zz     2"]


def test_the_live_bar_shows_a_launch_label_with_brackets_as_text():
    # rich reads "[tests/test_a.py]" or "[lr=0.001]" in a markup column as a style tag and drops it
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    step = _step(name="tests")
    with display(console) as reporter:
        reporter.run_started(SimpleNamespace(name="smoke"), "/tmp/run", [step])
        reporter.step_started(step, 2)
        reporter.launch_started(step, SimpleNamespace(argv=[], label="tests/test_a.py"), 0, 2)
        task = next(t for t in reporter.p.tasks if t.id == reporter.task)
        shown = [column.render(task).plain for column in reporter.p.columns if hasattr(column, "text_format")]
        assert shown == ["train / tests", "train [tests/test_a.py] 1/2"]
        reporter.launch_started(step, SimpleNamespace(argv=[], label="lr=0.001 :x:"), 1, 2)
        task = next(t for t in reporter.p.tasks if t.id == reporter.task)
        assert [column.render(task).plain for column in reporter.p.columns
                if hasattr(column, "text_format")][1] == "train [lr=0.001 :x:] 2/2"


def test_the_timer_ends_with_the_display_when_its_body_raises_keyboard_interrupt():
    console, out = _plain()
    with pytest.raises(KeyboardInterrupt):
        with display(console, interval_s=3600) as reporter:
            reporter.step_started(_step(), 1)
            assert [t for t in threading.enumerate() if t.name == "nsav-progress"]
            raise KeyboardInterrupt
    assert not [t for t in threading.enumerate() if t.name == "nsav-progress"]
    reporter.close()  # again: nothing happens, nothing prints
    reporter.tick()
    assert [ln for ln in out.getvalue().splitlines() if "RUNNING" in ln] == []


def test_the_cli_console_prints_emoji_codes_as_they_are():
    # the CLI prints paths with console.print(markup=False): rich still turned ":x:" into U+274C
    out = io.StringIO()
    console = make_console()
    console.file = out
    console.print("/runs/a:x:b/report.html", markup=False)
    assert out.getvalue() == "/runs/a:x:b/report.html\n"
