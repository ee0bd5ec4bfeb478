"""Heartbeat file format (nsa.training.heartbeat) and stall detection (nsa.training.watchdog).

The earlier system's watchdog never fired: it could not read the heartbeat file, and non-zero ranks wrote only a
boot heartbeat. These tests read real files the way the watchdog does, signal real processes and run the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from nsa.training import heartbeat as hb
from nsa.training.heartbeat import (HeartbeatWriter, TERMINAL_MSGS, encode_record, heartbeat_path, latest_heartbeats,
                           read_heartbeats)
from nsa.training.watchdog import HALT_NAME, WatchdogConfig, check, main, run, signal_stack_dumps, write_halt

REPO = Path(__file__).resolve().parents[3]
T0 = 1_700_000_000.0
DEAD_PID = 2 ** 22 + 12345  # above Linux's pid_max ceiling (4194304): never a live process


class FakeClock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def append_record(out_dir, rank, ts, step, msg, *, pid=DEAD_PID, host="other-host", **metrics):
    """Append one record with a chosen pid/host (so no test ever signals a real process by accident)."""
    with open(heartbeat_path(out_dir, rank), "ab") as f:
        f.write(encode_record(ts, rank, pid, host, step, msg, **metrics))


# --------------------------------------------------------------------------------------------- heartbeat file


def test_round_trip_keys_order_and_values(tmp_path):
    clock = FakeClock()
    with HeartbeatWriter(tmp_path, 1, clock=clock) as w:
        w.write(0, "boot")
        clock.t += 2.5
        w.write(7, "step", loss=2.25, lr=3e-4, toks=1024, note="x", missing=None)
    path = tmp_path / "heartbeat_rank1.jsonl"
    assert heartbeat_path(tmp_path, 1) == path
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert list(json.loads(lines[1])) == ["ts", "rank", "pid", "host", "step", "msg",
                                          "loss", "lr", "toks", "note", "missing"]
    recs = read_heartbeats(tmp_path)
    assert list(recs) == [1] and recs.bad_lines == {}
    boot, step = recs[1]
    assert boot == {"ts": T0, "rank": 1, "pid": os.getpid(), "host": socket.gethostname(), "step": 0, "msg": "boot"}
    assert step["ts"] == T0 + 2.5 and step["step"] == 7 and step["msg"] == "step"
    assert (step["loss"], step["lr"], step["toks"], step["note"], step["missing"]) == (2.25, 3e-4, 1024, "x", None)
    assert latest_heartbeats(tmp_path) == {1: step}


def test_non_finite_metrics_are_null_and_valid_json(tmp_path):
    with HeartbeatWriter(tmp_path, 0) as w:
        w.write(3, "step", loss=float("nan"), grad_norm=float("inf"), neg=float("-inf"), ok=1.5)
    text = heartbeat_path(tmp_path, 0).read_text()
    assert "NaN" not in text and "Infinity" not in text
    rec = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert (rec["loss"], rec["grad_norm"], rec["neg"], rec["ok"]) == (None, None, None, 1.5)


def test_writer_rejects_reserved_and_unsupported_metrics(tmp_path):
    with HeartbeatWriter(tmp_path, 0) as w:
        with pytest.raises(ValueError, match="'ts' is reserved"):
            w.write(1, "step", ts=3.0)
        with pytest.raises(TypeError, match="'cfg'"):
            w.write(1, "step", cfg={"a": 1})
    with pytest.raises(ValueError, match="closed"):
        w.write(2, "step")
    assert heartbeat_path(tmp_path, 0).read_bytes() == b""  # nothing half-written


def test_resumed_writer_appends(tmp_path):
    with HeartbeatWriter(tmp_path, 0) as w:
        w.write(0, "boot")
        w.write(10, "stop")
    with HeartbeatWriter(tmp_path, 0) as w:  # the resumed run
        w.write(10, "boot")
        w.write(11, "step")
    assert [(r["step"], r["msg"]) for r in read_heartbeats(tmp_path)[0]] == \
        [(0, "boot"), (10, "stop"), (10, "boot"), (11, "step")]
    assert latest_heartbeats(tmp_path)[0]["step"] == 11


def test_resumed_writer_after_a_cut_off_line_keeps_its_first_record(tmp_path):
    """A writer killed mid-line leaves a last line without its newline; the resumed run's writer ends that line
    first, so its own first record is a line of its own (not glued to the cut-off one, where neither decodes)."""
    append_record(tmp_path, 0, T0, 7, "step")
    with open(heartbeat_path(tmp_path, 0), "ab") as f:
        f.write(encode_record(T0 + 1, 0, 1, "h", 8, "step")[:25])  # cut off mid-line
    with HeartbeatWriter(tmp_path, 0, clock=lambda: T0 + 50) as w:
        w.write(7, "boot")
    recs = read_heartbeats(tmp_path)
    assert [(r["step"], r["msg"]) for r in recs[0]] == [(7, "step"), (7, "boot")]
    assert recs.bad_lines == {0: 1}  # the cut-off line, now complete, is skipped
    assert latest_heartbeats(tmp_path)[0]["msg"] == "boot"
    with HeartbeatWriter(tmp_path, 0) as w:  # a file that ends with its newline gets nothing added
        pass
    assert heartbeat_path(tmp_path, 0).read_bytes().endswith(b"\n") and read_heartbeats(tmp_path).bad_lines == {0: 1}


def test_partial_last_line_and_bad_lines(tmp_path):
    append_record(tmp_path, 0, T0, 1, "step")
    append_record(tmp_path, 0, T0 + 1, 2, "step")
    with open(heartbeat_path(tmp_path, 0), "ab") as f:
        f.write(b"this is not json\n\n")
        f.write(encode_record(T0 + 2, 0, 1, "h", 3, "step")[:-1])  # being written: all but its newline
    heartbeat_path(tmp_path, 1).write_bytes(b"")  # empty file: no record
    heartbeat_path(tmp_path, 2).write_bytes(b'{"ts": 1.0, "step": 0, "ms')  # only a partial line
    (tmp_path / "heartbeat_rankX.jsonl").write_text("ignored\n")
    recs = read_heartbeats(tmp_path)
    assert [r["step"] for r in recs[0]] == [1, 2]
    assert recs[1] == [] and recs[2] == []
    assert recs.bad_lines == {0: 1}
    latest = latest_heartbeats(tmp_path)
    assert list(latest) == [0] and latest[0]["step"] == 2  # skips the partial line AND the undecodable one


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="heartbeat directory not found: .*nope"):
        latest_heartbeats(tmp_path / "nope")


def test_latest_on_big_file_reads_only_the_tail(tmp_path, monkeypatch):
    path = heartbeat_path(tmp_path, 3)
    with open(path, "wb") as f:
        f.write(b"".join(encode_record(T0 + i, 3, 42, "h", i, "step", loss=1.0 / (i + 1)) for i in range(50_000)))
    size = path.stat().st_size
    assert size > 4_000_000

    bytes_read = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self._f = f

        def read(self, *a):
            data = self._f.read(*a)
            bytes_read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    monkeypatch.setattr(hb, "open", lambda *a, **k: Counting(real_open(*a, **k)), raising=False)
    latest = latest_heartbeats(tmp_path)
    assert latest[3]["step"] == 49_999 and latest[3]["ts"] == T0 + 49_999
    tail_bytes = sum(bytes_read)
    assert 0 < tail_bytes < size / 100

    bytes_read.clear()
    assert len(read_heartbeats(tmp_path)[3]) == 50_000  # the full reader, through the same counter
    assert sum(bytes_read) == size


def test_long_lines_grow_the_tail_window(tmp_path):
    append_record(tmp_path, 0, T0, 1, "step", blob="a" * 20_000)
    append_record(tmp_path, 0, T0 + 1, 2, "step", blob="b" * 50_000)
    with open(heartbeat_path(tmp_path, 0), "ab") as f:
        f.write(b'{"ts": 5, "rank": 0, "blob": "' + b"c" * 30_000)  # long partial line
    rec = latest_heartbeats(tmp_path)[0]
    assert rec["step"] == 2 and rec["blob"] == "b" * 50_000


def test_concurrent_appender_never_yields_a_broken_record(tmp_path):
    n = 3000
    with HeartbeatWriter(tmp_path, 0) as w:
        w.write(0, "boot", pad="x" * 300)
    done, reading = threading.Event(), threading.Event()

    def appender():
        reading.wait(10)
        with HeartbeatWriter(tmp_path, 0) as w2:
            for i in range(1, n + 1):
                w2.write(i, "step", pad="x" * (100 + 300 * (i % 7)), check=i * 3)
        done.set()

    t = threading.Thread(target=appender)
    t.start()
    seen = []
    try:
        while not done.is_set() or not seen or seen[-1] != n:
            rec = latest_heartbeats(tmp_path)[0]
            assert rec.get("check", 0) == rec["step"] * 3 and rec["msg"] in ("boot", "step")
            seen.append(rec["step"])
            reading.set()  # the first read has happened: start appending
            recs = read_heartbeats(tmp_path)
            assert recs.bad_lines == {}
            assert [r["step"] for r in recs[0]] == list(range(len(recs[0])))
    finally:
        t.join()
    assert seen == sorted(seen) and seen[-1] == n
    assert len(set(seen)) > 1  # reads really overlapped the writes


# ------------------------------------------------------------------------------------------------------ check


def test_check_waiting_running_stalled_finished(tmp_path):
    assert check(tmp_path, 300, now=T0).state == "waiting"

    append_record(tmp_path, 0, T0, 0, "boot")
    append_record(tmp_path, 1, T0, 0, "boot")
    append_record(tmp_path, 0, T0 + 100, 50, "step")
    append_record(tmp_path, 1, T0 + 110, 50, "step")
    v = check(tmp_path, 300, now=T0 + 200)
    assert v.state == "running" and v.stalled_ranks == []
    assert v.ages == {0: pytest.approx(100.0), 1: pytest.approx(90.0)}

    # rank 0 keeps going, rank 1 stops writing
    append_record(tmp_path, 0, T0 + 400, 90, "step")
    v = check(tmp_path, 300, now=T0 + 450)
    assert v.state == "stalled" and v.stalled_ranks == [1]
    assert "rank 1" in v.reason and "340s" in v.reason and "step 50" in v.reason and "rank 0" not in v.reason
    assert v.latest[1]["step"] == 50

    # both end: a terminal record is never stale
    for msg in TERMINAL_MSGS:
        d = tmp_path / msg
        d.mkdir()
        append_record(d, 0, T0, 100, "done")
        append_record(d, 1, T0, 100, msg)
        v = check(d, 300, now=T0 + 10_000)
        assert v.state == "finished" and v.stalled_ranks == [], msg
        assert f"rank 1: {msg} at step 100" in v.reason


def test_a_stall_asks_every_unfinished_rank_for_dumps_not_only_the_stalled(tmp_path):
    """The hung rank crosses the threshold first; a rank waiting on it in a collective follows seconds later (how
    many depends on the load: a CI run caught rank 1 alone). Where that rank waits is half the diagnosis, so the
    dumps go to every rank not yet finished; a finished one has no stack to show."""
    append_record(tmp_path, 0, T0 + 5, 3, "step")   # entered the collective later: 1 s old at the check
    append_record(tmp_path, 1, T0, 3, "fault")      # hung: 6 s old
    append_record(tmp_path, 2, T0, 9, "done")
    v = check(tmp_path, 3, now=T0 + 6)
    assert v.state == "stalled" and v.stalled_ranks == [1]
    assert v.dump_ranks == [0, 1]
    assert check(tmp_path, 3, now=T0 + 9).dump_ranks == [0, 1]  # both stalled now: the same ranks


def test_check_one_rank_finished_other_alive_is_running(tmp_path):
    append_record(tmp_path, 0, T0, 100, "done")
    append_record(tmp_path, 1, T0 + 500, 99, "step")
    v = check(tmp_path, 300, now=T0 + 600)
    assert v.state == "running" and "1 finished" in v.reason


def test_check_expected_rank_missing(tmp_path):
    append_record(tmp_path, 0, T0, 0, "boot")
    append_record(tmp_path, 0, T0 + 250, 20, "step")
    v = check(tmp_path, 300, now=T0 + 280, expected_ranks=2)
    assert v.state == "running" and v.ages[1] == pytest.approx(280.0) and "waiting for rank(s) 1" in v.reason
    v = check(tmp_path, 300, now=T0 + 301, expected_ranks=2)
    assert v.state == "stalled" and v.stalled_ranks == [1]
    assert "1 never wrote a heartbeat" in v.reason
    # without expected_ranks, only the files seen count
    assert check(tmp_path, 300, now=T0 + 301).state == "running"
    # rank 0 done, rank 1 never came: not finished
    append_record(tmp_path, 0, T0 + 290, 20, "done")
    assert check(tmp_path, 300, now=T0 + 295, expected_ranks=2).state == "running"
    assert check(tmp_path, 300, now=T0 + 295).state == "finished"


def test_check_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="stall_after_s"):
        check(tmp_path, 0)
    with pytest.raises(ValueError, match="expected_ranks"):
        check(tmp_path, 10, expected_ranks=0)
    with pytest.raises(ValueError, match="interval_s"):
        WatchdogConfig(tmp_path, interval_s=-1)


def test_write_halt_is_atomic_json(tmp_path):
    path = write_halt(tmp_path, "rank 1 stuck")
    assert path == tmp_path / HALT_NAME == tmp_path / ".HALT"
    body = json.loads(path.read_text())
    assert body["by"] == "watchdog" and body["reason"] == "rank 1 stuck" and body["ts"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".HALT"]  # no temp file left behind
    write_halt(tmp_path, "again")
    assert json.loads(path.read_text())["reason"] == "again"


# -------------------------------------------------------------------------------------------------------- run


def test_run_detects_stall_and_halts(tmp_path):
    clock = FakeClock()
    append_record(tmp_path, 0, T0, 0, "boot")
    append_record(tmp_path, 1, T0, 0, "boot")
    events = []

    def sleep(s):
        clock.sleep(s)
        append_record(tmp_path, 0, clock.t, int(clock.t - T0), "step")  # rank 0 alive, rank 1 silent

    cfg = WatchdogConfig(tmp_path, stall_after_s=120, interval_s=30, dump_stacks=True)
    v = run(cfg, sleep=sleep, now=clock, on_event=lambda k, i: events.append((k, i)))
    assert v.state == "stalled" and v.stalled_ranks == [1]
    assert clock.t == T0 + 150  # the first check past 120 s
    body = json.loads((tmp_path / HALT_NAME).read_text())
    assert "rank 1" in body["reason"] and "step 0" in body["reason"] and "rank 0" not in body["reason"]
    kinds = [k for k, _ in events]
    assert kinds == ["check"] * 6 + ["stalled"]
    assert events[-1][1]["halt_path"] == tmp_path / HALT_NAME
    assert events[-1][1]["signalled_pids"] == []  # other host: never signalled


def test_run_sees_a_stall_after_a_record_stamped_in_the_future(tmp_path):
    """A writer whose clock is an hour ahead stops: the loop counts the silence on its own clock from when it first
    saw that record, instead of waiting an hour for the record's ts to be in the past."""
    clock = FakeClock()
    append_record(tmp_path, 0, T0 + 3_600, 4, "step")
    append_record(tmp_path, 1, T0 - 1, 4, "step")

    def sleep(s):
        clock.sleep(s)
        if clock.t < T0 + 8:
            append_record(tmp_path, 1, clock.t, 5, "step")  # rank 1 stays alive
        assert clock.t < T0 + 100, "no stall seen"

    verdict = run(WatchdogConfig(tmp_path, stall_after_s=10, interval_s=1, halt=False, dump_stacks=False),
                  sleep=sleep, now=clock)
    assert verdict.state == "stalled" and verdict.stalled_ranks == [0], verdict.reason
    assert 10 < verdict.ages[0] <= 12
    assert clock.t - T0 <= 12
    # one look without that memory judges by the record's own ts: not stalled (yet)
    assert check(tmp_path, 10, now=clock.t).state == "running"


