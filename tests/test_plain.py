"""User-given text inside the dashboard's Markdown is a code span: shown as typed."""

from dashboard.plain import literal


def test_user_text_becomes_one_code_span_that_markdown_cannot_break_out_of():
    assert literal("a.png") == "`a.png`"
    assert literal("[x](https://x.io)") == "`[x](https://x.io)`"
    assert literal("a`b") == "``a`b``"  # a longer fence than any run of backticks inside
    assert literal("`x`") == "`` `x` ``"
    assert literal("line\nbreak") == "`line break`"
    assert literal("abcdef", 3) == "`abc…`"
