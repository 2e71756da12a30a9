"""One rule for every name that becomes part of a path: scenario names, machine names (``--machine``,
a hosts file's hosts, a Ray node's label) and what a result file says they were.

A safe name is one path component that a results folder reads back: it starts with a letter or a
digit (so never ``.``, ``..``, a hidden ``.x`` or a ``_x`` that ``results.load_folder`` passes over,
nor the run lock ``.suite-run.lock``), holds only letters, digits, ``_``, ``.`` and ``-`` (no ``/``,
no control character, no trailing newline: ``re.fullmatch``, not ``re.match`` with ``$``), and is at
most MAX_LENGTH characters, so a file name built from it stays far below NAME_MAX (255 bytes).
"""

from __future__ import annotations

import re
from pathlib import Path

from suite.spec.settings import brief

MAX_LENGTH = 100
_SAFE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_LENGTH - 1}}}")
ALLOWED = f"1 to {MAX_LENGTH} letters, digits, '_', '.' or '-', starting with a letter or a digit (it names a folder)"


class UnsafeName(ValueError):
    """A name that cannot be a path component; the message names where it came from."""


def is_safe(value: object) -> bool:
    return isinstance(value, str) and _SAFE.fullmatch(value) is not None


def safe_name(value: object, source: str) -> str:
    """``value`` when it is a safe name, else UnsafeName naming ``source`` (a file and key, a flag),
    the value as Python writes it (control characters escaped) and what is allowed."""
    if is_safe(value):
        return str(value)
    raise UnsafeName(f"{source}: got {brief(value)}; allowed: {ALLOWED}")


def inside(folder: Path, name: str, source: str) -> Path:
    """``folder / name`` for a safe ``name``, confirmed to lie inside ``folder`` once resolved."""
    path = folder / safe_name(name, source)
    if path.resolve().parent != folder.resolve():
        raise UnsafeName(f"{source}: {name!r} leads outside {folder}")
    return path
