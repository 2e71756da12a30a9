"""What the machine was doing during a run: CPU, memory and GPU, sampled while the worker trains.

The report's question "why is my small network slower on the GPU?" is answered by how busy the GPU
was during each step; these samplers measure that, and what the CPU and memory did beside it.

Samplers, each a thread started by ``Recorder`` once the worker is launched (``RunSkeleton.run``):

- ``ProcSampler`` (local backend): the worker's whole process tree from ``/proc``. CPU is the sum of
  utime + stime + cutime + cstime of every process in the tree (the worker, its descendants, and
  anything left in its session), differenced between samples: **percent of one core** (100 = one
  core busy all the time, like ``top`` and ``docker stats``; divide by the machine's cores for a
  share of the machine). Memory is the tree's summed resident set size (RSS); the largest per-process
  high-water mark the kernel kept (``VmHWM``) is recorded beside it, because a spike between two
  samples is in the kernel's mark and not in the sampled sum.
- ``DockerStatsSampler`` (Docker backend, local or remote engine): the Engine API's container stats
  stream, which the engine publishes about once a second (not 5 Hz: see the class). CPU percent is
  docker CLI's formula (docker/cli ``cli/command/container/stats_helpers.go``
  ``calculateCPUPercentUnix``): delta of ``cpu_stats.cpu_usage.total_usage`` over delta of
  ``system_cpu_usage``, times ``online_cpus`` x 100, against ``precpu_stats``: also percent of one
  core. Memory is ``usage`` minus ``total_inactive_file`` (cgroup v1) or ``inactive_file`` (cgroup
  v2), the CLI's ``calculateMemUsageUnixNoCache``.
- ``NvmlSampler`` (GPUs on this machine: local backend, or a Docker engine on this host): NVML through
  ``nvidia-ml-py``, devices by UUID. Utilization is NVML's "percent of time over the past sample
  period during which one or more kernels was executing" (a period of 1/6 s to 1 s by product).
- ``SmiSampler`` (GPUs of a remote engine): ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits
  -lms 200`` run inside the run's container through the Engine API's exec.

Sampling never fails a run: a sampler that cannot start or breaks records its error in the section.

The ``telemetry`` section of a result (``Recorder.section``)::

    {"interval_s": 0.2,
     "windows": {"fit": [start, end], "steady": [start, end]},   # seconds from the run's start
     "sources": [{"name", "method", "samples", "rate_hz", "error"}],
     "metrics": [{"name", "device", "unit", "source",
                  "summary": {"run"|"fit"|"steady": {"mean", "p95", "max", "n"}},
                  "series": {"t": [...], "v": [...], "decimated_from": N}}]}

``fit`` is the timed ``model.fit`` (from the worker's "fit" phase line to its "evaluate" line, as the
host received them), ``steady`` the part after the first epoch. The clock-event-reasons metric has
``reasons`` (reason -> share of samples) in place of mean/p95/max. Series longer than
``SERIES_POINTS`` are decimated for storage by averaging consecutive equal-count buckets (time and
value); every summary is computed from the full series before that.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

INTERVAL_S = 0.2  # 5 Hz
SERIES_POINTS = 600  # points kept per stored series; more are averaged down in buckets
STOP_JOIN_S = 2.0  # how long stopping waits for a sampler thread; a stuck one is abandoned, not waited for
MAX_CONSECUTIVE_ERRORS = 5

# Metric names: the result's ``metrics[].name`` (suite.results names what reports read).
CPU_PERCENT = "cpu_percent"
MEMORY_BYTES = "memory_bytes"
PROCESS_HWM_BYTES = "process_hwm_bytes"
GPU_UTIL_PERCENT = "gpu_util_percent"
GPU_MEMORY_BYTES = "gpu_memory_used_bytes"
GPU_SM_CLOCK_MHZ = "gpu_sm_clock_mhz"
GPU_POWER_W = "gpu_power_w"
GPU_TEMPERATURE_C = "gpu_temperature_c"
GPU_CLOCK_REASONS = "gpu_clock_event_reasons"

UNITS = {
    CPU_PERCENT: "% of one core",
    MEMORY_BYTES: "bytes",
    PROCESS_HWM_BYTES: "bytes",
    GPU_UTIL_PERCENT: "%",
    GPU_MEMORY_BYTES: "bytes",
    GPU_SM_CLOCK_MHZ: "MHz",
    GPU_POWER_W: "W",
    GPU_TEMPERATURE_C: "C",
    GPU_CLOCK_REASONS: "bitmask",
}

# NVML's clock event (formerly "throttle") reasons, nvml.h / pynvml nvmlClocksThrottleReason*.
CLOCK_REASONS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
    0x200: "BoardLimit",
    0x400: "Reliability",
}

Key = tuple[str, str | None]  # (metric name, device or None)


def decode_reasons(mask: int) -> list[str]:
    """The names of the bits set in an NVML clock event reasons mask; unknown bits as hex."""
    names = [name for bit, name in CLOCK_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_REASONS)
    return names + ([f"unknown {unknown:#x}"] if unknown else [])


# ---------------------------------------------------------------------------------------------
# Summaries


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile by linear interpolation between closest ranks (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(values: list[float]) -> dict[str, float] | None:
    """mean, p95, max and n of the values that are not None; None when there are none."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return {"mean": sum(vals) / len(vals), "p95": percentile(vals, 95), "max": max(vals), "n": len(vals)}


