"""The import graph of nsa/ and validation/ against the layer table of docs/architecture.md ("Layers: who may
import whom"): no import runs upward, no import is part of a circle, and function-level imports only shrink.

The graph is built with the standard library's ast module, without importing anything it reads. Every import is an
edge: module level, under ``if TYPE_CHECKING:``, inside a function, and ``importlib.import_module("literal")``.
An edge goes to the module the statement names (``from a.b import c`` -> ``a.b.c`` when that is a module, else
``a.b``); the packages above it that Python also runs are not edges.

Today's code still has upward imports and circles; issue 23 removes them over several changes. They are listed
below, each with the item that removes it. The test fails when a violation appears that is not listed (naming it
and the rule) and when a listed one is gone (shrink the list: it stays exact). Function-level imports are counted
per module, with and without a one-line reason comment; the counts are exact too.

``python tests/test_import_graph.py`` prints the upward imports, the circles and every function-level import.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nsa", "validation")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
LAYER_SECTION = "## Layers: who may import whom"
RULE = ("a module imports only modules of its own layer or of a layer below it, and no import is part of a circle "
        "(docs/architecture.md, 'Layers: who may import whom')")

# Upward imports that exist today: "importer -> imported": the item of issue 23 that removes it. None is left: a
# new one fails the test.
KNOWN_UPWARD: dict[str, str] = {}

# Circles that exist today (every elementary one, written from its smallest module): the item that removes it.
# None is left: a new one fails the test.
KNOWN_CIRCLES: dict[str, str] = {}

# Function-level imports per module: (all of them, those without a one-line reason comment). Each one left keeps a
# heavy or optional library (torch, pandas, numpy, matplotlib, jinja2, scipy, triton, pyarrow, datasets, pynvml,
# tensorboard) out of a start-up path or a torch-free module, and says so; these counts may only go down.
KNOWN_FUNCTION_IMPORTS: dict[str, tuple[int, int]] = {
    'nsa.attention.kernels': (1, 0),
    'nsa.attention.kernels.aot': (1, 0),
    'nsa.training.cli': (2, 0),
    'nsa.training.corpus': (1, 0),
    'nsa.training.fineweb': (1, 0),
    'nsa.training.outputs': (1, 0),
    'nsa.training.trainer': (1, 0),
    'validation.launch.environment': (1, 0),
    'validation.launch.telemetry': (1, 0),
    'validation.analysis.metrics': (1, 0),
    'validation.report.renderer': (1, 0),
    'validation.run': (1, 0),
    'validation.analysis.significance.distributions': (1, 0),
    'validation.analysis.significance.power': (1, 0),
    'validation.analysis.stats': (1, 0),
}


# ---------------------------------------------------------------------------------------------------------------
# the graph


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str  # a module of the graph
    target: str  # the module of the graph it names, or the outside name as written (torch, numpy.linalg, ...)
    internal: bool  # target is a module of the graph
    where: str  # "module", "type_checking" or "function"
    path: str  # the importer's file, relative to the root
    line: int
    reason: bool  # a one-line comment on the statement or on the line above it (function-level imports)

    @property
    def at(self) -> str:
        return f"{self.path}:{self.line}"


def module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} for every .py file of the packages (a package by its __init__.py)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


_PRAGMA = re.compile(r"^(noqa\b|type:|pragma:|fmt:|isort:)")


def _has_reason(lines: list[str], node: ast.stmt) -> bool:
    """A comment (not a bare pragma) at the end of the statement's lines, or a comment line just above it."""
    for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
        comment = lines[number - 1].partition("#")[2].strip()
        if comment and not _PRAGMA.match(comment):
            return True
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return above.startswith("#") and not _PRAGMA.match(above.lstrip("#").strip())


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    """Every import statement and literal importlib.import_module call of the packages, one Import per name."""
    files = module_files(root, packages)

    def module_of(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    found: list[Import] = []
    for module, path in files.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        rel = path.relative_to(root).as_posix()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def add(names: list[str], node: ast.AST, where: str) -> None:
            for name in names:
                target = module_of(name)
                if target == module:
                    continue
                reason = where == "function" and _has_reason(lines, node)
                found.append(Import(module, target or name, target is not None, where, rel, node.lineno, reason))

        def visit(node: ast.AST, where: str) -> None:
            for child in ast.iter_child_nodes(node):
                inner = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    inner = "function"
                elif isinstance(child, ast.If) and where == "module" and _is_type_checking(child.test):
                    for stmt in child.body:
                        visit_statement(stmt, "type_checking")
                    for stmt in child.orelse:
                        visit_statement(stmt, where)
                    continue
                visit_statement(child, inner)

        def visit_statement(node: ast.AST, where: str) -> None:
            if isinstance(node, ast.Import):
                add([alias.name for alias in node.names], node, where)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                add([f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names],
                    node, where)
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str) and ast.unparse(node.func) in (
                      "importlib.import_module", "import_module")):
                add([node.args[0].value], node, where)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                where = "function"
            visit(node, where)

        visit(ast.parse(source, filename=rel), "module")
    return found


