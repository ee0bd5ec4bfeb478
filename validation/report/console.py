"""Tables and lines on the console, for every command that prints one (plan, run's summary, list, kinds, compare).

Where stdout is not a terminal (a pipe, a file, a CI log) nothing is ever wrapped or cut: a table is one line per
row, its columns padded to their widest value, every name and value in full however long the line gets (rich would
wrap at 80 columns and cut values with an ellipsis). On a terminal a table is a rich Table whose cells fold
(wrap inside the cell) instead of being cut. Lines printed with print_line never wrap when not on a terminal.

Every name and value is printed as its text (validation.formatting.printable): a terminal escape sequence inside one
(a coloured log line in a failure's reason) is taken out, another control character shown as U+FFFD, so a value
never recolours or moves the cursor of the console or log it lands in. Nothing in a value is read as rich markup or
an emoji code ("[red]", "[tests/x.py]", ":x:" and a trailing backslash print as they are), on a terminal or not.

Output that cannot be written (stdout on a full disk or over a quota, `> FILE`; an I/O error) is no traceback: the
console's stream records the first OS error and drops what follows, the command goes on to its end, and end_output
then prints one line naming the stream and the error and ends the command with exit 2 (not 1: `compare`'s
regression, not 0: nothing of it lost unsaid).

Only rich, validation.formatting and validation.results.store's OS error text are imported here (validation.cli's
start-up stays light).
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Sequence

import typer

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from validation.formatting import printable
from validation.results.store import os_error_text

# Styles of the words the tables show (status, verdict) on a terminal; plain words elsewhere.
STYLES = {"PASS": "green", "PASSED": "green", "GO": "green", "better": "green",
          "FAIL": "red", "FAILED": "red", "ERROR": "red", "NO-GO": "red", "HANG": "red", "TIMEOUT": "red",
          "worse": "red", "WARN": "yellow", "INCOMPLETE": "yellow", "SKIPPED": "dim", "invalid": "red"}
GAP = "  "
STREAM_NAMES = {"stdout": "standard output", "stderr": "standard error"}

# The first OS error of a write to each stream that failed other than by its reader going (BrokenPipeError: unread):
# {"stdout": "No space left on device [ENOSPC]"}; end_output reads and clears it.
_UNWRITTEN: dict[str, str] = {}


class _Stream:
    """A console's file: sys.stdout or sys.stderr as it is at each write (a test's capture included). A write or
    flush failing with an OSError other than BrokenPipeError (which rich hands to on_broken_pipe) is recorded in
    _UNWRITTEN and the stream's output is dropped from then on (unwritable), instead of a traceback."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        # isatty, encoding, fileno of the stream; while a rich Live display holds sys.stdout (a FileProxy), its
        # rich_proxied_file, which rich's Console.file then writes to directly (not back through the proxy)
        return getattr(getattr(sys, self._name), attr)

    def _call(self, method: str, *args) -> None:
        stream = getattr(sys, self._name)
        if stream is None or self._name in _UNWRITTEN:
            return
        try:
            getattr(stream, method)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            unwritable(self._name, exc)

    def write(self, text: str) -> int:
        self._call("write", text)
        return len(text)

    def flush(self) -> None:
        self._call("flush")


def unwritable(name: str, exc: OSError) -> None:
    """A write to sys.<name> ("stdout", "stderr") failed with `exc`: recorded (the first error) for end_output, and
    the stream's file descriptor pointed at /dev/null where it has one, so that what Python still holds for it
    (its buffer, flushed at exit) goes nowhere instead of failing again."""
    _UNWRITTEN.setdefault(name, os_error_text(exc))
    stream = getattr(sys, name)
    try:
        stream.fileno()  # a test's capture has none, and Python holds nothing for it at exit
        unread(stream)
    except (OSError, ValueError, AttributeError):
        pass


def end_output(err: Console, code: int | None = None, keep_code: bool = False) -> None:
    """The end of a command's output: when a write to stdout or stderr failed (_Stream, echo), exit 2, with one line
    on `err` for stdout ("nsa-validate: error: cannot write standard output: No space left on device [ENOSPC]"); with
    `keep_code` (`run`: its verdict's exit code stands, its results are in RUN_DIR) the line alone; otherwise exit
    `code` (None: the command goes on). The record is cleared either way."""
    lost = dict(_UNWRITTEN)
    _UNWRITTEN.clear()
    for name, why in lost.items():
        if name != "stderr":
            err.print(f"nsa-validate: error: cannot write {STREAM_NAMES[name]}: {why}", markup=False, soft_wrap=True)
    if lost and not keep_code:
        raise typer.Exit(2)
    if code is not None:
        raise typer.Exit(code)


