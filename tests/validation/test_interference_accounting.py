"""The run's own CPU in validation.launch.telemetry.HostProbe, where processes of the run end between two samples:
what each had used at the last sample is taken off the children time of the process that now holds it, once, so
that neither side gains or loses it (the other processes' CPU is the machine's total less the run's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from validation import contracts
from validation.launch import telemetry

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"
PS = telemetry.ProcStat


def _probe_two_samples(monkeypatch, before: dict, after: dict, busy: tuple[int, int]) -> dict:
    """HostProbe(100)'s second sample over the process tables `before` and `after`, the machine's busy ticks
    being busy[0] then busy[1]."""
    ticks = iter([(busy[0], 0), (busy[1], 0)])
    monkeypatch.setattr(telemetry, "_cpu_ticks", lambda: next(ticks))
    probe = telemetry.HostProbe(100, ncpu=2)
    probe.sample(before)
    time.sleep(0.01)  # a period to measure over
    return probe.sample(after)


def test_a_rank_and_the_agent_that_waited_for_it_ending_in_one_period_are_counted_once(monkeypatch):
    """nsa-validate (100) -> agent (101) -> rank (102): the rank had used 200 ticks at the first sample and 300 when it
    ended; the agent reaped it and ended too, nsa-validate reaped the agent (its children time: the agent's 1 tick and
    the rank's 300). The run used 100 ticks in the period, a neighbour (200) another 100. Before the fix the rank's
    200 ticks of the earlier periods were counted again as the run's, and the neighbour's core read 0."""
    before = {100: PS("nsa-validate", "S", 1, 5, 10, 0), 101: PS("torchrun", "S", 100, 6, 1, 0),
              102: PS("python", "R", 101, 7, 200, 0), 200: PS("python", "R", 1, 8, 0, 0)}
    after = {100: PS("nsa-validate", "S", 1, 5, 10, 301), 200: PS("python", "R", 1, 8, 100, 0)}
    out = _probe_two_samples(monkeypatch, before, after, (10_000, 10_200))
    assert out["host_cpu_pct"] > 0
    assert abs(out["other_cpu_pct"] / out["host_cpu_pct"] - 0.5) < 0.01, out
    # but the agent (101) ended without waiting for its rank (102), which lives on, re-parented outside the run: the
    # rank's time is in no children time of the run, so nothing of it is taken off nsa-validate's (which holds the
    # agent's 1 tick and its 50 ticks since); taking it off would count the run's 50 ticks as another's
    before = {100: PS("nsa-validate", "S", 1, 5, 10, 0), 101: PS("torchrun", "S", 100, 6, 1, 0),
              102: PS("python", "R", 101, 7, 200, 0)}
    after = {100: PS("nsa-validate", "S", 1, 5, 10, 51), 102: PS("python", "R", 1, 7, 250, 0)}
    out = _probe_two_samples(monkeypatch, before, after, (10_000, 10_100))
    # the run used 50 (the agent), the rank, now another's, 50
    assert abs(out["other_cpu_pct"] / out["host_cpu_pct"] - 0.5) < 0.01, out


def test_a_process_of_the_run_started_while_the_last_table_was_read_counts_its_first_period(monkeypatch):
    """A child of the run (101) started while the last sample read /proc (after its listing, so it is missing from
    that table), 50 ms before that sample read the clock: everything it has used is since the last sample. Before the
    fix "new" meant "started after the clock reading", and its first period's CPU (here all the machine's) counted
    as another process's: a busy machine, whose sampler is preempted mid-scan, saw contention of its own making."""
    with open("/proc/uptime") as f:
        boot_ticks = float(f.read().split()[0]) * telemetry._CLK_TCK
    before = {100: PS("nsa-validate", "S", 1, 5, 10, 0)}
    after = {100: PS("nsa-validate", "S", 1, 5, 10, 0), 101: PS("python", "R", 100, int(boot_ticks) - 5, 100, 0)}
    out = _probe_two_samples(monkeypatch, before, after, (10_000, 10_100))
    assert out["host_cpu_pct"] > 0 and out["other_cpu_pct"] == 0.0, out
    assert out["other_top"] is None, out


def _neighbour(seconds: float) -> int:
    """A busy process outside the run (double-forked, in a session of its own, its output not on our pipe): its pid."""
    code = (f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {BUSY.format(s=seconds)!r}], "
            "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint(p.pid)")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_a_neighbours_core_is_seen_in_the_period_a_chain_of_the_runs_processes_ends(tmp_path):
    """The step (A) runs B, which runs C busy for 1.5 s; C and B end in one period and A sleeps 1.2 s; a neighbour
    keeps a core busy throughout. Every period after C ended shows the neighbour's core (at least half of one, on a
    machine that other work may share); before the fix the period in which C and B ended read 0: C's earlier time
    was counted again as the run's and took the neighbour's place."""
    inner = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BUSY.format(s=1.5)!r}])\n"
    step = (f"import subprocess, sys, time\nsubprocess.run([sys.executable, '-c', {inner!r}])\n"
            f"open({str(tmp_path / 'ended')!r}, 'w').write(repr(time.time()))\ntime.sleep(1.2)\n")
    neighbour = _neighbour(6.0)
    proc = sampler = None
    try:
        proc = subprocess.Popen([sys.executable, "-c", step])
        sampler = telemetry.Sampler(tmp_path / "telemetry.csv", proc.pid, interval_s=0.25, node="n0",
                                    own_root=proc.pid, gpus=False).start()
        proc.wait(timeout=60)
        sampler._thread.join(10)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if sampler is not None:
            sampler.stop()
        try:
            os.kill(neighbour, signal.SIGKILL)
        except ProcessLookupError:
            pass
    ended = float((tmp_path / "ended").read_text())
    rows = contracts.read_telemetry(tmp_path)
    after = [r for r in rows if r["time"] > ended + 0.05 and r["other_cpu_pct"] is not None]
    assert len(after) >= 2, rows
    assert min(r["other_cpu_pct"] for r in after) >= 50.0, [(r["time"] - ended, r["other_cpu_pct"]) for r in after]


def test_a_period_whose_busy_ticks_went_down_measures_nothing(monkeypatch):
    """/proc/stat's busy sum falls where a CPU goes offline between two reads (its counters leave the sum): that
    period's machine CPU is unknown, never negative (the run's own figure stays). Before the fix: host_cpu_pct
    -100.0 for 1,000 then 900 ticks."""
    table = {100: PS("nsa-validate", "S", 1, 5, 10, 0)}
    out = _probe_two_samples(monkeypatch, table, table, (1_000, 900))
    assert out["host_cpu_pct"] is None and out["other_cpu_pct"] is None and out["steal_pct"] is None, out
    out = _probe_two_samples(monkeypatch, table, table, (1_000, 1_000))
    assert out["host_cpu_pct"] == 0.0, out
