"""A device's matmul peak, measured by the first ok run of each peak key in one ``suite run`` and
reused by the later ones, whichever backend and plan loop runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from suite.backends.base import Backend
from suite.record import results
from suite.record.results import PEAK
from suite.spec.plan import RunSpec, parse_device


def peak_key(spec: RunSpec, backend: Backend) -> tuple:
    """Everything that changes a device's matmul peak: where it runs, the framework, the device
    kind, the compute dtype (mixed precision) and the thread settings."""
    kind = parse_device(spec.device)[0]
    cfg = spec.config
    threads = cfg.get("threads") or {}
    return (
        backend.name,
        cfg.get("image") or "default",
        cfg["backend"],
        kind,
        "mixed" if cfg["training"].get("mixed_precision") else "float32",
        threads.get("intra_op"),
        threads.get("inter_op"),
    )


def run_with_peak(
    spec: RunSpec,
    backend: Backend,
    peaks: dict[tuple, dict],
    on_event: Callable[[dict], None] | None = None,
) -> results.RunResult:
    """Run; the first ok run of each peak key in this invocation measures the peak, later ones reuse it.

    The cache lives for one ``suite run``: a figure measured on another day, under other load or
    another driver, is never carried over.
    """
    key = peak_key(spec, backend)
    cached = peaks.get(key)
    asked = dataclasses.replace(spec, calibrate_peak=cached is None)
    result = backend.run(asked, on_event=on_event) if on_event is not None else backend.run(asked)
    if not result.ok:
        return result
    if cached is None:
        if PEAK.of(result):
            peaks[key] = {**PEAK.of(result), "measured_in": spec.run_id}
        return result
    return dataclasses.replace(result, work={**result.work, PEAK.key: {**cached, "source": "cached"}})
