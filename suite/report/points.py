"""Result files -> the views reports are drawn from: per machine, per scenario, per matrix point.

Pure and deterministic: the same files give the same views in the same order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from suite.environment import datasets
from suite.record import results, telemetry_figures
from suite.record.results import FIT_S, RUN_MACHINE, TEST_ACCURACY, Field, RunResult, finished_at
from suite.report import stats
from suite.spec import names, select
from suite.spec.settings import AUTO, MAX_REPEATS

# A run that trains to less than this test accuracy is broken, however fast: it is shown, flagged
# and kept out of every verdict. MNIST MLPs reach ~0.97; the smoke sizes ~0.9.
ACCURACY_GATE = 0.80


def gate_text(accuracy: float | None) -> str:
    """Why a point that ran takes no part in any comparison: its test accuracy under the gate."""
    got = "not recorded" if accuracy is None else f"{accuracy:.3f}"
    return f"below the accuracy gate ({got} < {ACCURACY_GATE:.2f}): left out of comparisons"


@dataclass
class Point:
    """A matrix point's runs. Its figures are read many times over for a page (each column, verdict
    and note), so each is computed once: ``runs`` is complete when the point is made and is not changed after."""

    label: str
    coords: dict[str, Any]
    runs: list[RunResult]  # newest attempt per repetition, by repetition
    _values: dict[Field, list[float]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @functools.cached_property
    def ok_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.ok]

    def values(self, field: Field) -> list[float]:
        """The field's value in every ok run that recorded it (a new list each call)."""
        if field not in self._values:
            section, key = field  # field.of(r), without a call per run: a page reads a dozen fields of 10,000 runs
            self._values[field] = [v for r in self.ok_runs if (v := getattr(r, section).get(key)) is not None]
        return list(self._values[field])

    def summary(self, field: Field) -> stats.Summary | None:
        return stats.summarize(self.values(field))

    @property
    def auto(self) -> dict[str, Any] | None:
        return auto_rule(self.ok_runs)

    @property
    def first_stage(self) -> int | None:
        return first_stage(self.runs)

    @functools.cached_property
    def _telemetry(self) -> list[telemetry_figures.RunTelemetry]:
        return [telemetry_figures.figures_of(r) for r in self.ok_runs]

    @property
    def gpu_busy(self) -> float | None:
        """GPU utilization (%) over the steady epochs, the plain mean across the repetitions that
        recorded it: a share of time, so runs of equal length weigh equally (a geometric mean would be
        dragged towards one idle run); None when none did (CPU points, results without telemetry)."""
        busy = [b for t in self._telemetry if (b := t.gpu_busy_percent) is not None]
        return sum(busy) / len(busy) if busy else None

    @property
    def peak_memory(self) -> float | None:
        """The largest peak host memory (bytes) of any repetition: what the machine had to hold."""
        peaks = [m for t in self._telemetry if (m := t.peak_memory_bytes) is not None]
        return max(peaks) if peaks else None

    @property
    def peak_gpu_memory(self) -> float | None:
        """The largest memory used on one GPU (bytes) in any repetition."""
        peaks = [m for t in self._telemetry if (m := t.peak_gpu_memory_bytes) is not None]
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


@dataclass(frozen=True)
class LeftOut:
    """Runs of a point that a page does not show: measured with other settings than the ones shown."""

    label: str
    runs: int
    differences: str  # in words: "model.dropout 0.1 here, 0.2 shown"
    example: str  # one of the result files, relative to the results folder (for ``suite show``)


