"""Rendering a run's results into report files: Markdown and HTML through Jinja2 templates shipped as package data
(validation/report/templates; each step kind's own part as blocks, validation.kinds.blocks, rendered here to both),
JSON, JUnit (validation.report.junit), and writing them with the plots into the run directory.

Rendering is pure: the same results give byte-identical output (nothing about the time of rendering goes in).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from markupsafe import Markup, escape

from nsa.training.outputs import atomic_write
from validation import report
from validation.formatting import NA, printable
from validation.kinds.blocks import Badge, Block, Bullets, Heading, Pairs, Paragraph, Table, code
from validation.report.junit import render_junit
from validation.report.view import build_view
from validation.results.store import read_results

FORMATS = ("md", "html", "json", "junit")
TEMPLATES_DIR = resources.files("validation.report") / "templates"  # package data: found wherever it is installed
TEMPLATE_NAMES = {"md": "report.md.j2", "html": "report.html.j2"}
REPORT_FILES = {"md": "report.md", "html": "report.html", "json": "report.json", "junit": "junit.xml"}


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a surrogate code point, which UTF-8 cannot encode


class ReportError(RuntimeError):
    """A report cannot be produced (unknown format, templates not found)."""


def render(results: dict, fmt: str = "md", *, run_dir: Path | None = None,
           plots: list[dict] | None = None) -> str:
    """results (the results.json dict) as a report in fmt (one of FORMATS); pure and deterministic.

    run_dir, when given, is the run directory the report will sit in: plots whose PNG is not there are left out
    and artifacts that are not there are marked missing. plots overrides results["plots"] ([{"title", "path"}]).
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt == "json":
        # a lone surrogate (a name decoded from bytes that are not UTF-8, read back from results.json's "\\udcff")
        # as that escape again: UTF-8 holds none, so the text could be neither written nor printed
        text = json.dumps(results, indent=2, sort_keys=True, ensure_ascii=False)
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text) + "\n"
    if fmt == "junit":
        return render_junit(results)
    text = _template(fmt).render(r=build_view(results, run_dir=run_dir, plots=plots, inline_plots=fmt == "html"))
    return _tidy_markdown(text) if fmt == "md" else text


