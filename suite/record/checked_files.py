"""The result files of a folder that this user's suite has already read and found to be results,
so that a report over thousands of them does not check every field of every file again, and what a
report reads of each (``SlimRecords``), so that it does not decode their telemetry series either.

A file counts as checked when the sha256 of its bytes, as read now, is that of bytes this code
checked before: the bytes decoded are the bytes hashed, so whatever changed a file, by whatever
means and whatever its times say, makes it another file, checked again. The list is kept in this
user's cache folder (made readable and writable by the user alone: it vouches for what it names),
not in the results folder: a results folder may come from anyone, and a list kept there could vouch
for any file (where the cache folder lies inside the folder read, no list is kept). It is keyed by
the package's code (``paths.code_digest``), so an update reads every file again, and it holds the
files of one folder as they were last read; the lists of the KEPT_LISTS folders read most recently
are kept. Where the cache folder cannot be read or written, nothing is listed and every file is
checked."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import orjson

from suite import paths
from suite.safe import bounded, whole_file

MAX_LIST_BYTES = 64 * bounded.MiB  # a list of 10,000 files is under 1 MiB
KEPT_LISTS = 64  # lists kept, one per results folder; the least recently used go first


def _kept_for(folder: os.PathLike[str] | str, kind: str, suffix: str) -> Path | None:
    """Where this user's cache keeps what it knows of the files of ``folder`` (by its real path), in
    its folder ``kind``; None where there is no cache, or it lies inside ``folder``: what it keeps
    there would be read as a result."""
    cache, here = paths.cache_dir(), os.path.realpath(folder)
    if cache is None:
        return None
    path = cache / kind / f"{hashlib.sha256(os.fsencode(here)).hexdigest()[:32]}{suffix}"  # whatever bytes it holds
    return None if Path(os.path.realpath(path)).is_relative_to(here) else path


class CheckedFiles:
    """The files of ``folder`` found to be results, by the sha256 of their bytes."""

    def __init__(self, folder: os.PathLike[str] | str) -> None:
        self.path = _kept_for(folder, "checked-results", ".json")
        self.listed: set[str] = set()
        self.seen: set[str] = set()
        if self.path is None:
            return
        with contextlib.suppress(OSError, ValueError, RecursionError):
            data = json.loads(whole_file.read_kept(self.path, MAX_LIST_BYTES))
            if isinstance(data, dict) and data.get("code") == paths.code_digest():
                files = data.get("files")
                self.listed = {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()
                with contextlib.suppress(OSError):
                    os.utime(self.path)  # used now: the lists pruned first are those least recently used

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
            whole_file.keep(self.path, json.dumps(data, separators=(",", ":")).encode(), most=KEPT_LISTS)


MAX_STORE_BYTES = 512 * bounded.MiB  # 10,000 records of one GPU's telemetry, without series, are about 80 MB
KEPT_STORES = 8  # stores kept, one per results folder (of use only beside its list); the least recently used go first
_DIGEST_CHARS = 64


def without_series(data: dict[str, Any]) -> dict[str, Any]:
    """A record's data less its telemetry series (``suite.telemetry``: up to 600 samples per metric):
    what a report reads of it. Its pages and exports read each metric's summary and the load block
    (record/telemetry_figures, record/under_load), never a series; ``show`` reads the file itself.
    ``data`` itself where it holds no series."""
    telemetry = data.get("telemetry")
    if not isinstance(telemetry, dict) or not isinstance(metrics := telemetry.get("metrics"), list):
        return data
    if not any(isinstance(m, dict) and "series" in m for m in metrics):
        return data
    slim = [{k: v for k, v in m.items() if k != "series"} if isinstance(m, dict) else m for m in metrics]
    return {**data, "telemetry": {**telemetry, "metrics": slim}}


class SlimRecords:
    """The records of ``folder``'s checked result files that hold telemetry series, less those
    (``without_series``), by the sha256 of each file's bytes: a report over thousands of files
    decodes these instead, a few kilobytes each, however long the runs' series are (a record of
    minutes on eight GPUs is about a megabyte). Kept beside the folder's CheckedFiles list, in this
    user's cache folder, by the same rules: keyed by the package's code, holding the files of the
    folder as last read, and where it cannot be read, nothing is taken from it. A record is taken
    only for bytes the list holds as checked (``results.load_folder``), so it vouches for nothing
    the list does not.

    One line per record: its file's sha256, a space, the record as JSON (which holds no raw line
    break); the first line is the code's digest."""

    def __init__(self, folder: os.PathLike[str] | str) -> None:
        self.path = _kept_for(folder, "slim-results", ".jsonl")
        self._stored: dict[str, memoryview] = {}
        self._kept: dict[str, bytes | memoryview] = {}
        self._put: set[str] = set()  # the records put since the store was read
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            raw = whole_file.read_kept(self.path, MAX_STORE_BYTES)
            code = paths.code_digest()
            if code is None or not raw.startswith(code.encode() + b"\n"):
                return
            with contextlib.suppress(OSError):
                os.utime(self.path)  # used now: the stores pruned first are those least recently used
            view, start = memoryview(raw), _DIGEST_CHARS + 1
            while start < len(raw):
                end = raw.find(b"\n", start)
                end = len(raw) if end == -1 else end
                if end - start > _DIGEST_CHARS + 1 and raw[start + _DIGEST_CHARS] == ord(" "):
                    digest = raw[start : start + _DIGEST_CHARS].decode("ascii", "replace")
                    self._stored[digest] = view[start + _DIGEST_CHARS + 1 : end]
                start = end + 1

    def get(self, digest: str) -> dict[str, Any] | None:
        """The record of the file whose bytes have sha256 ``digest``, as stored; None where none is
        (or it does not decode: the file is then decoded as any other)."""
        line = self._stored.get(digest)
        if line is None:
            return None
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        self._kept[digest] = line
        return data

    def put(self, digest: str, data: dict[str, Any]) -> None:
        """Keep ``data`` (``without_series``) as the record of the bytes with sha256 ``digest``; not
        where orjson cannot write it (a lone surrogate, which ``json`` read): that file is decoded
        from its bytes each time."""
        with contextlib.suppress(orjson.JSONEncodeError):
            self._kept[digest] = orjson.dumps(data)
            self._put.add(digest)

    def save(self) -> None:
        """Keep the records of this folder's files as read now (those gone from it are dropped), as
        many as MAX_STORE_BYTES holds, by their digests' order. Not written where it would hold what
        it holds: the records of a folder that outgrew the cap, beyond it, are decoded from their
        files by every report, and each would otherwise write the whole store again."""
        code = paths.code_digest()
        if self.path is None or code is None or (not self._put and self._kept.keys() == self._stored.keys()):
            return
        parts: list[bytes | memoryview] = [code.encode(), b"\n"]
        size, held = _DIGEST_CHARS + 1, []
        for digest, line in sorted(self._kept.items()):
            size += len(line) + _DIGEST_CHARS + 2
            if size > MAX_STORE_BYTES:
                break
            parts += [digest.encode(), b" ", line, b"\n"]
            held.append(digest)
        if set(held) == set(self._stored) and not self._put.intersection(held):
            return
        with contextlib.suppress(OSError):
            whole_file.keep(self.path, b"".join(parts), most=KEPT_STORES)