@dataclass
class ScenarioView:
    machine: str
    scenario: str
    smoke: bool
    points: list[Point]
    other_sizes: list[str] = field(default_factory=list)  # e.g. smoke results left out of this view
    overrides: dict[str, Any] = field(default_factory=dict)  # the ``--set`` every run of this view had
    left_out: list[LeftOut] = field(default_factory=list)  # runs of these points under earlier settings
    # The folders of its result files, relative to the results folder: a machine's folder may be
    # named otherwise than the machine its records name (renamed, or copied from elsewhere).
    folders: list[str] = field(default_factory=list)

    @functools.cached_property
    def newest(self) -> RunResult:
        """The newest run that reached the worker (it carries environment facts), else the newest.
        Read for every figure of a page: found once, as its points are complete when it is made."""
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

    def point(self, coords: dict[str, Any]) -> Point | None:
        """The point at ``coords`` (all of them its own)."""
        for p in self.points:
            if all(p.coords.get(k) == v for k, v in coords.items()):
                return p
        return None

    def point_by_label(self, label: str) -> Point | None:
        return next((p for p in self.points if p.label == label), None)

    def baseline_for(self, point: Point) -> Point | None:
        """The point ``point`` is compared with: ``report.baseline`` at its other coordinates; for
        a sweep of the user's own (verdict ``none``) without one, the first point."""
        report = self.spec.get("report", {})
        baseline = report.get("baseline") or {}
        if not baseline:
            return self.points[0] if report.get("verdict", "none") == "none" and self.points else None
        return self.point({**point.coords, **baseline})


def auto_rule(ok_runs: list[RunResult]) -> dict[str, Any] | None:
    """The ``repeats: auto`` rule a point's runs were made under (the first ok run's that names one).
    The record's shape has checked its types; a rule out of the ranges a scenario allows was not
    written by this suite and counts as none (the point is read as a fixed count)."""
    for r in ok_runs:
        rule = ((r.spec.get("report") or {}).get("repeats") or {}).get(AUTO)
        if rule is None:
            continue
        first, cap, precision = rule["first"], rule["max_repeats"], rule["precision"]
        if 2 <= first <= cap <= MAX_REPEATS and 0.001 <= precision <= 1:
            return dict(rule)
        return None
    return None


def first_stage(runs: list[RunResult]) -> int | None:
    """The length of a point's first stage under ``repeats: auto``, where repetitions 0 to its end
    are each on file, ok and timed (as the runner took them to set the count): those runs alone give
    the variance of its intervals. They are then its first ok timed runs, as ``Point.values`` lists
    them. None for a fixed count, or a first stage not whole on file: the point is read as a fixed
    count, Welch's interval over every run."""
    ok = [r for r in runs if r.ok]
    rule = auto_rule(ok)
    if rule is None:
        return None
    first = int(rule["first"])
    timed = {int(r.spec.get("repetition", -1)) for r in ok if FIT_S.of(r) is not None}
    return first if all(rep in timed for rep in range(first)) else None


def fit_ratio(numerator: Point, denominator: Point) -> stats.Ratio:
    """The ratio of two points' fit times, numerator's over denominator's, with the interval their
    repetitions allow: Welch's over every run, or the two-stage one for a point of ``repeats: auto``."""
    return stats.ratio(
        numerator.values(FIT_S), denominator.values(FIT_S), first=(numerator.first_stage, denominator.first_stage)
    )


def stopping_note(p: Point) -> str | None:
    """For a point of ``repeats: auto``: how many runs it took and why it stopped there."""
    rule = p.auto
    if rule is None:
        return None
    fits, first = p.values(FIT_S), int(rule["first"])
    if p.first_stage is None:
        return (
            f"repeats: auto: {len(fits)} runs; its first stage (runs 1-{first}) is not all ok in this machine's "
            "folder, so the interval is over every run, as for a fixed count"
        )
    if any((a := TEST_ACCURACY.of(r)) is not None and a < ACCURACY_GATE for r in p.runs[:first]):
        return f"repeats: auto: {len(fits)} runs; below the accuracy gate in its first stage, which asks for no more"
    spread = float(np.log(fits[:first]).var(ddof=1))
    need = int(stats.two_stage_count(spread, float(rule["precision"]), 10**9, first))
    cap = int(rule["max_repeats"])
    if need > cap and len(fits) >= cap:
        return f"repeats: auto: {len(fits)} runs, the cap (max_repeats; its first {first} asked for {need})"
    if len(fits) >= need:
        return f"repeats: auto: {len(fits)} runs, precision reached"
    asked = min(need, cap)
    return f"repeats: auto: {len(fits)} of the {asked} runs its first {first} asked for: the plan stopped short"


def load_views(results_dir: Path) -> list[ScenarioView]:
    """Every (machine, scenario) in the results folder, full-size preferred over smoke. For the
    commands that draw pages and end (``report``, ``compare``): the records are loaded frozen."""
    return group_views(results_dir, results.load_folder(results_dir, frozen=True, slim=True))


