"""Facts about the host the orchestrator runs on: GPUs, machine name, Docker engine.

GPU inventory comes from NVML (nvidia-ml-py) where installed, else from ``nvidia-smi``; both
report the same indices and UUIDs that CUDA_VISIBLE_DEVICES and Docker device requests take.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from suite.worker.facts import collect_nvidia_smi


def gpu_inventory() -> tuple[list[dict[str, Any]], str]:
    """(GPUs, note). The note says how they were found, or why none were."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpus.append(
                    {
                        "index": i,
                        "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                        "name": _text(pynvml.nvmlDeviceGetName(h)),
                        "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
                        "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
                    }
                )
            return gpus, "NVML"
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 - NVMLError without a driver: report, count no GPU
        return [], f"NVML: {exc}"
    return _nvidia_smi()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvidia_smi() -> tuple[list[dict[str, Any]], str]:
    gpus, problem = collect_nvidia_smi()
    return gpus, problem or "nvidia-smi"


def machine_name() -> str:
    """The results folder name for this host: its hostname, made safe for a path."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname()).strip("-") or "machine"
