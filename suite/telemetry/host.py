"""Samplers of CPU and memory: the worker's process tree from /proc, a container from the Engine API."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from suite.telemetry.core import (
    CONTAINER_MAX_USAGE_BYTES,
    CPU_PERCENT,
    MEMORY_BYTES,
    PROCESS_HWM_BYTES,
    Ended,
    Key,
    PolledSampler,
    Sampler,
)

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def proc_stat_fields(pid: int, proc: str = "/proc") -> tuple[str, list[str]] | None:
    """(command name, fields from field 3 on) of ``/proc/PID/stat``, None when the process is gone.

    The command name (field 2) is in parentheses and may hold spaces or parentheses itself, so the
    fields start after the last ")". ``fields[0]`` is field 3 (state), so field N (proc(5)'s
    numbering) is ``fields[N - 3]``: ppid 4, session 6, utime 14, stime 15, cutime 16, cstime 17,
    starttime 22, rss 24."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    close = data.rfind(")")
    return data[data.find("(") + 1 : close], data[close + 2 :].split()


def _proc_stat(pid: int, proc: str = "/proc") -> tuple[int, int, float, int] | None:
    """(ppid, session, cpu seconds incl. reaped children, rss pages) of one process, None when gone."""
    read = proc_stat_fields(pid, proc)
    if read is None:
        return None
    fields = read[1]
    ppid, session = int(fields[1]), int(fields[3])
    ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return ppid, session, ticks / CLK_TCK, int(fields[21])


