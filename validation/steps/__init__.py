"""Step kinds: one module per kind of runbook step, and the registry that maps a step's `kind:` to it.

    snapshot      snapshot.py       git sha, collect_env, GPU inventory, package versions (in-process; per node)
    train         train.py          one trainer launch; statistics over its training.csv window
    sweep         sweep.py          a matrix over env/args, the winner by the runbook's rule
    ab            ab.py             baseline vs variants (repeats), Welch t-test, recommendation
    pytest        pytest_suite.py   named tests with JUnit counts
    bench         bench.py          a benchmark script that writes JSON
    profile       profile.py        a trainer run under the torch profiler (or Nsight Systems)
    longrun       longrun.py        a long trainer run under the heartbeat watchdog

trainer.py holds what the trainer-launching kinds share (the trainer's argv, collecting one launch into metrics,
the loop over a sweep's points or an A/B's variants). A kind is a validation.steps.base.StepKind subclass; its module
registers an instance with ``register``. Every module of this package is imported on first use of the registry, so a
new kind is a new module here (plus its partials in templates/); a kind may also be registered from anywhere else
(a plugin, a test) before the runbook that uses it is read.
"""

from __future__ import annotations

import importlib
import pkgutil

from validation.steps.base import StepKind

# The first kinds, in the order the documentation lists them, and their modules; kinds added later follow them.
BUILTIN_KINDS = {"snapshot": "snapshot", "train": "train", "sweep": "sweep", "ab": "ab", "pytest": "pytest_suite",
                 "bench": "bench", "profile": "profile", "longrun": "longrun"}

_REGISTRY: dict[str, StepKind] = {}
_loaded = False


def _load_builtins() -> None:
    """Import every module of this package (the documented kinds first); each registers the kinds it defines."""
    global _loaded
    if not _loaded:
        _loaded = True
        found = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
        for module in [*BUILTIN_KINDS.values(), *(m for m in found if m not in BUILTIN_KINDS.values())]:
            importlib.import_module(f"validation.steps.{module}")


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
    """Remove a kind registered at run time (tests); the built-in kinds stay."""
    if name in BUILTIN_KINDS:
        raise ValueError(f"{name!r} is a built-in step kind")
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered kind: the documented ones first, in documentation order, then the others as registered."""
    _load_builtins()
    return tuple(n for n in BUILTIN_KINDS if n in _REGISTRY) + tuple(n for n in _REGISTRY if n not in BUILTIN_KINDS)


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
