"""The watchdog CLI started before a run: writers whose clocks disagree with the watchdog's, and a relaunch that
moves the files aside.

On a shared filesystem a rank on another node stamps its records with that node's clock. Which records belong to
the run being watched (those appended after the watchdog started) and how old they are must not depend on that
clock: a writer an hour behind is neither ignored nor stalled at once, one an hour ahead neither makes an earlier
run's records look like this run's nor looks fresh for an hour.

Each test runs ``main`` (the CLI) with its loop on a fake clock: ``sleep`` advances the clock and lets the
"trainer" append its next records, so the order of writes and checks is fixed and no test depends on timing.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from nsa.training import watchdog as wd
from nsa.training.heartbeat import encode_record, heartbeat_path
from nsa.training.watchdog import HALT_NAME, main
from test_watchdog import RANK_WAITING as WAITS_FOR_USR1  # a rank that waits for its SIGUSR1

HOUR = 3600.0
DEAD_PID = 2 ** 22 + 12345  # above Linux's pid_max ceiling: never a live process


def append(out_dir, rank, ts, step, msg):
    with open(heartbeat_path(out_dir, rank), "ab") as f:
        f.write(encode_record(ts, rank, DEAD_PID, "other-node", step, msg))


class Loop:
    """The watchdog loop's clock (starting at the real time, as the CLI's own start is) and a script of writes:
    ``script(t)`` is called after every sleep with the seconds since the loop started."""

    def __init__(self, monkeypatch, script):
        self.t0 = self.t = time.time()
        self.checks, self.events = [], []
        real_run = wd.run

        def run(cfg, **kw):
            on_event = kw.pop("on_event", None)

            def record(kind, info):
                self.events.append((self.t - self.t0, kind, info))
                if kind == "check":
                    self.checks.append((self.t - self.t0, info))
                if on_event is not None:
                    on_event(kind, info)

            return real_run(cfg, sleep=self.sleep, now=lambda: self.t, on_event=record, **kw)

        self.script = script
        monkeypatch.setattr(wd, "run", run)

    def sleep(self, seconds):
        self.t += seconds
        self.script(self.t - self.t0)
        assert self.t - self.t0 < 1_000, "the loop never ended"


ARGS = ["--interval", "1", "--stall-after", "30", "--max-wait-start", "100", "--no-dump"]


@pytest.mark.parametrize("skew", [-HOUR, HOUR], ids=["behind", "ahead"])
def test_a_healthy_run_whose_clock_is_off_by_an_hour_finishes(tmp_path, monkeypatch, skew):
    """Behind: its records were older than the watchdog's start and ignored (exit 3, 'no heartbeat'); they are
    this run's. Ahead: its ages must not stall it either."""
    def script(t):
        if t <= 60:  # boots at 1 s, a step every second for a minute (twice the stall threshold), then done
            append(tmp_path, 0, loop.t + skew, int(t), "boot" if t == 1 else "done" if t == 60 else "step")

    loop = Loop(monkeypatch, script)
    assert main(["--dir", str(tmp_path), *ARGS]) == 0
    t, verdict = loop.checks[-1]
    assert verdict.state == "finished" and t == 60 and verdict.latest[0]["step"] == 60
    assert all(v.state in ("waiting", "running") for _, v in loop.checks[:-1])
    assert not (tmp_path / HALT_NAME).exists()


@pytest.mark.parametrize("skew", [-HOUR, HOUR], ids=["behind", "ahead"])
def test_a_rank_whose_clock_is_off_by_an_hour_is_stalled_after_the_threshold(tmp_path, monkeypatch, skew):
    """Rank 0 (this node's clock) keeps going; rank 1 (another node's clock, off by an hour) writes until 10 s and
    stops: it is stalled at the first check more than 30 s (the threshold) after its last record, on the
    watchdog's clock; not at once (behind), not an hour late (ahead), and not ignored."""
    def script(t):
        append(tmp_path, 0, loop.t, int(t), "step")
        if t <= 10:
            append(tmp_path, 1, loop.t + skew, int(t), "step")

    loop = Loop(monkeypatch, script)
    assert main(["--dir", str(tmp_path), *ARGS]) == 1
    t, verdict = loop.checks[-1]
    assert verdict.state == "stalled" and verdict.stalled_ranks == [1], verdict.reason
    assert t == 41  # 10 s + 30 s, the first check past it (ages count from the check that saw the record)
    assert verdict.ages[1] == pytest.approx(31.0) and verdict.latest[1]["step"] == 10
    halt = json.loads((tmp_path / HALT_NAME).read_text())
    assert halt["by"] == "watchdog" and "rank 1 last heartbeat 31s ago (step 10" in halt["reason"]


def test_an_earlier_run_stamped_an_hour_ahead_is_not_this_runs(tmp_path, monkeypatch):
    """The run before (on a node whose clock is an hour ahead) ended with 'done' a minute ago by its clock, which
    is still in the future by the watchdog's: the watchdog started before the resume took it for this run's and
    exited 'finished' at once. The resumed run (same files, appended) is watched to its own end."""
    t0 = time.time()
    append(tmp_path, 0, t0 + HOUR - 600, 0, "boot")
    append(tmp_path, 0, t0 + HOUR - 60, 100, "done")

    def script(t):
        if 5 <= t <= 20:
            append(tmp_path, 0, loop.t + HOUR, 100 + int(t), "boot" if t == 5 else "done" if t == 20 else "step")

    loop = Loop(monkeypatch, script)
    assert main(["--dir", str(tmp_path), *ARGS]) == 0
    t, verdict = loop.checks[-1]
    assert verdict.state == "finished" and t == 20 and verdict.latest[0]["step"] == 120
    assert [v.state for _, v in loop.checks[:5]] == ["waiting"] * 5


