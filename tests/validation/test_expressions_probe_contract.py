"""validation.runbook.expressions against its contract and Python's own semantics: an absent or non-finite item
inside compared data never makes a criterion pass, mapping keys read the same way by `in` as by a subscript,
between() with its bounds the wrong way round, the integer-size bound at its edge, and evaluation never raising
however deep the caller's stack is."""

from __future__ import annotations

import sys

import pytest

from validation.runbook.expressions import (MAX_DEPTH, MAX_EXPONENT, MAX_INT_BITS, MAX_LENGTH, ExpressionError,
                                            compile_expression)

NAN = float("nan")
NS = {
    "x": {"a": 3, "lo": 1, "hi": 5, "vals": [NAN, 2.0], "gaps": [1, None, 3], "sizes": [1, 2, 3],
          "m": {"k": NAN, "j": 1.0}, "t": True, "f": False, "one": 1, "fl": 1.0, "z": -0.0},
    "y": {"m": {"k": 1.0, "j": 1.0}},
    "s": {"runs": {"50": {"mean": 41.5}, "25": {"mean": 40.0}}},
}


def ev(text: str, ns=NS):
    return compile_expression(text).evaluate(ns)


class _Plain:
    """Attribute access on plain data, for Python's own eval of the same text."""

    def __init__(self, d):
        self.__dict__.update({k: _Plain(v) if isinstance(v, dict) and k != "m" else v for k, v in d.items()})


def python_value(text: str):
    return eval(text, {"__builtins__": {"len": len}}, {k: _Plain(v) for k, v in NS.items()})  # plain data, our own text


# --- where the contract says it behaves like Python --------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "-x.a ** 2 == -9", "2 ** 3 ** 2 == 512", "(-2) ** 2 == 4", "not x.a == 3", "x.a or x.hi and x.lo",
    "1 < x.a < 5", "5 < x.a < x.hi", "x.fl == 1", "x.z == 0", "x.a // 2 * 2 + x.a % 2",
    "x.sizes == [1, 2, 3]", "3 in x.sizes", "'k' in x.m", "x.a - x.hi - x.lo", "x.hi / x.lo / 2",
])
def test_operators_follow_python(text):
    r = ev(text)
    want = python_value(text)
    assert (r.status, r.value, r.detail) == ("pass" if want else "fail", want, None), (text, r)


# --- an unknown item inside compared data ------------------------------------------------------------------------

@pytest.mark.parametrize("text, operand, held, sym", [
    ("x.vals != [1.0, 2.0]", "x.vals", "nan (not a finite number)", "!="),        # Python: True (nan != 1.0)
    ("not (x.vals >= [1.0, 2.0])", "x.vals", "nan (not a finite number)", ">="),  # Python: True
    ("3.0 not in x.vals", "x.vals", "nan (not a finite number)", "not in"),       # Python: True
    ("x.m != y.m", "x.m", "nan (not a finite number)", "!="),                     # Python: True (a value nan)
    ("x.gaps != [1, 2, 3]", "x.gaps", "None", "!="),                              # Python: True (None != 2)
    ("2 not in x.gaps", "x.gaps", "None", "not in"),                              # Python: True
    ("2 in x.gaps", "x.gaps", "None", "in"),                                      # Python: False; an error, not a fail
    ("x.gaps == [1, None, 3]", "x.gaps", "None", "=="),                           # as `x.a == None` is an error
])
def test_a_none_or_nan_held_in_compared_data_is_an_error_never_a_pass(text, operand, held, sym):
    r = ev(text)
    assert r.status == "error" and r.value is None, (text, r)
    assert r.detail.startswith(f"{operand} holds {held}, in comparison '{sym}': "), r.detail


@pytest.mark.parametrize("text, status", [
    ("2.0 in x.vals", "pass"),       # found: what the nan is does not change the answer
    ("2.0 not in x.vals", "fail"),
    ("3 in x.gaps", "pass"),
    ("'j' in x.m", "pass"),          # `in` over a mapping reads its keys, not the values
    ("len(x.vals) == 2", "pass"),
    ("x.sizes != [1, 2]", "pass"),   # nothing unknown: as Python
])
def test_an_answer_the_unknown_item_cannot_change_stands(text, status):
    r = ev(text)
    assert (r.status, r.detail) == (status, None), (text, r)
    assert r.value == python_value(text)


# --- mapping keys: `in` reads them as a subscript does ------------------------------------------------------------

