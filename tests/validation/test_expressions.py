"""validation.runbook.expressions: acceptance criteria are checked at compile time and evaluated without eval()."""

from __future__ import annotations

import pytest

from validation.runbook.expressions import EvalResult, Expression, ExpressionError, compile_expression

NS = {
    "baseline": {"status": "ok", "toks_per_s": {"mean": 847.2, "stdev": 3.5}, "toks_per_s_per_gpu": 423.6,
                 "final_loss": 2.5},
    "single": {"toks_per_s": {"mean": 470.6}},
    "ddp": {"toks_per_s_per_gpu": 400.0},
    "sdpa_audit": {"fallbacks": 0},
    "bucket_sweep": {"winner": {"label": "50"}, "runs": {"50": {"toks_per_s": {"mean": 41.5}}, "25": None}},
    "empty_sweep": {"winner": None},
    "parity": {"failed": 0, "passed": 12},
    "longrun": {"stalls": 0, "halted": False, "mem_plateau": None, "gpus": [{"name": "A100"}, {"name": "H100"}]},
    "x": {"a": 10.0, "zero": 0, "none": None, "text": "bf16"},
    "y": {"b": 7.0},
}
LOGS = {
    "baseline": "[ddp] gradient compression enabled: bf16\nstep 1 ...\nstep 2 ...\n",
    "longrun": "step 1\nstep 2\nWARNING slow step\nWARNING slow step\n",
}


def ev(text: str, ns=NS, logs=LOGS.get) -> EvalResult:
    return compile_expression(text).evaluate(ns, logs)


# --- the runbook's examples ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, status, actual", [
    ("baseline.toks_per_s.mean >= 39", "pass", "baseline.toks_per_s.mean = 847.2"),
    ("baseline.toks_per_s.mean >= 900", "fail", "baseline.toks_per_s.mean = 847.2"),
    ("ddp.toks_per_s_per_gpu / single.toks_per_s.mean >= 0.8", "pass",
     "ddp.toks_per_s_per_gpu / single.toks_per_s.mean = 0.85 "
     "(ddp.toks_per_s_per_gpu = 400, single.toks_per_s.mean = 470.6)"),
    ("sdpa_audit.fallbacks == 0", "pass", "sdpa_audit.fallbacks = 0"),
    ('log_contains(baseline, "gradient compression enabled: bf16")', "pass",
     "log_contains(baseline, 'gradient compression enabled: bf16') = True"),
    ('not log_contains(longrun, "Traceback")', "pass", "log_contains(longrun, 'Traceback') = False"),
    ('log_contains(longrun, "gradient compression enabled")', "fail",
     "log_contains(longrun, 'gradient compression enabled') = False"),
    ('log_count(longrun, "WARNING") <= 1', "fail", "log_count(longrun, 'WARNING') = 2"),
    ("bucket_sweep.winner is not None", "pass", "bucket_sweep.winner = {label=50}"),
    ("empty_sweep.winner is not None", "fail", "empty_sweep.winner = None"),
    ("empty_sweep.winner is None", "pass", "empty_sweep.winner = None"),
    ("parity.failed == 0 and parity.passed > 0", "pass", "parity.failed = 0; parity.passed = 12"),
    ("abs(x.a - y.b) < 5", "pass", "abs(x.a - y.b) = 3 (x.a = 10, y.b = 7)"),
    ("min(x.a, y.b) > 3", "pass", "min(x.a, y.b) = 7 (x.a = 10, y.b = 7)"),
    ("max(x.a, y.b) > 30", "fail", "max(x.a, y.b) = 10 (x.a = 10, y.b = 7)"),
    ("between(baseline.toks_per_s.mean, 45, 55)", "fail", "baseline.toks_per_s.mean = 847.2"),
    ("between(y.b, 5, 7)", "pass", "y.b = 7"),
    ('bucket_sweep.runs["50"].toks_per_s.mean > 40', "pass", "bucket_sweep.runs['50'].toks_per_s.mean = 41.5"),
    ("bucket_sweep.runs[50].toks_per_s.mean > 42", "fail", "bucket_sweep.runs[50].toks_per_s.mean = 41.5"),
    ("longrun.gpus[-1].name == 'H100'", "pass", "longrun.gpus[-1].name = 'H100'"),
    ("baseline.status in ('ok', 'short')", "pass", "baseline.status = 'ok'"),
    ("x.text not in ['fp16', 'bf16']", "fail", "x.text = 'bf16'"),
    ("0 < y.b < 7", "fail", "y.b = 7"),
    ("0 < y.b <= 7", "pass", "y.b = 7"),
    ("-x.a < -9", "pass", "-x.a = -10 (x.a = 10)"),
    ("round(x.a / 3, 1) == 3.3", "pass", "round(x.a / 3, 1) = 3.3 (x.a = 10)"),
    ("len(longrun.gpus) == 2", "pass", "len(longrun.gpus) = 2"),
    ("x.a ** 2 // 3 % 7 == 5", "pass", "x.a ** 2 // 3 % 7 = 5 (x.a = 10)"),
    ("longrun.stalls == 0 and not longrun.halted", "pass", "longrun.stalls = 0; longrun.halted = False"),
    ("longrun.stalls > 0 or longrun.halted", "fail", "longrun.stalls = 0; longrun.halted = False"),
])
def test_examples(text, status, actual):
    r = ev(text)
    assert (r.status, r.actual, r.detail) == (status, actual, None)


