"""Replacing a file whole or not at all: a reader sees the old bytes or the new ones, never a part."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace(path: Path, data: bytes, mode: int) -> None:
    """``path`` replaced by ``data``, written first to a temp file beside it made with O_EXCL (never
    a fixed name, which a planted link could turn into a write elsewhere) and given ``mode``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
