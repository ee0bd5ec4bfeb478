"""Every NSA_* environment toggle, defined in one place.

Each toggle is read ONCE, when the component that uses it is built (never inside a hot path), and parsed into a
typed value here; a value that cannot be parsed is an error naming the variable. The table below is the
documentation: `python -m nsa.toggles` prints it.

Toggles are the seed runbook's (../shared/seeds/004_*) and keep the meaning it gives them. A toggle is added
here together with the code that reads it, so this table never lists one that does nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class Toggle:
    name: str
    kind: str  # "bool", "int", "choice"
    default: object
    consumer: str
    help: str
    choices: tuple[str, ...] = ()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

TOGGLES: dict[str, Toggle] = {
    t.name: t
    for t in (
        Toggle("NSA_PREFILL_BATCHED", "bool", None, "nsa.NSAAttention",
               "1: vectorized prefill (cfg.prefill='batched'); 0: per-token oracle loop ('sequential'). "
               "Unset: the config decides."),
        Toggle("NSA_SEL_RANGES_V2", "bool", None, "nsa.NSAAttention",
               "1: vectorized selection-range builder (cfg.selection='v2'); 0: the simple loop ('v1'). "
               "Unset: the config decides."),
    )
}


def parse(name: str, environ: Mapping[str, str] | None = None):
    """The typed value of toggle `name` from `environ` (default: os.environ); its default when unset."""
    toggle = TOGGLES[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return toggle.default
    value = raw.strip().lower()
    parsers: dict[str, Callable[[str], object]] = {
        "bool": _parse_bool,
        "int": int,
        "choice": lambda v: v if v in toggle.choices else _bad(v),
    }
    try:
        return parsers[toggle.kind](value)
    except ValueError:
        expected = {"bool": "0 or 1", "int": "an integer", "choice": " | ".join(toggle.choices)}[toggle.kind]
        raise ValueError(f"environment variable {name}={raw!r} is invalid: expected {expected}") from None


def _parse_bool(value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(value)


def _bad(value: str):
    raise ValueError(value)


def table_markdown() -> str:
    rows = ["| variable | values | default | used by | meaning |", "|---|---|---|---|---|"]
    for t in TOGGLES.values():
        values = {"bool": "0/1", "int": "integer", "choice": "/".join(t.choices)}[t.kind]
        default = "unset" if t.default is None else str(t.default)
        rows.append(f"| `{t.name}` | {values} | {default} | {t.consumer} | {t.help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(table_markdown())