def test_values():
    assert ev("x.a * 2 + y.b").value == 27.0
    assert ev("x.a / 4").value == 2.5
    assert ev("log_count(longrun, 'step')").value == 4  # "step 1", "step 2", 2 x "slow step"
    assert ev("y.b - x.a").value == -3.0
    assert ev("x.a").status == "pass" and ev("x.zero").status == "fail"


def test_short_circuit_guards_none():
    # The right side would be an error (None > 3); `and` stops at the failing guard.
    r = ev("x.none is not None and x.none > 3")
    assert r.status == "fail" and r.detail is None
    assert ev("x.none is None or x.none > 3").status == "pass"


def test_names():
    e = compile_expression('ddp.toks_per_s_per_gpu / single.toks_per_s.mean >= 0.8 and not log_contains(longrun, "x")')
    assert e.names == {"ddp", "single", "longrun"}
    assert e.log_names == {"longrun"}
    assert compile_expression("min(a.x, b.y) > abs(c.z)").names == {"a", "b", "c"}
    assert compile_expression('s.runs["50"].m > 1').names == {"s"}
    assert compile_expression("1 + 2 > 2").names == set()


def test_multiline_text_is_one_expression():
    e = compile_expression("parity.failed == 0\n  and parity.passed > 0\n")
    assert isinstance(e, Expression) and e.text == "parity.failed == 0   and parity.passed > 0"
    assert e.evaluate(NS).status == "pass"


# --- errors at evaluation: never an exception ------------------------------------------------------------------

@pytest.mark.parametrize("text, detail", [
    ("baseline.tokens.mean >= 39", "baseline.tokens: no such key (step skipped or failed?)"),
    ("nosuchstep.toks_per_s.mean >= 39", "nosuchstep: no result (step skipped or failed?)"),
    ("x.none + 1 > 0", "None in arithmetic: x.none + 1 (x.none = None)"),
    ("x.none > 3", "None in comparison '>': x.none > 3 (x.none = None)"),
    ("x.none == 0", "None in comparison '==': x.none == 0 (x.none = None)"),
    ("longrun.mem_plateau == True", "None in comparison '==': longrun.mem_plateau == True (longrun.mem_plateau = None)"),
    ("x.a / x.zero > 1", "division by zero: x.a / x.zero (x.a = 10, x.zero = 0)"),
    ("x.a % x.zero > 1", "division by zero: x.a % x.zero (x.a = 10, x.zero = 0)"),
    ("bucket_sweep.runs['25'].toks_per_s.mean > 1",
     "bucket_sweep.runs['25'].toks_per_s: bucket_sweep.runs['25'] is None"),
    ("x.a.b > 1", "x.a.b: x.a is a float, not a mapping"),
    ("longrun.gpus[5].name == 'x'", "longrun.gpus[5]: index 5 out of range (length 2)"),
    ("x.text + 1 > 0", "'+' needs numbers, got str 'bf16' in x.text + 1"),
    ("x.text < 3", "cannot compare str 'bf16' < int 3 in x.text < 3"),
    ("x.a ** 1000 > 1", "exponent 1000 larger than 100 in x.a ** 1000"),
    ("between(x.none, 1, 2)", "None argument to between(): between(x.none, 1, 2) (x.none = None)"),
    ("len(x.a) > 1", "len() of float 10 in len(x.a)"),
])
def test_evaluation_errors(text, detail):
    r = ev(text)
    assert r.status == "error" and r.value is None
    assert r.detail == detail


def test_error_actual_shows_what_was_read():
    r = ev("x.a / x.zero > 1")
    assert r.actual == "x.a = 10; x.zero = 0"
    assert ev("baseline.tokens.mean >= 39").actual == "n/a"


def test_log_errors():
    assert ev("log_contains(baseline, 'x')", logs=None).detail == "log_contains(baseline, ...): no logs available"
    r = ev("log_contains(single, 'x')")  # LOGS.get returns None for single
    assert r.status == "error" and "no log for step single" in r.detail

    def raising(step):
        raise FileNotFoundError(f"{step}.log")

    r = ev("log_count(baseline, 'x') == 0", logs=raising)
    assert r.status == "error" and "log of step baseline unavailable" in r.detail


