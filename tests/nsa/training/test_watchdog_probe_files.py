"""Heartbeat files that change under a watchdog: appended, moved aside and created again (a retried or fresh run
archives the earlier run's files), truncated, rewritten, or marked while a line was half written."""

from __future__ import annotations

import os

from nsa.training import heartbeat as hb
from nsa.training.heartbeat import encode_record, heartbeat_path, mark_files
from nsa.training.watchdog import Watch, check

T0 = 1_700_000_000.0
DEAD_PID = 2 ** 22 + 12345


def line(ts, step, msg, rank=0):
    return encode_record(ts, rank, DEAD_PID, "other-node", step, msg)


def append(out_dir, rank, ts, step, msg):
    with open(heartbeat_path(out_dir, rank), "ab") as f:
        f.write(line(ts, step, msg, rank))


def steps(out_dir, marks, rank=0):
    """(step of the latest, step of the first) record written since `marks` were taken, None where none."""
    return (hb.latest_heartbeats(out_dir, after=marks).get(rank, {}).get("step"),
            (hb.first_heartbeat(heartbeat_path(out_dir, rank), after=marks.get(rank)) or {}).get("step"))


def test_marks_tell_new_records_by_place_not_by_ts(tmp_path):
    path = heartbeat_path(tmp_path, 0)
    append(tmp_path, 0, T0, 1, "step")
    append(tmp_path, 0, T0 + 10, 2, "step")
    marks = mark_files(tmp_path)
    assert steps(tmp_path, marks) == (None, None)              # nothing since the mark
    append(tmp_path, 0, T0 - 5_000, 3, "step")         # stamped long before the mark: new all the same
    append(tmp_path, 0, T0 + 9_000, 4, "step")
    assert steps(tmp_path, marks) == (4, 3)

    # moved aside and created again: the whole new file is new, its first record the first
    path.rename(tmp_path / "aside.jsonl")
    append(tmp_path, 0, T0, 1, "boot")
    append(tmp_path, 0, T0 + 1, 2, "step")
    assert steps(tmp_path, marks) == (2, 1)

    # the same inode truncated and written again, shorter or longer than at the mark: all of it is new
    marks = mark_files(tmp_path)
    with open(path, "wb") as f:
        f.write(line(T0, 7, "boot"))
    assert steps(tmp_path, marks) == (7, 7)
    with open(path, "wb") as f:
        f.write(line(T0 + 5, 8, "boot") * 3 + line(T0 + 6, 9, "step"))
    assert os.path.getsize(path) > marks[0].end
    assert steps(tmp_path, marks) == (9, 8)

    # a file that did not exist at the mark
    append(tmp_path, 1, T0, 5, "boot")
    assert hb.latest_heartbeats(tmp_path, after=marks)[1]["step"] == 5


def test_a_line_half_written_at_the_mark_counts_once_complete(tmp_path):
    path = heartbeat_path(tmp_path, 0)
    append(tmp_path, 0, T0, 1, "step")
    whole = line(T0 + 1, 2, "step")
    with open(path, "ab") as f:
        f.write(whole[:10])
    marks = mark_files(tmp_path)
    assert marks[0].end == len(line(T0, 1, "step"))
    assert hb.latest_heartbeats(tmp_path, after=marks) == {}
    with open(path, "ab") as f:
        f.write(whole[10:])
    assert hb.latest_heartbeats(tmp_path, after=marks)[0]["step"] == 2
    assert hb.first_heartbeat(path, after=marks[0])["step"] == 2


def test_a_watch_sees_only_records_appended_after_it_began_and_ages_them_on_its_own_clock(tmp_path):
    append(tmp_path, 0, T0 - 100, 5, "done")           # the run before
    watch = Watch(tmp_path, started=T0)
    assert check(tmp_path, 30, now=T0 + 1, watch=watch).state == "waiting"
    append(tmp_path, 0, T0 + 1.5 - 3_600, 5, "boot")   # a resume on a node an hour behind
    v = check(tmp_path, 30, now=T0 + 2, watch=watch)
    assert v.state == "running" and v.ages == {0: 0.0}  # written after the check at T0+1, by T0+2
    v = check(tmp_path, 30, now=T0 + 32, watch=watch)
    assert v.state == "running" and v.ages == {0: 30.0}
    v = check(tmp_path, 30, now=T0 + 33, watch=watch)
    assert v.state == "stalled" and v.ages == {0: 31.0}
    # with agreeing clocks, a record's own ts is its write time
    watch = Watch(tmp_path, started=T0)
    append(tmp_path, 0, T0 + 0.25, 6, "step")
    assert check(tmp_path, 30, now=T0 + 1, watch=watch).ages == {0: 0.75}


def test_lines_read_backwards_carry_their_offsets(tmp_path, monkeypatch):
    """Every line read backwards, in small blocks that cut lines anywhere, is where it says it is; compared with a
    forward split of the same bytes."""
    monkeypatch.setattr(hb, "_TAIL_BLOCK", 7)
    data = b"".join(b"x" * (i * 5 % 23) + b"%d\n" % i for i in range(60)) + b"\n\npartial"
    path = tmp_path / "f"
    path.write_bytes(data)
    expected, pos = [], 0
    for part in data.split(b"\n")[:-1]:  # the last piece has no newline: never yielded
        expected.append((pos, part))
        pos += len(part) + 1
    with open(path, "rb") as f:
        got = list(hb._lines_backwards(f, len(data)))
    assert got == expected[::-1]
    assert all(data[offset:offset + len(text)] == text for offset, text in got)


def test_a_resume_on_a_node_an_hour_behind_with_a_rank_not_booted_yet(tmp_path):
    """The earlier run's records of both ranks are in the files; the resume appends rank 0's boot (its clock an
    hour behind) while rank 1 is not up yet: running, rank 1 counted from rank 0's boot as this watch saw it, and
    stalled 30 s (the threshold) later on this clock."""
    for r in (0, 1):
        append(tmp_path, r, T0 - 7_200, 0, "boot")
        append(tmp_path, r, T0 - 7_000, 5, "stop")
    watch = Watch(tmp_path, started=T0)
    assert check(tmp_path, 30, now=T0 + 1, expected_ranks=2, watch=watch).state == "waiting"
    append(tmp_path, 0, T0 + 1.5 - 3_600, 5, "boot")
    v = check(tmp_path, 30, now=T0 + 2, expected_ranks=2, watch=watch)
    assert v.state == "running" and v.ages == {0: 0.0, 1: 0.0}, v.reason
    append(tmp_path, 0, T0 + 20 - 3_600, 6, "step")
    v = check(tmp_path, 30, now=T0 + 32, expected_ranks=2, watch=watch)
    assert v.state == "running" and v.ages == {0: 0.0, 1: 30.0}, v.reason
    v = check(tmp_path, 30, now=T0 + 33, expected_ranks=2, watch=watch)
    assert v.state == "stalled" and v.stalled_ranks == [1] and v.ages == {0: 1.0, 1: 31.0}, v.reason