def reason_shares(masks: list[float]) -> dict[str, float]:
    """reason -> share of samples in which it was active."""
    vals = [int(m) for m in masks if m is not None]
    if not vals:
        return {}
    counts: dict[str, int] = {}
    for m in vals:
        for name in decode_reasons(m):
            counts[name] = counts.get(name, 0) + 1
    return {name: counts[name] / len(vals) for name in sorted(counts)}


def decimate(t: list[float], v: list[float | None], points: int = SERIES_POINTS) -> tuple[list[float], list]:
    """At most ``points`` points: consecutive equal-count buckets, each its mean time and mean value."""
    n = len(t)
    if n <= points:
        return list(t), list(v)
    out_t, out_v = [], []
    for b in range(points):
        lo, hi = b * n // points, (b + 1) * n // points
        vals = [x for x in v[lo:hi] if x is not None]
        out_t.append(sum(t[lo:hi]) / (hi - lo))
        out_v.append(sum(vals) / len(vals) if vals else None)
    return out_t, out_v


def rate_hz(times: list[float]) -> float | None:
    """Samples per second actually achieved: (n - 1) over the time from the first to the last."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


# ---------------------------------------------------------------------------------------------
# Samplers


class Sampler:
    """One source of samples, run in its own thread; ``points`` collects (time, value) per metric."""

    name = "sampler"
    method = ""

    def __init__(self) -> None:
        self.points: dict[Key, list[tuple[float, float | None]]] = {}
        self.error: str | None = None
        self.reads: list[float] = []  # times of every completed read, for the achieved rate
        self._lock = threading.Lock()

    def add(self, key: Key, t: float, value: float | None) -> None:
        with self._lock:
            self.points.setdefault(key, []).append((t, value))

    def snapshot(self) -> tuple[dict[Key, list[tuple[float, float | None]]], list[float]]:
        with self._lock:
            return {k: list(v) for k, v in self.points.items()}, list(self.reads)

    def run(self, clock: Callable[[], float], stop: threading.Event, interval_s: float) -> None:
        """Sample until ``stop`` is set or the source ends; the base class samples nothing."""


class Ended(Exception):
    """What is sampled is gone (the process or container ended): the sampler stops, no error."""


class PolledSampler(Sampler):
    """A sampler that reads on a fixed cadence: ``open``, then ``read`` every interval, then ``close``."""

    def open(self) -> None:
        pass

    def read(self) -> dict[Key, float | None]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def run(self, clock: Callable[[], float], stop: threading.Event, interval_s: float) -> None:
        self.open()
        failures = 0
        try:
            due = clock()
            while not stop.is_set():
                try:
                    values = self.read()
                except Ended:
                    return
                except Exception as exc:  # noqa: BLE001 - recorded; a few in a row end this sampler only
                    failures += 1
                    self.error = f"{type(exc).__name__}: {exc}"
                    if failures >= MAX_CONSECUTIVE_ERRORS:
                        return
                else:
                    failures = 0
                    t = clock()
                    with self._lock:
                        self.reads.append(t)
                    for key, value in values.items():
                        self.add(key, t, value)
                due += interval_s
                now = clock()
                if due < now:
                    due = now  # fell behind (a slow read): no burst to catch up
                stop.wait(due - now)
        finally:
            self.close()


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_stat(pid: int, proc: str = "/proc") -> tuple[int, int, float, int] | None:
    """(ppid, session, cpu seconds incl. reaped children, rss pages) of one process, None when gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself.
    fields = data[data.rfind(")") + 2 :].split()
    # fields[0] is field 3 (state): ppid 4, session 6, utime 14, stime 15, cutime 16, cstime 17, rss 24.
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
        "/proc: utime+stime+cutime+cstime of the worker's process tree and session, as % of one core; "
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
        "cpu_stats and precpu_stats (% of one core); memory usage minus inactive file cache as the CLI shows it"
    )

    def __init__(self, client: Callable[[], Any], container_id: str):
        super().__init__()
        self._client_factory, self.container_id = client, container_id

    def run(self, clock: Callable[[], float], stop: threading.Event, interval_s: float) -> None:
        api = self._client_factory().api
        for stats in api.stats(self.container_id, stream=True, decode=True):
            if not ended_stats(stats):
                t = clock()
                with self._lock:
                    self.reads.append(t)
                for key, value in docker_sample(stats).items():
                    self.add(key, t, value)
            if stop.is_set() or ended_stats(stats):
                return