def write_reports(run_dir: Path, results: dict | None = None, formats: Iterable[str] = ("md", "html", "junit"),
                  plots: bool = True) -> list[Path]:
    """Write the reports of a run into run_dir and return the paths written (plots first).

    results defaults to RUN_DIR/results.json (validation.results.store.read_results); results.json itself is never
    written here. With plots=True, plots/*.png are made first and shown in the reports. A report file that cannot
    be written raises OSError whose filename is that report's path (report.html, not a temp file beside it); the
    reports replaced before it are whole and new, those after it whole and as they were.
    """
    run_dir = Path(run_dir)
    formats = tuple(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ReportError(f"unknown report format {unknown[0]!r} (expected one of {', '.join(FORMATS)})")
    if results is None:
        results = read_results(run_dir)
    for fmt in formats:
        if fmt in TEMPLATE_NAMES:
            _template(fmt)  # a template is missing: fail before writing anything
    written: list[Path] = []
    plot_list = None
    if plots:
        plot_list = report.make_plots(results, run_dir)  # the package loads plots (matplotlib) on first use
        written += [run_dir / p["path"] for p in plot_list]
    # every file rendered from the same results before any is replaced, each replaced whole (temp + rename): an
    # interruption leaves each report as it was or as it is now, never half written, and keeps the window in
    # which the reports disagree with each other to the renames alone
    texts = {fmt: render(results, fmt, run_dir=run_dir, plots=plot_list) for fmt in formats}
    for fmt, text in texts.items():
        target = run_dir / REPORT_FILES[fmt]
        try:
            written.append(atomic_write(target, text.encode("utf-8")))
        except OSError as exc:  # named by the report's own path: atomic_write's names its temp file, gone again
            raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc
    return written


# --------------------------------------------------------------------------------------------------------------
# Templates

def _md_cell(value: Any) -> str:
    """Text safe inside a Markdown table cell: no pipes, no line breaks (md_text is applied after it)."""
    text = NA if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", " ") or NA


class _MarkdownDone(str):
    """Markdown the md template shows as it is (a kind's blocks, already made safe; a fenced block's lines): the
    template's finalize (md_text) leaves it alone but for control characters."""


_LINE_BREAK = re.compile(r"[ \t]*(?:\r\n|\r|\n)[ \t]*")
# an unescaped `<` that can open raw HTML or an autolink in CommonMark (a tag, a closing tag, a comment, a
# declaration, a processing instruction, <scheme:...>), and an inline link's or image's `](`
_HTML_START = re.compile(r"(?<!\\)((?:\\\\)*)<(?=[A-Za-z/!?])")
_LINK_START = re.compile(r"\]\(")
_BACKTICKS = re.compile(r"`+")


def _escaped(text: str, index: int) -> bool:
    """The character at `index` follows an odd number of backslashes: a backslash escape in Markdown."""
    n = 0
    while index - n > 0 and text[index - n - 1] == "\\":
        n += 1
    return n % 2 == 1


def _outside_code(text: str, change) -> str:
    """text with `change` applied to what lies outside its Markdown code spans (a run of n backticks to the next run
    of exactly n: CommonMark's rule; an unmatched run is literal text, and so is a backslash-escaped backtick outside
    a code span, which opens none)."""
    out, start, pos = [], 0, 0
    while True:
        opening = _BACKTICKS.search(text, pos)
        if opening is None:
            break
        begin = opening.start() + _escaped(text, opening.start())  # an escaped first backtick is text
        n = opening.end() - begin
        closing = next((m for m in _BACKTICKS.finditer(text, opening.end()) if len(m.group(0)) == n), None) \
            if n else None
        if closing is None:
            pos = opening.end()
            continue
        out += [change(text[start:begin]), text[begin:closing.end()]]
        start = pos = closing.end()
    return "".join(out + [change(text[start:])])


# a backtick outside the value's code spans (one of a run that closes none) that no backslash escapes yet
_LONE_BACKTICK = re.compile(r"(?<!\\)((?:\\\\)*)`")


def _md_escape(text: str) -> str:
    text = _LONE_BACKTICK.sub(lambda m: m.group(1) + "\\`", text) if "`" in text else text
    return _LINK_START.sub("]\\(", _HTML_START.sub(lambda m: m.group(1) + "\\<", text))


def md_text(value: Any, *, lines: bool = False) -> str:
    """A value as Markdown text that keeps the report's structure, whatever it holds (a GPU name, a hostname, a
    branch, a step's title or reason): control characters as printable() shows them, line breaks as spaces (a
    heading, a list item or a bold label stays one line; `lines`: kept, for a description's paragraphs), and
    outside code spans no raw HTML or autolink (`<` escaped, so a `<script>` shows as text wherever the Markdown is
    rendered) and no inline link or image (`](` escaped), and a backtick that closes no code span of the value
    escaped (it would otherwise pair with a code span the report puts after the value, on the same line, and leave
    that span's text, a `<` included, outside code), as is a fence (``` or ~~~) the value opens and never closes
    (it would take the rest of the report into a code block). Idempotent; the report's own inline Markdown (code
    spans, **bold**) is kept."""
    if isinstance(value, _MarkdownDone):
        return value
    text = printable(value)
    if not lines:
        return _md_line(_LINE_BREAK.sub(" ", text))
    return _md_paragraphs(text)


# a line that opens a fenced code block in CommonMark: up to 3 spaces, then 3 or more backticks (an info string of
# no backtick after them) or tildes
_FENCE_OPEN = re.compile(r"^( {0,3})(`{3,}(?=[^`]*$)|~{3,})")


def _md_line(text: str) -> str:
    """md_text of one line: a fence it opens escaped (no later line closes it), then what lies outside its code
    spans."""
    opening = _FENCE_OPEN.match(text)
    if opening is not None:
        text = opening.group(1) + "\\" + text[len(opening.group(1)):]
    return _outside_code(text, _md_escape) if ("<" in text or "](" in text or "`" in text) else text


def _md_paragraphs(text: str) -> str:
    """md_text keeping line breaks (as \\n): each line on its own (a code span across lines could span two blocks,
    where CommonMark pairs no backticks, and leave a `<` outside code), but a fenced code block the value opens and
    closes itself (a description's example) kept as it is, its lines being code."""
    lines = re.split(r"\r\n|\r|\n", text)
    out: list[str] = []
    i = 0
    while i < len(lines):
        opening = _FENCE_OPEN.match(lines[i])
        if opening is not None:
            run = opening.group(2)
            closing = re.compile(rf" {{0,3}}{re.escape(run[0])}{{{len(run)},}}[ \t]*")
            end = next((j for j in range(i + 1, len(lines)) if closing.fullmatch(lines[j])), None)
            if end is not None:
                out += lines[i:end + 1]
                i = end + 1
                continue
        out.append(_md_line(lines[i]))
        i += 1
    return "\n".join(out)


_LINK_TEXT_SPECIAL = re.compile(r"([\\\[\]])")


def md_link_text(value: Any) -> _MarkdownDone:
    """md_text for the text of a Markdown image or link (`![text](...)`): outside code spans a backslash or bracket
    of the value escaped, so that the text ends at the report's own `]` whatever brackets the value holds."""
    text = _LINE_BREAK.sub(" ", printable(value))
    return _MarkdownDone(md_text(_outside_code(text, lambda part: _LINK_TEXT_SPECIAL.sub(r"\\\1", part))))


def md_destination(path: Any) -> _MarkdownDone:
    """A relative path as a Markdown link destination that resolves to that file from the report: every character
    a URL or Markdown reads otherwise (a space, `#`, `?`, `%`, parentheses, `<`, non-ASCII) percent-encoded (UTF-8),
    `/` kept."""
    return _MarkdownDone(quote(printable(path), safe="/"))


def _md_finalize(value: Any) -> str:
    """What every {{ }} of a Markdown template shows: md_text, or printable text where the template marked it done
    (a kind's blocks, a fenced block's lines: the `verbatim` filter)."""
    if isinstance(value, _MarkdownDone):
        return printable(value)
    return md_text(value)


def _template(fmt: str):
    """The Jinja2 template of fmt ("md" or "html"); ReportError naming the folder when it is not there."""
    path = TEMPLATES_DIR / TEMPLATE_NAMES[fmt]
    if not path.is_file():
        what = "folder" if not TEMPLATES_DIR.is_dir() else f"template {TEMPLATE_NAMES[fmt]}"
        raise ReportError(
            f"report templates not found: no {what} at {path if what != 'folder' else TEMPLATES_DIR} "
            f"(the templates are package data of validation.report: report.md.j2 and report.html.j2 in "
            f"validation/report/templates/; reinstall nsa-validate, e.g. `pip install .`)")
    return _jinja_env(fmt).get_template(TEMPLATE_NAMES[fmt])


def _load(name: str) -> str | None:
    """A template's source from TEMPLATES_DIR; None when there is none."""
    path = TEMPLATES_DIR / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _tidy_markdown(text: str) -> str:
    """At most one blank line in a row and none at the end, except inside fenced code blocks."""
    out: list[str] = []
    fence = None
    for line in text.split("\n"):
        stripped = line.strip()
        if fence is None:
            match = re.match(r"^(`{3,})", stripped)
            if match:
                fence = match.group(1)
            elif not stripped and (not out or not out[-1].strip()):
                continue
        elif stripped == fence:
            fence = None
        out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_STRONG = re.compile(r"\*\*(.+?)\*\*", re.S)
_CODE_TAGS = re.compile(r"(<code>.*?</code>)", re.S)


def html_text(value: Any):
    """A value as HTML text: escaped (control characters as printable() shows them), with the inline Markdown that
    free text carries (step names in backticks, **bold**) turned into <code> and <strong>, so the page never shows
    literal Markdown. Markup passes as is."""
    if isinstance(value, Markup):
        return value
    text = str(escape(printable(value)))
    if "`" in text:
        text = _CODE_SPAN.sub(lambda m: f"<code>{m.group(2).strip()}</code>", text)
    if "**" in text:  # outside code only, so that <strong> never crosses a <code> (a `x ** 2` in a reason)
        text = _outside_code_tags(text, lambda part: _STRONG.sub(lambda m: f"<strong>{m.group(1)}</strong>", part))
    return Markup(text)


def _outside_code_tags(html: str, change) -> str:
    """html with `change` applied to what lies outside its <code> elements."""
    parts = _CODE_TAGS.split(html)
    return "".join(part if i % 2 else change(part) for i, part in enumerate(parts))


def blocks_markdown(blocks: Iterable[Block]) -> str:
    """A kind's blocks (validation.kinds.blocks) as Markdown, each after a blank line (a cell of None: n/a; an
    empty one stays empty)."""
    def cell(v: Any) -> str:
        if isinstance(v, Badge):
            return md_text(_md_cell((f"**{v.label}**" if v.bold else v.label) + (f" ({v.after})" if v.after else "")))
        return md_text(_md_cell(v)) if v != "" else ""

    out: list[str] = []
    for block in blocks:
        out.append("")
        if isinstance(block, Paragraph):
            out.append(md_text(block.text))
        elif isinstance(block, Heading):
            out.append(f"**{md_text(block.text)}**")
        elif isinstance(block, Bullets):
            out.extend(f"- {md_text(item)}" for item in block.items)
        elif isinstance(block, Table):
            out.append("| " + " | ".join(cell(c.label) if c.label else "" for c in block.columns) + " |")
            out.append("|" + "---|" * len(block.columns))
            out.extend("| " + " | ".join(cell(v) for v in row) + " |" for row in block.rows)
        elif isinstance(block, Pairs):
            out += ["| | |", "|---|---|"] + [f"| {cell(k)} | {cell(v)} |" for k, v in block.rows]
        else:
            raise TypeError(f"not a report block: {block!r}")
    return "\n".join(out) + "\n"


def blocks_html(blocks: Iterable[Block]) -> Markup:
    """A kind's blocks as HTML (escaped; inline Markdown as <code> and <strong>)."""
    def cell(v: Any) -> Markup:
        if isinstance(v, Badge):
            label = Markup(f"<strong>{escape(printable(v.label))}</strong>") if v.bold else escape(printable(v.label))
            after = Markup(" (") + _inline(v.after) + Markup(")") if v.after else ""
            return Markup(f'<span class="status {escape(v.css)}">{label}</span>{after}')
        return _inline(NA if v is None else v)

    out: list[str] = []
    for block in blocks:
        if isinstance(block, Paragraph):
            out.append(f"<p{_class(block.style)}>{_inline(block.text)}</p>")
        elif isinstance(block, Heading):
            out.append(f"<h5>{_inline(block.text)}</h5>")
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"\n  <li>{_inline(item)}</li>" for item in block.items) + "\n</ul>")
        elif isinstance(block, Table):
            classes = [_class(" ".join(k for k, on in (("num", c.numeric), ("wrap", c.wrap)) if on))
                       for c in block.columns]
            head = "".join(f"<th>{_inline(c.label)}</th>" for c in block.columns)
            body = "".join(f"\n  <tr{_class('best') if i in block.marked else ''}>"
                           + "".join(f"<td{k}>{cell(v)}</td>" for k, v in zip(classes, row)) + "</tr>"
                           for i, row in enumerate(block.rows))
            out.append(f'<div class="table-wrap"><table>\n  <tr>{head}</tr>{body}\n</table></div>')
        elif isinstance(block, Pairs):
            body = "".join(f'\n  <tr><th>{_inline(k)}</th><td class="num">{cell(v)}</td></tr>' for k, v in block.rows)
            out.append(f'<div class="table-wrap"><table class="summary">{body}\n</table></div>')
        else:
            raise TypeError(f"not a report block: {block!r}")
    return Markup("\n".join(out))


