"""Acceptance criteria: small Python-like expressions over step results, checked safely.

    baseline.toks_per_s.mean >= 39
    ddp.toks_per_s_per_gpu / single.toks_per_s.mean >= 0.8
    parity.failed == 0 and parity.passed > 0
    bucket_sweep.winner is not None
    sweep.runs["NSA_DDP_BUCKET_MB=50"].toks_per_s.mean > 40
    between(baseline.toks_per_s.mean, 45, 55)
    not log_contains(longrun, "Traceback")

An expression is parsed with `ast` and checked against a whitelist when it is compiled (a runbook with a bad
expression is rejected at load time, and so is one reading a metric its step's kind does not produce: `paths`,
validation.kinds.base.check_metric_reference); it is then evaluated by walking the tree: nothing is ever passed to
eval(), and attribute access only reads keys of mappings. Allowed:

    and, or, not, unary -, + - * / // % ** (numbers only; |exponent| <= MAX_EXPONENT; integer results up to
    MAX_INT_BITS bits), nested at most MAX_DEPTH levels
    == != < <= > >= in, not in, is None, is not None
    names (step names), a.b (key "b" of mapping a), a["k"] / a[0] (constant keys), tuple/list literals
    numbers, strings, True, False, None
    FUNCTIONS: abs, min, max, round, len, between(x, lo, hi), log_contains(step, "text"), log_count(step, "text")

Evaluation never raises for data: a missing name or key, None in arithmetic, under `not` or in a comparison other
than is/is not, a division by zero, a result that is not finite (overflow to infinity), a NaN read from the data or a
type mismatch gives status "error" with a detail sentence: a figure that is absent or not a number never makes a
criterion pass (`not x.throttled` with throttled null is an error, not "not throttled"), nor does one held inside
compared data (`x.sizes != [1, 2]` with a null size is an error) unless `in` / `not in` found the item it looked for.
`and` / `or` follow three-valued (Kleene) logic: a part whose value is null is unknown (a null it compares or
computes with is an error, as anywhere), and so is a part that reads a figure measured while other work used the
machine (Expression.evaluate's `disturbed`: validation.execution.acceptance then makes a criterion inconclusive when
it stands on one), or could not be evaluated for one; `and` is false when a known part is false, `or` true when
a known part is true, whatever the unknown parts hold (`a.toks_per_s.mean > 100 and b.failed == 0` with a's figure
disturbed and b.failed 3 is false, and reads b only). Otherwise the value is Python's: `and` settled by a null is
null, `or` whose every side is false or null is null when one is (`not (a.throttled or b.throttled)` with a.throttled
null is an error: the absent figure might have held), and a part settling it on a disturbed figure leaves the
criterion standing on that figure. Values of different kinds (a number, a flag, a text, a list, a mapping) compared
by == / != are a type mismatch (`x.code != '0'` with a code 0 is an error, and so is `x.ok == 1` with ok true: a
flag is no number, as YAML's true is not 1), and `in` / `not in` over a list finds an item only by one of its own
kind (over a list holding nothing of its kind: an error).
A list read from the data and a list or tuple literal compare as the same kind of sequence (`x.throttle_reasons ==
[]`). `in` over a mapping finds a key as a subscript reads it (`50 in sweep.runs`: the key "50" of results.json).
between(x, lo, hi) with lo above hi is an error (no value lies between).
"""

from __future__ import annotations

import ast
import math
import operator
import re
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping


class ExpressionError(ValueError):
    """An expression that cannot be compiled: a syntax error or a construct that is not allowed."""


MAX_EXPONENT = 100
MAX_LENGTH = 2000
MAX_DEPTH = 100        # syntax-tree depth: bounds the evaluator's and the report's recursion
MAX_INT_BITS = 10_000  # an integer result larger than this is an error (x ** 99 ** ... would never finish)

# name -> (min args, max args or None); the one list of callable functions.
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "abs": (1, 1), "min": (1, None), "max": (1, None), "round": (1, 2), "len": (1, 1),
    "between": (3, 3), "log_contains": (2, 2), "log_count": (2, 2),
}
LOG_FUNCTIONS = ("log_contains", "log_count")
STATUSES = ("pass", "fail", "error")

_BINOPS: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv), ast.FloorDiv: ("//", operator.floordiv), ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}
_CMPOPS: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Eq: ("==", operator.eq), ast.NotEq: ("!=", operator.ne), ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le), ast.Gt: (">", operator.gt), ast.GtE: (">=", operator.ge),
    ast.Is: ("is", operator.is_), ast.IsNot: ("is not", operator.is_not),
    ast.In: ("in", lambda a, b: a in b), ast.NotIn: ("not in", lambda a, b: a not in b),
}
_OP_WORDS = {"Invert": "~", "UAdd": "unary +", "MatMult": "@", "BitAnd": "&", "BitOr": "|", "BitXor": "^",
             "LShift": "<<", "RShift": ">>"}
