"""What keeps a local worker from outliving its ``suite run``, and what finds one that did.

- ``Lifeline``: the pipe whose end-of-file tells the worker its host is gone (the worker's side,
  and why a pipe, is ``suite.worker.lifeline``).
- ``make_run_folder``: the temp folder of one run (spec, result), with a lock file the host holds
  and its worker inherits. The worker removes the folder itself when its host dies; where both
  died (the OOM killer took both, or a person killed the worker's group too), nobody is left to, so
  each local backend's first launch removes the folders whose lock nobody holds
  (``sweep_stale_run_folders``). A lock, not a recorded pid: the kernel releases it when the last
  holder dies, whatever the pid namespace (``/tmp`` may be shared between containers) and however
  pids are reused.
- ``foreign_workers``: a worker still running for a results folder, found by the folder its
  environment carries, so a new ``suite run`` on that folder can say so.

Linux only where it reads ``/proc``; elsewhere nothing is found.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from suite.worker.lifeline import ORCHESTRATOR_ENV, RESULTS_FOLDER_ENV, RUN_FOLDER_PREFIX

FOLDER_LOCK = ".owner.lock"
# A folder younger than this is never swept: between ``mkdtemp`` and taking its lock another
# process could otherwise take the lock first.
STALE_AFTER_S = 60.0


class Lifeline:
    """A pipe: the worker inherits the read end (``child_fd``), the host keeps the write end until the
    worker has ended (``cut``). Both ends are close-on-exec (PEP 446): no other child of the host
    inherits the write end, which would keep the worker alive past the host."""

    def __init__(self) -> None:
        self.child_fd, self._write_fd = os.pipe()
        self._child_open = True

    def spawned(self) -> None:
        """After the worker started: the host's copy of the read end is not needed."""
        if self._child_open:
            os.close(self.child_fd)
            self._child_open = False

    def cut(self) -> None:
        """Close the host's end (idempotent): a worker still running takes it as the host gone."""
        self.spawned()
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1


def make_run_folder(parent: Path | None = None) -> tuple[Path, int]:
    """A fresh ``suite-run-*`` folder and the fd of its lock, held (pass it to the worker, close it
    once the folder is removed)."""
    folder = Path(tempfile.mkdtemp(prefix=RUN_FOLDER_PREFIX, dir=parent))
    try:
        fd = os.open(folder / FOLDER_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid(), "made_at": time.time()}).encode() + b"\n")
    return folder, fd


def sweep_stale_run_folders(parent: Path | None = None, min_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove this user's ``suite-run-*`` folders under ``parent`` (the temp folder) whose lock nobody
    holds and that are older than ``min_age_s``; the folders removed. A folder without the lock file
    (not made by ``make_run_folder``) is left alone. Never raises."""
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = sorted(parent.glob(RUN_FOLDER_PREFIX + "*"))
    except OSError:
        return removed
    for folder in candidates:
        try:
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or time.time() - info.st_mtime < min_age_s:
                continue
            fd = os.open(folder / FOLDER_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a live host or worker
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


# -- a worker still running for a results folder --------------------------------------------------


@dataclass(frozen=True)
class ForeignWorker:
    pid: int
    running_s: float | None
    orchestrator: int | None  # the pid of the ``suite run`` that started it
    orchestrator_alive: bool

    def line(self, folder: Path) -> str:
        since = f", running for {self.running_s:.0f} s" if self.running_s is not None else ""
        if self.orchestrator is None:
            owner = ""
        elif self.orchestrator_alive:
            owner = f", started by process {self.orchestrator}, which still runs"
        else:
            owner = f", started by `suite run` process {self.orchestrator}, which is gone"
        return (
            f"a worker of an earlier `suite run` is still running for {folder}: process {self.pid}{since}{owner}; "
            "the runs measured now share the machine with it and are slowed by it: stop it "
            f"(kill -KILL -- -{self.pid}) or let it end (at the latest at its run's limit)"
        )


def foreign_workers(folder: Path) -> list[ForeignWorker]:
    """The processes (one per process group) whose environment says they work for ``folder``, other
    than this process's own children: call it before this run starts any."""
    needle = f"{RESULTS_FOLDER_ENV}={folder.resolve()}".encode()
    found: dict[int, ForeignWorker] = {}
    proc = Path("/proc")
    for entry in sorted(proc.iterdir(), key=lambda p: (len(p.name), p.name)) if proc.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            group = os.getpgid(pid)
        except OSError:
            continue
        if needle not in environ or _parent(pid) == os.getpid():
            continue
        if group in found and found[group].pid == group:
            continue  # the group's leader (the worker itself) is already named
        owner = _env_value(environ, ORCHESTRATOR_ENV)
        pid_text, _, ticks = owner.partition(":")
        orchestrator = int(pid_text) if pid_text.isdigit() else None
        alive = orchestrator is not None and _alive(orchestrator, ticks)
        found[group] = ForeignWorker(pid, _running_s(pid), orchestrator, alive)
    return list(found.values())


def foreign_worker_lines(folder: Path) -> list[str]:
    """One line per worker still running for ``folder`` (see ``foreign_workers``); never raises."""
    try:
        return [w.line(folder) for w in foreign_workers(folder)]
    except Exception:  # noqa: BLE001 - a warning that cannot be made must not stop the run
        return []


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (the name may hold spaces and parens)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def _parent(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, ValueError, IndexError):
        return None


def process_identity(pid: int) -> str:
    """``pid:start``: a process, told apart from a later one given the same pid (start: clock ticks
    after boot, ``?`` where /proc cannot say)."""
    try:
        return f"{pid}:{_stat_fields(pid)[19]}"  # field 22 of stat: the start time
    except (OSError, IndexError):
        return f"{pid}:?"


def _running_s(pid: int) -> float | None:
    try:
        started_ticks = int(_stat_fields(pid)[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, ticks: str) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``ticks`` (any, when unknown)."""
    try:
        fields = _stat_fields(pid)
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X") and (ticks in ("", "?") or fields[19] == ticks)


def _env_value(environ: list[bytes], name: str) -> str:
    prefix = f"{name}=".encode()
    for item in environ:
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return ""
