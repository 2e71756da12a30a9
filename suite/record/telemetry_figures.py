"""The figures a report reads from a run's telemetry: how busy its GPUs were during the steps, and
its peak host and GPU memory (``suite.telemetry`` names the metrics and keeps the samples)."""

from __future__ import annotations

from typing import Any, NamedTuple

from suite import telemetry as tm
from suite.record.results import RunResult

# "Busy" is about the steps: the steady epochs where recorded, else the whole fit. Never the whole
# run: the idle setup, evaluation and probes around the fit would pass for a starved GPU.
BUSY_WINDOWS = ("steady", "fit")
BUSY_MIN_SAMPLES = 5  # a window shorter than a second at 5 Hz says too little: the next one is used


class RunTelemetry(NamedTuple):
    """A run's telemetry figures as reports read them (``figures_of``); None is "not measured".

    ``gpu_busy_percent``: mean GPU utilization over the steady epochs (else the whole fit: the first
    with at least BUSY_MIN_SAMPLES samples), averaged over the run's GPUs; None when no GPU was
    sampled or no fit window was recorded.

    ``peak_memory_bytes``: the run's peak host memory, the larger of the sampled peak (process tree
    RSS, or container usage less inactive file cache) and the largest per-process kernel high-water
    mark (local runs). The engine's own high-water mark of a container (cgroup v1 ``max_usage``)
    stays in the telemetry but is not taken here: it counts file cache, which the sampled figure
    leaves out, and cgroup v2 has none, so taking it would make the same run read differently on
    two hosts.

    ``peak_gpu_memory_bytes``: the largest memory used on any one of the run's GPUs (the device as
    a whole, other processes included).
    """

    gpu_busy_percent: float | None
    peak_memory_bytes: float | None
    peak_gpu_memory_bytes: float | None


def figures_of(result: RunResult) -> RunTelemetry:
    """The run's ``RunTelemetry``: its metrics are grouped by name once, not scanned once per figure
    (10,000 runs' pages read all three)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for m in (result.telemetry or {}).get("metrics", []):
        by_name.setdefault(m.get("name"), []).append(m)
    return RunTelemetry(
        _busy(by_name.get(tm.GPU_UTIL_PERCENT, [])),
        _peak(by_name.get(tm.MEMORY_BYTES, []) + by_name.get(tm.PROCESS_HWM_BYTES, [])),
        _peak(by_name.get(tm.GPU_MEMORY_BYTES, [])),
    )


def _busy(entries: list[dict[str, Any]]) -> float | None:
    values = [tm.window_stat(e, "mean", BUSY_WINDOWS, BUSY_MIN_SAMPLES) for e in entries]
    measured = [v for v in values if v is not None]
    return sum(measured) / len(measured) if measured else None


def _peak(entries: list[dict[str, Any]]) -> float | None:
    peaks = [tm.window_stat(e, "max", ("run",)) for e in entries]
    measured = [p for p in peaks if p is not None]
    return max(measured) if measured else None
