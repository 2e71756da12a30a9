"""A results folder and the machine folders in it: the lock one ``suite run`` holds on a folder, and
what is on file there (the newest result of each run, the wall times of the ok ones)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from suite.record import results
from suite.safe import bounded
from suite.safe.markdown import escaped
from suite.spec import names

LOCK_NAME = ".suite-run.lock"  # a dot name: never read as a result


class FolderBusy(Exception):
    """Another ``suite run`` holds the results folder; the message names it."""


def machine_dir(results_dir: Path, machine: str, source: str = "machine name (--machine)") -> Path:
    """``results_dir/machine``; UnsafeName (exit 2) where ``machine`` is not one safe path component."""
    return names.inside(results_dir, machine, source)


def on_file(folder: Path) -> list[results.RunResult]:
    """Every result in a machine's folder; none where the folder is not there yet."""
    return [r for _, r in results.load_folder(folder)] if folder.is_dir() else []


def pool_on_file(results_dir: Path, counts: Callable[[results.RunResult], bool]) -> list[results.RunResult]:
    """Every result of a pool's kind (``counts``) in any machine folder under ``results_dir``."""
    return [r for folder in result_folders(results_dir) for _, r in results.load_folder(folder) if counts(r)]


def previous_runs(folder: Path) -> dict[tuple[str, int], results.RunResult]:
    """(fingerprint, repetition) -> the newest result on file."""
    return results.latest_by_run(on_file(folder))


@contextlib.contextmanager
def hold_folder(folder: Path, *, wait: bool = False, say: Callable[[str], None] = print) -> Iterator[None]:
    """Hold ``folder`` for one ``suite run``: a second run on it would run the same points again.

    An advisory ``flock`` on a file inside, which records who holds it: the kernel releases it when
    the holder exits, also by SIGKILL, so a dead run never blocks the next one.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    try:  # O_NOFOLLOW: a link planted at the lock's name is never written through
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise FolderBusy(f"{path}: cannot be the run lock ({exc.strerror}); remove it if it is a link") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(path)
            if not wait:
                raise FolderBusy(
                    f"results folder {folder} is in use by {holder}; let it finish, or pass --wait to run after it"
                ) from None
            say(f"waiting for {holder} to finish with {folder}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": datetime.now(UTC).isoformat()}
        os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):  # who holds it is a courtesy to the next run; a full disk is not fatal
            os.pwrite(fd, json.dumps(me).encode() + b"\n", 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, so a waiting run keeps locking the same inode


def _holder(path: Path) -> str:
    try:
        data = json.loads(bounded.read_text(path, 4096))  # whoever could write the file wrote it: shown, not obeyed
        return escaped(f"`suite run` process {data['pid']} on host {data['host']} (since {data['started_at']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another `suite run`"  # it holds the lock but has not written its name yet


def wall_times(on_file: list[results.RunResult]) -> dict[str, list[float]]:
    """Fingerprint -> wall seconds (start to end, as the host saw them) of every ok run on file: what
    ``suite check`` estimates a point's runs from, and what a run's ETA starts from. Times no run
    could have taken are passed over: one that ends before it starts, or lasts longer than its
    timeout allows (twice ``timeout_s`` and an hour for the setup around it; a record may come from
    anyone, with any times)."""
    out: dict[str, list[float]] = {}
    for r in on_file:
        started, finished = r.run.get("started_at"), r.run.get(results.FINISHED_AT.key)
        if not (r.ok and started and finished):
            continue
        try:
            seconds = (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()
            timeout = float(r.spec.get("config", {}).get("timeout_s", 0))
        except (TypeError, ValueError, AttributeError):
            continue
        if 0 <= seconds <= (2 * timeout + 3600 if timeout > 0 else MAX_WALL_S):
            out.setdefault(r.fingerprint, []).append(seconds)
    return out


MAX_WALL_S = 7 * 86400  # a run whose record names no timeout: a week is beyond any


def pool_previous_runs(
    results_dir: Path, counts: Callable[[results.RunResult], bool]
) -> dict[tuple[str, int], results.RunResult]:
    """(fingerprint, repetition) -> a result of the pool's kind in any machine folder under
    ``results_dir``: the newest ``ok`` one where there is one, else the newest. A pool runs each run
    once, on whichever node took it (a node that has left the cluster since included), so a run
    ``ok`` in any of them is done, whatever else is on file: the times of results made on different
    machines come from different clocks (a node's, the orchestrator's for a lost run), so "newest"
    cannot order a lost attempt against its retry. ``counts`` says which results are the pool's (a
    Ray node's, on the GPU model asked for); the others are not looked at."""
    return ok_first_by_run(pool_on_file(results_dir, counts))


def ok_first_by_run(found: list[results.RunResult]) -> dict[tuple[str, int], results.RunResult]:
    """(fingerprint, repetition) -> the newest ``ok`` result of ``found`` where there is one, else the newest."""
    return results.latest_by_run(found) | results.latest_by_run([r for r in found if r.ok])


def result_folders(results_dir: Path) -> list[Path]:
    """The machine folders under a results folder (a name starting with '.' or '_' is none)."""
    if not results_dir.is_dir():
        return []
    return sorted(p for p in results_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
