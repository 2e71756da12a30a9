"""What every backend shares: the protocol, the skip rule, and turning worker output into a result.

A backend turns one RunSpec into one RunResult. It never raises for a failed run: a timeout, a
crash, a missing image are statuses. ``run`` is called only for specs that ``skip_reason``
did not rule out.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from suite import hostinfo
from suite.plan import RunSpec, parse_device
from suite.results import RunResult

LOG_TAIL_LINES = 60


class Backend(Protocol):
    name: str

    def inventory(self) -> dict[str, Any]:
        """What this backend can give a run: {'gpus': [{index, uuid, name, ...}], 'cpus': N, ...}."""
        ...

    def skip_reason(self, spec: RunSpec) -> str | None:
        """Why this spec cannot run here (recorded as ``skipped``), or None."""
        ...

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        """The ``skipped`` record for a spec, with this backend's run facts."""
        ...

    def run(self, spec: RunSpec) -> RunResult: ...

    def close(self) -> None:
        """Release what the backend holds (containers, clients); also called on Ctrl-C."""
        ...


def host_inventory() -> dict[str, Any]:
    """The GPUs (NVML or nvidia-smi) and CPUs of the machine the suite runs on."""
    gpus, note = hostinfo.gpu_inventory()
    return {"gpus": gpus, "gpu_note": note, "cpus": os.cpu_count()}


def device_skip_reason(spec: RunSpec, inventory: dict[str, Any]) -> str | None:
    kind, count = parse_device(spec.device)
    gpus = inventory.get("gpus", [])
    if kind == "gpu" and count > len(gpus):
        have = f"{len(gpus)} GPU(s)" if gpus else "no GPU"
        why = inventory.get("gpu_note") or ""
        return f"needs {count} GPU(s); this machine has {have}" + (f" ({why})" if why else "")
    return None


def gpu_ids(spec: RunSpec, inventory: dict[str, Any]) -> list[str]:
    """The host GPUs a spec gets: the first N of the inventory, by index. Empty for CPU runs."""
    kind, count = parse_device(spec.device)
    if kind != "gpu":
        return []
    return [str(g["index"]) for g in inventory["gpus"][:count]]


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def skipped_result(spec: RunSpec, reason: str, run_info: dict[str, Any]) -> RunResult:
    now = now_iso()
    return RunResult(
        status="skipped", spec=spec.to_dict(), message=reason, run={**run_info, "started_at": now, "finished_at": now}
    )


def result_from_worker(
    spec: RunSpec, result_file: Path, log: str, run_info: dict[str, Any], fallback_status: str, fallback_message: str
) -> RunResult:
    """Merge the worker's record with what the host saw; the host's word wins when it killed the run."""
    record: dict[str, Any] = {}
    if result_file.is_file():
        try:
            record = json.loads(result_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            fallback_message = f"worker result unreadable ({exc}); {fallback_message}"
    status = record.get("status") if record and fallback_status in ("", "ok") else fallback_status
    message = record.get("message", "") if status == record.get("status") else fallback_message
    if not status:
        status, message = "error", fallback_message or "worker wrote no result"
    run = {**run_info, **{k: v for k, v in record.items() if k == "settings"}}
    if record.get("traceback"):
        run["traceback"] = record["traceback"]
    return RunResult(
        status=status,
        spec=spec.to_dict(),
        message=message,
        log_tail="" if status == "ok" else tail(log),
        run=run,
        timing=record.get("timing", {}),
        quality=record.get("quality", {}),
        work=record.get("work", {}),
        environment=record.get("environment", {}),
    )


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")