# no tag inside: an <em> never crosses a <strong> or <code> the text already holds
_EMPHASIS = re.compile(r"(?<![\w*])\*(?=[A-Za-z])([^*\n<>]+?)(?<=[\w)])\*(?![\w*])")


def _inline(value: Any) -> Markup:
    """html_text, and *emphasis* as <em> (a block's text only, outside code: a word's own asterisks, as in char*,
    and those inside `code` stay)."""
    return Markup(_outside_code_tags(str(html_text(value)),
                                     lambda part: _EMPHASIS.sub(lambda m: f"<em>{m.group(1)}</em>", part)))


def _class(name: str) -> str:
    return f' class="{name}"' if name else ""


def _verbatim(value: Any):
    """Escaped text shown exactly as it is (a traceback, a command): no Markdown turned into HTML (control
    characters as printable() shows them)."""
    return Markup(str(escape(printable(value))))


def _md_verbatim(value: Any) -> _MarkdownDone:
    """Text a Markdown template shows as it is: a fenced block's lines (a traceback, a command)."""
    return _MarkdownDone("" if value is None else str(value))


def _md_lines(value: Any) -> _MarkdownDone:
    """md_text keeping line breaks: a description's paragraphs."""
    return _MarkdownDone(md_text(value, lines=True))


def _jinja_env(fmt: str):
    """The Jinja2 environment of fmt: HTML autoescapes and turns inline Markdown in values into HTML (html_text).
    One per format and templates folder in a process, so that a template is compiled once (0.06-0.1 s each), not at
    every report a process renders."""
    return _env_for(fmt, TEMPLATES_DIR)


@functools.lru_cache(maxsize=None)
def _env_for(fmt: str, templates_dir: Path):
    import jinja2  # start-up: jinja2 loads when a report is rendered, not with nsa-validate --help

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        autoescape=lambda name: bool(name) and name.endswith((".html.j2", ".html")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=html_text if fmt == "html" else _md_finalize,
    )
    env.filters["cell"] = _md_cell
    env.filters["link_text"] = md_link_text
    env.filters["destination"] = md_destination
    env.filters["code"] = code
    env.filters["blocks"] = (lambda blocks: _MarkdownDone(blocks_markdown(blocks))) if fmt == "md" else blocks_html
    env.filters["verbatim"] = _md_verbatim if fmt == "md" else _verbatim
    env.filters["lines"] = _md_lines if fmt == "md" else html_text
    return env
