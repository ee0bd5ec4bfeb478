"""The scaling analysis against the definitions: strong efficiency = T(n0) n0 / (T(n) n), weak = T(n0) / T(n), from
step times computed here; and an efficiency outside (0, 1.1] is never read as a result, whichever step made it."""

import pytest

from validation.analysis.parallelism import scaling_table
from validation.analysis.plausibility import implausible_reads, range_of


def test_strong_and_weak_efficiency_from_step_times():
    seq, global_batch, per_rank = 256, 8, 4
    step_time = {1: 1.0, 2: 0.6, 4: 0.4}  # seconds per optimizer step
    strong = scaling_table({n: global_batch * seq / t for n, t in step_time.items()}, "strong")
    weak = scaling_table({n: n * per_rank * seq / t for n, t in step_time.items()}, "weak")
    for row in strong["rows"]:
        n = row["world_size"]
        assert row["efficiency"] == pytest.approx(step_time[1] * 1 / (step_time[n] * n))
    for row in weak["rows"]:
        assert row["efficiency"] == pytest.approx(step_time[1] / step_time[row["world_size"]])
    assert strong["efficiency"]["min"] == pytest.approx(1.0 / (0.4 * 4))
    assert weak["efficiency"]["last"] == pytest.approx(2.5)  # impossible: flagged below, never a result


def test_a_scaling_steps_impossible_efficiency_is_an_error_for_a_criterion_not_a_pass():
    """`scaling.weak.efficiency.min >= 0.8` read 2.5 (weak scaling with 4 ranks at 2.5x one rank's step rate per
    rank) as a pass: the physical range covered only a train step's `scaling_efficiency`."""
    weak = scaling_table({1: 100.0, 4: 1000.0}, "weak")  # 10x the throughput on 4 ranks: efficiency 2.5
    ns = {"scaling": {"weak": weak, "strong": scaling_table({1: 100.0, 2: 190.0}, "strong")}}
    bad = implausible_reads(ns, [("scaling", ("weak", "efficiency", "min"))])
    assert len(bad) == 1 and "scaling.weak.efficiency.min = 2.5 outside (0, 1.1]" in bad[0]
    assert implausible_reads(ns, [("scaling", ("weak", "rows", 1, "efficiency"))])
    assert implausible_reads(ns, [("scaling", ("weak",))])  # the whole table read
    assert implausible_reads(ns, [("scaling", ("strong", "efficiency", "min"))]) == []  # 0.95: plausible
    assert range_of("strong.efficiency.last") is not None and range_of("strong.rows.0.efficiency") is not None
    assert implausible_reads({"s": {"weak": {"efficiency": {"min": 0.0}}}}, [("s", ("weak", "efficiency", "min"))])