def ended_stats(stats: dict[str, Any]) -> bool:
    """A sample of a container that no longer runs: the engine sends zeros and a zero read time."""
    return str(stats.get("read", "")).startswith("0001-") or not (stats.get("memory_stats") or {}).get("usage")


def docker_sample(stats: dict[str, Any]) -> dict[Key, float | None]:
    """One Engine API stats sample as metrics; no CPU figure for the first (its precpu_stats is empty)."""
    out: dict[Key, float | None] = {(MEMORY_BYTES, None): docker_memory_bytes(stats.get("memory_stats") or {})}
    previous = stats.get("precpu_stats") or {}
    if previous.get("system_cpu_usage"):
        out[(CPU_PERCENT, None)] = docker_cpu_percent(previous, stats.get("cpu_stats") or {})
    return out


class NvmlSampler(PolledSampler):
    """GPUs on this machine through NVML (``nvidia-ml-py``), looked up by UUID, never by index."""

    name = "nvml"
    method = "NVML (nvidia-ml-py) on the orchestrator's machine, devices by UUID"

    def __init__(self, uuids: list[str]):
        super().__init__()
        self.uuids = uuids
        self._nvml: Any = None
        self._handles: dict[str, Any] = {}

    def open(self) -> None:
        import pynvml  # optional at run time: absent, the sampler records why and the run goes on

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in self.uuids}

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that failed is not worth a record
                pass

    def read(self) -> dict[Key, float | None]:
        out: dict[Key, float | None] = {}
        for uuid, handle in self._handles.items():
            for name, value in self._device(handle).items():
                out[(name, uuid)] = value
        return out

    def _device(self, h: Any) -> dict[str, float | None]:
        n = self._nvml
        temperature = (
            (lambda: n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU))
            if hasattr(n, "nvmlDeviceGetTemperatureV")
            else (lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        )
        reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        readers: dict[str, Callable[[], float]] = {
            GPU_UTIL_PERCENT: lambda: n.nvmlDeviceGetUtilizationRates(h).gpu,
            GPU_MEMORY_BYTES: lambda: n.nvmlDeviceGetMemoryInfo(h).used,
            GPU_SM_CLOCK_MHZ: lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            GPU_POWER_W: lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML reports mW
            GPU_TEMPERATURE_C: temperature,
            GPU_CLOCK_REASONS: lambda: reasons(h),
        }
        out: dict[str, float | None] = {}
        for name, read in readers.items():
            try:
                out[name] = float(read())
            except n.NVMLError as exc:  # one field a product does not support: None, said once
                out[name] = None
                self.error = self.error or f"{name}: {exc}"
        return out


# nvidia-smi's query fields, in the order asked; the name each becomes; its scale to the metric's unit.
SMI_FIELDS = (
    ("uuid", None, None),
    ("utilization.gpu", GPU_UTIL_PERCENT, 1.0),
    ("memory.used", GPU_MEMORY_BYTES, 1024.0 * 1024.0),  # MiB
    ("clocks.sm", GPU_SM_CLOCK_MHZ, 1.0),
    ("power.draw", GPU_POWER_W, 1.0),
    ("temperature.gpu", GPU_TEMPERATURE_C, 1.0),
    ("clocks_throttle_reasons.active", GPU_CLOCK_REASONS, None),
)
# What nvidia-smi prints in a csv header for these fields (units in brackets are stripped).
_SMI_ALIASES = {"clocks.current.sm": "clocks.sm", "clocks_event_reasons.active": "clocks_throttle_reasons.active"}
_SMI_UNITS = (" %", " MiB", " MHz", " W")


