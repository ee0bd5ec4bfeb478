"""How much of validation/ reads its records by string key: the figure the typed step kinds (Options and Result
dataclasses, one codec for results.json) bring down to at most a third of what it was when that work began.

Counted with the standard library's ast module over every module of validation/ (and of any package its code moves
to, listed in PACKAGES), without importing them:
- subscript loads with a string literal key: ``result["metrics"]`` (not stores or deletes: ``d["k"] = v``);
- ``.get("literal", ...)`` calls;
- ``.pop("literal", ...)`` and ``getattr(obj, "literal", ...)`` calls.

The test prints the figure (``python tests/test_string_keys.py`` prints it per module) and fails when it grows
beyond CEILING: lower CEILING when a change brings it down, so that it only goes one way.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("validation",)
BASELINE = 2169  # at d56c884, when the typed step kinds were asked for: 711 subscripts, 1,443 .get, 15 .pop/getattr
TARGET = BASELINE // 3
CEILING = 472  # the count once the report, acceptance, the runner and every kind read typed records (the report's own comparisons too: findings.Found): it may only go down


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def count(tree: ast.AST) -> Counter:
    """{"subscript": n, "get": n, "pop_getattr": n} of one module."""
    found: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_str(node.slice):
            found["subscript"] += 1
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and _is_str(node.args[0]):
                found["get"] += 1
            elif isinstance(func, ast.Attribute) and func.attr == "pop" and _is_str(node.args[0]):
                found["pop_getattr"] += 1
            elif (isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2
                  and _is_str(node.args[1])):
                found["pop_getattr"] += 1
    return found


def per_module() -> dict[str, Counter]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            out[path.relative_to(ROOT).as_posix()] = count(ast.parse(path.read_text(encoding="utf-8")))
    return out


def total(modules: dict[str, Counter]) -> Counter:
    out: Counter = Counter()
    for c in modules.values():
        out.update(c)
    return out


def line(figures: Counter) -> str:
    n = sum(figures.values())
    return (f"string-key reads in {', '.join(p + '/' for p in PACKAGES)}: {n:,} ({figures['subscript']:,} subscripts, "
            f"{figures['get']:,} .get, {figures['pop_getattr']:,} .pop/getattr); {BASELINE:,} at the start of the "
            f"typed step kinds, target at most {TARGET:,}")


def test_the_string_key_reads_are_counted_and_do_not_grow(record_property):
    figures = total(per_module())
    record_property("figure", line(figures))  # printed at the end of the session (tests/conftest.py)
    n = sum(figures.values())
    assert n > 0
    assert n <= CEILING, f"{line(figures)}: more than CEILING = {CEILING:,}; read typed records instead"


def test_the_counter_counts_each_form_once():
    code = ('r = d["a"]\nd["b"] = 1\ndel d["c"]\nx = d.get("e", 0)\ny = d.get(k)\nd.pop("f", None)\n'
            'getattr(o, "g", None)\ngetattr(o, name)\nz = d[0]\n')
    assert count(ast.parse(code)) == Counter(subscript=1, get=1, pop_getattr=2)


if __name__ == "__main__":
    modules = per_module()
    for name, c in sorted(modules.items(), key=lambda kv: -sum(kv[1].values())):
        if c:
            print(f"{sum(c.values()):6,}  {name}")
    print(line(total(modules)), file=sys.stderr)
