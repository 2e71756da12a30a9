"""``python -m suite images lock``: docker/images.lock written from an engine, each base's registry
digest and how each Debian-made base was made, keeping what could not be refreshed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suite.environment import debian_base
from suite.environment.image_catalog import (
    LOCK,
    ImageError,
    load_catalog,
    read_lock,
    write_lock,
)
from suite.environment.images import _connect, debian_record


def lock_images(
    names: list[str] | None = None,
    progress: Callable[[str], None] = print,
    *,
    client: Any = None,
    docker_host: str | None = None,
    path: Path = LOCK,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Record in docker/images.lock each base's registry digest and how each Debian-made base was made.

    ``bases``: the registry's digest of each base tag (needs a daemon that reaches the registry).
    ``debian_bases``: for each image whose base for this checkout's recipe was made from Debian
    packages and is on the engine, that base's Debian suite, mirror, recipe hash, image ID, when it
    was made, every package with its version, and the lock file (and sha256) its pip layer came from.

    Everything that could be recorded is written, also when some of it could not. Entries that
    could not be refreshed keep their previous value. Raises ImageError, listing what was and was
    not recorded, when any base's registry digest is missing (the lock is then incomplete for
    builds on registry bases); an image without a Debian base on the engine is no error.
    """
    catalog = load_catalog()
    # Names are checked before connecting, so a typo is reported as such, engine or not.
    defs = [catalog.get(n) for n in (names or list(catalog.images))]
    bases = sorted({d.base for d in defs})
    client = client or _connect(docker_host)
    lock = read_lock(path)
    recorded, failures, absent = [], [], []
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for base in bases:
        try:
            digest = client.images.get_registry_data(base).id
        except Exception as exc:  # noqa: BLE001 - listed below with the engine's words
            failures.append(f"registry digest of {base}: {exc}")
            progress(f"{base}: no digest ({exc})")
            continue
        lock["bases"][base] = _stamped({"digest": digest}, lock["bases"].get(base), now)
        recorded.append(f"registry digest of {base}: {digest}")
        progress(f"{base}: {digest}")
    for d in defs:
        entry = debian_record(client, debian_base.recipe_for(d, catalog.root))
        if entry is None:
            kept = " (the previous entry is kept)" if d.name in lock["debian_bases"] else ""
            absent.append(f"Debian base of {d.name}: none on the engine for this checkout's recipe{kept}")
            continue
        lock["debian_bases"][d.name] = _stamped(entry, lock["debian_bases"].get(d.name), now)
        recorded.append(
            f"Debian base of {d.name}: {entry['base']} ({entry['image_id'][:19]}), {len(entry['packages'])} "
            f"Debian packages, pip lock {entry['pip_lock']['file']}"
        )
    write_lock(path, lock["bases"], lock["debian_bases"])
    for line in recorded:
        progress(f"recorded: {line}")
    for line in absent:
        progress(f"not recorded: {line}")
    progress(f"wrote {path}")
    if failures:
        listed = "\n  ".join(failures)
        done = "\n  ".join(recorded) or "nothing"
        raise ImageError(
            f"could not lock every base image (does the daemon reach the registry?):\n  {listed}\n"
            f"{path} was written with what was recorded:\n  {done}"
        )
    return lock


def _stamped(entry: dict[str, Any], previous: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """``entry`` with ``locked_at``: the previous one's when nothing else changed, so that locking again
    leaves the committed file as it is; else ``now``."""
    if previous is not None and {k: v for k, v in previous.items() if k != "locked_at"} == entry:
        return {**entry, "locked_at": previous.get("locked_at", now)}
    return {**entry, "locked_at": now}
