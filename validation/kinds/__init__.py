"""Step kinds: one package per kind of runbook step, and the registry that maps a step's `kind:` to it.

A kind is a validation.kinds.base.StepKind subclass with its Options, its Result (the step's record) and its report
hooks, in a package of its own here (validation/kinds/<kind>/) that registers an instance with ``register``. Every
package and module of this package is imported on first use of the registry, so the kinds are whatever they
register: ``names()`` lists them (``nsa-validate kinds`` prints them, and README's table of kinds is its
``--markdown`` output), and adding one is a new package here. A kind may also be registered from anywhere else (a
plugin by entry point, a test) before the runbook that uses it is read. Nothing outside a kind's package names it
(tests/validation/kinds/test_kind_isolation.py). Modules that register no kind hold what kinds share: base.py (the
StepKind interface), blocks.py (what a kind's part of the report is made of), trainer.py (the trainer's argv,
collecting a launch into metrics, the runs of a multi-launch step), train_report.py, _decision_view.py (the
deciding kinds' report part); a leading underscore marks a helper module the registry does not import itself
(_plot_helpers, _decision_view).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from typing import Any, Iterable

from validation.kinds.base import StepKind
from validation.results.codec import decode
from validation.results.run import Step as StepRecord

# The entry-point group through which an installed distribution adds kinds: each entry point names a StepKind
# subclass (or instance), e.g. in its pyproject.toml:
#     [project.entry-points."nsa_validate.kinds"]
#     shout = "my_package.kinds:Shout"
# The project's own kinds are declared there too; from a source tree without installed metadata (PYTHONPATH, as on
# a GPU machine) they register from this package's modules all the same.
ENTRY_POINT_GROUP = "nsa_validate.kinds"

_REGISTRY: dict[str, StepKind] = {}
_LOAD_ERRORS: dict[str, str] = {}  # entry-point name -> why it did not load (shown by `kinds` and by a runbook using it)
_loaded = False


def _load_builtins() -> None:
    """Import every module of this package but the helpers (a leading underscore), each registering its kinds; then
    the kinds of every ENTRY_POINT_GROUP entry point."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            if not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")
        _load_entry_points()


def _load_entry_points() -> None:
    """Register the kind each ENTRY_POINT_GROUP entry point names (a class is instantiated). One that fails to load
    or is not a StepKind is left out, with the reason kept for `load_errors`; a built-in kind declared again (the
    project's own entry points) is the same kind, not a clash."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {ep.name} = {ep.value}" + (f" (from {ep.dist.name})" if getattr(ep, "dist", None) else "")
        try:
            obj = ep.load()
            kind = obj() if isinstance(obj, type) and issubclass(obj, StepKind) else obj
            known = _REGISTRY.get(getattr(kind, "name", None))
            if known is not None and type(known) is type(kind):
                continue
            register(kind)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the others (or the CLI) down
            _LOAD_ERRORS[ep.name] = f"{where}: {type(exc).__name__}: {exc}"


def load_errors() -> dict[str, str]:
    """{entry-point name: why its kind did not load}: what `nsa-validate kinds` warns about."""
    _load_builtins()
    return dict(_LOAD_ERRORS)


def built_in(name: str) -> bool:
    """Whether kind `name` is one of this package's (its class is defined in a module of validation.kinds)."""
    _load_builtins()
    return name in _REGISTRY and type(_REGISTRY[name]).__module__.startswith(__name__ + ".")


def register(kind: StepKind, *, replace: bool = False) -> StepKind:
    """Make `kind` the kind of every step whose `kind:` is kind.name; returns it. A name already registered is
    refused unless `replace`."""
    if not isinstance(kind, StepKind) or not kind.name or not kind.name.isidentifier():
        raise ValueError(f"a step kind is a StepKind instance with an identifier name, got {kind!r}")
    if kind.name in _REGISTRY and not replace and _REGISTRY[kind.name] is not kind:
        raise ValueError(f"step kind {kind.name!r} is already registered ({type(_REGISTRY[kind.name]).__module__})")
    _REGISTRY[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove a kind registered at run time (tests); this package's own kinds stay."""
    if built_in(name):
        raise ValueError(f"{name!r} is a built-in step kind")
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered kind: this package's kinds by their `listing` (the order a validation goes), then its others
    by package name, then the others (plugins, tests) as registered; the same order whichever module was imported
    first."""
    _load_builtins()
    own = sorted((n for n in _REGISTRY if built_in(n)),
                 key=lambda n: (_REGISTRY[n].listing is None, _REGISTRY[n].listing or 0, type(_REGISTRY[n]).__module__, n))
    return tuple(own) + tuple(n for n in _REGISTRY if not built_in(n))


def get(name: str) -> StepKind:
    """The kind named `name`; KeyError when none is registered."""
    _load_builtins()
    return _REGISTRY[name]


def find(name: object) -> StepKind | None:
    """The kind named `name`, or None (e.g. a results.json written with a kind this process does not know)."""
    _load_builtins()
    return _REGISTRY.get(name) if isinstance(name, str) else None


def kinds() -> list[StepKind]:
    return [_REGISTRY[n] for n in names()]


def table_markdown() -> str:
    """The table of step kinds (`nsa-validate kinds --markdown`; README.md shows it)."""
    rows = ["| kind | what it does | its own keys |", "|---|---|---|"]
    for kind in kinds():
        own = ", ".join(f"`{k}`" for k in kind.keys) or "—"
        rows.append(f"| `{kind.name}` | {kind.summary} | {own} |")
    return "\n".join(rows) + "\n"


def table_rows() -> list[tuple[str, str, str, str]]:
    """The table of step kinds `nsa-validate kinds` prints, one row per kind in names() order: its name, what it does
    (inline-code backticks removed), its own keys ("-" when it has none) and the module that defines it."""
    return [(kind.name, kind.summary.replace("`", ""), ", ".join(kind.keys) or "-", type(kind).__module__)
            for kind in kinds()]


def read_step(entry: Any) -> StepRecord:
    """A step's results.json entry as its kind's Result (StepKind.read: leniently), or as the common step record
    where its kind is unknown to this process."""
    if isinstance(entry, StepRecord):
        return entry
    kind = find(entry.get("kind") if isinstance(entry, dict) else None)
    return kind.read(entry) if kind is not None else decode(StepRecord, entry, "step", lenient=True)


def read_steps(entries: Iterable[Any]) -> list[StepRecord]:
    """Every step's entry, in the order given, each as its own kind's Result (read_step): what key_figures and
    key_figure_steps take."""
    return [read_step(e) for e in entries]
