"""The result files of a folder that this user's suite has already read and found to be results,
so that a report over thousands of them does not check every field of every file again.

A file counts as checked when the sha256 of its bytes, as read now, is that of bytes this code
checked before: the bytes decoded are the bytes hashed, so whatever changed a file, by whatever
means and whatever its times say, makes it another file, checked again. The list is kept in this
user's cache folder (made readable and writable by the user alone: it vouches for what it names),
not in the results folder: a results folder may come from anyone, and a list kept there could vouch
for any file (where the cache folder lies inside the folder read, no list is kept). It is keyed by
the package's code (``paths.code_digest``), so an update reads every file again, and it holds the
files of one folder as they were last read. Where the cache folder cannot be read or written,
nothing is listed and every file is checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from suite import paths
from suite.safe import bounded, whole_file

MAX_LIST_BYTES = 64 * bounded.MiB  # a list of 10,000 files is under 1 MiB


class CheckedFiles:
    """The files of ``folder`` found to be results, by the sha256 of their bytes."""

    def __init__(self, folder: os.PathLike[str] | str) -> None:
        cache, here = paths.cache_dir(), os.path.realpath(folder)
        name = hashlib.sha256(os.fsencode(here)).hexdigest()[:32]  # whatever bytes the path holds
        self.path = cache / "checked-results" / f"{name}.json" if cache is not None else None
        if self.path is not None and Path(os.path.realpath(self.path)).is_relative_to(here):
            self.path = None  # a cache inside the folder read: its list would be read as a result
        self.listed: set[str] = set()
        self.seen: set[str] = set()
        if self.path is None:
            return
        with contextlib.suppress(OSError, ValueError, RecursionError):
            data = json.loads(whole_file.read_kept(self.path, MAX_LIST_BYTES))
            if isinstance(data, dict) and data.get("code") == paths.code_digest():
                files = data.get("files")
                self.listed = {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()

    def checked(self, digest: str) -> bool:
        """Whether bytes whose sha256 is ``digest`` were checked before (they stay listed)."""
        if digest in self.listed:
            self.seen.add(digest)
            return True
        return False

    def add(self, digest: str) -> None:
        """Bytes whose sha256 is ``digest`` are a result, checked now."""
        self.seen.add(digest)

    def save(self) -> None:
        """Keep the list of this folder's files as read now (those gone from it are dropped)."""
        if self.path is None or self.seen == self.listed:
            return
        data = {"code": paths.code_digest(), "files": sorted(self.seen)}
        with contextlib.suppress(OSError):
            whole_file.keep(self.path, json.dumps(data, separators=(",", ":")).encode())