def make_console(stderr: bool = False) -> Console:
    """The CLI's console: soft-wrapped (no line breaks inserted) when it is not a terminal; no emoji codes (a path
    or value holding ":x:" prints as it is, and statuses are words); a reader that has gone (`| head -1`) is
    unread(), not rich's own exit 1; a write that fails otherwise (a full disk) is recorded for end_output and what
    follows dropped, not a traceback."""
    console = Console(file=_Stream("stderr" if stderr else "stdout"), stderr=stderr, highlight=False, emoji=False)
    if not console.is_terminal:
        console.soft_wrap = True
    console.on_broken_pipe = lambda: unread(sys.stderr if stderr else sys.stdout, console)
    return console


def unread(stream, console: Console | None = None) -> None:
    """The reader of `stream` has gone (`| head -1`): what is printed to it from here on is dropped, and the command
    goes on to its own end and exit code (rich and click exit 1 at once: for `run` NO-GO, the run cut off mid-step
    with its step left `running`; for `compare` a regression; rich's own also dropped stdout for stderr)."""
    if console is not None:
        console.quiet = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


def echo(text: str, nl: bool = True) -> None:
    """typer.echo to stdout, unread() when its reader has gone; a write that fails otherwise (a full disk) is
    recorded for end_output (unwritable) and stdout's later output dropped."""
    if "stdout" in _UNWRITTEN:
        return
    try:
        typer.echo(text, nl=nl)
    except BrokenPipeError:
        unread(sys.stdout)
    except OSError as exc:
        unwritable("stdout", exc)


def _cell(value: object) -> str:
    """One table cell as a single line of text."""
    text = printable(value)
    return " ".join(text.split()) if ("\n" in text or "\r" in text or "\t" in text) else text


def table_lines(columns: Sequence[str], rows: Iterable[Sequence[object]], title: str | None = None) -> list[str]:
    """A table as plain lines: the title (if any), the header, then one line per row, columns padded to their
    widest cell (in terminal cells: a CJK character takes two, a combining mark none) and separated by two spaces,
    nothing cut; the last column is not padded."""
    body = [[_cell(v) for v in row] for row in rows]
    header = [_cell(c) for c in columns]
    n = len(header)
    body = [(row + [""] * n)[:n] for row in body]
    widths = [max([cell_len(header[i])] + [cell_len(r[i]) for r in body]) for i in range(n)]

    def line(cells: list[str]) -> str:
        return GAP.join(c + " " * (widths[i] - cell_len(c)) if i < n - 1 else c
                        for i, c in enumerate(cells)).rstrip()

    out = [_cell(title)] if title else []
    out.append(line(header))
    out += [line(r) for r in body]
    return out


def print_table(console: Console, columns: Sequence[str], rows: Iterable[Sequence[object]],
                title: str | None = None, styles: dict[str, str] | None = None) -> None:
    """Print a table: plain full lines when `console` is not a terminal (table_lines), else a rich Table whose
    cells fold. `styles` maps a cell's exact text to a rich style (default STYLES), applied on a terminal only."""
    rows = [list(r) for r in rows]
    if not console.is_terminal:
        for text in table_lines(columns, rows, title):
            console.print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)
        return

    styles = STYLES if styles is None else styles
    # Text, not str: never read as markup or emoji codes
    table = Table(title=Text(_cell(title), style="table.title") if title else None)
    for col in columns:
        table.add_column(Text(_cell(col)), overflow="fold")
    for row in rows:
        texts = [_cell(value) for value in row]
        table.add_row(*[Text(text, style=styles.get(text) or "") for text in texts])
    console.print(table)


def print_line(console: Console, text: str, style: str | None = None) -> None:
    """One line of plain text (no markup or emoji code interpreted), styled on a terminal only, never wrapped
    elsewhere."""
    print_text(console, Text(printable(text), style=style if style and console.is_terminal else ""))


def print_lines(console: Console, lines: Iterable[tuple[str, str | None]]) -> None:
    """(text, style) pairs, each printed by print_line: what plan, `run --dry-run` and run's summary print."""
    for text, style in lines:
        print_line(console, text, style)


def print_summary(console: Console, columns: Sequence[str], rows: Sequence[Sequence[object]],
                  lines: Iterable[tuple[str, str | None]], title: str | None = None) -> None:
    """A table (print_table), left out when it has no rows, then (text, style) lines (print_lines): run's summary
    (validation.report.view.console_summary)."""
    if rows:
        print_table(console, columns, rows, title=title)
    print_lines(console, lines)


def print_text(console: Console, text: Text) -> None:
    """A rich Text as it is (a Text is never read as markup or emoji codes): no highlighting, never wrapped when
    `console` is not a terminal."""
    console.print(text, highlight=False, soft_wrap=not console.is_terminal)
