"""The result files of a folder that this user's suite has already read and found to be results,
so that a report over thousands of them does not check every field of every file again.

A file counts as checked while its device, inode, size, modification and change times are those it
had when it was checked. Its bytes are still read and decoded every time; only the field-by-field
check is skipped. The list is kept in this user's cache folder, never in the results folder: a
results folder may come from someone else, and a list kept there could vouch for any file. Writing
a file, or putting another one in its place, changes its change time, which no program can set
back, so a file changed since its check is checked again. A file changed less than RACY_S
before it was read is not listed: its times could still match after a later change (git's "racy
clean" entries). The list is keyed by the code that checks, so a new check reads every file again.
Where the cache folder cannot be written, nothing is listed and every file is checked as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from suite import paths

RACY_S = 2.0
_CHECKERS = ("shape.py", "results.py", "checked_files.py")  # the code whose verdict the list keeps


def _checker() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in _CHECKERS:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def key_of(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


class CheckedFiles:
    """The files of ``folder`` found to be results, by path relative to it (see the module's text)."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder.resolve())
        name = hashlib.sha256(self.folder.encode()).hexdigest()[:32]
        self.path = paths.cache_dir() / "checked-results" / f"{name}.json"
        self.checker = _checker()
        self.listed: dict[str, list[int]] = {}
        self.seen: dict[str, list[int]] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("folder") == self.folder and data.get("checker") == self.checker:
                files = data.get("files")
                self.listed = files if isinstance(files, dict) else {}

    def checked(self, relative: str, info: os.stat_result) -> bool:
        """Whether the file at ``relative``, as ``info`` describes it now, was checked before (then
        it stays listed)."""
        key = key_of(info)
        if self.listed.get(relative) != key:
            return False
        self.seen[relative] = key
        return True

    def add(self, relative: str, info: os.stat_result) -> None:
        """The file at ``relative`` (``info``: as it was read) is a result, checked now."""
        if time.time() - info.st_ctime_ns / 1e9 >= RACY_S:
            self.seen[relative] = key_of(info)

    def save(self) -> None:
        """Keep the list of this folder's files checked now (those gone from it are dropped)."""
        if self.seen == self.listed:
            return
        data: dict[str, Any] = {"folder": self.folder, "checker": self.checker, "files": self.seen}
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(data, fh, separators=(",", ":"))
                os.replace(tmp, self.path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