_NODE_WORDS = {
    "Lambda": "a lambda", "ListComp": "a comprehension", "SetComp": "a comprehension",
    "DictComp": "a comprehension", "GeneratorExp": "a comprehension", "IfExp": "a conditional expression",
    "NamedExpr": "an assignment (:=)", "JoinedStr": "an f-string", "Starred": "a starred argument",
    "Await": "await", "Yield": "yield", "YieldFrom": "yield", "Slice": "a slice", "Dict": "a dict literal",
    "Set": "a set literal",
}


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one evaluation.

    value:  the expression's value (None on error)
    status: "pass" (truthy), "fail" (falsy) or "error" (could not be evaluated; see detail)
    detail: why it is an error, None otherwise
    actual: the values behind the verdict for a report's "Actual" column, e.g. "baseline.toks_per_s.mean = 847.2"
    reads:  the paths of Expression.paths the evaluation read to their end, each once, in their order: what a "pass"
            or "fail" stands on (`a.loss_drop > 0 and a.toks_per_s.mean > 1` failing on its loss never read the
            throughput; a part of and / or reading a disturbed figure that a known part decided without is left out)
    """

    value: Any
    status: str
    detail: str | None
    actual: str
    reads: tuple[tuple[str, tuple], ...] = ()


class _EvalError(Exception):
    """Internal: evaluation cannot go on; the message is the detail."""


def _src(node: ast.AST) -> str:
    return ast.unparse(node)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_brief_repr = reprlib.Repr()
_brief_repr.maxlevel, _brief_repr.maxstring, _brief_repr.maxother = 3, 40, 40


def fmt_value(v: Any) -> str:
    """A value as the report shows it (4 significant digits; one decimal from 10,000)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v) if v.bit_length() <= MAX_INT_BITS else f"<integer of {v.bit_length()} bits>"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.1f}" if abs(v) >= 1e4 else f"{v:.4g}"
    if isinstance(v, str):
        return repr(v) if len(v) <= 60 else repr(v[:57] + "...")
    if isinstance(v, (dict, list, tuple)):  # key=value and comma lists, as the reports show data (not reprs)
        text = _plain(v, 3)
        return text if len(text) <= 160 else text[:157] + "..."
    try:
        text = _brief_repr.repr(v)  # bounded: data may be huge or self-referencing
    except ValueError:  # an int too long for str()
        text = f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(v: Any, depth: int) -> str:
    """A dict as {k=v, ...}, a list as [a, b, ...], strings unquoted inside; bounded in depth and length."""
    if isinstance(v, str):
        return v if len(v) <= 40 else v[:37] + "..."
    if not isinstance(v, (dict, list, tuple)):
        return fmt_value(v)
    if depth <= 0:
        return "{...}" if isinstance(v, dict) else "[...]"
    items = list(v.items())[:8] if isinstance(v, dict) else list(v)[:8]
    more = len(v) > 8
    if isinstance(v, dict):
        body = ", ".join(f"{_plain(k, depth - 1)}={_plain(x, depth - 1)}" for k, x in items)
        return "{" + body + (", ..." if more else "") + "}"
    body = ", ".join(_plain(x, depth - 1) for x in items)
    return "[" + body + (", ..." if more else "") + "]"


