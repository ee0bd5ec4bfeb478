"""`nsa-validate list` on a runs directory whose results.json is not a regular file (a FIFO, a directory) or is
larger than a listing reads: the row says so ("unreadable: ..."), the file is never opened (a FIFO's open waits for
a writer: the listing held forever), and the other runs are listed as before. Each case runs in a child process
bounded in time, so that the old behaviour (blocking) fails the test instead of holding it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 64 << 20  # the largest results.json a listing reads (validation.run.LIST_MAX_BYTES)
GOOD = {"runbook": {"name": "cpu_smoke"}, "verdict": "GO", "started": "2026-12-01T07:00:00Z"}

LISTING = """
import json, sys
from validation.run import list_runs
rows = list_runs(sys.argv[1])
print(json.dumps([[path.name, str(name), str(verdict), str(started)] for path, name, verdict, started in rows]))
"""


def _list(runs_dir: Path) -> list[list[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", LISTING, str(runs_dir)], capture_output=True, text=True, env=env,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _run(runs_dir: Path, name: str) -> Path:
    (runs_dir / name).mkdir(parents=True)
    return runs_dir / name / "results.json"


def test_a_results_json_that_is_not_a_regular_file_is_listed_as_such_without_being_read(tmp_path):
    _run(tmp_path, "a_good").write_text(json.dumps(GOOD))
    os.mkfifo(_run(tmp_path, "b_fifo"))  # was: open() waited for a writer, the listing never ended
    _run(tmp_path, "c_dir").mkdir()
    os.symlink(tmp_path / "b_fifo" / "results.json", _run(tmp_path, "d_link_to_fifo"))
    rows = _list(tmp_path)
    assert rows == [
        ["a_good", "cpu_smoke", "GO", "2026-12-01T07:00:00Z"],
        ["b_fifo", "?", "unreadable: a FIFO, not a regular file", ""],
        ["c_dir", "?", "unreadable: a directory, not a regular file", ""],
        ["d_link_to_fifo", "?", "unreadable: a FIFO, not a regular file", ""],
    ]


def test_a_results_json_larger_than_a_listing_reads_is_listed_without_being_read(tmp_path):
    huge = _run(tmp_path, "huge")
    with open(huge, "wb") as f:  # sparse: no disk used; one byte past the limit
        f.truncate(LIMIT + 1)
    _run(tmp_path, "small").write_text(json.dumps(GOOD))
    rows = _list(tmp_path)
    assert rows == [
        ["huge", "?", "unreadable: 64 MiB, larger than a listing reads (64 MiB)", ""],
        ["small", "cpu_smoke", "GO", "2026-12-01T07:00:00Z"],
    ]


READERS = """
import sys
from pathlib import Path
from validation.results import reuse
from validation.results.store import ResultsError, load_json, read_results
run = Path(sys.argv[1])
for read in (lambda: load_json(run / "results.json"), lambda: read_results(run)):
    try:
        read()
    except ResultsError as exc:
        print(exc)
print(len(reuse._candidates(None, run.parent.parent)))  # every results.json under reports/, the FIFO among them
"""


def test_every_reader_of_a_results_json_refuses_one_that_is_not_a_regular_file_without_opening_it(tmp_path):
    # `run --reuse`'s search (every results.json under reports/), report/compare's read_results and load_json
    # itself: a FIFO named results.json is refused by its stat, where opening it waited for a writer
    os.mkfifo(_run(tmp_path / "reports", "x"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", READERS, str(tmp_path / "reports" / "x")], capture_output=True,
                          text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    fifo = tmp_path / "reports" / "x" / "results.json"
    assert proc.stdout.splitlines() == [f"{fifo}: unreadable (a FIFO, not a regular file)"] * 2 + ["1"]
