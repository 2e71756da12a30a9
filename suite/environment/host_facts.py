"""Facts about the host the orchestrator runs on: GPUs, machine name, Docker engine.

GPU inventory comes from NVML (nvidia-ml-py) where it starts, else from ``nvidia-smi``; both
report the same indices (nvidia-smi's order, which is PCI bus order), UUIDs and PCI bus ids, and
the same per-GPU facts.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from suite.worker.facts import collect_nvidia_smi


def gpu_inventory() -> tuple[list[dict[str, Any]], str]:
    """(GPUs, note). The note says how they were found, or why none were.

    Each GPU carries the fields ``collect_nvidia_smi`` records (index, uuid, name, pci_bus_id,
    memory_mib, driver, vbios, power_limit_w, persistence_mode, application clocks, compute_mode,
    cuda_driver_version); a value the driver cannot give is None. NVML is asked first; where it
    is installed but cannot start (no driver library), nvidia-smi is asked, and the note says both.
    """
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return _nvidia_smi()
    try:
        return _nvml(pynvml), "NVML"
    except Exception as exc:  # noqa: BLE001 - NVMLError without a driver: say so, then ask nvidia-smi
        gpus, note = _nvidia_smi()
        return gpus, f"NVML: {exc}; {note}"


def _nvml(pynvml: Any) -> list[dict[str, Any]]:
    pynvml.nvmlInit()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = _optional(pynvml, lambda: _cuda_version(pynvml.nvmlSystemGetCudaDriverVersion()))
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            power_mw = _optional(pynvml, lambda h=h: pynvml.nvmlDeviceGetPowerManagementLimit(h))
            persistence = _optional(pynvml, lambda h=h: pynvml.nvmlDeviceGetPersistenceMode(h))
            compute = _optional(pynvml, lambda h=h: pynvml.nvmlDeviceGetComputeMode(h))
            gpus.append(
                {
                    "index": i,
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "pci_bus_id": _optional(pynvml, lambda h=h: _text(pynvml.nvmlDeviceGetPciInfo(h).busId)),
                    "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
                    "driver": driver,
                    "vbios": _optional(pynvml, lambda h=h: _text(pynvml.nvmlDeviceGetVbiosVersion(h))),
                    "power_limit_w": power_mw / 1000 if power_mw is not None else None,
                    "persistence_mode": bool(persistence) if persistence is not None else None,
                    "app_clock_graphics_mhz": _optional(
                        pynvml, lambda h=h: pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_GRAPHICS)
                    ),
                    "app_clock_memory_mhz": _optional(
                        pynvml, lambda h=h: pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_MEM)
                    ),
                    "compute_mode": COMPUTE_MODES.get(compute) if compute is not None else None,
                    "cuda_driver_version": cuda,
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


# nvmlComputeMode_t, in nvidia-smi's words for the compute_mode field.
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


def _optional(pynvml: Any, ask: Any) -> Any:
    """A value this GPU or driver may not support (NVML_ERROR_NOT_SUPPORTED and kin): None then."""
    try:
        return ask()
    except pynvml.NVMLError:
        return None


def _cuda_version(code: int) -> str:
    """NVML's 12020 is CUDA 12.2 (major * 1000 + minor * 10)."""
    return f"{code // 1000}.{code % 1000 // 10}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvidia_smi() -> tuple[list[dict[str, Any]], str]:
    gpus, problem = collect_nvidia_smi()
    return gpus, problem or "nvidia-smi"


def machine_name(hostname: str | None = None) -> str:
    """The results folder name for this host (or for ``hostname``): the hostname, made safe for a path."""
    return (
        re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname() if hostname is None else hostname).strip("-") or "machine"
    )