class _Checker:
    """Compile-time whitelist check; collects the step names read."""

    def __init__(self, text: str):
        self.text = text
        self.names: set[str] = set()
        self.log_names: set[str] = set()

    def fail(self, node: ast.AST, what: str) -> None:
        col = getattr(node, "col_offset", 0) + 1
        raise ExpressionError(f"{what} is not allowed in an acceptance expression (column {col}): {self.text}")

    def check(self, node: ast.AST) -> None:
        kind = type(node).__name__
        if isinstance(node, ast.Expression):
            self.check(node.body)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                self.check(v)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.Not, ast.USub)):
                self.fail(node, f"the unary operator {_OP_WORDS.get(type(node.op).__name__, type(node.op).__name__)}")
            self.check(node.operand)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                self.fail(node, f"the operator {_OP_WORDS.get(type(node.op).__name__, type(node.op).__name__)}")
            self.check(node.left)
            self.check(node.right)
        elif isinstance(node, ast.Compare):
            self.check(node.left)
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.Is, ast.IsNot)) and not (isinstance(right, ast.Constant)
                                                                 and right.value is None):
                    self.fail(right, "'is' / 'is not' with anything but None")
                self.check(right)
        elif isinstance(node, ast.Name):
            if node.id in FUNCTIONS:
                self.fail(node, f"the function name {node.id!r} used as a value")
            if node.id.startswith("_"):
                self.fail(node, f"the name {node.id!r} (starts with '_')")
            self.names.add(node.id)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                self.fail(node, f"the attribute {node.attr!r} (starts with '_')")
            self.check(node.value)
        elif isinstance(node, ast.Subscript):
            key = node.slice
            negative_int = (isinstance(key, ast.UnaryOp) and isinstance(key.op, ast.USub)
                            and isinstance(key.operand, ast.Constant) and _is_int(key.operand.value))
            if not negative_int and not (isinstance(key, ast.Constant)
                                         and (isinstance(key.value, str) or _is_int(key.value))):
                self.fail(node.slice, "a subscript that is not a constant string or integer")
            self.check(node.value)
        elif isinstance(node, ast.Constant):
            v = node.value
            if not (v is None or isinstance(v, (bool, int, float, str))):
                self.fail(node, f"the constant {v!r}")
            if isinstance(v, float) and not math.isfinite(v):  # 1e999: results hold no infinity, nor may criteria
                self.fail(node, f"the non-finite constant {_src(node)}")
        elif isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                self.check(e)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        else:
            self.fail(node, _NODE_WORDS.get(kind, f"{kind}"))

    def check_call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            what = node.func.id if isinstance(node.func, ast.Name) else _src(node.func)
            self.fail(node, f"calling {what!r} (functions: {', '.join(FUNCTIONS)})")
        name = node.func.id
        if node.keywords:
            self.fail(node.keywords[0].value, f"a keyword argument to {name}()")
        for a in node.args:
            if isinstance(a, ast.Starred):
                self.fail(a, "a starred argument")
        lo, hi = FUNCTIONS[name]
        n = len(node.args)
        if n < lo or (hi is not None and n > hi):
            want = str(lo) if lo == hi else f"{lo} or more" if hi is None else f"{lo} to {hi}"
            raise ExpressionError(f"{name}() takes {want} argument(s), got {n} (column {node.col_offset + 1}): "
                                  f"{self.text}")
        if name in LOG_FUNCTIONS:
            step, text = node.args
            if not isinstance(step, ast.Name) or step.id.startswith("_"):
                self.fail(step, f"a first argument of {name}() that is not a bare step name")
            if not (isinstance(text, ast.Constant) and isinstance(text.value, str)):
                self.fail(text, f"a second argument of {name}() that is not a string constant")
            self.names.add(step.id)
            self.log_names.add(step.id)
            return
        for a in node.args:
            self.check(a)


