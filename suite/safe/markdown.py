"""User text made safe where it lands: Markdown table cells, prose, code spans, plot labels.

Every string a user supplies (scenario, variant and machine names, point labels, questions,
descriptions, messages) passes through one of these before it reaches a report or a plot, so a
name such as ``spe=4 | fused`` cannot split a table row or turn a sentence into emphasis.
"""

from __future__ import annotations

import re
from typing import Any

# CommonMark lets a backslash escape any ASCII punctuation; these are the ones that start or end
# inline markup (emphasis, code, links, HTML, entities, GitHub's math, strikethrough) or split a
# table cell. An underscore
# between two letters or digits can neither open nor close emphasis, so names like
# steps_per_execution stay as written.
_SPECIAL = re.compile(r"([\\`*\[\]<>|~&$])|(?<![^\W_])_|_(?![^\W_])")
# What opens a block when it starts a line: a heading, a list item, a quote, a rule.
_BLOCK_START = re.compile(r"^(#|[-+=>]|\d+[.)])")


def escaped(text: str) -> str:
    """``text`` with every control character written as Python escapes it (``\\x1b``, ``\\n``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def escaped_lines(text: str) -> str:
    """``text`` escaped as ``escaped`` does, each line on its own: its newlines are kept."""
    return "\n".join(escaped(line) for line in text.split("\n"))


def one_line(value: Any) -> str:
    """``value`` on one line, any other control character (an escape sequence from a result file
    made elsewhere) written as Python escapes it, so a page shows it instead of a terminal obeying it."""
    return escaped(" ".join(str(value).split()))


def cell(value: Any) -> str:
    """Text shown as itself inside a Markdown table cell or a sentence: one line, markup escaped."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), one_line(value))


def paragraph(value: Any) -> str:
    """User text that stands as a paragraph of its own: ``cell`` plus no heading, list or rule."""
    return _BLOCK_START.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], cell(value))


def code(value: Any, in_table: bool = False) -> str:
    """An inline code span holding the text exactly, whatever backticks it contains.

    Backslashes are literal inside code spans, so the fence is made longer than any run of
    backticks in the text instead. In a table a pipe must still be escaped: GitHub splits cells
    before it parses code spans, and removes the backslash again inside the span.
    """
    text = one_line(value)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip(" ") else ""
    if in_table:
        text = text.replace("|", "\\|")
    return f"{fence}{pad}{text}{pad}{fence}"


def plot_text(value: Any) -> str:
    """A label matplotlib draws as written: one line, and ``$`` not read as the start of math."""
    return one_line(value).replace("$", r"\$")
