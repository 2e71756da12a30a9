"""Whether the kernel's OOM killer acted while a local worker ran: the evidence behind ``host_oom``.

A worker ended by a SIGKILL the suite did not send was once taken to be the OOM killer's victim;
a person, a job scheduler or a watchdog sends the same signal. The kernel counts its OOM kills:
per memory cgroup (cgroup v1 ``memory.oom_control``, v2 ``memory.events``, line ``oom_kill N``;
v2 counts a cgroup's descendants too, v1 only the cgroup itself) and for the whole machine
(``/proc/vmstat``, line ``oom_kill N``, since Linux 4.13). ``OomWitness`` reads them when the
worker starts and after it ends; the worker's own cgroup decides where it can be read, the
machine's counter otherwise:

- its cgroup's counter rose: the OOM killer acted in its cgroup (``host_oom``);
- its cgroup's counter did not rise: not the OOM killer, even if it acted elsewhere;
- no cgroup counter, the machine's did not rise: not the OOM killer;
- no cgroup counter, the machine's rose: the OOM killer acted on the machine (``host_oom``);
- nothing readable: not known.

A worker may be moved to another cgroup after it starts (a wrapper that joins a limited one, as a
test does): ``follow`` reads its cgroup again while it lives (the local backend, once a second),
and the counter of the cgroup it moved to is read from then on. The cgroup of a process that has
ended cannot be read (the kernel shows an exited process in the root cgroup), hence the following.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

VMSTAT = Path("/proc/vmstat")
COUNTER = "oom_kill"
_ESCAPED = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space as \040

Locate = Callable[[int], tuple[str, Path] | None]


def read_counter(path: Path, key: str = COUNTER) -> int | None:
    """The value of the ``key N`` line of a kernel counter file, or None."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def memory_cgroup(pid: int) -> tuple[str, Path] | None:
    """(the memory cgroup of process ``pid``, as /proc shows it; the file of its OOM-kill counter),
    or None where no readable one is found (no memory controller, a cgroup not mounted here)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            v1 = path
        elif hierarchy == "0" and not controllers:
            v2 = path
    for root, mountpoint, fstype, options in _cgroup_mounts():
        if v1 is not None and fstype == "cgroup" and "memory" in options.split(","):
            path, name = v1, "memory.oom_control"
        elif v1 is None and v2 is not None and fstype == "cgroup2":
            path, name = v2, "memory.events"
        else:
            continue
        folder = _under(mountpoint, root, path)
        if folder is not None and read_counter(folder / name) is not None:
            return path, folder / name
    return None


def _cgroup_mounts() -> list[tuple[str, str, str, str]]:
    """(root within the hierarchy, mount point, fs type, super options) of each cgroup mount."""
    mounts: list[tuple[str, str, str, str]] = []
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return mounts
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            mounts.append((_unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2]))
    return mounts


def _unescape(text: str) -> str:
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 8)), text)


def _under(mountpoint: str, root: str, path: str) -> Path | None:
    """Where cgroup ``path`` lies under a mount of the hierarchy's ``root``, or None if outside it."""
    if root == "/":
        return Path(mountpoint) / path.lstrip("/")
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return Path(mountpoint) / path[len(root) :].lstrip("/")
    return None


class OomWitness:
    """The OOM-kill counters around one worker's life: made just after it starts, ``verdict`` after it ends."""

    def __init__(self, pid: int, vmstat: Path = VMSTAT, locate: Locate = memory_cgroup):
        self.pid, self._vmstat, self._locate = pid, vmstat, locate
        self.machine_before = read_counter(vmstat)
        self.group: str | None = None
        self.counter: Path | None = None
        self.group_before: int | None = None
        self.follow()

    def follow(self) -> None:
        """Read the worker's cgroup again (while it lives); from a new one, count from now."""
        found = self._locate(self.pid)
        if found is None:
            return
        group, counter = found
        if group == self.group:
            return
        if group == "/" and self.group is not None:
            return  # an exiting process shows the root cgroup: not a move
        self.group, self.counter, self.group_before = group, counter, read_counter(counter)

    def verdict(self) -> tuple[bool | None, str]:
        """(whether the OOM killer acted, as far as the counters tell: None when none could be read;
        the evidence, in words)."""
        machine_after = read_counter(self._vmstat)
        group_after = read_counter(self.counter) if self.counter is not None else None
        if self.group_before is not None and group_after is not None:
            counted = f"{COUNTER} {self.group_before} -> {group_after} in {self.counter}"
            if group_after > self.group_before:
                return (
                    True,
                    f"the kernel's OOM killer acted in its memory cgroup {self.group} during the run ({counted})",
                )
            return False, f"no OOM kill in its memory cgroup {self.group} during the run ({counted})"
        if self.machine_before is not None and machine_after is not None:
            counted = f"{COUNTER} {self.machine_before} -> {machine_after} in {self._vmstat}"
            if machine_after > self.machine_before:
                return True, (
                    f"the kernel's OOM killer acted on this machine during the run ({counted}; "
                    "no counter of the worker's own memory cgroup could be read)"
                )
            return False, f"no OOM kill on this machine during the run ({counted})"
        return None, f"no OOM-kill counter could be read ({self._vmstat}, the worker's memory cgroup)"
