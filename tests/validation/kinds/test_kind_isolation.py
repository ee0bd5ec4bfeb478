"""Nothing outside a step kind's package names the kind (issue 33): every built-in kind is a package of
validation/kinds/, and no module of validation/ outside it
- imports it (the registry finds the packages by walking validation/kinds, not by name),
- compares anything with its name (`kind == "ab"`, `step.kind in ("sweep", "triage")`),
- keys a mapping by its name, asks the registry for it by name (`find("train")`, `get("sweep")`), or lists kind
  names (a tuple or list of two or more of them).

The modules are read with ast, without importing them. A kind's package may name itself (train's key figures read
the run's other train steps). Shared modules of validation/kinds/ (base.py, trainer.py, blocks.py, ...) are outside
every kind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from validation import kinds

ROOT = Path(__file__).resolve().parents[3]
VALIDATION = ROOT / "validation"


def _package_of(kind) -> Path:
    """The folder of a built-in kind's package."""
    module = type(kind).__module__.split(".")
    assert module[:2] == ["validation", "kinds"] and len(module) >= 3, module
    return VALIDATION / "kinds" / module[2]


def _named(node: ast.AST, names: set[str]) -> list[ast.Constant]:
    """The constants by which `node` itself uses a kind name as a kind (a comparison, a mapping key, a registry
    lookup, a list of kinds)."""
    hits: list[ast.Constant] = []
    if isinstance(node, ast.Compare):
        for side in [node.left, *node.comparators]:
            hits += [c for c in ast.walk(side) if isinstance(c, ast.Constant) and c.value in names]
    elif isinstance(node, ast.Dict):
        hits += [k for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
    elif isinstance(node, ast.Call):
        func = node.func
        # the registry's lookups (kinds.get / find, get_kind), not a mapping's .get of a key of that name
        registry = (isinstance(func, ast.Attribute) and func.attr in ("find", "get")
                    and isinstance(func.value, ast.Name) and func.value.id in ("kinds", "step_kinds"))
        if (registry or (isinstance(func, ast.Name) and func.id in ("find", "get_kind"))) and node.args:
            first = node.args[0]
            hits += [first] if isinstance(first, ast.Constant) and first.value in names else []
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        listed = [e for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
        hits += listed if len(listed) >= 2 else []
    return hits


def _uses(tree: ast.AST, names: set[str]) -> list[ast.Constant]:
    """Every constant of `tree` used as a kind name, each once, in source order."""
    seen = {id(c): c for node in ast.walk(tree) for c in _named(node, names)}
    return sorted(seen.values(), key=lambda c: (c.lineno, c.col_offset))


def _imports(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def test_every_built_in_kind_is_a_package():
    for kind in kinds.kinds():
        if kinds.built_in(kind.name):
            package = _package_of(kind)
            assert (package / "__init__.py").is_file(), f"kind {kind.name} is not a package of validation/kinds"


def test_no_module_outside_a_kind_names_it():
    own = {k.name: _package_of(k) for k in kinds.kinds() if kinds.built_in(k.name)}
    packages = {p.name: name for name, p in own.items()}
    found = []
    for path in sorted(VALIDATION.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        inside = next((name for name, p in own.items() if p in path.parents), None)
        others = set(own) - {inside}
        for const in _uses(tree, others):
            found.append(f"{path.relative_to(ROOT)}:{const.lineno} names the kind {const.value!r}")
        for node in ast.walk(tree):
            for module in _imports(node):
                parts = module.split(".")
                if parts[:2] == ["validation", "kinds"] and len(parts) >= 3 and parts[2] in packages:
                    if packages[parts[2]] != inside:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports the kind package {module}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("kind == 'ab'", ["ab"]),
    ("step.kind in ('sweep', 'triage')", ["sweep", "triage"]),
    ("{'train': 1}", ["train"]),
    ("find('scan')", ["scan"]),
    ("step_kinds.find('ab')", ["ab"]),
    ("kinds.get('sweep')", ["sweep"]),
    ("raw.get('comm')", []),  # a mapping's key of that name
    ("ORDER = ('snapshot', 'train')", ["snapshot", "train"]),
    ("label = 'train'", []),  # a word in text is not a kind
    ("x = ('train',)", []),
])
def test_the_check_sees_each_form(source, expected):
    names = {"ab", "sweep", "triage", "train", "scan", "snapshot"}
    assert [c.value for c in _uses(ast.parse(source), names)] == expected
