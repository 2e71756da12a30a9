"""``-k EXPR``: which points of a plan (``run``, ``check``) or of the results (``report``) to take.

The language is pytest's ``-k``, over point labels instead of test names, parsed here and never
handed to ``eval``::

    expr := or_expr
    or   := and_expr ("or" and_expr)*
    and  := not_expr ("and" not_expr)*
    not  := "not" not_expr | "(" expr ")" | term
    term := KEY=VALUE | WORD

``KEY=VALUE`` compares one coordinate of the point as its label shows it (``width=750``,
``device=gpu``, ``variant=jit_compile``, ``batch_size=1024``; a boolean reads ``on`` or ``off``).
A key is an axis name as the label spells it, the full setting path (``model.hidden.0=750``,
``training.batch_size=1024``), or ``scenario`` (the scenario's name). The value may hold ``*`` as a
wildcard (``device=gpu*``) and may be quoted where it holds spaces or parentheses
(``variant='tf.data prefetch'``). A bare ``WORD`` matches when it is part of the label
(``-k prefetch``, ``-k "not jit_compile"``). Matching ignores case, as pytest's does. A key no
point has is an error naming the keys there are; so is an expression that matches nothing (it
lists the labels there are): a typo must not pass for an empty plan.
"""

from __future__ import annotations

import collections
import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from suite.spec.plan import RunSpec, coordinates

SCENARIO_KEY = "scenario"
KEYWORDS = ("and", "or", "not")
MAX_LISTED = 60  # labels listed when nothing matched; a bigger plan says how many more
MAX_UNKNOWN = 5  # unknown keys named (and looked up for a near miss) in the message


class SelectError(Exception):
    """A ``-k`` expression that cannot be read, names a key no point has, or matches nothing."""


# --------------------------------------------------------------------------- the expression


@dataclass(frozen=True)
class Item:
    """What a term is matched against: one point."""

    scenario: str
    label: str
    coords: dict[str, str]  # lower-cased key -> value as the label shows it (lower-cased)


@dataclass(frozen=True)
class _Term:
    key: str | None  # None: a bare word
    value: str

    def __call__(self, item: Item) -> bool:
        if self.key is None:
            return self.value in item.label.lower()
        have = item.scenario.lower() if self.key == SCENARIO_KEY else item.coords.get(self.key)
        if have is None:
            return False
        return _glob(self.value, have) if "*" in self.value else have == self.value


def _glob(pattern: str, text: str) -> bool:
    """Whether ``text`` is all of ``pattern``, where ``*`` matches any run of characters and every other
    character only itself (``[``, ``?`` too).

    Linear, not backtracking: the text must start with what comes before the first star and end with
    what comes after the last, and each piece between stars is taken where it first occurs after the
    previous one. Taking the earliest place is never wrong, since it leaves the most room for the rest.
    A regular expression with one ``.*`` per star takes exponential time on ``a*a*a*...*b``.
    """
    first, *middle, last = pattern.split("*")
    end = len(text) - len(last)
    if end < len(first) or not text.startswith(first) or not text.endswith(last):
        return False
    at = len(first)
    for piece in middle:
        found = text.find(piece, at, end)
        if found < 0:
            return False
        at = found + len(piece)
    return True


_Step = _Term | str  # a term, or an operator of KEYWORDS applied to what the steps before left


@dataclass(frozen=True)
class Selection:
    """A parsed ``-k`` expression: call it on an Item.

    ``program`` is the expression in postfix order (``a and not b`` is ``a, b, not, and``), evaluated
    with a stack of booleans: neither parsing nor evaluating recurses, so no nesting depth or number
    of terms meets Python's recursion limit, and the work grows with the expression's length.
    """

    text: str
    program: tuple[_Step, ...]
    keys: tuple[str, ...]  # the keys its terms name, lower-cased, in order

    def __call__(self, item: Item) -> bool:
        stack: list[bool] = []
        for step in self.program:
            if isinstance(step, _Term):
                stack.append(step(item))
            elif step == "not":
                stack[-1] = not stack[-1]
            else:
                right = stack.pop()
                stack[-1] = (stack[-1] and right) if step == "and" else (stack[-1] or right)
        return stack[0]


_BINDS = {"or": 1, "and": 2, "not": 3}  # how tightly each operator binds: "not" before "and" before "or"


