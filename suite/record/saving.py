"""Writing a result file: atomically, never over another file, and never losing the measurement.

A result is written once, whole, beside the earlier attempts at its run; where its folder cannot
take it, it is kept in a fallback folder (or on stderr) with the command that moves it back.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import math
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from suite.record.results import RunResult
from suite.safe import whole_file

ROOM = 64 * 1024  # bytes a result file may take: most are 3-20 KB, telemetry included


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot hold result files (created if missing), or None when it can: asked
    before anything runs, so a plan does not fail after its first run. ROOM bytes are written and
    synced into a file that is gone once closed: an empty file takes no block, so a full disk
    would let it through and the first run train for nothing."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as fh:
            fh.write(bytes(ROOM))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = f"no room for a result file of {ROOM // 1024} KiB ({why})"
        return f"results folder {folder} cannot be created or written: {why}"
    return None


def unwritable_here(folder: Path) -> str | None:
    """``unwritable`` without making anything: whether the nearest existing folder on the way to
    ``folder`` is a folder this process may write in (for ``check``, which writes nothing)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"results folder {folder} cannot be created or written: {existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"results folder {folder} cannot be created or written: {existing} is not writable here"
    with contextlib.suppress(OSError):
        disk = os.statvfs(existing)  # root may write the blocks kept back for it, as run's check does
        if (disk.f_bfree if os.geteuid() == 0 else disk.f_bavail) * disk.f_frsize < ROOM:
            return (
                f"results folder {folder} cannot be created or written: no room for a result file of {ROOM // 1024} KiB"
            )
    return None


class Unsaved(Exception):
    """A result that could not be written where it belongs; the message says where it was kept
    instead and the command that moves it back."""


# errno of a file system that has no hard links (vfat, some network and FUSE file systems)
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


def save(result: RunResult, folder: Path, stem: str) -> Path:
    """Write ``folder/stem.json`` (or ``stem.2.json`` ... if taken) via a temp file and a hard link.

    A reader never sees a half-written file, and an earlier attempt at the same run is kept: a
    failure followed by a success leaves both on disk, and the report picks the newest. On a file
    system without hard links the file is created exclusively and written in place instead.

    A measurement is never lost to the disk: where the file cannot be written (the disk is full, the
    name too long, the folder gone), the record is kept in a fallback folder and ``Unsaved`` says
    where and how to move it back; where no fallback folder takes it either, the record itself is
    written to stderr. A number JSON cannot hold (NaN, an infinity) is recorded as null.
    """
    text = json.dumps(_finite(result.to_dict()), indent=1, sort_keys=True, allow_nan=False, default=_jsonable) + "\n"
    try:
        return _save_text(text, folder, stem)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise Unsaved(_keep_elsewhere(text, folder, stem, why)) from None


def _save_text(text: str, folder: Path, stem: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():  # a link planted as a scenario's folder would take the result elsewhere
        raise OSError(errno.ELOOP, "it is a link; results are never written through one", str(folder))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}.", suffix=".tmp")
    try:
        os.fchmod(fd, whole_file.created_mode())  # mkstemp's 0600 would keep the result from its readers
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        for attempt in itertools.count(1):
            target = folder / (f"{stem}.json" if attempt == 1 else f"{stem}.{attempt}.json")
            try:
                os.link(tmp, target)  # fails if the target exists: never overwrite
                return target
            except FileExistsError:
                continue
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
            try:  # no hard links here: create it exclusively, then write it
                out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, whole_file.created_mode())
            except FileExistsError:
                continue
            try:
                with os.fdopen(out, "w", encoding="utf-8") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError:
                target.unlink(missing_ok=True)  # never a cut-off record where a reader looks
                raise
            return target
        raise AssertionError("unreachable")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def fallback_folders() -> list[Path]:
    """Where a result that cannot be saved in its results folder is kept, first that takes it: the
    system's temp folder and the user's cache, each most likely on another disk than the results."""
    user = f"suite-unsaved-{os.getuid()}" if hasattr(os, "getuid") else "suite-unsaved"
    return [Path(tempfile.gettempdir()) / user, Path.home() / ".cache" / "suite-unsaved"]


def kept_elsewhere(machine: str) -> list[str]:
    """Lines naming the results of ``machine`` that a full disk or a lost folder sent to a fallback
    folder and that are still there: a run that does not find them measures their points again."""
    out = []
    for base in fallback_folders():
        folder = base / machine[:100]
        with contextlib.suppress(OSError):  # missing, or not this user's own folder: nothing kept there
            kept = sorted((whole_file.own_folder(base) / machine[:100]).glob("*/*.json"))
            if kept:
                scenarios = sorted({k.parent.name for k in kept})
                out.append(
                    f"kept in {folder}: {len(kept)} result{'s' if len(kept) != 1 else ''} of {machine} "
                    f"({', '.join(scenarios)}) that a run could not save where it belonged; move each back "
                    "as its message said (mv -n), or its run is measured again"
                )
    return out


def _keep_elsewhere(text: str, folder: Path, stem: str, why: str) -> str:
    """Keep ``text`` in a fallback folder (under the machine and scenario folder names it had);
    the message naming where, with the command that moves it back."""
    wanted = folder / f"{stem}.json"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    for base in fallback_folders():
        try:
            private = whole_file.private_folder(base)
            kept = _save_text(text, private / folder.parent.name[:100] / folder.name[:100], stem[:100])
        except OSError:
            continue
        # Moved back under a name of its own: a rerun made before the move ("rerun when it can")
        # saves the same run as stem.json, which the move must never overwrite (mv -n: nor anything).
        back = folder / f"{kept.name[: -len('.json')]}.kept-{digest}.json"
        return (
            f"the result of {stem} could not be saved as {wanted} ({why});\n  it is kept as {kept}.\n"
            f"  Move it back once there is room: mkdir -p {shlex.quote(str(folder))} && "
            f"mv -n {shlex.quote(str(kept))} {shlex.quote(str(back))}"
        )
    sys.stderr.write(text)
    return (
        f"the result of {stem} could not be saved as {wanted} ({why}),\n  nor in "
        f"{' or '.join(map(str, fallback_folders()))};\n  its record is on stderr above: save it as "
        f"{folder / f'{stem[:100]}.kept-{digest}.json'} (a name no run saves under)"
    )


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
