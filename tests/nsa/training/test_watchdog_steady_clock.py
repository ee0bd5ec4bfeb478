"""The watchdog loop's own clock when the host's wall clock steps (an NTP correction, an operator's `date -s`).

A rank's silence is a duration: it must be counted on a clock that only moves forward at the rate of time, not on
the wall clock, which can step an hour either way while the run goes on. The loop here runs with its default clock
on a virtual host: ``time.time`` (the wall clock, which the trainer's heartbeats are stamped with too) steps by an
hour at a chosen moment while ``time.monotonic`` does not; ``time.sleep`` advances both and lets the "trainer"
write its next records. The watchdog module is loaded afresh while that host's clocks are in place, so that its
defaults are that host's, as they are in a real process.
"""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest

from nsa.training import watchdog
from nsa.training.heartbeat import HeartbeatWriter

HOUR = 3600.0
T0 = 1_700_000_000.0


class Host:
    """A host's clocks: `t` seconds have passed (monotonic); the wall clock is T0 + t, stepped by `step_by` once
    `t` reaches `step_at`. `script(t)` runs after every sleep (the trainer's writes)."""

    def __init__(self, step_at: float, step_by: float, script):
        self.t, self.step_at, self.step_by, self.script = 0.0, step_at, step_by, script

    def wall(self) -> float:
        return T0 + self.t + (self.step_by if self.t >= self.step_at else 0.0)

    def monotonic(self) -> float:
        return 1_000.0 + self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.script(self.t)


def _watchdog_on(host: Host, monkeypatch):
    monkeypatch.setattr(time, "time", host.wall)
    monkeypatch.setattr(time, "monotonic", host.monotonic)
    monkeypatch.setattr(time, "sleep", host.sleep)
    spec = importlib.util.spec_from_file_location("watchdog_on_a_stepping_host", watchdog.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("only_new", [True, False])
def test_a_slow_live_run_is_not_stalled_when_the_wall_clock_steps_an_hour_ahead(tmp_path, monkeypatch, only_new):
    """One step every 120 s, a threshold of 300 s, checks every 30 s: the wall clock steps an hour ahead at 200 s
    (between two steps). No record is ever more than 120 s old; the run finishes at 960 s without a .HALT."""
    def trainer(t):
        assert t < 2_000, "the loop never ended"
        if t % 120 == 0:
            writer.write(int(t // 120), "done" if t >= 960 else "step")

    host = Host(step_at=200, step_by=HOUR, script=trainer)
    writer = HeartbeatWriter(tmp_path, 0, clock=host.wall)  # the trainer stamps its records with the wall clock
    wd = _watchdog_on(host, monkeypatch)
    if not only_new:
        writer.write(0, "boot")
    cfg = wd.WatchdogConfig(tmp_path, stall_after_s=300, interval_s=30, dump_stacks=False, only_new=only_new)
    try:
        verdict = wd.run(cfg)
    finally:
        writer.close()
    assert verdict.state == "finished", verdict.reason
    assert host.t == 960
    assert not (tmp_path / wd.HALT_NAME).exists()


def test_a_hung_rank_is_stalled_on_time_when_the_wall_clock_steps_an_hour_back(tmp_path, monkeypatch):
    """The rank's last record is at 120 s; the wall clock steps an hour back at 200 s. Its silence passes 300 s at
    420 s: the first check after that (450 s) finds it stalled, not the one an hour later."""
    def trainer(t):
        assert t < 2_000, "the stall was not seen within 2,000 s"
        if t <= 120 and t % 60 == 0:
            writer.write(int(t // 60), "step")

    host = Host(step_at=200, step_by=-HOUR, script=trainer)
    writer = HeartbeatWriter(tmp_path, 0, clock=host.wall)
    wd = _watchdog_on(host, monkeypatch)
    cfg = wd.WatchdogConfig(tmp_path, stall_after_s=300, interval_s=30, halt=False, dump_stacks=False,
                            only_new=True)
    try:
        verdict = wd.run(cfg)
    finally:
        writer.close()
    assert verdict.state == "stalled" and verdict.stalled_ranks == [0], verdict.reason
    assert host.t == 450
    assert verdict.ages[0] == pytest.approx(330)


def test_checks_with_a_watch_and_no_clock_given_count_silence_on_the_watchs_clock(tmp_path, monkeypatch):
    """A caller polling on its own (the validation suite's launcher) keeps a Watch and passes no `now`: a live rank
    writing every 60 s is never stalled by the wall clock stepping an hour ahead at 100 s."""
    host = Host(step_at=100, step_by=HOUR, script=lambda t: t % 60 == 0 and writer.write(int(t // 60), "step"))
    writer = HeartbeatWriter(tmp_path, 0, clock=host.wall)
    wd = _watchdog_on(host, monkeypatch)
    watch = wd.Watch(tmp_path, time.time())
    states = []
    try:
        for _ in range(12):
            host.sleep(15)
            states.append(wd.check(tmp_path, 120, watch=watch).state)
    finally:
        writer.close()
    assert states == ["waiting"] * 3 + ["running"] * 9  # the first record at 60 s


def test_a_rank_hung_in_the_checkpoint_of_a_stop_is_stalled_not_finished(tmp_path):
    """A halt or SIGTERM is followed by a checkpoint (collectives under DDP/FSDP). Its heartbeat said "stop", a
    terminal record, before that save: a rank hung in it read as a finished run (exit 0). The record before the
    save is "stopping", which is not terminal: the rank's silence counts, and "stop" comes once the save is done."""
    beats = HeartbeatWriter(tmp_path, 0, clock=lambda: T0)
    beats.write(1, "step")
    beats.write(1, "stopping", reason="SIGTERM received")
    verdict = watchdog.check(tmp_path, 300, now=T0 + 301)
    assert verdict.state == "stalled", verdict
    HeartbeatWriter(tmp_path, 0, clock=lambda: T0 + 10).write(1, "stop", status="terminated")
    assert watchdog.check(tmp_path, 300, now=T0 + 400).state == "finished"