def _vm_hwm(pid: int, proc: str = "/proc") -> int | None:
    """The kernel's peak resident set size of one process (VmHWM), in bytes."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class ProcSampler(PolledSampler):
    """CPU and memory of a process tree from /proc (see the module docstring for what is counted)."""

    name = "proc"
    method = (
        "/proc: utime+stime+cutime+cstime of the worker's process tree (and its session where all of /proc is "
        "scanned), as % of one core; "
        "memory the tree's summed RSS, and the largest per-process VmHWM"
    )

    def __init__(self, root_pid: int, proc: str = "/proc"):
        super().__init__()
        self.root, self.proc = root_pid, proc
        self._last: tuple[float, float] | None = None  # (monotonic time, cpu seconds)
        self._hwm: dict[int, int] = {}

    def members(self) -> dict[int, tuple[int, int, float, int]]:
        """Every process whose ancestry reaches the root: from the kernel's children lists where it
        keeps them (a few small reads per sample), else from a scan of every process (which also
        finds orphans left in the root's session)."""
        if os.path.exists(f"{self.proc}/{self.root}/task/{self.root}/children"):
            return self._descendants()
        return self._scan()

    def _descendants(self) -> dict[int, tuple[int, int, float, int]]:
        found: dict[int, tuple[int, int, float, int]] = {}
        todo = [self.root]
        while todo:
            pid = todo.pop()
            if pid in found:
                continue
            info = _proc_stat(pid, self.proc)
            if info is None:
                continue
            found[pid] = info
            try:
                tasks = os.listdir(f"{self.proc}/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                try:
                    with open(f"{self.proc}/{pid}/task/{tid}/children", "rb") as fh:
                        todo += [int(c) for c in fh.read().split()]
                except OSError:
                    pass
        return found

    def _scan(self) -> dict[int, tuple[int, int, float, int]]:
        table = {}
        for entry in os.listdir(self.proc):
            if entry.isdigit():
                info = _proc_stat(int(entry), self.proc)
                if info is not None:
                    table[int(entry)] = info
        children: dict[int, list[int]] = {}
        for pid, info in table.items():
            children.setdefault(info[0], []).append(pid)
        tree, todo = set(), [self.root] if self.root in table else []
        while todo:
            pid = todo.pop()
            if pid not in tree:
                tree.add(pid)
                todo += children.get(pid, [])
        tree |= {pid for pid, info in table.items() if info[1] == self.root}
        return {pid: table[pid] for pid in tree}

    def read(self) -> dict[Key, float | None]:
        now = time.monotonic()
        members = self.members()
        if not members:
            raise Ended
        cpu_s = sum(info[2] for info in members.values())
        rss = sum(info[3] for info in members.values()) * PAGE_SIZE
        for pid in members:
            hwm = _vm_hwm(pid, self.proc)
            if hwm is not None:
                self._hwm[pid] = max(hwm, self._hwm.get(pid, 0))
        out: dict[Key, float | None] = {(MEMORY_BYTES, None): float(rss)}
        if self._hwm:
            out[(PROCESS_HWM_BYTES, None)] = float(max(self._hwm.values()))
        if self._last is not None and now > self._last[0]:
            # A process that left the tree unreaped takes its time with it: never below zero.
            out[(CPU_PERCENT, None)] = max(0.0, cpu_s - self._last[1]) / (now - self._last[0]) * 100.0
        self._last = (now, cpu_s)
        return out


def docker_cpu_percent(previous: dict[str, Any], current: dict[str, Any]) -> float | None:
    """docker CLI's CPU percent between two ``cpu_stats`` reads (calculateCPUPercentUnix)."""
    try:
        cpu_delta = current["cpu_usage"]["total_usage"] - previous["cpu_usage"]["total_usage"]
        system_delta = current["system_cpu_usage"] - previous["system_cpu_usage"]
    except (KeyError, TypeError):
        return None
    online = current.get("online_cpus") or len(current.get("cpu_usage", {}).get("percpu_usage") or [])
    if system_delta <= 0:
        return None  # two reads of the same instant: no interval to divide by
    return max(cpu_delta, 0) / system_delta * online * 100.0  # the CLI shows 0 for a negative delta


def docker_memory_bytes(memory_stats: dict[str, Any]) -> float | None:
    """docker CLI's memory usage without cache (calculateMemUsageUnixNoCache)."""
    usage = memory_stats.get("usage")
    if usage is None:
        return None
    stats = memory_stats.get("stats") or {}
    if "total_inactive_file" in stats and stats["total_inactive_file"] < usage:  # cgroup v1
        return float(usage - stats["total_inactive_file"])
    if stats.get("inactive_file", usage) < usage:  # cgroup v2
        return float(usage - stats["inactive_file"])
    return float(usage)


class DockerStatsSampler(Sampler):
    """A container's CPU and memory from the Engine API's stats stream.

    The engine publishes a sample about once a second (Docker 20.10 here: 1.00 s apart), each with
    the previous read as ``precpu_stats``; a one-shot read, the only way to ask more often, took
    0.8 s per call on a busy 2-core engine here, so the stream's cadence is what a container gets.
    """

    name = "docker_stats"
    method = (
        "Engine API container stats stream (about 1 Hz): CPU % as the docker CLI computes it from "
        "cpu_stats and precpu_stats (% of one core); memory usage minus inactive file cache as the CLI shows it, "
        "and the engine's high-water mark memory_stats.max_usage where it keeps one (cgroup v1, file cache included)"
    )

    def __init__(self, client: Callable[[], Any], container_id: str):
        super().__init__()
        self._client_factory, self.container_id = client, container_id

    def run(self, clock: Callable[[], float], stop: threading.Event, interval_s: float) -> None:
        api = self._client_factory().api
        for stats in api.stats(self.container_id, stream=True, decode=True):
            if ended_stats(stats):
                break
            t = clock()
            with self._lock:
                self.reads.append(t)
            for key, value in docker_sample(stats).items():
                self.add(key, t, value)
            if stop.is_set():
                return
        if not self.reads:
            self.error = "no samples: the engine's stats stream ended before its first sample"


def ended_stats(stats: dict[str, Any]) -> bool:
    """A sample of a container that no longer runs: the engine sends a zero read time ("0001-01-01...").

    A missing or zero memory usage is not taken as the end: some engines and cgroup setups leave it
    out of live samples, and ending on it would stop the sampler silently."""
    return str(stats.get("read", "")).startswith("0001-")


def docker_sample(stats: dict[str, Any]) -> dict[Key, float | None]:
    """One Engine API stats sample as metrics; no CPU figure for the first (its precpu_stats is empty)."""
    memory = stats.get("memory_stats") or {}
    out: dict[Key, float | None] = {(MEMORY_BYTES, None): docker_memory_bytes(memory)}
    if memory.get("max_usage"):  # cgroup v1's high-water mark; cgroup v2 engines report none
        out[(CONTAINER_MAX_USAGE_BYTES, None)] = float(memory["max_usage"])
    previous = stats.get("precpu_stats") or {}
    if previous.get("system_cpu_usage"):
        out[(CPU_PERCENT, None)] = docker_cpu_percent(previous, stats.get("cpu_stats") or {})
    return out
