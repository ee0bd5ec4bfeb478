"""What a step kind's part of the report is made of: blocks, which the report renders to Markdown and to HTML alike
(validation.report.renderer), so that a kind writes its view once and no template per format.

A kind's ``StepKind.blocks(result)`` returns a list of them, in the order the step section shows them:

    Paragraph(text, style)      a line of text (style: muted, context, flag or note; a class in HTML)
    Heading(text)               a heading inside the step section
    Bullets(items)              a list
    Pairs(rows)                 label and value a row, without column heads (a summary)
    Table(columns, rows, marked) a table; a Column is its label and whether it holds figures (right-aligned in
                                HTML); marked rows (the best, a cliff) are highlighted in HTML

Text anywhere in a block may carry the report's inline Markdown: `code`, **bold** and *emphasis* (``code(...)`` and
``strong(...)`` write the first two); HTML shows them as <code>, <strong> and <em>. A cell of None shows as n/a; a Badge cell is
a status (PASSED, FAILED, ...).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Union

from validation.formatting import NA


STYLES = ("", "muted", "context", "flag", "note")


@dataclasses.dataclass(frozen=True)
class Paragraph:
    text: str
    style: str = ""  # one of STYLES: a side remark (muted), the context of a figure, a flag; HTML's class

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"paragraph style {self.style!r} is not one of {STYLES}")


@dataclasses.dataclass(frozen=True)
class Heading:
    text: str  # a heading inside a step section: bold in Markdown, <h5> in HTML


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Label and value a row, no column heads (a summary)."""
    rows: tuple[tuple[str, str | None], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple((str(k), v) for k, v in self.rows))


@dataclasses.dataclass(frozen=True)
class Badge:
    """A status in a table cell: its label in Markdown, a coloured badge (class "status <css>") in HTML; bold (a
    chosen row's mark), and text after it (a reason)."""
    label: str
    css: str = ""
    bold: bool = False
    after: str | None = None


@dataclasses.dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", tuple(self.items))


@dataclasses.dataclass(frozen=True)
class Column:
    label: str
    numeric: bool = False  # figures: right-aligned in HTML
    wrap: bool = False  # figures that may wrap (a long mean ± stdev)


@dataclasses.dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[str | Badge | None, ...], ...]
    marked: frozenset[int] = frozenset()  # rows to stand out (the best, a cliff): highlighted in HTML

    def __post_init__(self) -> None:
        object.__setattr__(self, "marked", frozenset(self.marked))
        columns = tuple(c if isinstance(c, Column) else Column(str(c)) for c in self.columns)
        rows = tuple(tuple(row) for row in self.rows)
        for i, row in enumerate(rows):
            if len(row) != len(columns):
                raise ValueError(f"table row {i} has {len(row)} cells for {len(columns)} columns")
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "rows", rows)


Block = Union[Paragraph, Heading, Bullets, Table, Pairs]


def code(value: object) -> str:
    """Inline code, in the report's Markdown: a span that survives backticks inside the value."""
    text = NA if value is None else str(value)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def strong(value: object) -> str:
    return f"**{NA if value is None else value}**"
