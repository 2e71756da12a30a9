"""Lines for the console: the width every plain line fits, and a long line fitted to it.

Text on these lines may come from a result file made elsewhere: a line holding a control character
is never split, so the command that prints it escaped (``markdown.escaped``) shows it whole.
"""

from __future__ import annotations

import os
import re
import textwrap

# Each host's run under ``run --hosts`` gets WIDTH_ENV: its lines, with ``[host] `` in front, still fit.
WIDTH_ENV, MIN_WIDTH, MAX_WIDTH = "SUITE_LINE_WIDTH", 60, 120


def _width() -> int:
    """Columns every plain line fits, whatever the terminal: 120, or fewer where WIDTH_ENV says."""
    value = os.environ.get(WIDTH_ENV, "")
    digits = value.isascii() and value.isdigit() and len(value) < 4  # int() refuses other scripts' digits
    return min(max(int(value), MIN_WIDTH), MAX_WIDTH) if digits else MAX_WIDTH


WIDTH = _width()


def fitted(line: str, column: int, width: int = WIDTH) -> list[str]:
    """``line`` in lines of ``width`` columns. It goes on under its value where a key pads it to a
    column ("image:        name ..."), else two columns further in than it starts where indented,
    else (a fact with no indent) under ``column``. Lines break after a semicolon where they can,
    else after a comma (so a "key value" pair stays whole), else at spaces, a part too long for a
    line starting one of its own (a longer word alone on its line). A line holding a control
    character is left whole: it quotes a record, which the command prints escaped, never split or
    changed."""
    if len(line) <= width or not line.isprintable():
        return [line]
    lead = len(line) - len(line.lstrip(" "))
    padded = re.match(r" *[^ :][^:]*:  +(?=\S)", line)
    indent = " " * (len(padded.group()) if padded else lead + 2 if lead else column)
    out = [" " * lead]

    def place(text: str, separators: tuple[str, ...]) -> None:
        joined = out[-1] + (" " if out[-1].strip() else "") + text
        if len(joined) <= width:
            out[-1] = joined
        elif len(indent) + len(text) <= width:
            out.append(indent + text)
        elif separators:
            for piece in re.split(rf"(?<={re.escape(separators[0])}) ", text):
                place(piece, separators[1:])
        else:  # on a line of its own, at spaces
            if out[-1].strip():
                out.append(indent)
            out[-1:] = textwrap.wrap(
                out[-1] + text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
            )

    place(line[lead:], (";", ","))
    return out
