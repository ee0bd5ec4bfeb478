"""Acceptance expressions: a figure that is not a finite number (NaN, an overflow to infinity) or is absent (None)
never makes a criterion pass, whichever way the expression is written; list data compares with list literals."""

from __future__ import annotations

import pytest

from validation.runbook.expressions import ExpressionError, compile_expression

NAN, INF = float("nan"), float("inf")
NS = {"x": {"n": NAN, "i": INF, "a": 3, "big": 1e308, "none": None, "vals": [1.0, NAN], "rev": [NAN, 1.0],
            "reasons": [], "sizes": [1024, 2048], "pairs": [[1, 2], [3, 4]]}}


def ev(text: str):
    return compile_expression(text).evaluate(NS)


@pytest.mark.parametrize("text", [
    "not (x.n < 5)", "x.n != 5", "x.n", "x.n and True", "not between(x.n, 0, 1)", "max(5, x.n) > 4",
    "not (x.n == x.n)", "x.n is not None", "x.i > 1", "not (x.i < 1)",
])
def test_a_nan_or_infinite_figure_is_an_error_never_a_pass(text):
    r = ev(text)
    assert r.status == "error", (text, r)
    assert "not a finite number" in r.detail


@pytest.mark.parametrize("text", ["max(x.vals) > 0", "max(x.rev) > 0", "min(x.rev) < 2"])
def test_min_max_of_a_list_holding_nan_is_an_error_not_an_order_dependent_answer(text):
    # Python: max([1.0, nan]) is 1.0, max([nan, 1.0]) is nan: the answer depended on the order of the data
    r = ev(text)
    assert r.status == "error" and "not a finite number" in r.detail, (text, r)


@pytest.mark.parametrize("text", ["x.big * 10 > 0", "not (x.big * 10 - x.big * 10 >= 1)", "x.big + x.big > 1"])
def test_arithmetic_that_overflows_to_infinity_is_an_error(text):
    r = ev(text)
    assert r.status == "error" and "not finite" in r.detail, (text, r)


def test_a_non_finite_constant_is_refused_when_compiled():
    with pytest.raises(ExpressionError, match="non-finite constant"):
        compile_expression("x.a < 1e999")


def test_not_of_an_absent_figure_is_an_error_not_a_pass():
    # `not longrun.throttled` with throttled null (no GPU, no pynvml) claimed "not throttled" without evidence
    r = ev("not x.none")
    assert r.status == "error" and r.detail == "None under 'not': not x.none (x.none = None)"
    assert ev("not (x.none and x.a > 1)").status == "error"
    assert ev("x.none is None or not x.none").status == "pass"  # a guard still works


@pytest.mark.parametrize("text, status", [
    ("x.reasons == []", "pass"), ("x.reasons != []", "fail"), ("x.sizes == [1024, 2048]", "pass"),
    ("x.sizes == (1024, 2048)", "pass"), ("x.sizes != [1024, 2048]", "fail"), ("[3, 4] in x.pairs", "pass"),
    ("x.pairs == [[1, 2], [3, 4]]", "pass"), ("x.sizes < [1024, 4096]", "pass"),
])
def test_list_data_compares_with_list_and_tuple_literals_by_their_elements(text, status):
    # a list from results.json was compared with the tuple a literal evaluates to: [] == () is False in Python
    r = ev(text)
    assert (r.status, r.detail) == (status, None), (text, r)
