"""Samplers of GPUs: NVML on this machine, nvidia-smi inside a remote engine's container."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from suite.telemetry.core import (
    GPU_CLOCK_REASONS,
    GPU_MEMORY_BYTES,
    GPU_POWER_W,
    GPU_SM_CLOCK_MHZ,
    GPU_TEMPERATURE_C,
    GPU_UTIL_PERCENT,
    INTERVAL_S,
    Key,
    PolledSampler,
    Sampler,
)


class NvmlSampler(PolledSampler):
    """GPUs on this machine through NVML (``nvidia-ml-py``), looked up by UUID, never by index."""

    name = "nvml"
    method = "NVML (nvidia-ml-py) on the orchestrator's machine, devices by UUID"

    def __init__(self, uuids: list[str]):
        super().__init__()
        self.uuids = uuids
        self._nvml: Any = None  # the module, set once nvmlInit succeeded: what close must undo
        self._handles: dict[str, Any] = {}
        self._temperature_v = self._reasons_event = True  # the newer calls, until the driver says it lacks them

    def open(self) -> None:
        import pynvml  # optional at run time: absent, the sampler records why and the run goes on

        self._temperature_v = hasattr(pynvml, "nvmlDeviceGetTemperatureV")
        self._reasons_event = hasattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
        pynvml.nvmlInit()
        self._nvml = pynvml  # initialised: from here on close() shuts it down, whatever fails next
        self._handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in self.uuids}

    def close(self) -> None:
        """Undo a successful nvmlInit exactly once; safe after a failed or partial open."""
        nvml, self._nvml, self._handles = self._nvml, None, {}
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that failed is not worth a record
                pass

    def read(self) -> dict[Key, float | None]:
        out: dict[Key, float | None] = {}
        for uuid, handle in self._handles.items():
            for name, value in self._device(handle).items():
                out[(name, uuid)] = value
        return out

    def _temperature(self, h: Any) -> float:
        n = self._nvml
        if self._temperature_v:
            try:
                return n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU)
            except Exception as exc:
                if not _function_not_found(n, exc):
                    raise
                self._temperature_v = False  # a driver without the call: the old one from now on
        return n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)

    def _reasons(self, h: Any) -> float:
        n = self._nvml
        if self._reasons_event:
            try:
                return n.nvmlDeviceGetCurrentClocksEventReasons(h)
            except Exception as exc:
                if not _function_not_found(n, exc):
                    raise
                self._reasons_event = False  # before R535: the call's older name
        return n.nvmlDeviceGetCurrentClocksThrottleReasons(h)

    def _device(self, h: Any) -> dict[str, float | None]:
        n = self._nvml
        readers: dict[str, Callable[[], float]] = {
            GPU_UTIL_PERCENT: lambda: n.nvmlDeviceGetUtilizationRates(h).gpu,
            GPU_MEMORY_BYTES: lambda: n.nvmlDeviceGetMemoryInfo(h).used,
            GPU_SM_CLOCK_MHZ: lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            GPU_POWER_W: lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML reports mW
            GPU_TEMPERATURE_C: lambda: self._temperature(h),
            GPU_CLOCK_REASONS: lambda: self._reasons(h),
        }
        out: dict[str, float | None] = {}
        for name, read in readers.items():
            try:
                out[name] = float(read())
            except Exception as exc:  # noqa: BLE001 - one field a product or driver lacks: None, said once
                out[name] = None
                self.error = self.error or f"{name}: {type(exc).__name__}: {exc}"
        return out


def _function_not_found(nvml: Any, exc: Exception) -> bool:
    """NVML's answer for a call the installed driver does not have (the binding is newer than it)."""
    not_found = getattr(nvml, "NVMLError_FunctionNotFound", None)
    if isinstance(not_found, type) and isinstance(exc, not_found):
        return True
    code = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
    return getattr(exc, "value", None) == code and isinstance(exc, getattr(nvml, "NVMLError", ()))


