"""Samplers of GPUs: NVML on this machine, nvidia-smi inside a remote engine's container."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
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
        api = self._client_factory().api
        exec_id = api.exec_create(self.container_id, smi_command(interval_s), stdout=True, stderr=True)
        buffer = b""
        for chunk in api.exec_start(exec_id, stream=True):
            buffer += chunk
            *whole, buffer = buffer.split(b"\n")
            yield from (line.decode("utf-8", errors="replace") for line in whole)
        if buffer:
            yield buffer.decode("utf-8", errors="replace")
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