def group_views(results_dir: Path, loaded: list[tuple[Path, RunResult]]) -> list[ScenarioView]:
    """The views of results already loaded from ``results_dir`` (the same objects, so a caller can
    tell which files the views count).

    One view per machine, scenario and set of ``--set`` overrides: a run with overrides is never
    shown as a row of the scenario as its file says, but in a view of its own that names them (the
    view without overrides first). Full size is preferred over smoke, and the other size is named.
    """
    grouped: dict[tuple[str, str, bool, str], list[tuple[Path, RunResult]]] = defaultdict(list)
    checked: set[str] = set()  # machine names found safe: thousands of runs name a few
    for path, result in loaded:
        machine = RUN_MACHINE.of(result)
        if not machine:
            where = path.relative_to(results_dir).parts
            if len(where) == 1:  # its own name would stand for the machine: one "machine" per such file
                raise results.ResultError(
                    f"{path}: names no machine and lies in no machine's folder; allowed: "
                    f"{results_dir}/<machine>/<scenario>/{path.name}"
                )
            machine = where[0]
        if not (isinstance(machine, str) and machine in checked):
            if not names.is_safe(machine):  # a folder's name, where the record names no machine
                raise results.ResultError(f"{path}: machine folder {machine!r}; allowed: {names.ALLOWED}")
            checked.add(machine)
        key = (machine, result.spec["scenario"], bool(result.spec.get("smoke")), _overrides_key(result))
        grouped[key].append((path, result))
    views = []
    # The runs as the scenario file says first, then each set of overrides.
    for machine, scenario, overrides in sorted(
        {(m, s, o) for m, s, _, o in grouped}, key=lambda k: (*k[:2], k[2] != "{}", k[2])
    ):
        full, smoke = (
            grouped.get((machine, scenario, False, overrides)),
            grouped.get((machine, scenario, True, overrides)),
        )
        chosen, is_smoke = (full, False) if full else (smoke, True)
        points, left_out = _points(chosen or [], results_dir)
        as_recorded = dict((chosen or [])[0][1].spec.get("overrides") or {}) if chosen else {}  # the order --set gave
        # A few folders hold thousands of files: their names as strings, not a Path made and hashed for each.
        parents = {os.path.dirname(p) or os.curdir for p, _ in chosen or []}
        folders = sorted({Path(os.path.relpath(parent, results_dir)).as_posix() for parent in parents})
        view = ScenarioView(
            machine, scenario, is_smoke, points, overrides=as_recorded, left_out=left_out, folders=folders
        )
        if full and smoke:
            view.other_sizes.append(f"{len(smoke)} smoke-size result files, not shown")
        views.append(view)
    return views


def _overrides_key(result: RunResult) -> str:
    overrides = result.spec.get("overrides")
    return json.dumps(dict(overrides), sort_keys=True) if overrides else "{}"  # most runs have none


def _points(runs: list[tuple[Path, RunResult]], results_dir: Path) -> tuple[list[Point], list[LeftOut]]:
    """One point per label, and the runs left out of it (``runs``' files lie in ``results_dir``).

    A label whose runs have several fingerprints (the scenario file, the image or the data changed
    between them) shows the newest fingerprint's runs, the point as it is measured now; the runs of
    every other fingerprint are left out and named with what differs, never merged into the row.
    """
    by_label: dict[str, list[tuple[Path, RunResult]]] = defaultdict(list)
    for path, r in runs:
        by_label[r.spec["point_label"]].append((path, r))
    points, left_out = [], []
    place: dict[str, int] = {}
    for label, pairs in by_label.items():
        rs = [r for _, r in pairs]
        shown = max(rs, key=finished_at)
        current = [r for r in rs if r.fingerprint == shown.fingerprint]
        latest = results.latest_by_run(current)
        chosen = [latest[k] for k in sorted(latest, key=lambda k: k[1])]
        points.append(Point(label, dict(chosen[0].spec.get("point", {})), chosen))
        # Its place in the plan that first ran it: a later `run -k ... --fresh` numbers its plan anew.
        place[label] = min((finished_at(r), int(r.spec.get("order", 0))) for r in current)[1]
        others: dict[str, list[tuple[Path, RunResult]]] = defaultdict(list)
        for path, r in pairs:
            if r.fingerprint != shown.fingerprint:
                others[r.fingerprint].append((path, r))
        for group in sorted(others.values(), key=lambda g: max(finished_at(r) for _, r in g), reverse=True):
            newest_path, newest = max(group, key=lambda pr: finished_at(pr[1]))
            words = config_differences(newest.spec, shown.spec) or "another fingerprint"
            left_out.append(LeftOut(label, len(group), words, str(newest_path.relative_to(results_dir))))
    # The plan's own order (matrix order in the YAML), label as tie-break.
    points.sort(key=lambda p: (place[p.label], p.label))
    return points, left_out


