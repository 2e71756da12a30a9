"""The machine's load around a run: what other processes, the hypervisor and other GPU users took.

A run measured beside a busy program is slower by an amount nobody can tell afterwards, so the
load is recorded with the result and a result measured under load says so (``suite.record.under_load
.load_note``). ``LoadSampler`` is one more telemetry sampler; ``sample_machine`` takes the same
figures for ``suite env`` over a short sample.

What is measured, each from ``/proc`` of the machine the orchestrator runs on:

- **Other processes' CPU** (``other_cores``): utime + stime (``/proc/PID/stat`` fields 14 and 15) of
  every process that is not the run's own, differenced between scans once a second, over the wall
  time between the first and the last scan: cores used by others on average (1.0 = one core busy
  all the time). A process is told apart by its PID and start time (field 22), so a reused PID is a
  new process; one started after the first scan counts from zero, one alive at the first scan
  from what it had used then. A process's reaped children (cutime, cstime) are not added: their
  time was counted while they were seen. What a process used after its last scan is lost when it
  ends, so a swarm of processes shorter than a second is under-counted; ``machine_busy_cores``
  (everything that ran, the run included, from ``/proc/stat``) shows such a swarm.
- **The run's own processes** (``Ownership``): the orchestrator's own process, and the worker's
  process tree (its descendants and its session) for a local run, or every process whose
  ``/proc/PID/cgroup`` names the container for a Docker run on an engine on this machine. A
  process once the run's own stays so (an orphan re-parented to init still is).
- **Steal** (``steal_share``): the ``steal`` column of ``/proc/stat``'s ``cpu`` line over the sum
  of its first eight columns (user, nice, system, idle, iowait, irq, softirq, steal; guest time is
  already in user and nice): the share of CPU time a hypervisor gave to other guests.
- **Load average** (``os.getloadavg``) when sampling started and when it stopped, beside the
  machine's logical cores (``os.cpu_count``). It counts the run's own threads, so it is shown, not
  judged, for a run.
- **Other processes on the run's GPUs** (``gpu_others``): NVML's compute processes per GPU
  (``nvmlDeviceGetComputeRunningProcesses``) whose PID is not the run's own, gathered over every
  scan; left out, without a word, where NVML cannot be imported or started.

The result's ``telemetry.load``::

    {"method", "own", "cores", "scans", "window_s", "loadavg_start": [1, 5, 15 min], "loadavg_end",
     "other_cores", "machine_busy_cores", "steal_share",
     "fit": {"other_cores", "steal_share", "covered_s"},       # the timed fit's part of the scans
     "top_others": [{"pid", "name", "cores"}],                 # at most TOP_OTHERS, largest first
     "gpu_others": {uuid: [{"pid", "name", "used_memory_bytes"}]},  # only where NVML answered
     "error"}

Beside it the sampler's ``other_cpu_percent`` and ``cpu_steal_percent`` metrics are the same
figures per scan interval, as series with the usual summaries.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from suite.telemetry.core import CPU_STEAL_PERCENT, OTHER_CPU_PERCENT, Sampler
from suite.telemetry.host import CLK_TCK, proc_stat_fields

LOAD_INTERVAL_S = 1.0  # a scan reads every process's stat: ~3 ms of CPU for 80 processes, so once a second
TOP_OTHERS = 5  # the largest other processes named in the record
TOP_MIN_CORES = 0.01  # smaller than this is not worth a name
MAX_SCAN_FAILURES = 5

METHOD = (
    "/proc: utime+stime of every process not the run's own, differenced between scans about once a "
    "second (cores used by others); /proc/stat steal over all CPU time; os.getloadavg at the start and the "
    "end; NVML compute processes on the run's GPUs where NVML answers"
)


class Process(NamedTuple):
    name: str
    ppid: int
    session: int
    start: int  # clock ticks after boot
    ticks: int  # utime + stime


def read_process(pid: int, proc: str = "/proc") -> Process | None:
    read = proc_stat_fields(pid, proc)
    if read is None:
        return None
    name, f = read
    try:
        return Process(name, int(f[1]), int(f[3]), int(f[19]), int(f[11]) + int(f[12]))
    except (IndexError, ValueError):
        return None


def read_processes(proc: str = "/proc") -> dict[int, Process]:
    """Every process /proc lists now (one that ends while it is read is left out)."""
    table = {}
    for entry in os.listdir(proc):
        if entry.isdigit():
            info = read_process(int(entry), proc)
            if info is not None:
                table[int(entry)] = info
    return table


class CpuTimes(NamedTuple):
    """``/proc/stat``'s ``cpu`` line, in clock ticks summed over every CPU."""

    total: int  # user + nice + system + idle + iowait + irq + softirq + steal
    busy: int  # user + nice + system + irq + softirq: what ran, on behalf of anyone
    steal: int