def test_a_rank_not_booted_yet_is_counted_from_the_runs_first_record_on_the_watchdogs_clock(tmp_path,
                                                                                             monkeypatch):
    """Rank 0 (clock an hour behind) boots at 3 s; rank 1 never comes. Rank 1 is stalled 30 s after rank 0's first
    record was seen, not at once (an hour 'after the run's first heartbeat')."""
    def script(t):
        if t >= 3:
            append(tmp_path, 0, loop.t - HOUR, int(t), "boot" if t == 3 else "step")

    loop = Loop(monkeypatch, script)
    assert main(["--dir", str(tmp_path), "--ranks", "2", *ARGS]) == 1
    t, verdict = loop.checks[-1]
    assert verdict.state == "stalled" and verdict.stalled_ranks == [1], verdict.reason
    assert t == 34 and "1 never wrote a heartbeat (31s after the run's first one)" in verdict.reason
    assert [v.state for _, v in loop.checks[:3]] == ["waiting"] * 3
    assert all(v.state == "running" for _, v in loop.checks[3:-1])


def test_include_earlier_and_once_still_judge_the_records_already_there(tmp_path, monkeypatch):
    """--include-earlier and --once judge what is in the files when they start: a stale rank is stalled at the
    first check."""
    now = time.time()
    append(tmp_path, 0, now - 900, 118, "step")
    loop = Loop(monkeypatch, lambda t: None)
    assert main(["--dir", str(tmp_path), "--include-earlier", "--halt", "0", *ARGS]) == 1
    assert len(loop.checks) == 1 and loop.checks[0][1].stalled_ranks == [0]
    assert main(["--dir", str(tmp_path), "--once", "--halt", "0", "--stall-after", "30", "--no-dump"]) == 1
    assert not (tmp_path / HALT_NAME).exists()


ARGS_SHORT_WAIT = ["--interval", "1", "--stall-after", "30", "--max-wait-start", "20", "--no-dump"]


def relaunch(tmp_path, loop, t, again=True):
    """Steps to 25 s, a crash, at 35 s a fresh relaunch that moves the files aside; it boots at 40 s and ends
    at 50 s (`again`), or never comes."""
    if t <= 25:
        append(tmp_path, 0, loop.t, int(t), "step")
    elif t == 35:
        (tmp_path / "previous_runs").mkdir()
        heartbeat_path(tmp_path, 0).rename(tmp_path / "previous_runs" / "heartbeat_rank0.jsonl")
    elif again and 40 <= t <= 50:
        append(tmp_path, 0, loop.t, int(t) - 40, "done" if t == 50 else "step")


def test_a_relaunch_that_moves_the_files_aside_is_watched_to_its_end(tmp_path, monkeypatch):
    """The files are gone for 5 s, 35 s after the watchdog started, more than --max-wait-start (20 s): it gave up
    ('no heartbeat ... after 35s', exit 3) and the relaunched run went unwatched."""
    loop = Loop(monkeypatch, lambda t: relaunch(tmp_path, loop, t))
    assert main(["--dir", str(tmp_path), *ARGS_SHORT_WAIT]) == 0
    t, verdict = loop.checks[-1]
    assert verdict.state == "finished" and t == 50 and verdict.latest[0]["step"] == 10


def test_files_moved_aside_and_no_relaunch_gives_up_max_wait_start_after_they_went(tmp_path, monkeypatch):
    loop = Loop(monkeypatch, lambda t: relaunch(tmp_path, loop, t, again=False))
    assert main(["--dir", str(tmp_path), *ARGS_SHORT_WAIT]) == 3
    t, kind, verdict = loop.events[-1]
    assert kind == "gave_up" and t == 55 and "after 20s" in verdict.reason




@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_a_stall_whose_halt_cannot_be_written_still_asks_for_dumps_and_exits_1(tmp_path, capsys):
    """.HALT cannot be written (here a directory is in its way; a full disk or a read-only mount alike): the
    watchdog exited 2 ('usage error') without asking the ranks for their stack dumps. The stall is reported
    (exit 1) with why there is no .HALT, and the dumps are asked for."""
    got = tmp_path / "got_usr1"
    out = tmp_path / "run"
    (out / HALT_NAME).mkdir(parents=True)
    rank = subprocess.Popen([sys.executable, "-c", WAITS_FOR_USR1, str(got)], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "ready"
        with open(heartbeat_path(out, 0), "ab") as f:  # a live rank waiting on rank 1 in a collective
            f.write(encode_record(time.time(), 0, rank.pid, socket.gethostname(), 120, "step"))
        append(out, 1, time.time() - 900, 118, "step")  # stalled
        assert main(["--dir", str(out), "--once", "--stall-after", "300"]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert "stalled: rank 1" in lines[0]
        assert f"STALLED: could not write {out / HALT_NAME}" in lines[1], lines[1]
        assert f"stack dumps requested from pid(s) {rank.pid}" in lines[1], lines[1]
        assert rank.wait(timeout=20) == 0 and got.read_text() == "1"
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
