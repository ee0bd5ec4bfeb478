"""validation.runbook.expressions: a flag is no number for == / != (YAML's true is not 1), and and / or decide in
three-valued (Kleene) logic, a part reading a disturbed figure or a null being unknown: checked against truth tables
written out by hand."""

from __future__ import annotations

import itertools

import pytest

from validation.runbook.expressions import compile_expression

NS = {
    "x": {"t": True, "f": False, "n": None, "one": 1, "zero": 0, "fl": 1.0, "flags": [True, False], "nums": [1, 0]},
    "d": {"t": True, "f": False},  # figures measured while other work used the machine
}
DISTURBED = [("d", ("t",)), ("d", ("f",)), ("d", ("missing",))]


def ev(text: str, disturbed: bool = True):
    expr = compile_expression(text)
    return expr.evaluate(NS, disturbed=DISTURBED) if disturbed else expr.evaluate(NS)


# --- a flag compared with a number --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, flag, number", [
    ("True == 1", "True", "1"),          # Python: True
    ("x.t == 1", "True", "1"),           # Python: True
    ("x.f != 0", "False", "0"),          # Python: False
    ("x.t != 0", "True", "0"),           # Python: True
    ("x.one == True", "True", "1"),      # Python: True
    ("x.zero != False", "False", "0"),   # Python: False
    ("x.flags == [1, 0]", "True", "1"),  # Python: True (item by item)
    ("x.nums != [True, True]", "True", "1"),  # Python: True (0 != True)
])
def test_a_flag_compared_with_a_number_is_a_type_mismatch(text, flag, number):
    r = ev(text, disturbed=False)
    assert r.status == "error" and r.value is None, r
    assert "values of different kinds are a type mismatch" in r.detail, r.detail
    assert "flag " + flag in r.detail and "number " + number in r.detail, r.detail


@pytest.mark.parametrize("text, want", [
    ("x.t == True", "pass"), ("x.f != True", "pass"), ("x.one == 1", "pass"), ("x.fl == 1", "pass"),
    ("x.flags == [True, False]", "pass"), ("x.nums == [1, 0.0]", "pass"), ("x.zero != 1", "pass"),
    ("x.t == False", "fail"),
])
def test_flags_with_flags_and_numbers_with_numbers_still_compare(text, want):
    assert ev(text, disturbed=False).status == want


def test_in_over_a_list_of_numbers_finds_no_flag():
    assert ev("True in x.nums", disturbed=False).status == "error"       # Python: True (True == 1)
    assert ev("False not in x.nums", disturbed=False).status == "error"  # Python: False
    assert ev("True in x.flags", disturbed=False).status == "pass"


# --- and / or in three-valued logic --------------------------------------------------------------------------------

# the operands: known true, known false, a disturbed figure (true or false underneath), null
OPERANDS = {"T": "x.t", "F": "x.f", "uT": "d.t", "uF": "d.f", "N": "x.n"}
# Kleene's tables, written out; "?" is unknown (a disturbed figure or a null decides it)
AND = {
    ("T", "T"): "T", ("T", "F"): "F", ("T", "uT"): "?", ("T", "uF"): "?", ("T", "N"): "?",
    ("F", "T"): "F", ("F", "F"): "F", ("F", "uT"): "F", ("F", "uF"): "F", ("F", "N"): "F",
    ("uT", "T"): "?", ("uT", "F"): "F", ("uT", "uT"): "?", ("uT", "uF"): "?", ("uT", "N"): "?",
    ("uF", "T"): "?", ("uF", "F"): "F", ("uF", "uT"): "?", ("uF", "uF"): "?", ("uF", "N"): "?",
    ("N", "T"): "?", ("N", "F"): "F", ("N", "uT"): "?", ("N", "uF"): "?", ("N", "N"): "?",
}
OR = {
    ("T", "T"): "T", ("T", "F"): "T", ("T", "uT"): "T", ("T", "uF"): "T", ("T", "N"): "T",
    ("F", "T"): "T", ("F", "F"): "F", ("F", "uT"): "?", ("F", "uF"): "?", ("F", "N"): "?",
    ("uT", "T"): "T", ("uT", "F"): "?", ("uT", "uT"): "?", ("uT", "uF"): "?", ("uT", "N"): "?",
    ("uF", "T"): "T", ("uF", "F"): "?", ("uF", "uT"): "?", ("uF", "uF"): "?", ("uF", "N"): "?",
    ("N", "T"): "T", ("N", "F"): "?", ("N", "uT"): "?", ("N", "uF"): "?", ("N", "N"): "?",
}


