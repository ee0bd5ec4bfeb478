"""nccl-tests output as nccl-tests writes it (src/util.cu of NVIDIA/nccl-tests: a `#wrong` count per row in each of
the out-of-place and in-place columns, then `# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth`; no
footer when the run ends on an error), and the message-size range of the comm step when one bound is given."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from validation import kinds
from validation.analysis import nccl_tests
from validation.analysis.collectives import bus_factor
from validation.kinds.comm import Options
from validation.runbook.loader import load_runbook
from validation.runbook.plan import step_launches

HEAD = """\
# nccl-tests version 2.17.1 nccl-headers=22603 nccl-library=22603
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 2 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41172 on  gpu-node-01 device  0 [0000:18:00] NVIDIA H200
#  Rank  1 Group  0 Pid  41172 on  gpu-node-01 device  1 [0000:2a:00] NVIDIA H200
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
"""
ROW_1M = "     1048576        262144     float     sum      -1    100.0   10.49   10.49  {w1}    99.00   10.59   10.59  {w2}\n"
ROW_2M = "     2097152        524288     float     sum      -1    150.0   13.98   13.98  {w1}   149.00   14.07   14.07  {w2}\n"
ROW_4M = "     4194304       1048576     float     sum      -1    250.0   16.78   16.78  {w1}   249.00   16.84   16.84  {w2}\n"
FOOT = """\
# Out of bounds values : {bounds} {verdict}
# Avg bus bandwidth    : 13.75
#
# Collective test concluded: all_reduce_perf
"""


def _output(wrong=("0", "0", "0", "0", "0", "0"), bounds=0, footer=True) -> str:
    w = iter(wrong)
    rows = "".join(r.format(w1=next(w), w2=next(w)) for r in (ROW_1M, ROW_2M, ROW_4M))
    return HEAD + rows + (FOOT.format(bounds=bounds, verdict="FAILED" if bounds else "OK") if footer else "")


def test_a_clean_run_is_read_with_its_out_of_place_times():
    parsed = nccl_tests.parse(_output(), "all_reduce")
    assert parsed["world_size"] == 2 and [r["bytes"] for r in parsed["rows"]] == [1 << 20, 2 << 20, 4 << 20]
    # 4 MiB in 250 us out-of-place: 16.777216 GB/s, x 2(2-1)/2 = 1
    assert parsed["rows"][-1]["busbw_gbps"] == pytest.approx(16.777216)


@pytest.mark.parametrize("wrong, bounds, where", [
    (("0", "0", "12", "0", "0", "0"), 1, "2097152"),  # out-of-place column of the 2 MiB row
    (("0", "0", "0", "0", "0", "4"), 1, "4194304"),  # in-place column of the 4 MiB row
    (("0", "0", "0", "1.04858e+06", "0", "0"), 0, "2097152"),  # nccl-tests writes the count with %g
    (("0", "0", "0", "0", "0", "0"), 3, "3 out-of-bounds"),  # only the footer's count says it
])
def test_wrong_results_are_an_error_never_a_table(wrong, bounds, where):
    with pytest.raises(nccl_tests.WrongResults, match="wrong results") as info:
        nccl_tests.parse(_output(wrong, bounds), "all_reduce")
    assert where in str(info.value)


def test_not_checked_results_read_as_they_are():
    """-c 0: nccl-tests writes N/A for #wrong; nothing says the results were wrong."""
    parsed = nccl_tests.parse(_output(("N/A",) * 6), "all_reduce")
    assert len(parsed["rows"]) == 3


def test_an_output_without_its_footer_did_not_finish():
    truncated = _output(footer=False)
    with pytest.raises(nccl_tests.NcclTestsError, match="did not finish"):
        nccl_tests.parse(truncated, "all_reduce")
    cut = truncated[:truncated.index("   249.00   16.84")]  # mid-row: the 4 MiB row's in-place half is gone
    with pytest.raises(nccl_tests.NcclTestsError, match="did not finish"):
        nccl_tests.parse(cut, "all_reduce")
    # what nccl-tests prints when a collective fails (NCCLCHECK, TESTCHECK), with no footer after it
    failed = (HEAD + ROW_1M.format(w1="0", w2="0")
              + "10-0-0-1: Test NCCL failure common.cu:954 'unhandled system error / '\n"
              + " .. 10-0-0-1 pid 41172: Test failure common.cu:1103\n")
    with pytest.raises(nccl_tests.NcclTestsError, match="did not finish"):
        nccl_tests.parse(failed, "all_reduce")


