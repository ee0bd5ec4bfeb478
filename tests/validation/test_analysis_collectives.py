"""validation.analysis.collectives and nccl_tests against nccl-tests' own definitions, computed here by hand."""

import pytest

from validation.analysis.collectives import bandwidth_row, predict_seconds, time_at
from validation.analysis.nccl_tests import parse

# all_gather_perf -g 4: "size" is the gathered output (count = elements per rank), time in us
ALL_GATHER_4 = """\
# nThread 1 nGpus 4 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid   1 on host device  0 [0x01] NVIDIA H200
#  Rank  1 Group  0 Pid   1 on host device  1 [0x02] NVIDIA H200
#  Rank  2 Group  0 Pid   1 on host device  2 [0x03] NVIDIA H200
#  Rank  3 Group  0 Pid   1 on host device  3 [0x04] NVIDIA H200
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576         65536     float    none      -1    20.00   52.43   39.32      0    19.00   55.19   41.39      0
     4194304        262144     float    none      -1    50.00   83.89   62.91      0    49.00   85.60   64.20      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 51.1
"""


def test_nccl_tests_rows_follow_its_byte_and_bus_conventions():
    out = parse(ALL_GATHER_4, "all_gather")
    assert out["world_size"] == 4
    for row in out["rows"]:
        algbw = row["bytes"] / row["time_s"] / 1e9  # size is the gathered output: algbw = size / time
        assert row["algbw_gbps"] == pytest.approx(algbw)
        assert row["busbw_gbps"] == pytest.approx(algbw * 3 / 4)  # (n - 1) / n
        assert row["busbw_gbps"] == pytest.approx(row["reported_busbw_gbps"], abs=0.01)  # what nccl-tests printed


def test_beyond_the_largest_size_a_table_of_bytes_and_times_alone_predicts():
    """A row's bandwidth columns are optional (BandwidthRow); beyond the largest size the prediction used them and
    raised a TypeError on a table of bytes and times, which is all the extrapolation needs: t_max x S / S_max."""
    bare = [{"bytes": 1 << 10, "time_s": 1e-4}, {"bytes": 1 << 20, "time_s": 2e-3}]
    assert time_at(bare, "all_reduce", 4, 1 << 21) == pytest.approx(4e-3)
    assert predict_seconds({"all_gather": [1 << 22]}, {"all_gather": bare}, 4).total_s == pytest.approx(8e-3)
    full = [bandwidth_row("all_reduce", 4, r["bytes"], r["time_s"]) for r in bare]
    assert time_at(full, "all_reduce", 4, 1 << 21) == pytest.approx(4e-3)  # the same with the columns present