def compile_expression(text: str) -> "Expression":
    """Parse and check an acceptance expression; raises ExpressionError naming what is wrong and where."""
    if not isinstance(text, str):
        raise ExpressionError(f"expected an expression string, got {type(text).__name__}: {text!r}")
    flat = " ".join(text.strip().splitlines())
    if not flat:
        raise ExpressionError("empty expression")
    if len(flat) > MAX_LENGTH:
        raise ExpressionError(f"expression longer than {MAX_LENGTH} characters: {flat[:60]}...")
    try:
        tree = ast.parse(flat, mode="eval")
    except SyntaxError as exc:
        where = f"column {exc.offset}" if exc.offset and exc.offset <= len(flat) else "the end"
        raise ExpressionError(f"syntax error at {where}: {exc.msg}: {flat}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise ExpressionError(f"expression cannot be parsed ({type(exc).__name__}): {flat[:60]}") from None
    if _depth(tree) > MAX_DEPTH:
        raise ExpressionError(f"expression nested too deeply (more than {MAX_DEPTH} levels): {flat[:60]}")
    checker = _Checker(flat)
    try:
        checker.check(tree)
    except RecursionError:
        raise ExpressionError(f"expression nested too deeply: {flat[:60]}") from None
    return Expression(flat, tree, frozenset(checker.names), frozenset(checker.log_names))


def _depth(tree: ast.AST) -> int:
    """The depth of a syntax tree (iterative: the tree may be deeper than Python's recursion limit)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


class Expression:
    """A compiled acceptance expression.

    text:      the expression (multi-line YAML text joined into one line)
    names:     the top-level names (step names) it reads, including the steps whose logs it reads
    log_names: the steps whose logs it reads (log_contains / log_count)
    """

    def __init__(self, text: str, tree: ast.Expression, names: frozenset[str], log_names: frozenset[str]):
        self.text, self._tree, self.names, self.log_names = text, tree, names, log_names

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    @property
    def paths(self) -> list[tuple[str, tuple]]:
        """(step, key path) of every value the expression reads from a step, in order, e.g. `sweep.runs["x=5"].
        toks_per_s.mean` -> ("sweep", ("runs", "x=5", "toks_per_s", "mean")); a bare step name reads ()."""
        return _read_paths(self._tree.body)

    @property
    def structural_paths(self) -> list[tuple[str, tuple]]:
        """The paths of `paths` the expression only counts, looks into or compares with a string: len()'s argument
        (`len(bench.checks) >= 4`), the container of `in` / `not in` (`'nsa' in bench.best`), and a value compared
        with a string constant by ==, != or in (`bench.status == 'passed'`). For a kind whose every key may be a
        figure (a benchmark's free-form JSON) they say whether the step ran and what it recorded, not how fast
        (validation.execution.evidence.performance_reads); a kind that names its performance keys means them
        whatever the comparison (a triage's culprit == 'x' is a decision on speed)."""
        return [p for node in _structural_nodes(self._tree.body) for p in _read_paths(node)]

    @property
    def measured_paths(self) -> list[tuple[str, tuple]]:
        """The paths of `paths` that are not structural_paths."""
        return _read_paths(self._tree.body, skip=frozenset(map(id, _structural_nodes(self._tree.body))))

    @property
    def compared_strings(self) -> list[tuple[str, tuple, str]]:
        """(step, key path, string) of every string constant a step's value is compared with by ==, !=, in or
        not in, e.g. `crash.status in ('failed', 'hang')` -> ("crash", ("status",), "failed"), ("crash",
        ("status",), "hang"): what a runbook's check can hold against the values the key can take."""
        found = []
        for node in ast.walk(self._tree):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                pairs = [(a, b), (b, a)] if isinstance(op, (ast.Eq, ast.NotEq)) else [(a, b)]
                for value, other in pairs:
                    where = _step_path(value)
                    consts = other.elts if isinstance(other, (ast.Tuple, ast.List)) else [other]
                    if where is not None:
                        found.extend((where[0], where[1], c.value) for c in consts
                                     if isinstance(c, ast.Constant) and isinstance(c.value, str))
        return found

    @property
    def numeric_paths(self) -> list[tuple[str, tuple]]:
        """(step, key path) of every step value the expression uses as a number: an operand of <, <=, >, >= or of
        arithmetic (`a.toks_per_s.mean >= 2 * b.x`), e.g. ("a", ("toks_per_s", "mean")), ("b", ("x",)): what the
        loader holds against the kind's names (a figure, not a mapping of them: `a.toks_per_s >= 1`)."""
        found: list[tuple[str, tuple]] = []
        for node in ast.walk(self._tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for op, a, b in zip(node.ops, operands, operands[1:]):
                    if isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
                        found += [w for w in (_step_path(a), _step_path(b)) if w is not None]
            elif isinstance(node, ast.BinOp):
                found += [w for w in (_step_path(node.left), _step_path(node.right)) if w is not None]
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
                found += [w for w in (_step_path(node.operand),) if w is not None]
        return found

    def evaluate(self, namespace: Mapping[str, Any], logs: Callable[[str], str] | None = None,
                 disturbed: Collection[tuple[str, tuple]] = ()) -> EvalResult:
        """Evaluate against step results: namespace maps step names to nested mappings; logs(step) returns the
        step's combined log text (for log_contains / log_count); disturbed: the paths (as Expression.paths gives
        them) whose figures were measured while other work used the machine, which decide no part of and / or that
        reads them (the module docstring). Never raises for missing or bad data."""
        ev = _Evaluator(namespace, logs, disturbed)
        try:
            value = ev.eval(self._tree.body)
        except _EvalError as exc:
            return EvalResult(None, "error", str(exc), ev.actual(self._tree.body) or "n/a", ev.reads(self._tree))
        except RecursionError:
            return EvalResult(None, "error", "expression nested too deeply", "n/a")
        reads = ev.reads(self._tree)
        return EvalResult(value, "pass" if value else "fail", None, ev.actual(self._tree.body) or fmt_value(value),
                          reads)


class _Evaluator:
    def __init__(self, namespace: Mapping[str, Any], logs: Callable[[str], str] | None,
                 disturbed: Collection[tuple[str, tuple]] = ()):
        self.ns, self.logs, self.disturbed = namespace, logs, frozenset(disturbed)
        self.values: dict[int, Any] = {}   # id(node) -> value, for the "actual" text
        self.set_aside: set[int] = set()   # id() of the parts of and / or that a known part decided without

    def reads(self, tree: ast.Expression) -> tuple[tuple[str, tuple], ...]:
        """The paths of `tree` (Expression.paths) evaluated to their end, each once, in their order, but those of
        a part of and / or that reads a disturbed figure and that a known part decided without."""
        return tuple(dict.fromkeys(path for node, path in _read_chains(tree.body, frozenset(self.set_aside))
                                   if id(node) in self.values))

    def eval(self, node: ast.AST) -> Any:
        value = self._eval(node)
        if isinstance(value, float) and not math.isfinite(value):  # NaN compares false both ways: `not (x < 5)`
            raise _EvalError(f"{_src(node)} is {value} (not a finite number)")  # would pass; results hold no inf
        self.values[id(node)] = value
        return value

    def _eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in self.ns:
                raise _EvalError(f"{node.id}: no result (step skipped or failed?)")
            return self.ns[node.id]
        if isinstance(node, ast.Attribute):
            return self._lookup(node, self.eval(node.value), node.attr)
        if isinstance(node, ast.Subscript):
            key = node.slice
            k = -key.operand.value if isinstance(key, ast.UnaryOp) else key.value
            return self._lookup(node, self.eval(node.value), k)
        if isinstance(node, ast.BoolOp):
            return self._boolop(node)
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                if v is None:  # an absent figure is no evidence for "not ...": `not x.throttled` on a null
                    raise _EvalError(f"None under 'not': {self._described(node)}")
                return not v
            self._need_numbers(node, "-", v)
            return -v
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.eval(e) for e in node.elts)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise AssertionError(f"unchecked node {type(node).__name__}")  # compile_expression rejects it

    def _boolop(self, node: ast.BoolOp) -> Any:
        """`and` / `or` in three-valued (Kleene) logic: a part that reads a disturbed figure (one in
        self.disturbed), or could not be evaluated for one, is unknown, and so is a null part; `and` is false when a
        known part is false, `or` true when a known part is true, whatever the unknown parts hold. Otherwise the value
        is Python's (the first part that settles it, from left to right), but for `or` whose every part is false or
        null: null when one is (the absent figure might have held). Parts after the one that settles it in Python
        are evaluated only while an unknown part settles it, and one of them that cannot be evaluated decides
        nothing; an error in a part Python evaluates is the expression's, unless the part is unknown."""
        is_and = isinstance(node.op, ast.And)
        settled: tuple[Any, _EvalError | None] | None = None  # Python's (value, error), once a part settles it
        unknown: list[ast.AST] = []  # the parts that read a disturbed figure
        value, null = None, False
        for part in node.values:
            try:
                value, error = self.eval(part), None
            except _EvalError as exc:
                value, error = None, exc
            shaken = self._reads_disturbed(part, error is not None)
            if shaken:
                unknown.append(part)
            known_decides = not shaken and error is None and value is not None and bool(value) != is_and
            if known_decides:  # false for `and`, true for `or`, whatever the unknown parts hold
                self.set_aside.update(map(id, unknown))
                return value
            if settled is None:
                if error is not None and not shaken:
                    raise error
                if error is not None or bool(value) != is_and:  # settled on an unknown or a null part: a known
                    settled = (value, error)                     # part further on may still decide
            null = null or value is None
        if settled is not None:
            if settled[1] is not None:
                raise settled[1]
            return settled[0]
        # `a.x or b.y` false with a.x null is not known to be false: the absent figure might have held, so the
        # value is None (`not (a.throttled or b.throttled)` with a.throttled null is then an error, never a pass)
        return None if null else value

    def _reads_disturbed(self, part: ast.AST, failed: bool) -> bool:
        """Whether a part of and / or reads a disturbed figure: one its evaluation read (every path it names, when
        it could not be evaluated), but in a part an and / or inside it decided without."""
        if not self.disturbed:
            return False
        return any(path in self.disturbed for n, path in _read_chains(part, frozenset(self.set_aside))
                   if failed or id(n) in self.values)

    def _lookup(self, node: ast.AST, container: Any, key: Any) -> Any:
        where = _src(node)
        parent = _src(node.value)  # type: ignore[attr-defined]
        if container is None:
            raise _EvalError(f"{where}: {parent} is None")
        if isinstance(container, Mapping):
            if key in container:
                return container[key]
            alt = _key_alias(key)
            if alt is not None and alt in container:
                return container[alt]
            raise _EvalError(f"{where}: no such key (step skipped or failed?)")
        if isinstance(container, (list, tuple)) and isinstance(key, int):
            if -len(container) <= key < len(container):
                return container[key]
            raise _EvalError(f"{where}: index {key} out of range (length {len(container)})")
        raise _EvalError(f"{where}: {parent} is a {type(container).__name__}, not a mapping")

    def _need_numbers(self, node: ast.AST, op: str, *values: Any) -> None:
        for v in values:
            if v is None:
                where = f"argument to {op}()" if isinstance(node, ast.Call) else "in arithmetic"
                raise _EvalError(f"None {where}: {self._described(node)}")
            if not _is_number(v):
                raise _EvalError(f"'{op}' needs numbers, got {type(v).__name__} {fmt_value(v)} in {_src(node)}")
            if isinstance(v, float) and not math.isfinite(v):  # an item of a list: max([1.0, nan]) is 1.0
                raise _EvalError(f"'{op}' of {v} (not a finite number) in {_src(node)}")

    def _described(self, node: ast.AST) -> str:
        operands = [n for a in node.args for n in _leaves(a)] if isinstance(node, ast.Call) else _leaves(node)
        leaves = [f"{_src(n)} = {fmt_value(self.values[id(n)])}" for n in operands if id(n) in self.values]
        return f"{_src(node)}" + (f" ({', '.join(leaves)})" if leaves else "")

    def _binop(self, node: ast.BinOp) -> Any:
        sym, fn = _BINOPS[type(node.op)]
        a, b = self.eval(node.left), self.eval(node.right)
        self._need_numbers(node, sym, a, b)
        if sym == "**" and abs(b) > MAX_EXPONENT:
            raise _EvalError(f"exponent {fmt_value(b)} larger than {MAX_EXPONENT} in {_src(node)}")
        # a ** b has at least (bits(a) - 1) * b + 1 bits: too many is known before computing it; a result that may
        # fit (at most bits(a) * b bits, so never far above the limit) is computed and checked below
        if sym == "**" and _is_int(a) and _is_int(b) and (abs(a).bit_length() - 1) * b >= MAX_INT_BITS:
            raise _EvalError(f"integer result larger than {MAX_INT_BITS} bits in {_src(node)}")
        try:
            result = fn(a, b)
        except ZeroDivisionError:
            raise _EvalError(f"division by zero: {self._described(node)}") from None
        except (OverflowError, ValueError) as exc:
            raise _EvalError(f"{exc} in {self._described(node)}") from None
        if isinstance(result, complex):
            raise _EvalError(f"complex result in {self._described(node)}")
        if isinstance(result, float) and not math.isfinite(result):  # 1e308 * 10: overflow, not a figure
            raise _EvalError(f"result not finite ({result}) in {self._described(node)}")
        if _is_int(result) and result.bit_length() > MAX_INT_BITS:
            raise _EvalError(f"integer result larger than {MAX_INT_BITS} bits in {_src(node)}")
        return result

    def _compare(self, node: ast.Compare) -> Any:
        left_node = node.left
        left = self.eval(left_node)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.eval(right_node)
            sym, fn = _CMPOPS[type(op)]
            if sym not in ("is", "is not") and (left is None or right is None):
                raise _EvalError(f"None in comparison '{sym}': {self._described(node)}")
            membership = sym in ("in", "not in")
            if membership and isinstance(right, Mapping):
                alt = _key_alias(left)  # `50 in sweep.runs` finds the key "50", as `sweep.runs[50]` reads it
                if alt is not None and left not in right and alt in right:
                    left = alt
            # An absent or non-finite item inside a compared sequence is no evidence either way ([nan, 2] != [1, 2]
            # would pass): an error, unless the item `in` / `not in` found settles the answer whatever the rest holds.
            if sym not in ("is", "is not"):
                self._no_hole(node, sym, left_node, left)
                if not membership:
                    self._no_hole(node, sym, right_node, right)
            if sym in ("<", "<=", ">", ">=") and (isinstance(left, bool) or isinstance(right, bool)):
                # true >= 1.0 holds in Python: a flag compared with a figure (`x.loss_drop >= 1.0` reading a
                # loss_drop recorded as true) is a type mismatch, never a pass
                raise _EvalError(f"cannot order {type(left).__name__} {fmt_value(left)} {sym} "
                                 f"{type(right).__name__} {fmt_value(right)} in {_src(node)}: true and false are no "
                                 "numbers")
            if sym in ("==", "!="):
                # 0 != '0', [1] != 1 and false != 0 hold in Python (true == 1 too): values of different kinds (a
                # flag, a number, a text, a list, a mapping) compared for equality are a type mismatch, never a pass
                # (YAML's true and 1 are different things: `x.ok == 1` reading a flag is no check of it)
                self._same_kind(node, sym, left, right)
            items = right
            if membership and isinstance(right, (list, tuple)):
                # an item is found only by an item of its own kind; a list holding nothing of it is a type mismatch
                items = type(right)(e for e in right if _mismatch(left, e) is None)
            try:
                ok = fn(*_comparable(left, items))
            except TypeError:
                raise _EvalError(f"cannot compare {type(left).__name__} {fmt_value(left)} {sym} "
                                 f"{type(right).__name__} {fmt_value(right)} in {_src(node)}") from None
            if membership and isinstance(right, (list, tuple)) and ok != (sym == "in"):
                self._no_hole(node, sym, right_node, right)  # not found: an unknown item might have matched
                if right and not items:  # nothing of its kind to find: `'0' not in x.codes` of numbers
                    self._same_kind(node, sym, left, right[0])
            if not ok:
                return False
            left_node, left = right_node, right
        return True

    def _same_kind(self, node: ast.Compare, sym: str, left: Any, right: Any) -> None:
        pair = _mismatch(left, right)
        if pair is not None:
            a, b = pair
            raise _EvalError(f"cannot compare {_kind(a)} {fmt_value(a)} with {_kind(b)} {fmt_value(b)} "
                             f"('{sym}') in {self._described(node)}: values of different kinds are a type mismatch")

    def _no_hole(self, node: ast.Compare, sym: str, operand: ast.AST, value: Any) -> None:
        hole = _hole(value)
        if hole is not _NO_HOLE:
            what = "None" if hole is None else f"{hole} (not a finite number)"
            raise _EvalError(f"{_src(operand)} holds {what}, in comparison '{sym}': {self._described(node)}")

    def _call(self, node: ast.Call) -> Any:
        name = node.func.id  # type: ignore[attr-defined]
        if name in LOG_FUNCTIONS:
            step = node.args[0].id  # type: ignore[attr-defined]
            text = node.args[1].value  # type: ignore[attr-defined]
            if self.logs is None:
                raise _EvalError(f"{name}({step}, ...): no logs available")
            try:
                log = self.logs(step)
            except (OSError, LookupError, ValueError) as exc:
                raise _EvalError(f"{name}({step}, ...): log of step {step} unavailable ({exc})") from None
            if log is None:
                raise _EvalError(f"{name}({step}, ...): no log for step {step} (step skipped or failed?)")
            return (text in log) if name == "log_contains" else log.count(text)
        args = [self.eval(a) for a in node.args]
        if name == "len":
            if not isinstance(args[0], (str, list, tuple, Mapping)):
                raise _EvalError(f"len() of {type(args[0]).__name__} {fmt_value(args[0])} in {_src(node)}")
            return len(args[0])
        if name in ("min", "max"):
            items = args
            if len(args) == 1:
                if not isinstance(args[0], (list, tuple)):
                    raise _EvalError(f"{name}() of one value needs a list, got {fmt_value(args[0])} in {_src(node)}")
                items = list(args[0])
                if not items:
                    raise _EvalError(f"{name}() of an empty list in {_src(node)}")
            self._need_numbers(node, name, *items)
            return min(items) if name == "min" else max(items)
        if name == "abs":
            self._need_numbers(node, name, *args)
            return abs(args[0])
        if name == "round":
            self._need_numbers(node, name, *args)
            if len(args) == 2 and (not isinstance(args[1], int) or abs(args[1]) > MAX_EXPONENT):
                raise _EvalError(f"round() digits must be an integer from -{MAX_EXPONENT} to {MAX_EXPONENT} "
                                 f"in {_src(node)}")
            try:
                return round(*args)
            except (OverflowError, ValueError) as exc:
                raise _EvalError(f"{exc} in {_src(node)}") from None
        if name == "between":
            self._need_numbers(node, name, *args)
            x, lo, hi = args
            if lo > hi:  # no value lies between: the criterion would always fail, and `not between(...)` always pass
                raise _EvalError(f"between() with lo {fmt_value(lo)} above hi {fmt_value(hi)}: {self._described(node)}")
            return lo <= x <= hi
        raise AssertionError(name)

    def actual(self, node: ast.AST) -> str:
        """The values a reader needs to judge the verdict: each non-constant side of a comparison (a computed
        side with its operands), a function call's result, the evaluated parts of and/or; "" when the text cannot be
        made (a caller deep in its own stack: ast.unparse recurses further than the evaluation did)."""
        try:
            parts = self._actual_parts(node)
        except RecursionError:
            return ""
        return "; ".join(dict.fromkeys(p for p in parts if p))

    def _actual_parts(self, node: ast.AST) -> list[str]:
        if isinstance(node, ast.BoolOp):
            return [p for v in node.values if id(v) in self.values for p in self._actual_parts(v)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return self._actual_parts(node.operand)
        if isinstance(node, ast.Compare):
            return [p for n in [node.left, *node.comparators] if not _constant(n) for p in self._describe(n)]
        if isinstance(node, ast.Call) and node.func.id == "between":  # type: ignore[attr-defined]
            return [p for a in node.args for p in self._describe(a)]  # the value, and bounds read from the data
        return self._describe(node)

    def _describe(self, node: ast.AST) -> list[str]:
        if _constant(node):
            return []
        if id(node) not in self.values:  # evaluation stopped inside it: show the operands that were read
            return [f"{_src(n)} = {fmt_value(self.values[id(n)])}" for n in _leaves(node)
                    if n is not node and id(n) in self.values]
        text = f"{_src(node)} = {fmt_value(self.values[id(node)])}"
        if isinstance(node, (ast.BinOp, ast.UnaryOp)) or (isinstance(node, ast.Call)
                                                          and node.func.id in ("abs", "min", "max", "round")):
            leaves = [f"{_src(n)} = {fmt_value(self.values[id(n)])}" for n in _leaves(node)
                      if id(n) in self.values]
            if leaves:
                text += f" ({', '.join(leaves)})"
        return [text]


def _kind(v: Any) -> str:
    """What kind of value `v` is, as equality tells kinds apart: a flag, a number, a text, a list, a mapping."""
    if isinstance(v, bool):
        return "flag"
    if _is_number(v):
        return "number"
    if isinstance(v, str):
        return "text"
    if isinstance(v, (list, tuple)):
        return "list"
    if isinstance(v, Mapping):
        return "mapping"
    return "None" if v is None else type(v).__name__


def _mismatch(left: Any, right: Any) -> tuple[Any, Any] | None:
    """The first pair of values of different kinds (_kind: a flag is no number, unlike in Python) that comparing
    `left` with `right` for equality would compare: the two themselves, else items at the same place of two lists or
    values of the same key of two mappings, MAX_DEPTH levels down; None when there is none (a null item is left to
    the comparison's hole check)."""
    stack = [(left, right, 0)]
    while stack:
        a, b, depth = stack.pop()
        if a is None or b is None:
            continue
        if _kind(a) != _kind(b):
            return a, b
        if depth < MAX_DEPTH:
            if isinstance(a, (list, tuple)):
                stack.extend((x, y, depth + 1) for x, y in reversed(list(zip(a, b))))
            elif isinstance(a, Mapping):
                stack.extend((a[k], b[k], depth + 1) for k in reversed(list(a)) if k in b)
    return None


def _comparable(left: Any, right: Any) -> tuple[Any, Any]:
    """Two operands as a comparison takes them: when both are sequences, every list in them (data read from
    results.json) a tuple, as list and tuple literals evaluate to, so that `x.sizes == [1, 2]` and
    `[1, 2] in x.pairs` compare elements, not the kind of sequence (in Python [] == () is False)."""
    seq = (list, tuple)
    if isinstance(left, seq) and isinstance(right, seq):
        return _as_tuples(left, MAX_DEPTH), _as_tuples(right, MAX_DEPTH)
    return left, right


_NO_HOLE = object()


def _hole(v: Any) -> Any:
    """The first None or non-finite float held inside a list, tuple or mapping (its values), MAX_DEPTH levels down;
    _NO_HOLE when there is none (or `v` holds nothing)."""
    stack = [(v, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > 0 and (item is None or (isinstance(item, float) and not math.isfinite(item))):
            return item
        if depth < MAX_DEPTH:
            if isinstance(item, (list, tuple)):
                stack.extend((e, depth + 1) for e in reversed(item))
            elif isinstance(item, Mapping):
                stack.extend((e, depth + 1) for e in reversed(list(item.values())))
    return _NO_HOLE


def _key_alias(key: Any) -> Any:
    """The other spelling of a mapping key: results.json's keys are strings, so `runs[50]` reads the key "50" (and
    "50" the key 50 of a mapping built in Python); None when there is none."""
    if _is_int(key):
        return str(key)
    if isinstance(key, str) and re.fullmatch(r"-?[0-9]{1,100}", key):
        return int(key)
    return None


def _as_tuples(v: Any, depth: int) -> Any:
    """`v` with its lists as tuples, `depth` levels down (a literal is nested at most MAX_DEPTH levels; data deeper
    than that keeps its inner lists)."""
    if isinstance(v, (list, tuple)) and depth > 0:
        return tuple(_as_tuples(e, depth - 1) for e in v)
    return v


def _read_paths(root: ast.AST, skip: frozenset[int] = frozenset()) -> list[tuple[str, tuple]]:
    """The longest attribute / constant-subscript chains rooted at a step name (see Expression.paths), but those
    inside a node whose id() is in `skip`."""
    return [path for _, path in _read_chains(root, skip)]


def _read_chains(root: ast.AST, skip: frozenset[int] = frozenset()) -> list[tuple[ast.AST, tuple[str, tuple]]]:
    """(the chain's outermost node, (step, key path)) of each path _read_paths finds."""
    found: list[tuple[ast.AST, tuple[str, tuple]]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in skip:
            continue
        top = node
        keys: list[Any] = []
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute):
                keys.append(node.attr)
            else:
                key = node.slice
                keys.append(-key.operand.value if isinstance(key, ast.UnaryOp) else key.value)
            node = node.value
        if isinstance(node, ast.Name):
            found.append((top, (node.id, tuple(reversed(keys)))))
        elif isinstance(node, ast.Call):  # a function's arguments (keys read from its result are not a step's)
            if node.func.id not in LOG_FUNCTIONS:  # type: ignore[attr-defined]  # a log is no result
                stack.extend(reversed(node.args))
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))
    return found


def _structural_nodes(root: ast.AST) -> list[ast.AST]:
    """The outermost nodes whose step values the expression only counts, looks into or compares with a string (see
    Expression.structural_paths): len()'s argument, the right side of `in` / `not in`, a side of == / != / in whose
    other side is a string constant (or a tuple of them)."""
    def text(node: ast.AST) -> bool:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List)) else [node]
        return bool(items) and all(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in items)

    found: dict[int, ast.AST] = {}
    for node in ast.walk(root):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
            found.update((id(a), a) for a in node.args)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                if isinstance(op, (ast.In, ast.NotIn)):
                    found[id(b)] = b
                    if text(b):
                        found[id(a)] = a
                elif isinstance(op, (ast.Eq, ast.NotEq)):
                    if text(b):
                        found[id(a)] = a
                    if text(a):
                        found[id(b)] = b
    inner = {id(n) for top in found.values() for n in ast.walk(top) if n is not top}
    return [n for i, n in found.items() if i not in inner]


def _step_path(node: ast.AST) -> tuple[str, tuple] | None:
    """(step, key path) when `node` is itself a chain of keys read from a step (`a.b["c"]`), else None."""
    paths = _read_paths(node)
    if len(paths) != 1 or not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        return None
    return paths[0]


def _constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _constant(node.operand)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_constant(e) for e in node.elts)
    return False


def _leaves(node: ast.AST) -> list[ast.AST]:
    """The data operands of a computed value: names, keys and function calls inside arithmetic."""
    if isinstance(node, ast.BinOp):
        return _leaves(node.left) + _leaves(node.right)
    if isinstance(node, ast.UnaryOp):
        return _leaves(node.operand)
    if isinstance(node, ast.Call) and node.func.id in ("abs", "min", "max", "round"):  # type: ignore[attr-defined]
        return [n for a in node.args for n in _leaves(a)]
    if isinstance(node, ast.Compare):
        return [n for x in [node.left, *node.comparators] for n in _leaves(x)]
    if _constant(node):
        return []
    return [node]