def test_run_without_halt_reports_only(tmp_path):
    clock = FakeClock(T0 + 1000)
    append_record(tmp_path, 0, T0, 5, "step")
    v = run(WatchdogConfig(tmp_path, halt=False, dump_stacks=False), sleep=clock.sleep, now=clock)
    assert v.state == "stalled" and not (tmp_path / HALT_NAME).exists()


def test_run_healthy_run_finishes_without_halt(tmp_path):
    clock = FakeClock()
    writers = [HeartbeatWriter(tmp_path, r, clock=clock) for r in range(2)]
    for w in writers:
        w.write(0, "boot")
    checks = []

    def sleep(s):
        clock.sleep(s)
        step = len(checks)
        for w in writers:
            w.write(step, "done" if step == 20 else "step", loss=1.0)

    cfg = WatchdogConfig(tmp_path, stall_after_s=60, interval_s=30, expected_ranks=2)
    try:
        v = run(cfg, sleep=sleep, now=clock, on_event=lambda k, i: checks.append(i) if k == "check" else None)
    finally:
        for w in writers:
            w.close()
    assert v.state == "finished" and len(checks) == 21
    assert [c.state for c in checks] == ["running"] * 20 + ["finished"]
    assert not (tmp_path / HALT_NAME).exists()


def test_run_gives_up_waiting(tmp_path):
    clock = FakeClock()
    events = []
    v = run(WatchdogConfig(tmp_path, interval_s=30, max_wait_start_s=100), sleep=clock.sleep, now=clock,
            on_event=lambda k, i: events.append(k))
    assert v.state == "waiting" and "no heartbeat" in v.reason
    assert clock.t == T0 + 120 and events == ["check"] * 5 + ["gave_up"]
    assert not (tmp_path / HALT_NAME).exists()