def smi_command(interval_s: float = INTERVAL_S) -> list[str]:
    """The loop run inside the container; it sees only the container's GPUs, so no --id."""
    cmd = [
        "nvidia-smi",
        "--query-gpu=" + ",".join(field for field, _, _ in SMI_FIELDS),
        "--format=csv,noheader,nounits",
        "-lms",
        str(round(interval_s * 1000)),
    ]
    return cmd


def _smi_value(text: str) -> str | None:
    text = text.strip()
    if not text or text.strip("[]") in ("N/A", "Not Supported", "Unknown Error", "Not Active"):
        return None
    for unit in _SMI_UNITS:
        if text.endswith(unit):
            return text[: -len(unit)].strip()
    return text


def parse_smi_header(line: str) -> list[str]:
    """Field names from nvidia-smi's csv header: 'utilization.gpu [%]' -> 'utilization.gpu'."""
    names = [part.split("[")[0].strip() for part in line.split(",")]
    return [_SMI_ALIASES.get(n, n) for n in names]


def parse_smi_line(line: str, fields: list[str]) -> dict[str, Any] | None:
    """One csv row of ``nvidia-smi --query-gpu`` (with or without units) -> {field: float | int | str | None}.

    Numbers become floats, the hex bitmask an int, "[N/A]" None; a row with the wrong number of
    columns (a warning line, a partial write) is None.
    """
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(fields):
        return None
    row: dict[str, Any] = {}
    for field, raw in zip(fields, parts, strict=True):
        value = _smi_value(raw)
        if value is None:
            row[field] = None
        elif value.lower().startswith("0x"):
            row[field] = int(value, 16)
        else:
            try:
                row[field] = float(value)
            except ValueError:
                row[field] = value
    return row


def smi_metrics(row: dict[str, Any]) -> dict[Key, float | None]:
    """A parsed row as the metrics of its GPU (by UUID; by the row's index when there is no UUID)."""
    device = row.get("uuid") or (str(int(row["index"])) if row.get("index") is not None else None)
    out: dict[Key, float | None] = {}
    for field, name, scale in SMI_FIELDS:
        if name is None or field not in row:
            continue
        value = row[field]
        out[(name, device)] = None if value is None else float(value) * (scale or 1.0)
    return out


class SmiSampler(Sampler):
    """GPUs of a remote engine: nvidia-smi looping inside the run's container, through the Engine API's exec."""

    name = "nvidia-smi"
    method = "nvidia-smi --query-gpu ... -lms 200 inside the run's container (Engine API exec)"

    def __init__(self, client: Callable[[], Any], container_id: str):
        super().__init__()
        self._client_factory, self.container_id = client, container_id

    def lines(self, interval_s: float) -> Iterator[str]:
        from suite.backends.base import split_lines

        api = self._client_factory().api
        exec_id = api.exec_create(self.container_id, smi_command(interval_s), stdout=True, stderr=True)
        yield from split_lines(api.exec_start(exec_id, stream=True))
        info = api.exec_inspect(exec_id)
        if info.get("ExitCode") not in (0, None):
            raise RuntimeError(f"nvidia-smi exited with code {info.get('ExitCode')}")

    def run(self, clock: Callable[[], float], stop: threading.Event, interval_s: float) -> None:
        fields = [field for field, _, _ in SMI_FIELDS]
        last_text = ""
        try:
            for line in self.lines(interval_s):
                if stop.is_set():
                    return
                row = parse_smi_line(line, fields)
                if row is None:
                    last_text = line.strip() or last_text
                    continue
                t = clock()
                with self._lock:
                    if not self.reads or self.reads[-1] != t:
                        self.reads.append(t)
                for key, value in smi_metrics(row).items():
                    self.add(key, t, value)
        except RuntimeError as exc:  # its exit code, with what it printed last
            self.error = f"{exc}" + (f": {last_text}" if last_text else "")
            return
        if not self.reads and last_text:
            self.error = f"nvidia-smi gave no samples: {last_text}"


# ---------------------------------------------------------------------------------------------
# The recorder: threads, the fit window, the result section


