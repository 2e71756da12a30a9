"""Run a plan: each spec through the backend, each result saved the moment it exists.

Resume is by fingerprint: a (fingerprint, repetition) with an ``ok`` result is not run again
unless ``fresh``. Results are saved one by one, so a run killed halfway loses only the run in
flight (hyperfine's rule: export after every benchmark).
"""

from __future__ import annotations

import dataclasses
import json
import re
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
            result = backend.skipped(spec, reason) if reason else _run_with_peak(spec, backend, folder)
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


def _peak_key(spec: RunSpec, backend: Backend) -> str:
    """Peaks are cached per machine (the folder), backend, image, framework and device kind."""
    kind = parse_device(spec.device)[0]
    parts = (backend.name, spec.config.get("image") or "default", spec.config["backend"], kind)
    return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", str(p)) for p in parts)


def _run_with_peak(spec: RunSpec, backend: Backend, folder: Path) -> results.RunResult:
    """Run; the first ok run of a device kind measures its peak, later ones reuse the cached figure."""
    cache = folder / "_calibration" / f"{_peak_key(spec, backend)}.json"
    cached = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else None
    result = backend.run(dataclasses.replace(spec, calibrate_peak=cached is None))
    if not result.ok:
        return result
    if cached is None and result.work.get("peak"):
        cache.parent.mkdir(parents=True, exist_ok=True)
        record = {**result.work["peak"], "measured_in": spec.run_id, "finished_at": result.run.get("finished_at")}
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(cache)
        return result
    if cached is not None:
        return dataclasses.replace(result, work={**result.work, "peak": {**cached, "source": "cached"}})
    return result


def _detail(result: results.RunResult) -> str:
    if result.ok:
        fit = result.timing.get("fit_s")
        acc = result.quality.get("test_accuracy")
        return f", fit {fit:.2f} s, test accuracy {acc:.3f}" if fit is not None and acc is not None else ""
    return f": {result.message.splitlines()[0][:200]}" if result.message else ""


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
