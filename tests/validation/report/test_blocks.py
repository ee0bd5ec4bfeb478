"""A kind's report blocks (validation.kinds.blocks) rendered to Markdown and HTML by the one renderer."""

from __future__ import annotations

import pytest

from validation.kinds.blocks import Bullets, Column, Paragraph, Table, code, strong
from validation.report.renderer import blocks_html, blocks_markdown


def test_markdown_of_each_block():
    md = blocks_markdown([Paragraph(f"Ran {code('a|b')}:"), Bullets(["one", strong("two")]),
                          Table((Column("Name"), Column("Value", numeric=True)), [("x|y", "1.5"), (None, "line\nbreak")])])
    assert md == ("\nRan `a|b`:\n\n- one\n- **two**\n\n| Name | Value |\n|---|---|\n| x\\|y | 1.5 |\n| n/a | line break |\n")


def test_html_escapes_and_turns_inline_markdown_into_tags():
    html = str(blocks_html([Paragraph("<script> in " + code("x<y")),
                            Table((Column("Key"), Column("Value", numeric=True)), [(strong("a&b"), None)])]))
    assert "<script>" not in html and "&lt;script&gt; in <code>x&lt;y</code>" in html
    assert "<tr><th>Key</th><th>Value</th></tr>" in html
    assert '<tr><td><strong>a&amp;b</strong></td><td class="num">n/a</td></tr>' in html


def test_a_row_must_fill_the_columns():
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        Table(("a", "b"), [("1", "2"), ("3",)])


def test_code_survives_backticks_in_its_value():
    assert code("a`b") == "``a`b``" and code("`x`") == "`` `x` ``"


def test_anything_else_is_refused():
    with pytest.raises(TypeError, match="not a report block"):
        blocks_markdown(["text"])
    with pytest.raises(TypeError, match="not a report block"):
        blocks_html([{"table": 1}])


def test_emphasis_in_html_but_not_inside_code_or_a_word():
    html = str(blocks_html([Paragraph("*Exposed* = the part; " + code("*x*") + "; char* p, 2 * 3 * 4")]))
    assert "<em>Exposed</em> = the part; <code>*x*</code>; char* p, 2 * 3 * 4" in html
