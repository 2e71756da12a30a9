"""Run a plan: each spec through the backend, each result saved the moment it exists.

Resume is by fingerprint: a (fingerprint, repetition) with an ``ok`` result is not run again
unless ``fresh``. Results are saved one by one, so a run killed halfway loses only the run in
flight (hyperfine's rule: export after every benchmark).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from suite import results
from suite.backends.base import Backend
from suite.plan import RunSpec, parse_device

FAILED = ("error", "timeout", "host_oom", "gpu_oom", "nan_loss", "device_mismatch", "image_unavailable")


@dataclass
class Summary:
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(self.counts[s] for s in FAILED)

    def lines(self) -> list[str]:
        parts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items()))
        out = [f"runs: {parts or 'none'}"]
        if self.failed:
            out.append("some runs failed; they are recorded with their status and shown in the report:")
            out += [f"  {f}" for f in self.failures]
        return out


def machine_dir(results_dir: Path, machine: str) -> Path:
    return results_dir / machine


def previous_runs(folder: Path) -> dict[tuple[str, int], results.RunResult]:
    """(fingerprint, repetition) -> the newest result on file."""
    if not folder.is_dir():
        return {}
    return results.latest_by_run([r for _, r in results.load_folder(folder)])


def run_plan(
    specs: list[RunSpec],
    backend: Backend,
    results_dir: Path,
    machine: str,
    *,
    fresh: bool = False,
    say: Callable[[str], None] = print,
) -> Summary:
    summary = Summary()
    folder = machine_dir(results_dir, machine)
    previous = {} if fresh else previous_runs(folder)
    peaks: dict[tuple, dict] = {}
    old_handler = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        for i, spec in enumerate(specs, 1):
            head = f"[{i}/{len(specs)}] {spec.scenario} [{spec.point_label}] rep {spec.repetition}"
            before = previous.get((spec.fingerprint, spec.repetition))
            if before is not None and before.ok:
                summary.counts["already done"] += 1
                say(f"{head}: already done (ok result on file; --fresh reruns)")
                continue
            t = time.perf_counter()
            reason = backend.skip_reason(spec)
            if reason and before is not None and before.status == "skipped" and before.message == reason:
                summary.counts["skipped"] += 1
                say(f"{head}: skipped, as recorded before: {reason}")
                continue
            result = backend.skipped(spec, reason) if reason else _run_with_peak(spec, backend, peaks)
            path = results.save(result, folder / spec.scenario, spec.run_id)
            summary.counts[result.status] += 1
            detail = _detail(result)
            if result.status in FAILED:
                summary.failures.append(
                    f"{head}: {result.status}: {result.message.splitlines()[0] if result.message else ''}"
                )
            say(f"{head}: {result.status}{detail} ({time.perf_counter() - t:.1f} s) -> {path}")
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        backend.close()
    return summary


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


def _run_with_peak(spec: RunSpec, backend: Backend, peaks: dict[tuple, dict]) -> results.RunResult:
    """Run; the first ok run of each peak key in this invocation measures the peak, later ones reuse it.

    The cache lives for one ``suite run``: a figure measured on another day, under other load or
    another driver, is never carried over.
    """
    key = peak_key(spec, backend)
    cached = peaks.get(key)
    result = backend.run(dataclasses.replace(spec, calibrate_peak=cached is None))
    if not result.ok:
        return result
    if cached is None:
        if result.work.get("peak"):
            peaks[key] = {**result.work["peak"], "measured_in": spec.run_id}
        return result
    return dataclasses.replace(result, work={**result.work, "peak": {**cached, "source": "cached"}})


def _detail(result: results.RunResult) -> str:
    if result.ok:
        fit = result.timing.get("fit_s")
        acc = result.quality.get("test_accuracy")
        return f", fit {fit:.2f} s, test accuracy {acc:.3f}" if fit is not None and acc is not None else ""
    return f": {result.message.splitlines()[0][:200]}" if result.message else ""


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
