"""The files a report writes: each replaced whole or not at all, as readable as any file this
process makes, with the sha256 of the bytes written."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

from suite.safe import whole_file


class Wrote(NamedTuple):
    """A file a report wrote, and the sha256 of the bytes it wrote there (report/up_to_date keeps it:
    what lies there later may be another's)."""

    path: Path
    sha256: str


def write(path: Path, content: str | bytes) -> Wrote:
    """``path`` replaced whole (``whole_file.replace``) by ``content``; text as UTF-8, where a lone
    surrogate (a result's JSON may escape one) is written as its escape, ``\\udc80``."""
    data = content if isinstance(content, bytes) else content.encode("utf-8", errors="backslashreplace")
    whole_file.replace(path, data, whole_file.created_mode())  # a page is as readable as any file made here
    return Wrote(path, hashlib.sha256(data).hexdigest())
