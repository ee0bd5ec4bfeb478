"""Nothing outside validation/kinds/ knows a step kind by name: the report, the run, the runbook and the analyses ask a
kind (its hooks and attributes: blocks, comparisons, key_figures, repeatable, ...) instead of comparing a step's kind
with "ab" or "train". Checked with the ast module: no comparison outside the kinds' package has a built-in kind's
name as an operand (alone or in a tuple, list or set)."""

from __future__ import annotations

import ast
from pathlib import Path

from validation import kinds

ROOT = Path(__file__).resolve().parents[1]


def kind_name_comparisons(root: Path = ROOT) -> list[str]:
    names = set(kinds.names())
    found = []
    for path in sorted((root / "validation").rglob("*.py")):
        if path.relative_to(root / "validation").parts[0] == "kinds":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            for operand in (node.left, *node.comparators):
                values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                for v in values:
                    if isinstance(v, ast.Constant) and v.value in names:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: {v.value!r}")
    return found


def test_no_module_outside_the_kinds_compares_with_a_kind_name():
    assert kind_name_comparisons() == []


def test_the_check_finds_such_a_comparison(tmp_path):
    (tmp_path / "validation" / "report").mkdir(parents=True)
    (tmp_path / "validation" / "report" / "x.py").write_text('def f(s):\n    return s.get("kind") in ("ab", "y")\n')
    (tmp_path / "validation" / "kinds").mkdir()
    (tmp_path / "validation" / "kinds" / "ab.py").write_text('NAME = "ab" if 1 == 1 else None\nassert "ab" == NAME\n')
    assert kind_name_comparisons(tmp_path) == ["validation/report/x.py:2: 'ab'"]