@pytest.mark.parametrize("text, status", [
    ("50 in s.runs", "pass"), ("50 not in s.runs", "fail"), ("'50' in s.runs", "pass"),
    ("51 in s.runs", "fail"), ("51 not in s.runs", "pass"), ("-50 in s.runs", "fail"),
])
def test_an_integer_key_in_a_mapping_is_found_as_the_subscript_finds_it(text, status):
    # results.json's keys are strings: `s.runs[50]` reads the key "50", so `50 not in s.runs` must not hold
    assert ev("s.runs[50].mean == 41.5").status == "pass"
    r = ev(text)
    assert (r.status, r.detail) == (status, None), (text, r)


# --- between() -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["between(x.a, 5, 1)", "not between(x.a, 5, 1)", "not between(x.a, x.hi, x.lo)"])
def test_between_with_lo_above_hi_is_an_error(text):
    # no value lies between 5 and 1: `not between(x.a, 5, 1)` passed whatever x.a was
    r = ev(text)
    assert r.status == "error" and "with lo 5 above hi 1" in r.detail, (text, r)


def test_between_shows_bounds_read_from_the_data():
    r = ev("between(x.a, x.lo, x.hi)")
    assert (r.status, r.actual) == ("pass", "x.a = 3; x.lo = 1; x.hi = 5")
    assert (ev("between(x.a, 3, 3)").status, ev("between(x.a, 3, 3)").actual) == ("pass", "x.a = 3")


# --- limits, at the bound and one step beyond -------------------------------------------------------------------

def test_an_integer_result_of_exactly_max_int_bits_is_allowed():
    base = 2 ** 101  # a constant: 2 ** 101 itself would pass MAX_EXPONENT
    assert MAX_INT_BITS == 10_000 and (base ** 99).bit_length() == MAX_INT_BITS  # 2 ** 9999
    r = ev(f"{base} ** 99 > 0")
    assert (r.status, r.detail) == ("pass", None), r
    assert compile_expression(f"{base} ** 99").evaluate({}).value == 2 ** 9999
    for text in (f"{base} ** 99 * 2 > 0", f"{2 * base} ** 99 > 0", "(2 ** 100) ** 100 > 0"):  # 10,001 bits or more
        r = ev(text)
        assert r.status == "error" and f"larger than {MAX_INT_BITS} bits" in r.detail, (text, r)


def test_exponent_length_and_round_digits_at_and_beyond_their_bounds():
    assert ev(f"2 ** {MAX_EXPONENT} == {2 ** MAX_EXPONENT}").status == "pass"
    assert ev(f"2 ** -{MAX_EXPONENT} > 0").status == "pass"
    for text in (f"2 ** {MAX_EXPONENT + 1} > 0", f"2 ** -{MAX_EXPONENT + 1} > 0", f"2 ** {MAX_EXPONENT}.5 > 0"):
        assert "larger than" in ev(text).detail
    assert ev(f"round(1.5, {MAX_EXPONENT}) == 1.5").status == "pass"
    assert ev(f"round(15, -{MAX_EXPONENT}) == 0").status == "pass"
    assert "round() digits" in ev(f"round(1.5, {MAX_EXPONENT + 1}) > 0").detail
    name = "v" * MAX_LENGTH
    assert compile_expression(f"  {name}\n").evaluate({name: 1}).status == "pass"
    with pytest.raises(ExpressionError, match=f"longer than {MAX_LENGTH}"):
        compile_expression(name + "v")


def _frames() -> int:
    f, n = sys._getframe(), 0
    while f is not None:
        f, n = f.f_back, n + 1
    return n


def _at_depth(n: int, fn):
    return fn() if n <= 0 else _at_depth(n - 1, fn)


@pytest.mark.parametrize("text, ns", [("-" * (MAX_DEPTH - 3) + "x", {"x": 1}),
                                      ("1 + (" * (MAX_DEPTH - 3) + "x" + ")" * (MAX_DEPTH - 3), {"x": 1})],
                         ids=["unary", "binary"])
def test_evaluation_never_raises_however_deep_the_callers_stack(text, ns):
    # ast.unparse, which writes the Actual text, recurses about twice as deep as the evaluation: a caller with a few
    # hundred frames left got a RecursionError out of evaluate() after the verdict was reached
    e = compile_expression(text)
    free = sys.getrecursionlimit() - _frames()
    outcomes = set()
    for left in range(free - 40, 20, -10):
        r = _at_depth(free - left, lambda: e.evaluate(ns))
        outcomes.add((r.status, r.value) if r.status == "pass" else r.status)
    assert outcomes <= {("pass", -1 if text.startswith("-") else (MAX_DEPTH - 3) + 1), "error"}, outcomes
    assert len(outcomes) == 2  # a pass with room to spare, an error where even the evaluation runs out