def test_attribute_access_never_reads_python_attributes():
    class Obj:
        real = 5

    r = ev("o.real > 1", ns={"o": Obj()})
    assert r.status == "error" and "not a mapping" in r.detail
    r = ev("o.real > 1", ns={"o": 5})  # int has a .real attribute; it is not a key
    assert r.status == "error"


def test_bool_is_not_a_number():
    assert ev("longrun.halted + 1 > 0").status == "error"


# --- rejected at compile time ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, words, column", [
    ("__import__('os')", "calling '__import__'", 1),
    ("__import__('os').system('x')", "calling \"__import__('os').system\"", 1),
    ("a.__class__", "'__class__'", 1),
    ("a._private > 1", "'_private'", 1),
    ("_a.b > 1", "'_a'", 1),
    ("(lambda: 1)() > 0", "calling 'lambda: 1'", 1),
    ("lambda: 1", "a lambda", 1),
    ("[v for v in a.b] == []", "a comprehension", 1),
    ("x.a if y else 3", "a conditional expression", 1),
    ("open('f') == 1", "calling 'open'", 1),
    ("a.b(1) > 0", "calling 'a.b'", 1),
    ("a.b[c] > 1", "a subscript that is not a constant", 5),
    ("a.b[1:2] > 1", "a subscript that is not a constant", 5),
    ("a.b[1.5] > 1", "a subscript that is not a constant", 5),
    ("a.b is 3", "'is' / 'is not' with anything but None", 8),
    ("log_contains(a.b, 'x')", "not a bare step name", 14),
    ("log_contains(a, b.c)", "not a string constant", 17),
    ("f'{a}' == 'x'", "an f-string", 1),
    ("~a.b", "the unary operator ~", 1),
    ("+a.b > 1", "the unary operator unary +", 1),
    ("a.b @ c.d", "the operator @", 1),
    ("a.b << 2", "the operator <<", 1),
    ("(y := 3) > 1", "an assignment (:=)", 2),
    ("{'a': 1} == a.b", "a dict literal", 1),
    ("max(*a.b) > 1", "a starred argument", 5),
    ("round(a.b, ndigits=1) > 1", "a keyword argument to round()", 20),
    ("abs > 1", "the function name 'abs' used as a value", 1),
    ("a.b == b'x'", "the constant b'x'", 8),
])
def test_rejected_constructs(text, words, column):
    with pytest.raises(ExpressionError) as info:
        compile_expression(text)
    msg = str(info.value)
    assert words in msg and "not allowed" in msg
    assert f"(column {column})" in msg
    assert msg.endswith(text)


@pytest.mark.parametrize("text, words", [
    ("a.b >", "syntax error at the end"),
    ("a.b >= 39 39", "syntax error at column 11"),
    ("a = 1", "syntax error at column 3"),
    ("", "empty expression"),
    ("between(1, 2)", "between() takes 3 argument(s), got 2"),
    ("abs(1, 2) > 0", "abs() takes 1 argument(s), got 2"),
    ("min() > 0", "min() takes 1 or more argument(s), got 0"),
    ("x" * 2001, "longer than 2000"),
    ("(" * 300 + "1" + ")" * 300, ""),
])
def test_syntax_and_arity_errors(text, words):
    with pytest.raises(ExpressionError, match=None) as info:
        compile_expression(text)
    assert words in str(info.value)


@pytest.mark.parametrize("value", [None, 39, True, ["a > 1"]])
def test_non_string_is_rejected(value):
    with pytest.raises(ExpressionError, match="expected an expression string"):
        compile_expression(value)


def test_nothing_runs_at_compile_time():
    calls = []
    e = compile_expression("log_contains(baseline, 'x')")
    assert calls == []  # compiling needs no logs
    e.evaluate(NS, lambda s: calls.append(s) or "")
    assert calls == ["baseline"]


@pytest.mark.parametrize("expr, data", [
    ("a.x >= 1.0", {"x": True}),
    ("a.x < 0.5", {"x": False}),
    ("0.5 <= a.x", {"x": True}),
    ("a.n > a.flag", {"n": 3, "flag": True}),
])
def test_a_flag_ordered_against_a_figure_is_an_error_never_a_pass(expr, data):
    """`baseline.loss_drop >= 1.0` with loss_drop recorded as true passed (True >= 1.0 in Python): a type mismatch
    is an error, as the module says; == between flags still holds."""
    result = compile_expression(expr).evaluate({"a": data})
    assert result.status == "error" and "true and false are no numbers" in result.detail
    assert compile_expression("a.f == True and a.g != True").evaluate({"a": {"f": True, "g": False}}).status == "pass"
