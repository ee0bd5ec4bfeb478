"""README.md's Layout section against the tree: every module at the top of nsa/ is named there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layout() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def _entry(layout: str, folder: str) -> str:
    """The text of one top-level folder's entry: its line and the indented lines below it, up to the next entry."""
    lines = layout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(folder + " "))
    body = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith(" " * 16):
            break
        body.append(line)
    return " ".join(body)


def test_every_top_level_nsa_module_is_named_in_the_layout():
    entry = _entry(_layout(), "nsa/")
    named = set(re.findall(r"[A-Za-z_]+", entry))
    modules = sorted(p.stem for p in (ROOT / "nsa").glob("*.py") if p.stem != "__init__")
    missing = [m for m in modules if m not in named]
    assert not missing, f"nsa/ modules the README's Layout does not name: {missing}"
