"""Reading files that come from outside (scenario and hosts files, result files from any machine)
with bounded work: only regular files, only up to a size cap.

A path can name a FIFO (opening it for reading waits for a writer that never comes), a device
(``/dev/zero`` never ends) or a file far larger than any input of its kind. Each is refused with an
``OSError`` whose ``strerror`` says why, so every caller's existing "cannot read: ..." message names
the file and the cause. Links are followed: a scenario linked from elsewhere is an ordinary use.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MiB = 1024 * 1024


def read_bytes(path: Path | str, limit: int, mine: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; OSError otherwise.
    ``mine``: only a file of this user's, not through a link (what this user's cache holds)."""
    # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; fstat then refuses it.
    nofollow = getattr(os, "O_NOFOLLOW", 0) if mine else 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file (a {_kind(info.st_mode)})", str(path))
        if mine and hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise OSError(errno.EPERM, "another user's file", str(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"{info.st_size:,} bytes, more than the {_size(limit)} allowed", str(path))
        os.set_blocking(fd, True)
        # The size fstat gave and a byte more, so that most files take one read and the check for
        # the end; a buffer of a megabyte for each of thousands of small files costs more than the read.
        # A size of 0 may be a file of /proc whose bytes come in one read only (/proc/sys/kernel/pid_max).
        chunks, total, want = [], 0, info.st_size + 1 if info.st_size else MiB
        while chunk := os.read(fd, min(limit + 1 - total, want)):
            chunks.append(chunk)
            total, want = total + len(chunk), MiB
            if total > limit:  # it grew while read
                raise OSError(errno.EFBIG, f"more than the {_size(limit)} allowed", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path | str, limit: int) -> str:
    """``read_bytes`` decoded as UTF-8 (UnicodeDecodeError where it is not)."""
    return read_bytes(path, limit).decode("utf-8")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "folder"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _size(limit: int) -> str:
    if limit % MiB == 0:
        return f"{limit // MiB} MiB"
    return f"{limit // 1024} KiB" if limit % 1024 == 0 else f"{limit:,} bytes"