def parse(text: str) -> Selection:
    """Parse ``text`` by the grammar of the module docstring; raises SelectError saying where it stopped
    making sense.

    Shunting-yard: terms go to the program as they come, operators wait on a stack until one that
    binds less tightly (or a ``)``) arrives, and a ``(`` waits until its ``)``.
    """
    tokens = _tokens(text)
    if not tokens:
        raise SelectError(f'-k {_shown(text)}: empty expression; e.g. -k "width=750 and device=gpu"')
    program: list[_Step] = []
    waiting: list[_Token] = []  # "(", "and", "or", "not" tokens, innermost last
    term_next = True  # a term, "not" or "(" is expected; else "and", "or" or ")"
    for tok in tokens:
        if term_next:
            if tok.bare("not", "("):
                waiting.append(tok)
            elif tok.bare(")", *KEYWORDS):
                raise SelectError(
                    f"-k {_shown(text)}: unexpected {_shown(tok.text)} at character {tok.pos + 1}; a term was expected"
                )
            else:
                program.append(_term(text, tok))
                term_next = False
        elif tok.bare("and", "or"):
            binds = _BINDS[tok.text.lower()]
            while waiting and not waiting[-1].bare("(") and _BINDS[waiting[-1].text.lower()] >= binds:
                program.append(waiting.pop().text.lower())
            waiting.append(tok)
            term_next = True
        else:
            while waiting and not waiting[-1].bare("("):
                program.append(waiting.pop().text.lower())
            if waiting:  # a "(" is open
                if not tok.bare(")"):
                    raise SelectError(f"-k {_shown(text)}: the '(' at character {waiting[-1].pos + 1} is not closed")
                waiting.pop()
            else:
                where = f"unexpected {_shown(tok.text)} at character {tok.pos + 1}"
                raise SelectError(f"-k {_shown(text)}: {where}; join terms with and, or")
    if term_next:
        raise SelectError(f"-k {_shown(text)}: ends where a term was expected (KEY=VALUE, a word, or '(')")
    while waiting:
        tok = waiting.pop()
        if tok.bare("("):
            raise SelectError(f"-k {_shown(text)}: the '(' at character {tok.pos + 1} is not closed")
        program.append(tok.text.lower())
    keys = tuple(dict.fromkeys(t.key for t in program if isinstance(t, _Term) and t.key is not None))
    return Selection(text, tuple(program), keys)


SHOWN_CHARS = 80  # an expression or term longer than this is shown in messages by its start and its length


def _shown(text: str) -> str:
    """``text`` as an error message quotes it: whole, or where long, its start and how long it is."""
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}... ({len(text):,} characters)"


@dataclass(frozen=True)
class _Token:
    pos: int  # where it starts in the expression, 0-based
    text: str  # quotes removed
    quoted: bool  # a quoted "and" is a word, a quoted "(" part of a value
    eq: int  # where the first '=' outside quotes is in ``text``; -1: none (a bare word)

    def bare(self, *words: str) -> bool:
        return not self.quoted and self.text.lower() in words


def _tokens(text: str) -> list[_Token]:
    """Tokens: "(", ")" and terms. Quotes group spaces and parentheses into a term and are dropped."""
    out: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "()":
            out.append(_Token(i, ch, False, -1))
            i += 1
        else:
            start, pieces, size, quoted, eq = i, [], 0, False, -1  # pieces joined once: linear in the length
            while i < len(text) and not text[i].isspace() and text[i] not in "()":
                if text[i] in "'\"":
                    end = text.find(text[i], i + 1)
                    if end < 0:
                        raise SelectError(f"-k {_shown(text)}: the quote at character {i + 1} is not closed")
                    piece, quoted, i = text[i + 1 : end], True, end + 1
                else:
                    if text[i] == "=" and eq < 0:
                        eq = size
                    piece, i = text[i], i + 1
                pieces.append(piece)
                size += len(piece)
            out.append(_Token(start, "".join(pieces), quoted, eq))
    return out


