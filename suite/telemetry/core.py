"""The core of run telemetry: metric names, summaries, the sampler base classes and the recorder.

``suite.telemetry``'s docstring says what is sampled and how the result's section is laid out.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

INTERVAL_S = 0.2  # 5 Hz
SERIES_POINTS = 600  # points kept per stored series; more are averaged down in buckets
STOP_JOIN_S = 2.0  # how long stopping waits for all sampler threads together; a stuck one is abandoned
MAX_CONSECUTIVE_ERRORS = 5

# Metric names: the result's ``metrics[].name`` (suite.record.results names what reports read).
CPU_PERCENT = "cpu_percent"
MEMORY_BYTES = "memory_bytes"
PROCESS_HWM_BYTES = "process_hwm_bytes"
CONTAINER_MAX_USAGE_BYTES = "container_max_usage_bytes"  # the engine's high-water mark (cgroup v1 only)
GPU_UTIL_PERCENT = "gpu_util_percent"
GPU_MEMORY_BYTES = "gpu_memory_used_bytes"
GPU_SM_CLOCK_MHZ = "gpu_sm_clock_mhz"
GPU_POWER_W = "gpu_power_w"
GPU_TEMPERATURE_C = "gpu_temperature_c"
GPU_CLOCK_REASONS = "gpu_clock_event_reasons"
OTHER_CPU_PERCENT = "other_cpu_percent"  # processes not the run's own (suite.telemetry.load)
CPU_STEAL_PERCENT = "cpu_steal_percent"  # CPU time a hypervisor gave to other guests

UNITS = {
    CPU_PERCENT: "% of one core",
    MEMORY_BYTES: "bytes",
    PROCESS_HWM_BYTES: "bytes",
    CONTAINER_MAX_USAGE_BYTES: "bytes",
    GPU_UTIL_PERCENT: "%",
    GPU_MEMORY_BYTES: "bytes",
    GPU_SM_CLOCK_MHZ: "MHz",
    GPU_POWER_W: "W",
    GPU_TEMPERATURE_C: "C",
    GPU_CLOCK_REASONS: "bitmask",
    OTHER_CPU_PERCENT: "% of one core",
    CPU_STEAL_PERCENT: "% of CPU time",
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


def summarize(values: list[float | None]) -> dict[str, float] | None:
    """mean, p95, max and n of the values that are not None; None when there are none."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return {"mean": sum(vals) / len(vals), "p95": percentile(vals, 95), "max": max(vals), "n": len(vals)}


def reason_shares(masks: list[float | None]) -> dict[str, float]:
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

    def extras(self, windows: dict[str, list[float]]) -> dict[str, Any]:
        """Blocks this sampler adds to the section beside ``metrics`` (``load``); none by default.
        Called when the section is built, with the fit windows the recorder marked."""
        return {}


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
        failures = 0
        try:
            self.open()  # inside the try: an open that half-succeeds is closed like any other
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

    def halt(self) -> None:
        """Stop sampling: signal every sampler, then wait for them all within one shared
        ``STOP_JOIN_S`` (a stuck one is abandoned, not waited for). Idempotent.

        The section is built later (``section``), once the worker's last progress lines have been
        read: they mark where the fit ended."""
        self._stop.set()
        deadline = time.monotonic() + STOP_JOIN_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> dict[str, Any]:
        """Halt and return the section; a second call returns the first one's section."""
        if self._section is None:
            self.halt()
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
        section: dict[str, Any] = {
            "interval_s": self.interval_s,
            "windows": {k: [round(a, 3), round(b, 3)] for k, (a, b) in windows.items()},
            "sources": sources,
            "metrics": metrics,
        }
        for sampler in self.samplers:
            try:
                section.update(sampler.extras(windows))
            except Exception as exc:  # noqa: BLE001 - a broken block is said in its source, never fails a run
                sampler.error = sampler.error or f"{type(exc).__name__}: {exc}"
                for src in sources:
                    if src["name"] == sampler.name and not src["error"]:
                        src["error"] = sampler.error
        return section


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
        n = summary.get("n") if summary else None
        if summary and summary.get(stat) is not None and (n is None or n >= min_n):
            return float(summary[stat])
    return None
