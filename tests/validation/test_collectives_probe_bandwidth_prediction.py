"""validation.analysis.collectives and the comm benchmark's command line against nccl-tests' definitions (algbw =
bytes / time in GB/s of 1e9 bytes; busbw = algbw x 2(n-1)/n all-reduce, (n-1)/n all-gather and reduce-scatter, 1
broadcast) and the documented prediction, with hand-computed figures."""

from __future__ import annotations

import math

import pytest

from validation.analysis import comm_bench
from validation.analysis.collectives import bandwidth_row, predict_seconds, time_at


# ------------------------------------------------------------------------------------------ bandwidth rows
@pytest.mark.parametrize("kind, n, bus", [("all_reduce", 4, 1.5), ("all_gather", 4, 0.75),
                                          ("reduce_scatter", 2, 0.5), ("broadcast", 4, 1.0)])
def test_a_row_by_hand_in_decimal_gigabytes(kind, n, bus):
    # 256 MiB = 268435456 B in 2 ms: 134.217728 GB/s (GB = 1e9 B; 125 GiB/s would be the binary figure)
    row = bandwidth_row(kind, n, 268435456, 2e-3)
    assert row["bytes"] == 268435456 and row["time_s"] == 2e-3
    assert row["algbw_gbps"] == pytest.approx(134.217728, rel=1e-12)
    assert row["busbw_gbps"] == pytest.approx(134.217728 * bus, rel=1e-12)


def test_a_row_at_one_rank_reports_the_calls_algbw_and_busbw_zero():
    row = bandwidth_row("all_reduce", 1, 1 << 20, 1e-4)
    assert row["algbw_gbps"] == pytest.approx(10.48576) and row["busbw_gbps"] == 0.0


@pytest.mark.parametrize("nbytes", [1000.5, float("inf"), True])
def test_a_row_needs_a_whole_number_of_bytes(nbytes):
    """A row records int(bytes); with 1000.5 B in 1 us its algbw was 1.0005 GB/s while its own bytes and time give
    1000 B / 1 us = 1.0 GB/s (algbw = bytes / time broken), and infinite bytes raised OverflowError."""
    with pytest.raises(ValueError, match="whole number of bytes"):
        bandwidth_row("all_reduce", 2, nbytes, 1e-6)


def test_a_row_of_an_integral_float_size_is_consistent():
    row = bandwidth_row("all_gather", 2, 4096.0, 1e-6)
    assert row["bytes"] == 4096 and row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)


# ------------------------------------------------------------------------------------------ prediction
# all_reduce at 4 ranks: 8 KiB in 20 us (latency), 1 MiB in 100 us, 64 MiB in 4 ms
TABLE = [{"bytes": 8192, "time_s": 20e-6}, {"bytes": 1 << 20, "time_s": 100e-6}, {"bytes": 1 << 26, "time_s": 4e-3}]


def test_prediction_by_hand_inside_below_and_beyond_the_table():
    # 8 MiB: log2 position 3 of 6 between 1 MiB and 64 MiB -> the geometric mean of their times
    assert time_at(TABLE, "all_reduce", 4, 1 << 23) == pytest.approx(math.sqrt(100e-6 * 4e-3), rel=1e-12)
    # 64 KiB: position 3 of 7 between 8 KiB and 1 MiB: 20 us x 5^(3/7)
    assert time_at(TABLE, "all_reduce", 4, 1 << 16) == pytest.approx(20e-6 * 5 ** (3 / 7), rel=1e-12)
    assert time_at(TABLE, "all_reduce", 4, 100) == pytest.approx(20e-6)  # the latency floor
    # 256 MiB: 4 ms + 192 MiB at the 64 MiB row's algbw (67108864 B / 4 ms) = 16 ms
    assert time_at(TABLE, "all_reduce", 4, 1 << 28) == pytest.approx(16e-3, rel=1e-12)
    # rows in any order, bandwidth columns ignored
    shuffled = [TABLE[2], {**TABLE[0], "busbw_gbps": 1e6}, TABLE[1]]
    assert time_at(shuffled, "all_reduce", 4, 1 << 23) == pytest.approx(math.sqrt(100e-6 * 4e-3), rel=1e-12)


def test_a_steps_prediction_sums_its_calls_and_names_kinds_without_a_table():
    sizes = {"all_reduce": [1 << 20] * 3 + [1 << 28], "broadcast": [4096], "all_gather": []}
    out = predict_seconds(sizes, {"all_reduce": TABLE, "broadcast": []}, 4)
    assert out.by_kind == {"all_reduce": pytest.approx(3 * 100e-6 + 16e-3)}
    assert out.total_s == pytest.approx(16.3e-3) and out.missing == ["broadcast"]


@pytest.mark.parametrize("bad", [{"bytes": 4096, "time_s": 0.0}, {"bytes": 4096, "time_s": -1e-6},
                                 {"bytes": 0, "time_s": 1e-6}])
def test_a_table_with_a_zero_or_negative_figure_is_refused(bad):
    with pytest.raises(ValueError, match="bytes > 0 and time_s > 0"):
        predict_seconds({"all_reduce": [4096]}, {"all_reduce": TABLE + [bad]}, 4)


@pytest.mark.parametrize("kind, world", [("all_reduce", 0), ("all_to_one", 4)])
def test_a_bad_kind_or_world_size_is_refused_at_every_size(kind, world):
    """They were checked only beyond the largest measured size: 1 MiB at world size 0 predicted 100 us, 256 MiB
    raised."""
    for nbytes in (100, 1 << 20, 1 << 23, 1 << 28):
        with pytest.raises(ValueError, match="world_size|collective"):
            time_at(TABLE, kind, world, nbytes)


# ------------------------------------------------------------------------------------------ benchmark command line
@pytest.mark.parametrize("argv", [["--min-bytes", "-8"], ["--max-bytes", "0"], ["--min-bytes", "0"],
                                  ["--sizes", "4096,-4"], ["--sizes", "0"], ["--sizes", ""]])
def test_the_benchmark_refuses_a_message_size_below_one_byte(argv, tmp_path, monkeypatch, capsys):
    """--min-bytes -8 doubled towards minus infinity without end (sizes_between never passed the largest size);
    0 or an empty --sizes read as "not given" and measured the default range (8 KiB .. 1 GiB on NCCL)."""
    started = []
    monkeypatch.setattr(comm_bench, "run", lambda args: started.append(args))
    assert comm_bench.main(["--out", str(tmp_path), *argv]) == 2
    assert started == [] and "bytes >= 1" in capsys.readouterr().err


def test_the_benchmark_sizes_by_hand():
    assert comm_bench.sizes_between(4096, 32768) == [4096, 8192, 16384, 32768]
    # all-gather at 3 ranks, about 8 KiB: 682 float32 elements a rank, 682 x 4 x 3 = 8184 B gathered
    count = comm_bench.elements("all_gather", 8192, 3)
    assert count == 682 and comm_bench.message_bytes("all_gather", count, 3) == 8184
    assert comm_bench.message_bytes("all_reduce", comm_bench.elements("all_reduce", 8192, 3), 3) == 8192
