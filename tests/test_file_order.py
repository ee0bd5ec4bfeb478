"""tests/file_order.py: the seconds per test file read from a `pytest --durations=0` log, and the order the files
go out in (listed ones longest first, the others after them as collected)."""

from __future__ import annotations

import json

import file_order

LOG = """\
============================== slowest durations ===============================
170.65s setup    tests/validation/test_e2e.py::test_cpu_smoke_ends_go_with_every_artifact
10.00s call     tests/validation/test_e2e.py::test_list_shows_runbooks
0.50s teardown tests/validation/test_e2e.py::test_list_shows_runbooks
180.58s call     tests/nsa/attention/kernels/test_aot_compile.py::test_every_kernel_compiles[sm80-x::y]
0.01s call     tests/test_kind_names.py::test_x
========================= 1 failed, 2 passed in 12.00s =========================
"""


def test_seconds_per_file_are_summed_over_setup_call_and_teardown():
    got = file_order.from_log(LOG)
    assert got == {"tests/validation/test_e2e.py": 181.2, "tests/nsa/attention/kernels/test_aot_compile.py": 180.6,
                   "tests/test_kind_names.py": 0.0}
    assert list(got) == sorted(got, key=lambda k: -got[k])


def test_listed_files_go_first_longest_first_then_the_rest_as_collected():
    paths = ["a.py", "new1.py", "b.py", "c.py", "new2.py"]
    assert file_order.ordered(paths, {"a.py": 1.0, "b.py": 30.0, "c.py": 5.0}) == \
        ["b.py", "c.py", "a.py", "new1.py", "new2.py"]
    assert file_order.ordered(paths, {}) == paths


def test_the_committed_durations_are_read_and_a_bad_file_orders_nothing(tmp_path):
    seconds = file_order.file_seconds()
    assert len(seconds) > 50 and all(v >= 0 for v in seconds.values())
    root = file_order.DURATIONS.parents[1]
    assert sum((root / p).is_file() for p in seconds) > 50  # a renamed file only goes after the listed ones
    bad = tmp_path / "d.json"
    bad.write_text("{not json")
    assert file_order.file_seconds(bad) == {} and file_order.file_seconds(tmp_path / "none.json") == {}
    bad.write_text(json.dumps({"seconds": {"x.py": "slow", "y.py": 2}}))
    assert file_order.file_seconds(bad) == {"y.py": 2.0}


def test_a_log_without_durations_is_refused(tmp_path, capsys):
    log = tmp_path / "ci.log"
    log.write_text("no durations here\n")
    assert file_order.main([str(log)]) == 1 and "no `--durations=0` lines" in capsys.readouterr().err
    assert file_order.main([]) == 2