# ----------------------------------------------------------------------------------------- signal_stack_dumps

CHILD = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    from nsa.training.heartbeat import HeartbeatWriter
    out = Path(sys.argv[1])
    def on_usr1(signum, frame):
        (out / "got_usr1").write_text("1")
    signal.signal(signal.SIGUSR1, on_usr1)
    with HeartbeatWriter(out, 0) as w:
        w.write(7, "step")
    print("ready", flush=True)
    deadline = time.time() + 30
    while not (out / "got_usr1").exists() and time.time() < deadline:
        time.sleep(0.02)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_signal_stack_dumps_reaches_a_real_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        latest = latest_heartbeats(tmp_path)
        assert latest[0]["pid"] == child.pid and latest[0]["host"] == socket.gethostname()
        # alongside: a dead pid on this host, a live pid on another host, and this test process itself
        latest[1] = dict(latest[0], rank=1, pid=DEAD_PID)
        latest[2] = dict(latest[0], rank=2, host="not-" + socket.gethostname())
        latest[3] = dict(latest[0], rank=3, pid=os.getpid())
        assert signal_stack_dumps(latest) == [child.pid]
        assert child.wait(timeout=20) == 0
        assert (tmp_path / "got_usr1").read_text() == "1"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_signal_stack_dumps_skips_gone_and_reused_pids(tmp_path):
    host = socket.gethostname()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert signal_stack_dumps({0: {"ts": time.time(), "pid": gone.pid, "host": host}}) == []
    assert signal_stack_dumps({0: {"ts": time.time(), "pid": DEAD_PID, "host": host}}) == []
    assert signal_stack_dumps({0: {"ts": time.time(), "pid": 0, "host": host},
                               1: {"ts": time.time(), "pid": -1, "host": host}}) == []
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # a live process, but the record says another host (or none): not signalled
        assert signal_stack_dumps({0: {"ts": time.time(), "pid": sleeper.pid, "host": "not-" + host},
                                   1: {"ts": time.time(), "pid": sleeper.pid}}) == []
        if sys.platform.startswith("linux"):
            # a live process that started after the record was written is a reused pid: not signalled
            assert signal_stack_dumps({0: {"ts": time.time() - 3600, "pid": sleeper.pid, "host": host}}) == []
        time.sleep(0.1)
        assert sleeper.poll() is None  # SIGUSR1's default action would have killed it
    finally:
        sleeper.kill()
        sleeper.wait()