def truth(r) -> str:
    """T / F when the outcome stands on known figures only; "?" when it is null, an error or reads a disturbed
    figure (validation.execution.acceptance then makes the criterion inconclusive)."""
    if r.status == "error" or r.value is None or any(p in DISTURBED for p in r.reads):
        return "?"
    return "T" if r.status == "pass" else "F"


@pytest.mark.parametrize("op, table", [("and", AND), ("or", OR)])
def test_and_or_follow_kleenes_tables(op, table):
    got = {(a, b): truth(ev(f"{OPERANDS[a]} {op} {OPERANDS[b]}")) for a, b in itertools.product(OPERANDS, repeat=2)}
    assert got == table


@pytest.mark.parametrize("op, table", [("and", AND), ("or", OR)])
def test_not_of_and_or_follows_kleenes_tables(op, table):
    flip = {"T": "F", "F": "T", "?": "?"}
    got = {(a, b): truth(ev(f"not ({OPERANDS[a]} {op} {OPERANDS[b]})"))
           for a, b in itertools.product(OPERANDS, repeat=2)}
    assert got == {k: flip[v] for k, v in table.items()}


def test_a_known_false_part_decides_and_reads_only_what_decided():
    r = ev("d.t and x.t and x.f")
    assert (r.status, r.value, r.reads) == ("fail", False, (("x", ("t",)), ("x", ("f",))))
    r = ev("d.f or x.f or x.t")
    assert (r.status, r.value, r.reads) == ("pass", True, (("x", ("f",)), ("x", ("t",))))
    # nested: the inner `and` is decided false by a known part, so `not` of it holds on that part alone
    r = ev("not (d.t and x.f) and x.t")
    assert (r.status, r.reads) == ("pass", (("x", ("f",)), ("x", ("t",))))


def test_an_undecided_part_keeps_pythons_value_and_its_disturbed_reads():
    r = ev("d.f and x.t")  # Python: False, standing on the disturbed figure
    assert (r.status, r.value) == ("fail", False) and ("d", ("f",)) in r.reads
    r = ev("x.f or d.t")
    assert (r.status, r.value) == ("pass", True) and ("d", ("t",)) in r.reads


def test_a_disturbed_part_that_cannot_be_evaluated_is_unknown_and_a_known_part_still_decides():
    assert (ev("d.missing > 1 and x.f").status, ev("d.missing > 1 and x.f").value) == ("fail", False)
    assert ev("d.missing > 1 or x.t").status == "pass"
    r = ev("d.missing > 1 and x.t")  # nothing decides: the error stands
    assert r.status == "error" and "no such key" in r.detail
    # an error of a known part is the expression's, as before
    assert ev("x.missing > 1 and x.f").status == "error"


def test_a_null_in_a_comparison_is_still_an_error_and_null_or_false_still_no_pass():
    assert ev("x.n > 1 and x.f").status == "error"
    r = ev("not (x.n or x.f)")
    assert r.status == "error" and "None under 'not'" in r.detail
    assert (ev("x.n and x.t").status, ev("x.n and x.t").value) == ("fail", None)


@pytest.mark.parametrize("text, want", [
    ("not (x.n and x.f)", "pass"),   # null and false is false whatever the null holds
    ("x.n and x.f", "fail"),
    ("not (x.n and x.t)", "error"),  # null and true is unknown: `not` of it is no pass
    ("x.n or x.t", "pass"),
])
def test_a_null_part_is_unknown_in_and_as_in_or(text, want):
    r = ev(text, disturbed=False)
    assert r.status == want, r
    if want != "error":
        assert r.value is (want == "pass")