def _term(text: str, tok: _Token) -> _Term:
    if not tok.text.strip():
        raise SelectError(
            f"-k {_shown(text)}: the empty quotes at character {tok.pos + 1} name nothing; give a word or KEY=VALUE"
        )
    if tok.eq < 0:
        return _Term(None, tok.text.lower())
    key, value = tok.text[: tok.eq].strip(), tok.text[tok.eq + 1 :].strip()
    if not key or not value:
        raise SelectError(
            f"-k {_shown(text)}: {_shown(tok.text)} at character {tok.pos + 1} needs a key and a value, e.g. width=750"
        )
    return _Term(key.lower(), value.lower())


# --------------------------------------------------------------------------- plans (report.points applies it to views)


def item_of(scenario: str, point: dict[str, Any], label: str) -> Item:
    """A point as ``-k`` sees it: each coordinate by its axis name and by its full setting path."""
    coords: dict[str, str] = {}
    for path, (name, value) in coordinates(point).items():
        coords.setdefault(name.lower(), value.lower())
        coords.setdefault(path.lower(), value.lower())
    return Item(scenario, label, coords)


def _spec_item(spec: RunSpec) -> Item:
    return item_of(spec.scenario, spec.point, spec.point_label)


def choose(items: list[Item], text: str) -> list[bool]:
    """Which of ``items`` the expression ``text`` takes; raises SelectError for an unknown key or no match."""
    selection = parse(text)
    known = {SCENARIO_KEY} | {k for item in items for k in item.coords}
    unknown = [k for k in selection.keys if k not in known]
    if unknown:
        names = sorted(known - {SCENARIO_KEY}, key=lambda k: ("." in k, k))
        named = unknown[:MAX_UNKNOWN]  # an expression of thousands of typos gets hints for the first few
        close = {c for k in named for c in difflib.get_close_matches(k, sorted(known), n=2, cutoff=0.6)}
        hint = f" (did you mean {' or '.join(sorted(close))}?)" if close else ""
        more = f" and {len(unknown) - len(named)} more" if len(unknown) > len(named) else ""
        raise SelectError(
            f"-k {_shown(text)}: no point has the key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(_shown, named))}{more}"
            f"{hint}; keys: {SCENARIO_KEY}, {', '.join(names) or '(no matrix axes)'}"
        )
    taken = [selection(item) for item in items]
    if not any(taken):
        points = len({(i.scenario, i.label) for i in items})  # a plan's items are runs: several per point
        raise SelectError(f"-k {_shown(text)} matches none of the {points} points; the points are:\n" + _listing(items))
    return taken


def _listing(items: Iterable[Item]) -> str:
    seen = list(dict.fromkeys((i.scenario, i.label) for i in items))
    lines = [f"  {scenario}: {label}" for scenario, label in seen[:MAX_LISTED]]
    if len(seen) > MAX_LISTED:
        lines.append(f"  ... and {len(seen) - MAX_LISTED} more (python -m suite check lists them all)")
    return "\n".join(lines)


def select_specs(specs: list[RunSpec], text: str | None) -> list[RunSpec]:
    """The specs whose point ``text`` takes (all of them for None), in their order."""
    if text is None:
        return specs
    taken = choose([_spec_item(s) for s in specs], text)
    return [s for s, keep in zip(specs, taken, strict=True) if keep]


def expression_for(points: list[tuple[dict[str, Any], str]]) -> str:
    """A ``-k`` expression taking exactly these points ((coordinates, label) each): the inverse of
    ``choose``, for "Reproduce" commands. A coordinate goes by its axis name unless two share it."""
    terms = []
    for point, label in points:
        coords = coordinates(point)
        names = collections.Counter(name for name, _ in coords.values())
        parts = [
            f"{_quoted(name if names[name] == 1 else path)}={_quoted(value)}" for path, (name, value) in coords.items()
        ]
        terms.append(" and ".join(parts) if parts else _quoted(label))
    if len(terms) == 1:
        return terms[0]
    return " or ".join(f"({t})" if " and " in t else t for t in terms)


def _quoted(value: str) -> str:
    """A key or value as one term: quoted where it holds spaces, parentheses, quotes or '=', or is
    an operator."""
    if value and not any(c.isspace() or c in "()'\"=" for c in value) and value.lower() not in KEYWORDS:
        return value
    return f'"{value}"' if "'" in value else f"'{value}'"


def points_of(specs: Iterable[RunSpec]) -> int:
    return len({(s.scenario, s.point_label) for s in specs})
