"""validation.analysis.collectives: the nccl-tests bandwidth conventions and the time prediction, against hand values."""

import math

import pytest

from validation.analysis.collectives import bandwidth_row, bus_factor, predict_seconds, time_at


@pytest.mark.parametrize("kind, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75),
    ("broadcast", 8, 1.0), ("all_reduce", 1, 0.0), ("broadcast", 1, 0.0), ("all_gather", 1, 0.0),
])
def test_bus_factors_are_the_nccl_tests_ones(kind, n, factor):
    assert bus_factor(kind, n) == pytest.approx(factor)


def test_a_row_gives_algbw_and_busbw_in_gb_per_s():
    row = bandwidth_row("all_reduce", 8, 1_000_000_000, 0.1)  # 1 GB in 100 ms
    assert row["algbw_gbps"] == pytest.approx(10.0) and row["busbw_gbps"] == pytest.approx(17.5)


@pytest.mark.parametrize("bad", [dict(kind="all_to_one", world_size=2), dict(kind="all_reduce", world_size=0)])
def test_bad_arguments_name_what_is_wrong(bad):
    with pytest.raises(ValueError, match="collective|world_size"):
        bus_factor(**bad)
    with pytest.raises(ValueError, match="bytes > 0"):
        bandwidth_row("all_reduce", 2, 0, 1.0)


TABLE = [bandwidth_row("all_reduce", 2, s, t) for s, t in ((1024, 1e-4), (1 << 20, 1e-3), (1 << 24, 1.6e-2))]


def test_time_is_the_measured_one_at_a_measured_size_and_log_interpolated_between():
    assert time_at(TABLE, "all_reduce", 2, 1 << 20) == pytest.approx(1e-3)
    mid = time_at(TABLE, "all_reduce", 2, 1 << 22)  # halfway in log size between 1 MiB and 16 MiB
    assert mid == pytest.approx(math.sqrt(1e-3 * 1.6e-2))
    assert time_at(TABLE, "all_reduce", 2, 10) == pytest.approx(1e-4)  # never faster than the latency


def test_beyond_the_largest_size_time_grows_at_the_largest_sizes_bus_bandwidth():
    big = 1 << 25
    busbw = TABLE[-1]["busbw_gbps"] * 1e9
    expected = 1.6e-2 + (big - (1 << 24)) * bus_factor("all_reduce", 2) / busbw
    assert time_at(TABLE, "all_reduce", 2, big) == pytest.approx(expected)
    assert time_at(TABLE, "all_reduce", 2, big) == pytest.approx(3.2e-2)  # twice the bytes at the same bandwidth


def test_predicted_seconds_sum_every_call_and_name_kinds_without_a_table():
    out = predict_seconds({"all_reduce": [1 << 20, 1 << 20, 1024], "all_gather": [4096]}, {"all_reduce": TABLE}, 2)
    assert out.by_kind["all_reduce"] == pytest.approx(2e-3 + 1e-4)
    assert out.total_s == pytest.approx(2.1e-3) and out.missing == ["all_gather"]
