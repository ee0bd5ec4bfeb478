"""A summary figure shown beside an earlier run's (compare's untested rows): a difference past a float's range is no
number in the row (results.json and `compare --json` hold no inf), and its direction still decides the verdict."""

from __future__ import annotations

import json

import pytest

from validation.report.compare import _untested


@pytest.mark.parametrize("x, y, verdict, rel", [
    (1e308, -1e308, "better", -2.0),   # a loss from 1e308 to -1e308: lower, 200% of |x| lower
    (-1e308, 1e308, "worse", 2.0),
    (2.0, 1.0, "better", -0.5),        # ordinary figures as before: the difference over |x|
    (-2.0, -1.0, "worse", 0.5),
])
def test_a_difference_past_a_floats_range_is_no_number_and_keeps_its_direction(x, y, verdict, rel):
    row = _untested("baseline", "final_loss", x, y, 0.05, "not tested")
    json.dumps(row, allow_nan=False)  # every figure a JSON number or null
    assert row["verdict"] == verdict and row["rel_delta"] == pytest.approx(rel)
    assert row["delta"] == (None if abs(y - x) == float("inf") else pytest.approx(y - x))


def test_a_change_from_zero_has_no_relative_difference_and_follows_its_sign():
    row = _untested("baseline", "mem_peak_gb", 0.0, 0.4, 0.05, "not tested")
    assert row["rel_delta"] is None and row["delta"] == pytest.approx(0.4) and row["verdict"] == "worse"
    assert _untested("baseline", "mem_peak_gb", 0.0, 0.0, 0.05, "")["verdict"] == "same"