class Recorder:
    """Runs the samplers of one run and turns what they gathered into the result's ``telemetry``."""

    def __init__(self, samplers: list[Sampler], t0: float, interval_s: float = INTERVAL_S):
        self.samplers, self.t0, self.interval_s = samplers, t0, interval_s
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._section: dict[str, Any] | None = None

    def clock(self) -> float:
        return time.monotonic() - self.t0

    def start(self) -> Recorder:
        for sampler in self.samplers:
            thread = threading.Thread(target=self._run, args=(sampler,), name=f"telemetry-{sampler.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, sampler: Sampler) -> None:
        try:
            sampler.run(self.clock, self._stop, self.interval_s)
        except Exception as exc:  # noqa: BLE001 - sampling never fails a run; the record says why it stopped
            sampler.error = f"{type(exc).__name__}: {exc}"

    def mark(self, event: dict[str, Any]) -> None:
        """Note the fit window from the worker's progress lines ("fit" phase, first epoch, "evaluate")."""
        t = self.clock()
        if event.get("event") == "phase" and event.get("phase") == "fit":
            self.marks.setdefault("fit_start", t)
        elif event.get("event") == "epoch" and event.get("phase") == "fit" and event.get("epoch") == 1:
            self.marks.setdefault("first_epoch_end", t)
        elif event.get("event") == "phase" and event.get("phase") == "evaluate":
            self.marks.setdefault("fit_end", t)

    def sink(self, on_event: Callable[[dict[str, Any]], None] | None) -> Callable[[dict[str, Any]], None]:
        """An event sink that marks the window, then hands the event on."""

        def both(event: dict[str, Any]) -> None:
            self.mark(event)
            if on_event is not None:
                on_event(event)

        return both

    def stop(self) -> dict[str, Any]:
        """Stop sampling and return the section; a second call returns the first one's section."""
        if self._section is None:
            self._stop.set()
            for thread in self._threads:
                thread.join(STOP_JOIN_S)
            self._section = self.section()
        return self._section

    def windows(self) -> dict[str, list[float]]:
        m = self.marks
        out = {}
        if "fit_start" in m and "fit_end" in m and m["fit_end"] > m["fit_start"]:
            out["fit"] = [m["fit_start"], m["fit_end"]]
            if "first_epoch_end" in m and m["fit_end"] > m["first_epoch_end"] >= m["fit_start"]:
                out["steady"] = [m["first_epoch_end"], m["fit_end"]]
        return out

    def section(self) -> dict[str, Any]:
        windows = self.windows()
        sources, metrics = [], []
        for sampler in self.samplers:
            points, reads = sampler.snapshot()
            rate = rate_hz(reads)
            sources.append(
                {
                    "name": sampler.name,
                    "method": sampler.method,
                    "samples": len(reads),
                    "rate_hz": None if rate is None else round(rate, 3),
                    "error": sampler.error,
                }
            )
            for (name, device), pts in sorted(points.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
                metrics.append(_metric(name, device, sampler.name, pts, windows))
        return {
            "interval_s": self.interval_s,
            "windows": {k: [round(a, 3), round(b, 3)] for k, (a, b) in windows.items()},
            "sources": sources,
            "metrics": metrics,
        }


def _metric(
    name: str, device: str | None, source: str, pts: list[tuple[float, float | None]], windows: dict[str, list[float]]
) -> dict[str, Any]:
    t = [p[0] for p in pts]
    v = [p[1] for p in pts]
    spans = {"run": None, **windows}
    summary: dict[str, Any] = {}
    for window, span in spans.items():
        vals = [x for ti, x in pts if span is None or span[0] <= ti <= span[1]]
        if name == GPU_CLOCK_REASONS:
            shares = reason_shares(vals)
            if vals:
                summary[window] = {"reasons": shares, "n": sum(1 for x in vals if x is not None)}
        else:
            s = summarize(vals)
            if s is not None:
                summary[window] = s
    dt, dv = decimate(t, v)
    series = {"t": [round(x, 3) for x in dt], "v": [None if x is None else _round(x) for x in dv]}
    if len(t) > len(dt):
        series["decimated_from"] = len(t)
    return {
        "name": name,
        "device": device,
        "unit": UNITS.get(name, ""),
        "source": source,
        "summary": summary,
        "series": series,
    }


def _round(x: float) -> float:
    """Six significant digits: enough for any of these readings, and a result file half the size."""
    return float(f"{x:.6g}")


# ---------------------------------------------------------------------------------------------
# Reading a result's section (what reports use)


def metric_entries(section: dict[str, Any] | None, name: str) -> list[dict[str, Any]]:
    return [m for m in (section or {}).get("metrics", []) if m.get("name") == name]


def window_stat(
    entry: dict[str, Any], stat: str, windows: tuple[str, ...] = ("steady", "fit", "run"), min_n: int = 1
) -> float | None:
    """``stat`` of the first of ``windows`` whose summary has at least ``min_n`` samples (a summary
    without a count counts as enough); None when none has."""
    for window in windows:
        summary = entry.get("summary", {}).get(window)
        if summary and summary.get(stat) is not None and summary.get("n", min_n) >= min_n:
            return float(summary[stat])
    return None
