"""Result files -> the views reports are drawn from: per machine, per scenario, per matrix point.

Pure and deterministic: the same files give the same views in the same order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite import results, stats
from suite.results import RUN_MACHINE, TEST_ACCURACY, Field, RunResult, finished_at

# A run that trains to less than this test accuracy is broken, however fast: it is shown, flagged
# and kept out of every verdict. MNIST MLPs reach ~0.97; the smoke sizes ~0.9.
ACCURACY_GATE = 0.80


@dataclass
class Point:
    label: str
    coords: dict[str, Any]
    runs: list[RunResult]  # newest attempt per repetition, by repetition

    @property
    def ok_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.ok]

    def values(self, field: Field) -> list[float]:
        """The field's value in every ok run that recorded it."""
        return [v for r in self.ok_runs if (v := field.of(r)) is not None]

    def summary(self, field: Field) -> stats.Summary | None:
        return stats.summarize(self.values(field))

    @property
    def gpu_busy(self) -> float | None:
        """GPU utilization (%) over the steady epochs, the plain mean across the repetitions that
        recorded it: a share of time, so runs of equal length weigh equally (a geometric mean would be
        dragged towards one idle run); None when none did (CPU points, results without telemetry)."""
        busy = [b for r in self.ok_runs if (b := results.gpu_busy_percent(r)) is not None]
        return sum(busy) / len(busy) if busy else None

    @property
    def peak_memory(self) -> float | None:
        """The largest peak host memory (bytes) of any repetition: what the machine had to hold."""
        peaks = [m for r in self.ok_runs if (m := results.peak_memory_bytes(r)) is not None]
        return max(peaks) if peaks else None

    @property
    def peak_gpu_memory(self) -> float | None:
        """The largest memory used on one GPU (bytes) in any repetition."""
        peaks = [m for r in self.ok_runs if (m := results.peak_gpu_memory_bytes(r)) is not None]
        return max(peaks) if peaks else None

    @property
    def accuracy(self) -> float | None:
        acc = self.values(TEST_ACCURACY)
        return min(acc) if acc else None

    @property
    def passes_gate(self) -> bool:
        return bool(self.ok_runs) and self.accuracy is not None and self.accuracy >= ACCURACY_GATE

    @property
    def status(self) -> str:
        counts: dict[str, int] = defaultdict(int)
        for r in self.runs:
            counts[r.status] += 1
        if len(counts) == 1:
            return next(iter(counts))
        return ", ".join(f"{s} {n}/{len(self.runs)}" for s, n in sorted(counts.items()))

    @property
    def device(self) -> str:
        return str(self.runs[0].spec["config"]["device"])


@dataclass
class ScenarioView:
    machine: str
    scenario: str
    smoke: bool
    points: list[Point]
    other_sizes: list[str] = field(default_factory=list)  # e.g. smoke results left out of this view

    @property
    def newest(self) -> RunResult:
        """The newest run that reached the worker (it carries environment facts), else the newest."""
        runs = [r for p in self.points for r in p.runs]
        ran = [r for r in runs if r.environment] or runs
        return max(ran, key=finished_at)

    @property
    def provenance_runs(self) -> list[RunResult]:
        """The runs whose provenance a page states: those that reached the worker (the code and
        packages that made its figures and failures), else every run (a page of skips only)."""
        runs = [r for p in self.points for r in p.runs]
        return [r for r in runs if r.environment] or runs

    @property
    def gpu_runs(self) -> list[RunResult]:
        """Runs of GPU points that reached the worker: the only ones whose GPU facts describe them."""
        return [r for p in self.points if p.device.startswith("gpu") for r in p.runs if r.environment]

    @property
    def spec(self) -> dict[str, Any]:
        return self.newest.spec

    @property
    def size_axis(self) -> str | None:
        """The matrix axis comparisons run along: the first one that is neither device nor variant."""
        keys = self.points[0].coords if self.points else {}
        return next((k for k in keys if k not in ("device", "variant")), None)

    def point(self, **coords: Any) -> Point | None:
        for p in self.points:
            if all(p.coords.get(k) == v for k, v in coords.items()):
                return p
        return None

    def point_by_label(self, label: str) -> Point | None:
        return next((p for p in self.points if p.label == label), None)

    def baseline_for(self, point: Point) -> Point | None:
        baseline = self.spec.get("report", {}).get("baseline") or {}
        if not baseline:
            return None
        return self.point(**{**point.coords, **baseline})


def load_views(results_dir: Path) -> list[ScenarioView]:
    """Every (machine, scenario) in the results folder, full-size preferred over smoke."""
    return group_views(results_dir, results.load_folder(results_dir))


def group_views(results_dir: Path, loaded: list[tuple[Path, RunResult]]) -> list[ScenarioView]:
    """The views of results already loaded from ``results_dir`` (the same objects, so a caller can
    tell which files the views count)."""
    grouped: dict[tuple[str, str, bool], list[RunResult]] = defaultdict(list)
    for path, result in loaded:
        machine = RUN_MACHINE.of(result) or path.relative_to(results_dir).parts[0]
        grouped[(machine, result.spec["scenario"], bool(result.spec.get("smoke")))].append(result)
    views = []
    for machine, scenario in sorted({(m, s) for m, s, _ in grouped}):
        full, smoke = grouped.get((machine, scenario, False)), grouped.get((machine, scenario, True))
        chosen, is_smoke = (full, False) if full else (smoke, True)
        view = ScenarioView(machine, scenario, is_smoke, _points(chosen or []))
        if full and smoke:
            view.other_sizes.append(f"{len(smoke)} smoke-size result files, not shown")
        views.append(view)
    return views


def _points(runs: list[RunResult]) -> list[Point]:
    """One point per label; if a label has several fingerprints (the scenario changed), the newest wins."""
    by_label: dict[str, list[RunResult]] = defaultdict(list)
    for r in runs:
        by_label[r.spec["point_label"]].append(r)
    points = []
    for label, rs in by_label.items():
        newest_fp = max(rs, key=finished_at).fingerprint
        latest = results.latest_by_run([r for r in rs if r.fingerprint == newest_fp])
        chosen = [latest[k] for k in sorted(latest, key=lambda k: k[1])]
        points.append(Point(label, dict(chosen[0].spec.get("point", {})), chosen))
    # The plan's own order (matrix order in the YAML), label as tie-break.
    return sorted(points, key=lambda p: (min(int(r.spec.get("order", 0)) for r in p.runs), p.label))
