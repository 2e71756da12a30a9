"""What every backend shares: the protocol, the skip rule, how a run ended, and turning worker output into a result.

A backend turns one RunSpec into one RunResult. It never raises for a failed run: a timeout, a
crash, a missing image are statuses. ``run`` is called only for specs that ``skip_reason``
did not rule out.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
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


def classify_exit(
    *,
    deadline_fired: bool,
    oom_killed: bool,
    exit_code: int | None,
    signum: int | None,
    wrote_result: bool,
    timeout_s: float,
    memory_limit: str | None = None,
    what: str = "worker",
) -> tuple[str, str]:
    """(status, message) for how a run ended, by the same rule on every backend; "" takes the worker's own.

    deadline_fired: the suite's deadline marked the run as over before sending its kill, so the
        kill's own exit code can never make a timeout look like anything else.
    oom_killed: the engine or kernel said so (Docker's ``State.OOMKilled``).
    exit_code, signum: as the backend saw them (-9 from a subprocess, 137 from a container) and the
        signal that ended the process, if one did.
    what: "worker" or "container", for the message.
    """
    code = "no exit code" if exit_code is None else f"exit code {exit_code}"
    if deadline_fired:
        return "timeout", f"{what} killed after the run's limit of {timeout_s:g} s (timeout_s)"
    # The suite sends SIGKILL only at its deadline, handled above: any other one is taken as the kernel's.
    if oom_killed or signum == signal.SIGKILL:
        if oom_killed:
            how = f"the engine reports that the kernel's OOM killer ended the {what} ({code})"
        else:
            how = f"the {what} was killed by SIGKILL ({code}), which the suite did not send"
        limit = f" (memory limit {memory_limit})" if memory_limit else ""
        why = f"the kernel's OOM killer sends SIGKILL when memory runs out{limit}"
        return "host_oom", f"out of host memory: {how}; {why}"
    if not wrote_result:
        if signum is not None:
            return "error", f"{what} killed by {_signal_name(signum)} ({code}) without writing a result"
        if exit_code is None:
            return "error", f"{what} ended with no exit code and without writing a result"
        return "error", f"{what} exited with code {exit_code} without writing a result"
    return "", ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
    return datetime.now(UTC).isoformat(timespec="microseconds")