def leaves(value: object, prefix: str = "") -> dict[str, object]:
    """A config as dotted path -> value (lists indexed: model.filters.0); {} stays a leaf. Walked
    with a stack of its own: a result may nest its config deeper than Python's recursion limit."""
    out: dict[str, object] = {}
    stack: list[tuple[str, object]] = [(prefix, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict) and item:
            stack += [(f"{where}{k}.", v) for k, v in reversed(item.items())]
        elif isinstance(item, list) and item:
            stack += [(f"{where}{i}.", v) for i, v in reversed(list(enumerate(item)))]
        else:
            out[where[:-1]] = item
    return out


def config_differences(spec: dict[str, Any], shown: dict[str, Any], limit: int = 3) -> str:
    """How a run's config differs from the one shown, in words: "model.dropout 0.1 (shown: 0.2)"."""
    mine, theirs = leaves(_measured(spec)), leaves(_measured(shown))
    paths = [p for p in sorted(set(mine) | set(theirs)) if mine.get(p) != theirs.get(p)]
    words = [f"{p} {_short(mine.get(p))} (shown: {_short(theirs.get(p))})" for p in paths[:limit]]
    if len(paths) > limit:
        words.append(f"{len(paths) - limit} more")
    return "; ".join(words)


def _measured(spec: dict[str, Any]) -> dict[str, Any]:
    """The config as its fingerprint sees it: the data's identity without where it lies or why."""
    config = dict(spec.get("config") or {})
    identity = (config.get("data") or {}).get("identity")
    if isinstance(identity, dict):
        config["data"] = {**config["data"], "identity": datasets.fingerprinted(identity)}
    return config


def _short(value: object) -> str:
    text = "unset" if value is None else json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:12] + "..."


# --------------------------------------------------------------------------- -k on views


@dataclass
class SelectedView(ScenarioView):
    """A ScenarioView cut with ``-k``: it remembers the expression, so its page's "Reproduce"
    command runs the same points."""

    selection: str | None = None  # the -k expression the page was cut with


def select_views(views: list[ScenarioView], text: str | None) -> list[ScenarioView]:
    """Report views cut down to the points ``text`` takes; a view with none of them is left out.

    Each cut view says on its page what was left out (its "Also on file" lines) and carries the
    expression, so its "Reproduce" command runs the same points (``selection``, see SelectedView).
    """
    if text is None:
        return views
    items = [(v, p, select.item_of(v.scenario, p.coords, p.label)) for v in views for p in v.points]
    taken = select.choose([item for _, _, item in items], text)
    kept: dict[int, list[Point]] = {}
    for (view, point, _), keep in zip(items, taken, strict=True):
        if keep:
            kept.setdefault(id(view), []).append(point)
    out: list[ScenarioView] = []
    for view in views:
        points = kept.get(id(view))
        if not points:
            continue
        dropped = len(view.points) - len(points)
        notes = list(view.other_sizes)
        if dropped:
            notes.append(f"{dropped} of {len(view.points)} points, not shown: the page was made with -k {text!r}")
        out.append(selected_view(view, points=points, other_sizes=notes, selection=text))
    return out


def selected_view(view: ScenarioView, **changes: Any) -> SelectedView:
    """``view`` with ``changes``, as a SelectedView: a ScenarioView that remembers its ``-k``."""
    fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(view)}
    return SelectedView(**{**fields, **changes})
