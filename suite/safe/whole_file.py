"""Replacing a file whole or not at all: a reader sees the old bytes or the new ones, never a part."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from suite.safe import bounded


def created_mode() -> int:
    """The mode a file made here by ``open`` would get (0o666 less this process's umask): for files
    made through a private temp file, so that they are as readable as any other file made here."""
    try:  # read without changing it (``os.umask`` sets it to read it)
        with open("/proc/self/status", encoding="ascii") as fh:
            umask = next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = 0o022
    return 0o666 & ~umask


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


def keep(path: Path, data: bytes, most: int | None = None) -> None:
    """``data`` as the file ``path`` of this user's cache folder (``paths.cache_dir``), whole or not
    at all; the folder it lies in, where made now, is readable and writable by this user alone (what
    the cache holds vouches for what it names), and the file too. ``most``: the files of that folder
    with the same suffix kept, the least recently written (or used: touched) going first. OSError
    where ``path`` cannot be written, or its folder is not a real folder of this user's: a link
    planted there would turn the pruning into deleting files elsewhere."""
    replace(private_folder(path.parent) / path.name, data, 0o600)
    if most is None:
        return
    with contextlib.suppress(OSError):
        kept = sorted((p.lstat().st_mtime_ns, p) for p in path.parent.glob(f"*{path.suffix}"))
        for _, old in kept[:-most]:
            with contextlib.suppress(OSError):
                old.unlink()


def private_folder(base: Path) -> Path:
    """``base``, made (0700) if missing, and only if it is a real folder of this user's: a shared
    temp folder lets anyone plant a link or a folder of their own at the name first."""
    base.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    return own_folder(base)


def read_kept(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a file ``keep`` wrote into this user's cache folder, at most ``limit``;
    OSError where its folder is not a real folder of this user's (a link, or another user's: what
    ``keep`` refuses to write through is not read through either, since a list or an entry found
    there would vouch for files it never checked, a plot stand for one it never drew), or the file
    is a link or another user's."""
    return bounded.read_bytes(own_folder(path.parent) / path.name, limit, mine=True)


def own_folder(folder: Path) -> Path:
    """``folder``, where it is a real folder of this user's; OSError where it is a link or another user's."""
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        raise OSError(errno.EPERM, "not a folder of this user's (a link, or another user's)", str(folder))
    return folder