def read_cpu_times(proc: str = "/proc") -> CpuTimes:
    with open(f"{proc}/stat", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("cpu "):
                return parse_cpu_line(line)
    raise OSError(f"{proc}/stat has no cpu line")


def parse_cpu_line(line: str) -> CpuTimes:
    v = [int(x) for x in line.split()[1:]] + [0] * 8  # older kernels have fewer columns
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    return CpuTimes(sum(v[:8]), user + nice + system + irq + softirq, steal)


def uptime_ticks(proc: str = "/proc") -> int:
    """Time since boot (``/proc/uptime``, in hundredths) in whole clock ticks, rounded down as the
    kernel rounds a process's start time. Integer arithmetic: ``float("74.60") * 100`` is
    7460.000000000001, which would put a process started in that very tick before the scan."""
    with open(f"{proc}/uptime", encoding="ascii") as fh:
        whole, _, frac = fh.read().split()[0].partition(".")
    hundredths = int(whole) * 100 + int((frac + "00")[:2])
    return hundredths * CLK_TCK // 100


class Ownership:
    """Which processes are the run's own: ``singles`` (the orchestrator), the descendants and the
    session of each of ``trees`` (a local worker), and where ``cgroup`` is given (a container's
    ID) every process whose ``/proc/PID/cgroup`` names it."""

    def __init__(
        self,
        singles: Iterable[int] = (),
        trees: Iterable[int] = (),
        cgroup: str | None = None,
        proc: str = "/proc",
    ):
        self.singles, self.trees, self.cgroup, self.proc = set(singles), set(trees), cgroup, proc
        self.cgroup_seen = False  # a process of the container was found in /proc
        self._in_cgroup: dict[tuple[int, int], bool] = {}

    def describe(self) -> str:
        parts = [f"the orchestrator (pid {p})" for p in sorted(self.singles)]
        parts += [f"the worker's process tree and session (pid {p})" for p in sorted(self.trees)]
        if self.cgroup:
            parts.append(f"the processes of container {self.cgroup[:12]} (by /proc/PID/cgroup)")
        return ", ".join(parts) or "none"

    def own(self, table: dict[int, Process]) -> set[int]:
        """The PIDs in ``table`` that are the run's own now."""
        mine = {p for p in self.singles if p in table}
        children: dict[int, list[int]] = {}
        for pid, info in table.items():
            children.setdefault(info.ppid, []).append(pid)
        todo = [p for p in self.trees if p in table]
        while todo:
            pid = todo.pop()
            if pid not in mine:
                mine.add(pid)
                todo += children.get(pid, [])
        mine |= {pid for pid, info in table.items() if info.session in self.trees}
        if self.cgroup:
            for pid, info in table.items():
                if pid not in mine and self._cgroup_member(pid, info):
                    mine.add(pid)
            live = {(pid, info.start) for pid, info in table.items()}
            self._in_cgroup = {k: v for k, v in self._in_cgroup.items() if k in live}
        return mine

    def _cgroup_member(self, pid: int, info: Process) -> bool:
        key = (pid, info.start)
        if key not in self._in_cgroup:
            try:
                with open(f"{self.proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
                    cgroup = self.cgroup
                    member = bool(cgroup and cgroup in fh.read())
            except OSError:
                member = False
            self._in_cgroup[key] = member
            self.cgroup_seen |= member
        return self._in_cgroup[key]


class Interval(NamedTuple):
    """One interval between two scans: seconds on the sampler's clock, CPU in clock ticks."""

    start: float
    end: float
    other_ticks: int
    busy_ticks: int
    steal_ticks: int
    total_ticks: int


class GpuProcesses:
    """Other compute processes on the given GPUs through NVML; ``available`` False where NVML
    cannot be imported or started, and then nothing is recorded."""

    def __init__(self, uuids: list[str]):
        self.uuids = uuids
        self.available = False
        self.error: str | None = None
        self.found: dict[str, dict[int, dict[str, Any]]] = {u: {} for u in uuids}
        self._nvml: Any = None
        self._handles: dict[str, Any] = {}
        if not uuids:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no NVML, no driver: GPU users are not checked, silently
            return
        self._nvml = pynvml
        try:
            self._handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids}
        except Exception:  # noqa: BLE001 - a GPU NVML cannot find: not checked
            self.close()
            return
        self.available = True

    def read(self, is_own: Callable[[int], bool], names: dict[int, str]) -> None:
        if not self.available:
            return
        for uuid, handle in self._handles.items():
            try:
                running = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception as exc:  # noqa: BLE001 - one failed read: said, the next may work
                self.error = f"{type(exc).__name__}: {exc}"
                continue
            for p in running:
                pid = int(p.pid)
                if is_own(pid):
                    continue
                used = getattr(p, "usedGpuMemory", None)
                seen = self.found[uuid].setdefault(pid, {"pid": pid, "name": names.get(pid), "used_memory_bytes": None})
                if isinstance(used, int) and used >= 0 and used < 2**63:  # NVML_VALUE_NOT_AVAILABLE is all ones
                    seen["used_memory_bytes"] = max(used, seen["used_memory_bytes"] or 0)

    def close(self) -> None:
        nvml, self._nvml, self._handles = self._nvml, None, {}
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that failed is not worth a record
                pass

    def section(self) -> dict[str, list[dict[str, Any]]]:
        return {u: sorted(found.values(), key=lambda p: p["pid"]) for u, found in self.found.items()}


class LoadTracker:
    """The arithmetic of the load figures: ``scan()`` reads /proc once (the first call is the
    baseline); ``figures()`` is the record's ``load`` block. No thread: ``LoadSampler`` and
    ``sample_machine`` drive it."""

    def __init__(self, ownership: Ownership, proc: str = "/proc", clock: Callable[[], float] = time.monotonic):
        self.ownership, self.proc, self.clock = ownership, proc, clock
        self.intervals: list[Interval] = []
        self.scans = 0
        self.table: dict[int, Process] = {}
        self.own_now: set[int] = set()
        self._own_keys: set[tuple[int, int]] = set()
        self._seen: dict[tuple[int, int], int] = {}  # other process -> its ticks at the last scan
        self._used: dict[tuple[int, int], int] = {}  # other process -> ticks used since the first scan
        self._names: dict[tuple[int, int], str] = {}
        self._first_up: int | None = None
        self._t0 = self._t_last = 0.0
        self._cpu_last: CpuTimes | None = None
        self._cpu0: CpuTimes | None = None

    def scan(self) -> Interval | None:
        """Read every process and the CPU line; the interval since the previous scan (None at the first)."""
        up = uptime_ticks(self.proc)
        cpu = read_cpu_times(self.proc)
        table = read_processes(self.proc)
        t = self.clock()
        own = self.ownership.own(table)
        other = 0
        live = set()
        for pid, info in table.items():
            key = (pid, info.start)
            live.add(key)
            if pid in own or key in self._own_keys:
                self._own_keys.add(key)
                continue
            previous = self._seen.get(key)
            if previous is None:
                # Started since the first scan: all of its time is in the window; else what it had is before it.
                previous = 0 if self._first_up is not None and info.start >= self._first_up else info.ticks
            used = max(0, info.ticks - previous)
            self._seen[key] = info.ticks
            if used:
                self._used[key] = self._used.get(key, 0) + used
                self._names[key] = info.name
            other += used
        self._seen = {k: v for k, v in self._seen.items() if k in live}
        self._own_keys &= live
        self.table = table
        self.own_now = own | {pid for pid, info in table.items() if (pid, info.start) in self._own_keys}
        self.scans += 1
        if self._first_up is None:
            self._first_up, self._t0, self._t_last, self._cpu0, self._cpu_last = up, t, t, cpu, cpu
            return None
        assert self._cpu_last is not None
        last = self._cpu_last
        interval = Interval(
            self._t_last, t, other, cpu.busy - last.busy, cpu.steal - last.steal, cpu.total - last.total
        )
        self._t_last, self._cpu_last = t, cpu
        self.intervals.append(interval)
        return interval

    def is_own(self, pid: int) -> bool:
        """A PID another source reports (NVML): the run's own by the last scan, or by a read of it now."""
        if pid in self.own_now:
            return True
        info = self.table.get(pid) or read_process(pid, self.proc)
        return info is not None and pid in self.ownership.own({**self.table, pid: info})

    def figures(self, windows: dict[str, list[float]] | None = None) -> dict[str, Any]:
        """The load block (the module docstring's layout) of what the scans saw."""
        window = self._t_last - self._t0
        out: dict[str, Any] = {
            "method": METHOD,
            "own": self.ownership.describe(),
            "cores": os.cpu_count(),
            "scans": self.scans,
            "window_s": round(window, 3),
            "other_cores": None,
            "machine_busy_cores": None,
            "steal_share": None,
        }
        if window <= 0 or self._cpu0 is None or self._cpu_last is None:
            return out
        cpu0, cpu1 = self._cpu0, self._cpu_last
        out["other_cores"] = round(sum(self._used.values()) / CLK_TCK / window, 4)
        out["machine_busy_cores"] = round((cpu1.busy - cpu0.busy) / CLK_TCK / window, 4)
        total = cpu1.total - cpu0.total
        out["steal_share"] = round((cpu1.steal - cpu0.steal) / total, 4) if total > 0 else None
        fit = (windows or {}).get("fit")
        if fit:
            part = _within(self.intervals, fit[0], fit[1])
            if part is not None:
                out["fit"] = part
        top = sorted(self._used.items(), key=lambda kv: -kv[1])
        out["top_others"] = [
            {"pid": key[0], "name": self._names.get(key), "cores": round(ticks / CLK_TCK / window, 4)}
            for key, ticks in top[:TOP_OTHERS]
            if ticks / CLK_TCK / window >= TOP_MIN_CORES
        ]
        return out


def _within(intervals: list[Interval], start: float, end: float) -> dict[str, Any] | None:
    """Other processes' cores and the steal share over the part of the scans inside [start, end],
    each interval weighted by how much of it lies inside; None when less than one scan interval
    lies inside (too short to say)."""
    covered = other = steal = total = 0.0
    for iv in intervals:
        length = iv.end - iv.start
        overlap = min(iv.end, end) - max(iv.start, start)
        if length <= 0 or overlap <= 0:
            continue
        share = overlap / length
        covered += overlap
        other += iv.other_ticks * share
        steal += iv.steal_ticks * share
        total += iv.total_ticks * share
    if covered < LOAD_INTERVAL_S * 0.9:
        return None
    return {
        "other_cores": round(other / CLK_TCK / covered, 4),
        "steal_share": round(steal / total, 4) if total > 0 else None,
        "covered_s": round(covered, 3),
    }


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class LoadSampler(Sampler):
    """The load around one run (the module docstring): a baseline scan when sampling starts, one a
    second while the run goes on, and a last one once it has stopped; the record's ``load`` block
    comes from ``extras``."""

    name = "load"
    method = METHOD

    def __init__(self, ownership: Ownership, gpus: list[str] | None = None, proc: str = "/proc"):
        super().__init__()
        self.ownership, self.gpus, self.proc = ownership, list(gpus or []), proc
        self.tracker: LoadTracker | None = None
        self._gpu: GpuProcesses | None = None
        self._loadavg: dict[str, list[float] | None] = {}

    def run(self, clock: Callable[[], float], stop: threading.Event, interval_s: float) -> None:
        tracker = LoadTracker(self.ownership, self.proc, clock)
        self._loadavg["loadavg_start"] = loadavg()
        self._gpu = GpuProcesses(self.gpus)
        try:
            self._scan(tracker)  # the baseline: failing here (no /proc), the sampler records why and ends
            with self._lock:
                self.tracker = tracker
            failures = 0
            while not stop.wait(max(interval_s, LOAD_INTERVAL_S)):
                try:
                    self._scan(tracker)
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - recorded; a few in a row end this sampler only
                    failures += 1
                    self.error = f"{type(exc).__name__}: {exc}"
                    if failures >= MAX_SCAN_FAILURES:
                        return
            self._scan(tracker)  # the end: after the run's process has gone
            self._loadavg["loadavg_end"] = loadavg()
        finally:
            self._gpu.close()

    def _scan(self, tracker: LoadTracker) -> None:
        with self._lock:
            interval = tracker.scan()
            self.reads.append(tracker.clock())
            if self._gpu is not None:
                self._gpu.read(tracker.is_own, {pid: info.name for pid, info in tracker.table.items()})
        if interval is not None and interval.end > interval.start:
            cores = interval.other_ticks / CLK_TCK / (interval.end - interval.start)
            self.add((OTHER_CPU_PERCENT, None), interval.end, cores * 100)
            if interval.total_ticks > 0:
                self.add((CPU_STEAL_PERCENT, None), interval.end, interval.steal_ticks / interval.total_ticks * 100)

    def extras(self, windows: dict[str, list[float]]) -> dict[str, Any]:
        with self._lock:
            tracker = self.tracker
            if tracker is None:
                return {}
            block = {**tracker.figures(windows), **self._loadavg}
            if self.ownership.cgroup and not self.ownership.cgroup_seen:
                # Not one of the container's processes in this /proc (an engine in a VM): every CPU
                # figure of "others" would hold the run itself.
                unseen = "the container's processes are not in this machine's /proc"
                block.update(other_cores=None, top_others=[], error=unseen)
                block.pop("fit", None)
            if self._gpu is not None and self._gpu.available:
                block["gpu_others"] = self._gpu.section()
            if self.error and "error" not in block:
                block["error"] = self.error
        return {"load": block}


def sample_machine(seconds: float = 1.0, gpus: list[str] | None = None, proc: str = "/proc") -> dict[str, Any]:
    """The load block of this machine over ``seconds`` now, this process being the only own one
    (what ``suite env`` judges); the load average is the one at the end. Raises OSError where there
    is no /proc."""
    tracker = LoadTracker(Ownership(singles=[os.getpid()], proc=proc), proc)
    gpu = GpuProcesses(gpus or [])
    try:
        tracker.scan()
        time.sleep(seconds)
        tracker.scan()
        gpu.read(tracker.is_own, {pid: info.name for pid, info in tracker.table.items()})
    finally:
        gpu.close()
    block = {**tracker.figures(), "loadavg": loadavg()}
    if gpu.available:
        block["gpu_others"] = gpu.section()
    return block