def graph(found: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in found:
        edges.setdefault(imp.importer, set())
        if imp.internal:
            edges[imp.importer].add(imp.target)
    return edges


def circles(edges: dict[str, set[str]]) -> set[str]:
    """Every elementary circle, "a -> b -> ... -> a" written from its smallest module (each found once)."""
    found = set()
    for start in sorted(edges):
        path, on_path = [start], {start}

        def walk(node: str) -> None:
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    found.add(" -> ".join([*path, start]))
                elif nxt > start and nxt not in on_path:
                    path.append(nxt)
                    on_path.add(nxt)
                    walk(nxt)
                    on_path.discard(nxt)
                    path.pop()

        walk(start)
    return found


# ---------------------------------------------------------------------------------------------------------------
# the layer table


@dataclasses.dataclass(frozen=True)
class Layer:
    number: int
    name: str
    patterns: tuple[str, ...]


def read_layers(text: str) -> list[Layer]:
    """The rows of the table in the layer section of docs/architecture.md, top layer first."""
    if LAYER_SECTION not in text:
        raise AssertionError(f"docs/architecture.md has no section {LAYER_SECTION!r}")
    section = text.split(LAYER_SECTION, 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if len(cells) == 3 and cells[0].isdigit():
            layers.append(Layer(int(cells[0]), cells[1], tuple(re.findall(r"`([^`]+)`", cells[2]))))
    numbers = [layer.number for layer in layers]
    assert numbers == list(range(1, len(layers) + 1)), f"the layer table's rows are numbered {numbers}, not 1..n"
    return layers


def _specificity(pattern: str, module: str) -> tuple[int, int] | None:
    if pattern == module:
        return (1, len(pattern))
    if pattern.endswith(".*") and fnmatch.fnmatchcase(module, pattern) and "*" not in pattern[:-2]:
        return (0, len(pattern))
    return None


def assign(modules, layers: list[Layer]) -> tuple[dict[str, Layer], list[str], list[str]]:
    """{module: its layer} by the most specific entry; the modules no entry names; the entries that name none."""
    layer_of, used, unassigned = {}, set(), []
    for module in sorted(modules):
        matches = [(spec, pattern, layer) for layer in layers for pattern in layer.patterns
                   if (spec := _specificity(pattern, module)) is not None]
        if not matches:
            unassigned.append(module)
            continue
        _, pattern, layer = max(matches, key=lambda m: m[0])
        layer_of[module] = layer
        used.add(pattern)
    unused = [p for layer in layers for p in layer.patterns if p not in used]
    return layer_of, unassigned, unused


def upward(found: list[Import], layer_of: dict[str, Layer]) -> dict[str, list[Import]]:
    """{"importer -> imported": its statements} for every import of a module in a layer above the importer's."""
    up: dict[str, list[Import]] = {}
    for imp in found:
        if imp.internal and imp.importer in layer_of and imp.target in layer_of:
            if layer_of[imp.target].number < layer_of[imp.importer].number:
                up.setdefault(f"{imp.importer} -> {imp.target}", []).append(imp)
    return up


def function_counts(found: list[Import]) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    seen = set()
    for imp in found:
        if imp.where == "function" and (imp.path, imp.line) not in seen:  # one statement, however many names
            seen.add((imp.path, imp.line))
            c = counts.setdefault(imp.importer, [0, 0])
            c[0] += 1
            c[1] += not imp.reason
    return {m: (c[0], c[1]) for m, c in sorted(counts.items())}


# ---------------------------------------------------------------------------------------------------------------
# the tests


@pytest.fixture(scope="module")
def tree():
    found = imports()
    layers = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    layer_of, unassigned, unused = assign(module_files(), layers)
    return found, layers, layer_of, unassigned, unused


def test_layer_table_names_every_module_once(tree):
    _, layers, _, unassigned, unused = tree
    assert len(layers) >= 2
    assert not unassigned, (f"modules in no layer of docs/architecture.md ({LAYER_SECTION!r}): {unassigned}; "
                            "add each to the table")
    assert not unused, f"entries of the layer table that name no module: {unused}; remove or correct them"
    patterns = [p for layer in layers for p in layer.patterns]
    assert len(patterns) == len(set(patterns)), f"an entry of the layer table is in two layers: {patterns}"


def test_no_new_upward_import(tree):
    found, _, layer_of, _, _ = tree
    new = {edge: imps for edge, imps in upward(found, layer_of).items() if edge not in KNOWN_UPWARD}
    lines = [f"{edge} ({imps[0].at}, {imps[0].where}): layer {layer_of[imps[0].importer].number} "
             f"'{layer_of[imps[0].importer].name}' imports layer {layer_of[imps[0].target].number} "
             f"'{layer_of[imps[0].target].name}' above it" for edge, imps in sorted(new.items())]
    assert not new, "upward imports:\n  " + "\n  ".join(lines) + f"\nthe rule: {RULE}"


def test_known_upward_imports_still_exist(tree):
    found, _, layer_of, _, _ = tree
    gone = sorted(set(KNOWN_UPWARD) - set(upward(found, layer_of)))
    assert not gone, ("these upward imports are gone: remove them from KNOWN_UPWARD in tests/test_import_graph.py "
                      "so the list stays exact:\n  " + "\n  ".join(gone))


def test_no_new_circle(tree):
    found = tree[0]
    new = sorted(circles(graph(found)) - set(KNOWN_CIRCLES))
    assert not new, "import circles:\n  " + "\n  ".join(new) + f"\nthe rule: {RULE}"


def test_known_circles_still_exist(tree):
    gone = sorted(set(KNOWN_CIRCLES) - circles(graph(tree[0])))
    assert not gone, ("these import circles are gone: remove them from KNOWN_CIRCLES in tests/test_import_graph.py "
                      "so the list stays exact:\n  " + "\n  ".join(gone))


def test_function_level_imports_only_shrink(tree):
    counts = function_counts(tree[0])
    grown = {m: (counts.get(m, (0, 0)), KNOWN_FUNCTION_IMPORTS.get(m, (0, 0)))
             for m in set(counts) | set(KNOWN_FUNCTION_IMPORTS)
             if any(a > b for a, b in zip(counts.get(m, (0, 0)), KNOWN_FUNCTION_IMPORTS.get(m, (0, 0))))}
    listing = "\n".join(f"  {imp.at} {imp.importer} -> {imp.target}" for imp in tree[0]
                        if imp.where == "function" and imp.importer in grown and not imp.reason)
    assert not grown, (
        "more function-level imports (all, without a reason comment) than known: "
        + ", ".join(f"{m} {now} > {known}" for m, (now, known) in sorted(grown.items()))
        + "\nan import inside a function is only for start-up time and carries a one-line reason comment; "
          "move the others to the top of the module.\nthose without a reason there:\n" + listing)
    fewer = {m: counts.get(m) for m in sorted(set(counts) | set(KNOWN_FUNCTION_IMPORTS))
             if counts.get(m) != KNOWN_FUNCTION_IMPORTS.get(m)}
    assert not fewer, (
        "fewer function-level imports than KNOWN_FUNCTION_IMPORTS in tests/test_import_graph.py says; keep it "
        "exact:\n" + "".join(f"    {m!r}: {c},  (listed: {KNOWN_FUNCTION_IMPORTS.get(m)})\n" if c else
                             f"    {m!r}: remove it (listed: {KNOWN_FUNCTION_IMPORTS[m]})\n" for m, c in fewer.items()))


def test_the_graph_counts_every_kind_of_import(tmp_path):
    """The checker itself, on a small tree with one import of each kind, an upward one and a circle."""
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "top.py").write_text("import pkg.low.a\n")
    (pkg / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.low import b\n")
    (pkg / "low" / "b.py").write_text(
        "import importlib\n\ndef f():\n    import json  # start-up: kept out of --help\n"
        "    from . import c\n    return importlib.import_module('pkg.low.a')\n")
    (pkg / "low" / "c.py").write_text("from ..top import x\n")
    found = imports(tmp_path, ("pkg",))
    seen = {(i.importer, i.target, i.where, i.reason) for i in found}
    assert seen == {("pkg.top", "pkg.low.a", "module", False),
                    ("pkg.low.a", "typing", "module", False),
                    ("pkg.low.a", "pkg.low.b", "type_checking", False),
                    ("pkg.low.b", "importlib", "module", False),
                    ("pkg.low.b", "json", "function", True),
                    ("pkg.low.b", "pkg.low.c", "function", False),
                    ("pkg.low.b", "pkg.low.a", "function", False),
                    ("pkg.low.c", "pkg.top", "module", False)}
    assert circles(graph(found)) == {"pkg.low.a -> pkg.low.b -> pkg.low.a",
                                     "pkg.low.a -> pkg.low.b -> pkg.low.c -> pkg.top -> pkg.low.a"}
    layers = read_layers(f"{LAYER_SECTION}\n\n| layer | name | modules |\n|---|---|---|\n"
                         "| 1 | top | `pkg.top` |\n| 2 | low | `pkg`, `pkg.*` |\n\n## next\n| 3 | x | `y` |\n")
    assert [layer.name for layer in layers] == ["top", "low"]
    layer_of, unassigned, unused = assign(module_files(tmp_path, ("pkg",)), layers)
    assert (layer_of["pkg.top"].name, layer_of["pkg.low.c"].name, unassigned, unused) == ("top", "low", [], [])
    assert set(upward(found, layer_of)) == {"pkg.low.c -> pkg.top"}
    assert function_counts(found) == {"pkg.low.b": (3, 2)}


def _by_statement(found: list[Import]) -> dict[str, list[Import]]:
    statements: dict[str, list[Import]] = {}
    for imp in found:
        statements.setdefault(imp.at, []).append(imp)
    return statements


def main() -> int:
    found = imports()
    layer_of, unassigned, unused = assign(module_files(), read_layers(ARCHITECTURE.read_text(encoding="utf-8")))
    print(f"{len(module_files())} modules, {sum(i.internal for i in found)} imports between them")
    print(f"\nupward imports ({RULE}):")
    for edge, imps in sorted(upward(found, layer_of).items()):
        print(f"  {edge}  [{', '.join(dict.fromkeys(i.at for i in imps))}]  {KNOWN_UPWARD.get(edge, 'NEW')}")
    print("\ncircles:")
    for circle in sorted(circles(graph(found))):
        print(f"  {circle}  {KNOWN_CIRCLES.get(circle, 'NEW')}")
    function_level = [i for i in found if i.where == "function"]
    print(f"\nfunction-level imports ({len({(i.path, i.line) for i in function_level})} statements; "
          "R: with a one-line reason comment):")
    for at, imps in _by_statement(function_level).items():
        print(f"  {'R' if imps[0].reason else '-'} {at}  {', '.join(i.target for i in imps)}")
    if unassigned or unused:
        print(f"\nmodules in no layer: {unassigned}; entries naming no module: {unused}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
