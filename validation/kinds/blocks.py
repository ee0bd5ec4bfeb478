"""What a step kind's part of the report is made of: blocks, which the report renders to Markdown and to HTML alike
(validation.report.renderer), so that a kind writes its view once and no template per format.

A kind's ``StepKind.blocks(result)`` returns a list of them, in the order the step section shows them:

    Paragraph(text)             a line of text
    Bullets(items)              a list
    Table(columns, rows)        a table; a Column is its label and whether it holds figures (right-aligned in HTML)

Text anywhere in a block may carry the report's inline Markdown: `code` and **bold** (``code(...)`` and
``strong(...)`` write them); HTML shows them as <code> and <strong>. A cell of None shows as n/a.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Union

from validation.formatting import NA


@dataclasses.dataclass(frozen=True)
class Paragraph:
    text: str


@dataclasses.dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", tuple(self.items))


@dataclasses.dataclass(frozen=True)
class Column:
    label: str
    numeric: bool = False  # figures: right-aligned in HTML


@dataclasses.dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[str | None, ...], ...]

    def __post_init__(self) -> None:
        columns = tuple(c if isinstance(c, Column) else Column(str(c)) for c in self.columns)
        rows = tuple(tuple(row) for row in self.rows)
        for i, row in enumerate(rows):
            if len(row) != len(columns):
                raise ValueError(f"table row {i} has {len(row)} cells for {len(columns)} columns")
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "rows", rows)


Block = Union[Paragraph, Bullets, Table]


def code(value: object) -> str:
    """Inline code, in the report's Markdown: a span that survives backticks inside the value."""
    text = NA if value is None else str(value)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def strong(value: object) -> str:
    return f"**{NA if value is None else value}**"
