"""nccl-tests 2.13.0 to 2.13.3 output (validation.analysis.nccl_tests.parse): those versions print the `redop`
column of all_gather and broadcast blank (an empty `%6s`) under a header that names `redop` and `root`, so the
rows of those collectives have one field fewer than the header. The output below is written with the printf formats
of nccl-tests 2.13.3 (src/common.cu: the header, TimeTest's row preamble, BenchTime's figures and the footer) and
the figures checked by hand against the nccl-tests definitions (algbw = S / t in 10^9 B/s; busbw: x (n-1)/n for
all-gather, x 1 for broadcast)."""

from __future__ import annotations

import pytest

from validation.analysis import nccl_tests


def _output(op: str, root: int, n: int, rows, wrong=(0, 0), check=True) -> str:
    """A 2.13.3 run's stdout: `rows` (size B, count: the elements of one rank's buffer, out-of-place us, in-place
    us); printed busbw with the factor (n-1)/n (not what the parser's figures come from)."""
    out = [f"# nThread 1 nGpus {n} minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 "
           "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    out += ["#   Rank %2d Pid %6d on %10s device %2d [0x%02x] %s" % (i, 4242, "node1", i, 0x18 + i,
                                                                     "NVIDIA A100-SXM4-80GB") for i in range(n)]
    out += ["#", "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
            % ("", "", "", "", ""),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
            % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
               "busbw", "#wrong"),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
            % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")]
    for size, count, *times in rows:
        line = "%12li  %12li  %8s  %6s  %6s" % (size, count, "float", op, "%6i" % root)
        for t, w in zip(times, wrong):
            alg = size / 1e9 / (t * 1e-6)
            figures = ("%7.2f" % t, alg, alg * (n - 1) / n)
            line += ("  %7s  %6.2f  %6.2f  %5g" % (*figures, w) if check
                     else "  %7s  %6.2f  %6.2f  %5s" % (*figures, "N/A"))
        out.append(line)
    out += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 13.5 ", "#"]
    return "\n".join(out) + "\n"


def test_an_all_gather_row_with_its_reduction_column_blank_reads_its_out_of_place_time():
    text = _output("", -1, 2, [(1048576, 131072, 40.0, 39.0), (2097152, 262144, 70.0, 69.0)])
    parsed = nccl_tests.parse(text, "all_gather")
    assert parsed["world_size"] == 2
    assert [r["bytes"] for r in parsed["rows"]] == [1048576, 2097152]
    assert [r["time_s"] for r in parsed["rows"]] == pytest.approx([40e-6, 70e-6])
    # 1 MiB in 40 us: 1048576 / 40e-6 = 26.2144 GB/s; busbw x 1/2 at two ranks
    assert parsed["rows"][0]["algbw_gbps"] == pytest.approx(26.2144)
    assert parsed["rows"][0]["busbw_gbps"] == pytest.approx(13.1072)
    # 2 MiB in 70 us: 29.9593 GB/s, busbw 14.9797; the busbw nccl-tests printed, two decimals
    assert parsed["rows"][1]["busbw_gbps"] == pytest.approx(2097152 / 70e-6 / 1e9 / 2)
    assert parsed["rows"][1]["reported_busbw_gbps"] == 14.98


def test_a_broadcast_row_with_its_reduction_column_blank_at_eight_ranks():
    text = _output("", 0, 8, [(1048576, 262144, 25.0, 24.0)])
    row, = nccl_tests.parse(text, "broadcast")["rows"]
    assert row["time_s"] == pytest.approx(25e-6)
    assert row["algbw_gbps"] == pytest.approx(41.94304)  # 1048576 B / 25 us
    assert row["busbw_gbps"] == pytest.approx(41.94304)  # broadcast: busbw = algbw


def test_a_wrong_count_in_a_row_with_its_reduction_column_blank_is_still_found():
    text = _output("", -1, 2, [(1048576, 131072, 40.0, 39.0)], wrong=(0, 3))
    with pytest.raises(nccl_tests.WrongResults, match="1048576"):
        nccl_tests.parse(text, "all_gather")


def test_an_unchecked_row_with_its_reduction_column_blank_reads_as_it_is():
    text = _output("", -1, 2, [(1048576, 131072, 40.0, 39.0)], check=False)
    row, = nccl_tests.parse(text, "all_gather")["rows"]
    assert row["time_s"] == pytest.approx(40e-6)


def test_a_reduction_row_of_the_same_version_is_read_as_before():
    text = _output("sum", -1, 2, [(1048576, 131072, 40.0, 39.0)])
    row, = nccl_tests.parse(text, "reduce_scatter")["rows"]
    assert row["time_s"] == pytest.approx(40e-6)
    assert row["busbw_gbps"] == pytest.approx(13.1072)  # (n-1)/n = 1/2