# nvidia-smi's query fields, in the order asked; the name each becomes; its scale to the metric's unit.
SMI_FIELDS = (
    ("timestamp", None, None),  # nvidia-smi's own time of the tick: the rows of one tick share it
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
    """The loop run in a container given only the run's GPUs, so no --id."""
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


def smi_time(text: Any) -> float | None:
    """Seconds of nvidia-smi's ``timestamp`` ("2019/08/23 14:54:47.307", the machine's local time)
    on an arbitrary origin: only differences are used. None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        stamp = datetime.strptime(text.strip(), "%Y/%m/%d %H:%M:%S.%f")
    except ValueError:
        return None
    return (stamp - _EPOCH).total_seconds()


_EPOCH = datetime(1970, 1, 1)


class SmiSampler(Sampler):
    """GPUs of a remote engine: ``nvidia-smi --query-gpu ... -lms`` on the engine's machine.

    ``stream(command)`` starts the command there and yields its output as bytes; it raises
    RuntimeError when the command ends with an error (the Docker backend runs it in a helper
    container of its own, ``suite.backends.docker_run.GpuPoller``).

    nvidia-smi prints one row per GPU per tick, each with the tick's ``timestamp``: the rows of one
    tick are one read (so the achieved rate is the tick rate, whatever the number of GPUs), and a
    sample's time is nvidia-smi's timestamp, offset to the arrival of the first row, not the time
    its row arrived (output comes in buffered bursts).
    """

    name = "nvidia-smi"
    method = "nvidia-smi --query-gpu ... -lms 200 on the engine's machine; samples timed by nvidia-smi's timestamp"

    def __init__(self, stream: Callable[[list[str]], Iterable[bytes]], method: str | None = None):
        super().__init__()
        self._stream = stream
        if method is not None:
            self.method = method

    def lines(self, interval_s: float) -> Iterator[str]:
        buffer = b""
        for chunk in self._stream(smi_command(interval_s)):
            buffer += chunk
            *whole, buffer = buffer.split(b"\n")
            yield from (line.decode("utf-8", errors="replace") for line in whole)
        if buffer:
            yield buffer.decode("utf-8", errors="replace")

    def run(self, clock: Callable[[], float], stop: threading.Event, interval_s: float) -> None:
        fields = [field for field, _, _ in SMI_FIELDS]
        last_text = ""
        origin: tuple[float, float] | None = None  # (arrival on our clock, nvidia-smi time) of the first row
        tick_t: float | None = None  # the current tick's time
        tick_stamp: Any = None
        tick_devices: set[Any] = set()
        try:
            for line in self.lines(interval_s):
                if stop.is_set():
                    return
                row = parse_smi_line(line, fields)
                if row is None:
                    last_text = line.strip() or last_text
                    continue
                arrived = clock()
                stamp = smi_time(row.get("timestamp"))
                if stamp is not None and origin is None:
                    origin = (arrived, stamp)
                t = arrived if stamp is None or origin is None else origin[0] + (stamp - origin[1])
                metrics = smi_metrics(row)
                device = next((d for _, d in metrics), None)
                same_tick = (
                    tick_t is not None
                    and device not in tick_devices
                    and (
                        row.get("timestamp") == tick_stamp
                        if stamp is not None
                        else abs(t - tick_t) < interval_s / 2  # no timestamp: rows that came together
                    )
                )
                if not same_tick:
                    tick_t, tick_stamp, tick_devices = t, row.get("timestamp"), set()
                    with self._lock:
                        self.reads.append(t)
                tick_devices.add(device)
                assert tick_t is not None  # set by this row or by the tick it joins
                for key, value in metrics.items():
                    self.add(key, tick_t, value)
        except RuntimeError as exc:  # its exit code, with what it printed last
            self.error = f"{exc}" + (f": {last_text}" if last_text else "")
            return
        if not self.reads and last_text:
            self.error = f"nvidia-smi gave no samples: {last_text}"