# ------------------------------------------------------------------------------------------------------- main


def test_main_once_exit_codes(tmp_path, capsys):
    now = time.time()
    assert main(["--dir", str(tmp_path), "--once"]) == 3  # no heartbeat yet
    append_record(tmp_path, 0, now - 5, 10, "step")
    assert main(["--dir", str(tmp_path), "--once", "--stall-after", "60"]) == 0
    assert "running" in capsys.readouterr().out
    assert main(["--dir", str(tmp_path), "--once", "--stall-after", "60", "--ranks", "2"]) == 0
    assert not (tmp_path / HALT_NAME).exists()
    assert main(["--dir", str(tmp_path), "--once", "--stall-after", "1", "--halt", "0"]) == 1
    assert not (tmp_path / HALT_NAME).exists()
    assert main(["--dir", str(tmp_path), "--once", "--stall-after", "1", "--no-dump"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (tmp_path / HALT_NAME).exists()
    assert len(out) == 5 and "running" in out[0] and "waiting for rank(s) 1" in out[0]
    assert "stalled: rank 0" in out[1] and "STALLED: not halting (--halt 0)" in out[2]
    assert "stalled: rank 0" in out[3] and "STALLED: wrote" in out[4]
    append_record(tmp_path, 0, now, 11, "done")
    assert main(["--dir", str(tmp_path), "--once", "--stall-after", "1"]) == 0
    assert "finished" in capsys.readouterr().out


def test_main_usage_errors(tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    assert main(["--dir", str(missing), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err and "no such directory" in err
    (tmp_path / "file").write_text("")
    assert main(["--dir", str(tmp_path / "file")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["--dir", str(tmp_path), "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert main(["--dir", str(tmp_path), "--halt", "2"]) == 2
    assert main(["--dir", str(tmp_path), "--interval", "0"]) == 2
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "--stall-after" in capsys.readouterr().out


RANK_WAITING = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGUSR1, lambda *a: Path(sys.argv[1]).write_text("1"))
print("ready", flush=True)
deadline = time.time() + 30
while not Path(sys.argv[1]).exists() and time.time() < deadline:
    time.sleep(0.02)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_cli_subprocess_halts_a_stale_run(tmp_path):
    """Rank 1 is stale; rank 0 (a live process on this host, its heartbeat fresh: as a rank waiting on rank 1 in a
    collective) is asked for a stack dump too."""
    got = tmp_path / "rank0_got_usr1"
    rank0 = subprocess.Popen([sys.executable, "-c", RANK_WAITING, str(got)], stdout=subprocess.PIPE, text=True)
    try:
        assert rank0.stdout.readline().strip() == "ready"
        append_record(tmp_path, 0, time.time(), 120, "step", pid=rank0.pid, host=socket.gethostname())
        append_record(tmp_path, 1, time.time() - 900, 118, "step")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-m", "nsa.training.watchdog", "--dir", str(tmp_path), "--halt", "1",
                               "--interval", "30", "--stall-after", "300", "--include-earlier"],
                              capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 1, proc.stderr
        body = json.loads((tmp_path / HALT_NAME).read_text())
        assert body["by"] == "watchdog" and "rank 1" in body["reason"] and "step 118" in body["reason"]
        lines = proc.stdout.splitlines()
        assert len(lines) == 2 and "stalled: rank 1" in lines[0] and "STALLED: wrote" in lines[1]
        assert f"stack dumps requested from pid(s) {rank0.pid}" in lines[1], lines[1]
        assert rank0.wait(timeout=20) == 0 and got.read_text() == "1"
    finally:
        if rank0.poll() is None:
            rank0.kill()
            rank0.wait()


def test_watchdog_started_before_a_run_ignores_the_previous_runs_records(tmp_path):
    """A finished earlier run's last heartbeats (or a crashed one's stale ones) are not this run's: the loop waits
    for records newer than its own start instead of exiting 'finished' (or 'stalled') at once."""
    append_record(tmp_path, 0, time.time() - 50, 300, "done")
    append_record(tmp_path, 1, time.time() - 900, 118, "step")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "nsa.training.watchdog", "--dir", str(tmp_path), "--interval", "0.2",
                           "--max-wait-start", "1"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert not (tmp_path / HALT_NAME).exists()


def test_check_since_filters_old_records(tmp_path):
    now = time.time()
    append_record(tmp_path, 0, now - 100, 5, "done")
    assert check(tmp_path, 10, now=now).state == "finished"
    assert check(tmp_path, 10, now=now, since=now - 50).state == "waiting"
    append_record(tmp_path, 0, now - 1, 1, "boot")
    assert check(tmp_path, 10, now=now, since=now - 50).state == "running"


def test_resumed_run_rank_not_booted_yet_is_not_a_stall(tmp_path):
    """A resumed run appends to the earlier run's files, whose first records are that run's. A watchdog started long
    before the resume counts a rank that has not written yet from the resumed run's first record, not from its own
    start (which made it halt the resumed run a second after rank 0's boot)."""
    for r in (0, 1):
        append_record(tmp_path, r, T0, 0, "boot")
        append_record(tmp_path, r, T0 + 100, 5, "stop")
    since = T0 + 1_000  # the watchdog starts
    resumed = since + 5_000
    append_record(tmp_path, 0, resumed, 5, "boot")
    verdict = check(tmp_path, 300, now=resumed + 1, expected_ranks=2, since=since)
    assert verdict.state == "running", verdict.reason
    assert verdict.ages[1] == pytest.approx(1.0)
    append_record(tmp_path, 0, resumed + 290, 6, "step")
    verdict = check(tmp_path, 300, now=resumed + 301, expected_ranks=2, since=since)
    assert verdict.state == "stalled" and verdict.stalled_ranks == [1]
    assert "301s after the run's first one" in verdict.reason
    assert hb.first_heartbeat(heartbeat_path(tmp_path, 0), since=since)["ts"] == resumed
    assert hb.first_heartbeat(heartbeat_path(tmp_path, 1), since=since) is None
    assert hb.first_heartbeat(heartbeat_path(tmp_path, 1))["ts"] == T0


def test_loop_waits_for_the_directory_to_appear(tmp_path):
    out = tmp_path / "not-yet"
    clock = [0.0]

    def sleep(seconds):
        clock[0] += seconds
        if clock[0] >= 2 and not out.exists():
            out.mkdir()
            append_record(out, 0, clock[0], 1, "done")

    verdict = run(WatchdogConfig(out, stall_after_s=10, interval_s=1, max_wait_start_s=100), sleep=sleep,
                  now=lambda: clock[0])
    assert verdict.state == "finished"
