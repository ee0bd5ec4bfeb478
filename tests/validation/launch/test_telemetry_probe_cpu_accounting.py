"""The CPU accounting of validation.launch.telemetry's probes (TreeProbe, HostProbe) over hand-made /proc tables
(ProcStat per pid, times in clock ticks as /proc/PID/stat gives them): processes that start, end and are reaped
between two samples, and a pid the kernel gave again to a new process within one sample period. Each expected
figure is worked out by hand from the ticks each process used in the period."""

from __future__ import annotations

import time

import pytest

from validation.launch import telemetry
from validation.launch.telemetry import ProcStat as PS

TCK = telemetry._CLK_TCK


def _tree_pct(before: dict, after: dict, root: int = 100, seconds: float = 1.0) -> float | None:
    """TreeProbe(root)'s CPU figure (percent of one core) over the tables `before` and `after`, read `seconds`
    apart (their ProcStat.at), whatever the time of the calls."""
    probe = telemetry.TreeProbe(root)
    t0 = time.monotonic()
    assert probe.sample({p: st._replace(at=t0) for p, st in before.items()})["cpu_util_pct"] is None
    return probe.sample({p: st._replace(at=t0 + seconds) for p, st in after.items()})["cpu_util_pct"]


def _host_shares(monkeypatch, before: dict, after: dict, busy: tuple[int, int]) -> dict:
    """HostProbe(100)'s second sample over `before` and `after`, the machine's busy ticks being busy[0] then
    busy[1] (/proc/stat's user + nice + system)."""
    ticks = iter([(busy[0], 0), (busy[1], 0)])
    monkeypatch.setattr(telemetry, "_cpu_ticks", lambda: next(ticks))
    probe = telemetry.HostProbe(100, ncpu=2)
    probe.sample(before)
    time.sleep(0.01)  # a period to measure over
    return probe.sample(after)


# root 100 -> agent 101 -> rank 102 at the first sample; then the rank (20 more ticks, 320 in all) and the agent
# (10 more, 60 in all, having waited for the rank) end and 100 waits for the agent: its children time grows by
# 60 + 320. The kernel gives pid 101 again to a new child of 100, which uses 5 ticks. The tree used 10 + 20 + 5.
REUSED_BEFORE = {100: PS("python", "S", 1, 5, 10, 0), 101: PS("torchrun", "S", 100, 6, 50, 0),
                 102: PS("python", "R", 101, 7, 300, 0)}
REUSED_AFTER = {100: PS("python", "S", 1, 5, 10, 380), 101: PS("cc1", "R", 100, 900, 5, 0)}


def test_a_pid_given_again_within_the_period_does_not_stop_the_walk_to_the_reaper():
    """The rank's 300 ticks of the earlier periods are in 100's children time now: they are taken off there, not at
    the new process that holds the agent's old pid. Before the fix the walk stopped at pid 101 (alive again, a
    different process), and the tree read 335 ticks in a one-second period: 335% on the machine's clock where 35%
    was used."""
    assert _tree_pct(REUSED_BEFORE, REUSED_AFTER) == pytest.approx(100.0 * 35 / TCK, abs=0.1)


def test_a_pid_given_again_within_the_period_does_not_hide_a_neighbour(monkeypatch):
    """The same tree under HostProbe, the machine busy for 100 ticks: 35 the run's, 65 a neighbour's (pid 200).
    Before the fix the run's figure (335 ticks) exceeded the machine's and the neighbour read 0."""
    before = {**REUSED_BEFORE, 200: PS("python", "R", 1, 8, 0, 0)}
    after = {**REUSED_AFTER, 200: PS("python", "R", 1, 8, 65, 0)}
    out = _host_shares(monkeypatch, before, after, (10_000, 10_100))
    assert out["host_cpu_pct"] > 0
    assert out["other_cpu_pct"] / out["host_cpu_pct"] == pytest.approx(0.65, abs=0.01), out


def test_children_that_start_end_or_are_reaped_between_samples_count_once():
    """Root 100 with a child 101 (40 ticks at the first sample). In the period: 101 uses 10 more, ends and is
    reaped by 100 (children time + 50); a child 102 starts and uses 30, still running; a child 103 starts, uses 7,
    ends and is reaped by 100 (children time + 7, never seen); 100 itself uses 3. The tree used 10 + 30 + 7 + 3 = 50
    ticks over 2 s: 25 ticks a second."""
    before = {100: PS("python", "S", 1, 5, 20, 0), 101: PS("python", "R", 100, 6, 40, 0)}
    after = {100: PS("python", "S", 1, 5, 23, 57), 102: PS("python", "R", 100, 800, 30, 0)}
    assert _tree_pct(before, after, seconds=2.0) == pytest.approx(100.0 * 25 / TCK, abs=0.1)


def test_an_exited_childs_pid_given_to_a_new_child_counts_both_once():
    """Child 101 (start 6, 500 ticks at the first sample) uses 10 more, ends, is reaped by 100; a new child gets pid
    101 (start 900) and uses 20. The tree used 30 ticks (not 500 + 30, nor 20)."""
    before = {100: PS("python", "S", 1, 5, 0, 0), 101: PS("python", "R", 100, 6, 500, 0)}
    after = {100: PS("python", "S", 1, 5, 0, 510), 101: PS("python", "R", 100, 900, 20, 0)}
    assert _tree_pct(before, after) == pytest.approx(100.0 * 30 / TCK, abs=0.1)


def test_a_period_after_an_unread_proc_stat_measures_nothing(monkeypatch):
    """/proc/stat unread at the second sample (None: out of file handles): the run alone used 100 ticks in each of
    two periods, the machine 200 in all. The third sample may not set the machine's two periods against the run's
    last one (a neighbour of 50%, where there is none): it has no figure, and the fourth measures one period again
    (the run all of the machine)."""
    ticks = iter([(10_000, 0), None, (10_200, 0), (10_300, 0)])
    monkeypatch.setattr(telemetry, "_cpu_ticks", lambda: next(ticks))
    probe = telemetry.HostProbe(100, ncpu=2)
    outs = []
    for used in (0, 100, 200, 300):
        outs.append(probe.sample({100: PS("python", "R", 1, 5, used, 0)}))
        time.sleep(0.01)
    assert outs[1]["other_cpu_pct"] is None and outs[2]["other_cpu_pct"] is None
    assert outs[3]["host_cpu_pct"] > 0 and outs[3]["other_cpu_pct"] == 0.0