def test_an_older_version_rank_lines_count_and_its_error_column_is_judged_by_the_footer():
    """nccl-tests before 2.13: `#   Rank  0 Pid ...` (no Group) and an `error` column holding the largest deviation
    (within a tolerance; the out-of-bounds count is the verdict)."""
    text = """\
# nThread 1 nGpus 2 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  12345 on  host1 device  0 [0x18] Tesla V100-SXM2-16GB
#   Rank  1 Pid  12345 on  host1 device  1 [0x2a] Tesla V100-SXM2-16GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256   float     sum    20.00    0.05    0.05  1e-07    20.00    0.05    0.05  1e-07
        2048           512   float     sum    25.00    0.08    0.08  0e+00    24.00    0.09    0.09  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.065
"""
    parsed = nccl_tests.parse(text, "all_reduce")
    assert parsed["world_size"] == 2
    assert parsed["rows"][1]["busbw_gbps"] == pytest.approx(2048 / 25e-6 / 1e9 * bus_factor("all_reduce", 2))
    with pytest.raises(nccl_tests.WrongResults):
        nccl_tests.parse(text.replace(": 0 OK", ": 1 FAILED"), "all_reduce")


def _step_result(tmp_path: Path, text: str, status: str, reason: str | None):
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(text)
    lr = SimpleNamespace(status=status, reason=reason, log_path=log)
    spec = SimpleNamespace(argv=["all_reduce_perf"], dir="c/all_reduce")  # no telemetry there: no interference
    ctx = SimpleNamespace(run_dir=tmp_path, launches=[spec],
                          step=SimpleNamespace(launch=SimpleNamespace(nproc_per_node=2)),
                          launch=lambda spec, i, n: lr)
    return kinds.get("comm").run(Options(kinds=["all_reduce"]), ctx)


def test_the_comm_step_fails_on_wrong_results_and_says_so(tmp_path):
    bad = _output(("0", "0", "12", "0", "0", "0"), 1)
    result = _step_result(tmp_path, bad, "ok", None)
    assert result.status == "failed" and "wrong results" in result.reason
    assert result.metrics.collectives() == {}  # no table of wrong results to predict from
    # nccl-tests also exits non-zero then: the reason is still the wrong results, not only the exit status
    result = _step_result(tmp_path, bad, "failed", "exited 11")
    assert result.status == "failed" and "wrong results" in result.reason
    assert _step_result(tmp_path, _output(), "ok", None).status == "passed"


RUNBOOK = """\
name: comm_range
requirements: {{gpus: 0}}
defaults: {{nproc_per_node: 2, timeout_s: 60}}
phases:
  - name: comm
    steps:
      - {{name: c, kind: comm, source: nccl-tests, kinds: [all_reduce], {extra}}}
acceptance:
  - {{name: ran, expr: "True", target: "ran"}}
"""


@pytest.mark.parametrize("extra, b, e", [
    ("min_bytes: 2147483648", 2147483648, 2147483648),  # above the 1 GiB default maximum
    ("max_bytes: 4096", 4096, 4096),  # below the 8 KiB default minimum
    ("min_bytes: 1024", 1024, 1 << 30),
])
def test_one_bound_given_never_makes_an_empty_size_range(tmp_path, extra, b, e):
    path = tmp_path / "comm.yaml"
    path.write_text(RUNBOOK.format(extra=extra))
    (spec,) = step_launches(load_runbook(path).step("c"))
    argv = spec.argv
    assert (int(argv[argv.index("-b") + 1]), int(argv[argv.index("-e") + 1])) == (b, e)


@pytest.mark.parametrize("lo, hi, backend, expected", [
    (8 << 20, None, "gloo", (8 << 20, 8 << 20)),  # min above gloo's 4 MiB default maximum
    (None, 1024, "gloo", (1024, 1024)),  # max below gloo's 4 KiB default minimum
    (None, None, "gloo", (4096, 4 << 20)),
    (None, None, "nccl", (8192, 1 << 30)),
    (65536, None, "nccl", (65536, 1 << 30)),
])
def test_the_benchmarks_size_range(lo, hi, backend, expected):
    comm_bench = pytest.importorskip("validation.analysis.comm_bench")
    got = comm_bench.size_range(lo, hi, backend)
    assert got == expected and comm_bench.sizes_between(*got)
