"""User text cannot break a report: names with Markdown and table syntax, rendered by a real parser.

The reference is markdown-it-py (CommonMark with GitHub's table rule), not the suite's own code:
every table row must have as many cells as its header, and each user string must come out as
the same plain text, not as emphasis, code or a split cell.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import suite_cli, write_scenario
from markdown_it import MarkdownIt

from suite.safe.markdown import cell, code, plot_text

NAMES = ["spe=4 | fused", "*bold* `tick` _u_ $x$ <b>", "two\nlines ~~x~~ [l](u)"]

SCENARIO = """\
name: escapes
question: "Does | break * the `table`?"
description: "# a | b *c* &amp; $y$"
model: {hidden: [16]}
training: {epochs: 2}
data: {allow_synthetic: true, train_samples: 512, test_samples: 256}
repeats: 1
variants:
  - name: default
  - name: "spe=4 | fused"
    set: {training.steps_per_execution: 4}
  - name: "*bold* `tick` _u_ $x$ <b>"
    set: {training.steps_per_execution: 2}
  - name: "two\\nlines ~~x~~ [l](u)"
    set: {training.shuffle: false}
report: {baseline: {variant: default}, verdict: knobs}
"""


def _tables(html_tokens: list) -> list[list[list[str]]]:
    """Every table as rows of cell texts (header row first), from markdown-it's token stream."""
    tables, rows, row = [], [], None
    for i, tok in enumerate(html_tokens):
        if tok.type == "table_open":
            rows = []
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open"):
            inline = html_tokens[i + 1]
            row.append(inline.content if inline.type == "inline" else "")
        elif tok.type == "tr_close":
            rows.append(row)
        elif tok.type == "table_close":
            tables.append(rows)
    return tables


def _md() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


@pytest.mark.slow
def test_names_with_markdown_syntax_keep_every_table_whole(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "escapes", SCENARIO)
    res, out = tmp_path / "res", tmp_path / "reports"
    # A machine name is one safe folder name (docs/limits.md); its underscores could still read as emphasis.
    run = suite_cli("run", path, "--backend", "local", "--results", res, "--machine", "box_1_a_", "--allow-synthetic")
    assert run.returncode == 0, run.stdout + run.stderr
    # The variant named with a line break is one line on the console, as on the pages.
    assert "[variant=two lines ~~x~~ [l](u)]" in run.stdout, run.stdout
    assert not any(line.startswith("lines ~~x~~") for line in run.stdout.splitlines()), run.stdout
    rep = suite_cli("report", "--results", res, "--out", out)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    md = _md()
    for page in ("escapes.md", "README.md", "hardware.md"):
        text = (out / page).read_text()
        tokens = md.parse(text)
        tables = _tables(tokens)
        assert tables, page
        for table in tables:
            header = len(table[0])
            assert all(len(r) == header for r in table), (page, [len(r) for r in table])
        html = md.render(text)
        # What the user's strings would turn into if read as markup: none of it may appear.
        for markup in (
            "<em>bold</em>",
            "<code>tick</code>",
            "<em>u</em>",
            "<em>c</em>",
            "<s>x</s>",
            '<a href="u"',
            "<b>",
        ):
            assert markup not in html, (page, markup)
    page = (out / "escapes.md").read_text()
    html = md.render(page)
    assert "<h1>a" not in html and "# a | b *c* &amp;amp; $y$" in html, "the description is one plain paragraph"
    results = next(t for t in _tables(md.parse(page)) if t[0][0] == "point")
    labels = [r[0] for r in results[1:]]
    # Rendered back to text, each label is the user's string (newline folded to a space).
    rendered = [md.renderInline(label) for label in labels]
    for name in NAMES:
        want = " ".join(name.split()).replace("<", "&lt;").replace(">", "&gt;")
        assert f"variant={want}" in rendered, (want, rendered)
    assert (out / "escapes.box_1_a_.png").is_file(), "the plot is drawn with the same names"


def test_cell_escapes_markup_and_folds_lines() -> None:
    assert cell("a|b\nc") == "a\\|b c"
    assert cell("*x* `y` _z_") == "\\*x\\* \\`y\\` \\_z\\_"
    md = _md()
    for text in NAMES:
        assert md.renderInline(cell(text)) == " ".join(text.split()).replace("<", "&lt;").replace(">", "&gt;")


def test_code_span_holds_any_backticks() -> None:
    md = _md()
    for text in ["plain", "a`b", "``x``", "`lead", "trail`", "box|1"]:
        html = md.renderInline(code(text))
        assert html == f"<code>{text}</code>", (text, html)


def test_plot_text_is_not_math() -> None:
    assert plot_text("cost $5\n$6") == r"cost \$5 \$6"
