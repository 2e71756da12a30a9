"""Views -> plain data: the figures of every report table as numbers, and every run's timings.

The Markdown table (``pages.point_row``) formats what ``point_figures`` computes here, so a table cell,
a JSON number and a CSV cell can never disagree. The JSON shape is versioned (``FORMAT``,
``VERSION``) and documented field by field in docs/export.md; bump ``VERSION`` when a field changes
meaning or goes away (adding a field does not need a bump).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from suite.record import provenance, results, telemetry_figures, under_load
from suite.record.results import (
    ACHIEVED_FLOPS_PER_S,
    FIRST_EPOCH_OVERHEAD_S,
    FIT_S,
    PEAK,
    RUN_BACKEND,
    RUN_MACHINE,
    STEADY_EPOCH_S,
    STEADY_EXAMPLES_PER_S,
    STEADY_INCLUDES_FIRST_EPOCH,
    STEP_FLOOR_S,
    STEP_S,
    TEST_ACCURACY,
    RunResult,
)
from suite.report import stats, verdicts, writing
from suite.report.points import (
    ACCURACY_GATE,
    Point,
    ScenarioView,
    fit_ratio,
    gate_text,
    group_views,
    select_views,
    stopping_note,
)
from suite.safe.markdown import escaped_lines
from suite.spec.plan import override_flag, parse_device

FORMAT = "keras-speed-suite/report"
VERSION = 1
FORMATS = ("md", "json", "csv")  # what `report --format` accepts
RATIO_DIRECTION = "speedup: the baseline's fit time over this point's (above 1: this point is faster)"

# Every duration or count the worker records in ``timing``, in the order runs.csv shows them. Left
# out on purpose: ``worker_start_unix`` (a clock reading, not a duration) and ``*_schema1`` keys
# (figures a migration set aside, which no report shows). Lists become numbered CSV columns.
RUN_TIMINGS = (
    "launch_to_ready_s",
    "data_load_s",
    "build_compile_s",
    "first_step_s",
    "fit_s",
    "epoch_s",
    "first_epoch_overhead_s",
    "steady_epoch_s",
    "steady_examples_per_s",
    "steady_includes_first_epoch",
    "steps_per_epoch",
    "step_s",
    "step_floor_s",
    "step_floor_epochs_s",
    "overhead_share",
    "evaluate_s",
)
TIMINGS_LEFT_OUT = ("worker_start_unix",)


def peak_of(run: RunResult) -> float | None:
    """The calibrated peak of the device set in the run's compute dtype: per-device peak x GPUs
    (logical CPU devices share one CPU, so one peak)."""
    peak = PEAK.of(run) or {}
    if not peak.get("flops_per_s"):
        return None
    kind, count = parse_device(str(run.spec["config"]["device"]))
    return float(peak["flops_per_s"]) * (count if kind == "gpu" else 1)


@dataclass(frozen=True)
class PointFigures:
    """One row of a scenario table as numbers; None where the point has no such measurement.
    Field order is points.csv's column order."""

    machine: str
    scenario: str
    smoke: bool
    point: str
    device: str
    status: str
    runs_total: int
    runs_ok: int
    runs_timed: int  # of runs_ok, those that recorded a fit time: the fit figures are over these
    fit_s_median: float | None
    fit_s_min: float | None
    fit_s_max: float | None
    fit_s_geomean: float | None
    fit_spread_fraction: float | None
    fit_unstable: bool
    steady_epoch_s_median: float | None
    steady_epoch_s_min: float | None
    steady_epoch_s_max: float | None
    steady_examples_per_s_median: float | None
    first_epoch_overhead_s_median: float | None
    step_s_median: float | None
    step_floor_s_median: float | None
    fixed_cost_fraction: float | None
    achieved_flops_per_s_median: float | None
    peak_flops_per_s: float | None
    peak_fraction: float | None
    gpu_busy_percent: float | None
    peak_memory_bytes: float | None
    peak_gpu_memory_bytes: float | None
    is_baseline: bool
    baseline: str | None
    speedup: float | None
    speedup_ci_low: float | None
    speedup_ci_high: float | None
    speedup_runs_baseline: int | None
    speedup_runs_point: int | None
    speedup_significant: bool | None
    test_accuracy_min: float | None
    passes_accuracy_gate: bool
    first_repetition_outlier: bool
    status_counts: dict[str, int] = field(default_factory=dict)
    coords: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)  # the --set its runs were measured with


def overrides_text(overrides: dict[str, Any] | None) -> str:
    """``--set`` overrides as the flags' arguments, space-separated (``training.batch_size=1024``)."""
    return " ".join(override_flag(k, v) for k, v in sorted((overrides or {}).items()))


def point_figures(view: ScenarioView, p: Point) -> PointFigures:
    fit, steady = p.summary(FIT_S), p.summary(STEADY_EPOCH_S)
    eps, first = p.summary(STEADY_EXAMPLES_PER_S), p.summary(FIRST_EPOCH_OVERHEAD_S)
    step, floor = p.summary(STEP_S), p.summary(STEP_FLOOR_S)
    achieved = p.summary(ACHIEVED_FLOPS_PER_S)
    peaks = [peak for r in p.ok_runs if (peak := peak_of(r))]
    peak = float(np.median(peaks)) if peaks and achieved else None
    base = view.baseline_for(p)
    ratio = None
    not_compared = ""
    if base is not None and base is not p and fit and base.summary(FIT_S):
        not_compared = verdicts.not_comparable(p, base)
        if not not_compared:
            ratio = fit_ratio(base, p)
    elif base is None and fit and view.spec.get("report", {}).get("baseline"):
        # The baseline point is not among this view's: not run here, or (a view of --set runs) not
        # run with the same --set, against which alone these runs may be compared.
        not_compared = "no run of its baseline with the same --set" if view.overrides else "its baseline did not run"
    counts: dict[str, int] = {}
    for r in p.runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    outlier = stats.first_is_outlier(p.values(FIT_S))
    return PointFigures(
        machine=view.machine,
        scenario=view.scenario,
        smoke=view.smoke,
        point=p.label,
        device=p.device,
        status=p.status,
        runs_total=len(p.runs),
        runs_ok=len(p.ok_runs),
        runs_timed=len(p.values(FIT_S)),
        fit_s_median=fit.median if fit else None,
        fit_s_min=fit.low if fit else None,
        fit_s_max=fit.high if fit else None,
        fit_s_geomean=stats.geometric_mean(p.values(FIT_S)) if fit else None,
        fit_spread_fraction=fit.spread if fit else None,
        fit_unstable=bool(fit and fit.unstable),
        steady_epoch_s_median=steady.median if steady else None,
        steady_epoch_s_min=steady.low if steady else None,
        steady_epoch_s_max=steady.high if steady else None,
        steady_examples_per_s_median=eps.median if eps else None,
        first_epoch_overhead_s_median=first.median if first else None,
        step_s_median=step.median if step else None,
        step_floor_s_median=floor.median if floor else None,
        fixed_cost_fraction=floor.median / step.median if step and floor and step.median else None,
        achieved_flops_per_s_median=achieved.median if achieved else None,
        peak_flops_per_s=peak,
        peak_fraction=achieved.median / peak if achieved and peak else None,
        gpu_busy_percent=p.gpu_busy,
        peak_memory_bytes=p.peak_memory,
        peak_gpu_memory_bytes=p.peak_gpu_memory,
        is_baseline=base is p,
        baseline=base.label if base is not None else None,
        speedup=ratio.value if ratio else None,
        speedup_ci_low=ratio.low if ratio else None,
        speedup_ci_high=ratio.high if ratio else None,
        speedup_runs_baseline=ratio.runs[0] if ratio else None,
        speedup_runs_point=ratio.runs[1] if ratio else None,
        speedup_significant=ratio.significant if ratio else None,
        test_accuracy_min=p.accuracy,
        passes_accuracy_gate=p.passes_gate,
        first_repetition_outlier=outlier,
        status_counts=dict(sorted(counts.items())),
        coords=dict(p.coords),
        notes=_notes(p, fit, steady, first, outlier) + ([f"not compared: {not_compared}"] if not_compared else []),
        overrides=dict(p.runs[0].spec.get("overrides") or {}) if p.runs else {},
    )


def _notes(
    p: Point, fit: stats.Summary | None, steady: stats.Summary | None, first: stats.Summary | None, outlier: bool
) -> list[str]:
    notes = []
    # The steady epoch's median gives the cost table's figures (examples/s, fixed cost, GFLOP/s): a
    # spread there is flagged as the fit time's is.
    spread = [
        f"{what} spread {s.spread:.0%}"
        for what, s in (("fit times", fit), ("steady epochs", steady))
        if s and s.unstable
    ]
    if spread:
        notes.append(f"unstable: {', '.join(spread)}")
    untimed = len(p.ok_runs) - len(p.values(FIT_S))  # a record the worker did not write: its figures are the others'
    if untimed:
        timed = len(p.ok_runs) - untimed
        notes.append(
            f"{untimed} of {len(p.ok_runs)} ok runs recorded no fit time: its times are of the other {timed}"
            if timed
            else "no ok run recorded a fit time"
        )
    if outlier:
        notes.append("first repetition an outlier")
    if p.ok_runs and not p.passes_gate:
        notes.append(gate_text(p.accuracy))
    if any(STEADY_INCLUDES_FIRST_EPOCH.of(r) for r in p.ok_runs):
        notes.append("one epoch: the steady epoch includes tracing and compilation")
    load = under_load.point_load_note(p.ok_runs)
    if load:
        notes.append(load)
    stop = stopping_note(p)
    if stop:
        notes.append(stop)
    return notes


def ratio_of(f: PointFigures) -> stats.Ratio | None:
    """The speedup as the Ratio it was computed as, for its wording."""
    if f.speedup is None:
        return None
    runs = (f.speedup_runs_baseline or 0, f.speedup_runs_point or 0)
    return stats.Ratio(f.speedup, f.speedup_ci_low, f.speedup_ci_high, runs)


def run_record(path: str, r: RunResult, machine: str, counted: bool) -> dict[str, Any]:
    """One result file's figures: identity, every timing, quality, work and telemetry summary."""
    timing = {k: r.timing.get(k) for k in RUN_TIMINGS}
    first_line = r.message.splitlines()[0] if r.message else ""
    return {
        "file": path,
        "machine": machine,
        "scenario": r.spec.get("scenario"),
        "point": r.spec.get("point_label"),
        "device": str((r.spec.get("config") or {}).get("device", "")),
        "repetition": int(r.spec.get("repetition", 0)),
        "status": r.status,
        "counted": counted,
        "smoke": bool(r.spec.get("smoke")),
        "fingerprint": r.fingerprint,
        "overrides": dict(r.spec.get("overrides") or {}),
        "backend": RUN_BACKEND.of(r),
        "finished_at": results.finished_at(r) or None,
        **timing,
        "test_accuracy": TEST_ACCURACY.of(r),
        "test_loss": r.quality.get("test_loss"),
        "final_loss": r.quality.get("final_loss"),
        "achieved_flops_per_s": ACHIEVED_FLOPS_PER_S.of(r),
        "flops_per_example_train": r.work.get("flops_per_example_train"),
        "peak_flops_per_s": peak_of(r),
        **telemetry_figures.figures_of(r)._asdict(),
        "message": first_line,
        **provenance_fields(r),
    }


def provenance_fields(r: RunResult) -> dict[str, Any]:
    """The run's provenance, flat (runs.csv has one column each): null where not recorded;
    ``provenance_recorded`` tells a record made before provenance from one that knows a fact is null.
    A Docker record made before keeps what its image facts say (``provenance.of_result``)."""
    section = provenance.of_result(r.provenance, r.run)
    suite, environment, image = section.get("suite") or {}, section.get("environment") or {}, section.get("image") or {}
    at_end = section.get(provenance.CHANGED_DURING_RUN) or {}
    return {
        "provenance_recorded": bool(r.provenance),
        "suite_version": suite.get("version"),
        "git_revision": suite.get("git_revision"),
        "git_dirty": suite.get("git_dirty"),
        "dirty_paths": list(suite.get("dirty_paths") or []),
        "diff_sha256": suite.get("diff_sha256"),
        "suite_changed_during_run": bool(at_end) if r.provenance else None,
        "git_revision_at_end": at_end.get("git_revision"),
        "diff_sha256_at_end": at_end.get("diff_sha256"),
        "environment_kind": environment.get("kind"),
        "lock_file": environment.get("lock_file"),
        "lock_sha256": environment.get("lock_sha256"),
        "matches_lock": environment.get("matches_lock"),
        "lock_differences": list(environment.get("lock_differences") or []),
        "image_name": image.get("name"),
        "image_id": image.get("id"),
        "image_digest": image.get("digest"),
        "image_recipe_hash": image.get("recipe_hash"),
        "image_context_hash": image.get("context_hash"),
        **{f"image_{key}": image.get(key) for key in provenance.BASE_KEYS},
    }


def collect(results_dir: Path, loaded: list[tuple[Path, RunResult]], select: str | None = None) -> dict[str, Any]:
    """The whole export document (the JSON), from the result files under ``results_dir`` as
    ``results.load_folder`` read them (``loaded``).

    ``select``: a ``-k`` expression, as ``report -k`` takes it: the points it leaves out are left
    out here too, with their result files.
    """
    views = select_views(group_views(results_dir, loaded), select)
    counted = {id(r) for v in views for p in v.points for r in p.runs}
    taken = {(v.machine, v.scenario, p.label) for v in views for p in v.points}
    runs = []
    for path, r in loaded:
        machine = RUN_MACHINE.of(r) or path.relative_to(results_dir).parts[0]
        if select is None or (machine, r.spec.get("scenario"), r.spec.get("point_label")) in taken:
            runs.append(run_record(path.relative_to(results_dir).as_posix(), r, machine, id(r) in counted))
    return {
        "format": FORMAT,
        "version": VERSION,
        "interval": {"level": stats.LEVEL, "method": stats.METHOD, "min_runs": stats.MIN_RUNS_FOR_INTERVAL},
        "ratio_direction": RATIO_DIRECTION,
        "accuracy_gate": ACCURACY_GATE,
        "spread_limit": stats.SPREAD_LIMIT,
        "views": [_view_record(v) for v in views],
        "points": [asdict(point_figures(v, p)) for v in views for p in v.points],
        "runs": runs,
    }


def _view_record(view: ScenarioView) -> dict[str, Any]:
    verdict = verdicts.judge(view)
    return {
        "machine": view.machine,
        "scenario": view.scenario,
        "smoke": view.smoke,
        "overrides": dict(view.overrides),
        "question": view.spec.get("question", ""),
        "verdict": verdict.text,
        "not_compared": [{"points": names, "why": why} for why, names in verdict.not_compared_by_reason()],
        "baseline": view.spec.get("report", {}).get("baseline") or None,
        "points": [p.label for p in view.points],
        "other_sizes": list(view.other_sizes),
        "left_out": [asdict(x) for x in view.left_out],
    }


# points.csv flattens the nested fields: status_counts into a column per status (runs_ok is a field),
# notes joined by "; ", and coords into a column per matrix axis, ``coord.<path>`` (the union over
# every scenario exported, in order of appearance; empty where a point's scenario has no such axis).
_COUNTED = [s for s in results.STATUSES if s != results.STATUS_OK]
POINT_COLUMNS = (
    [f.name for f in fields(PointFigures) if f.name not in ("status_counts", "coords", "notes", "overrides")]
    + [f"runs_{s}" for s in _COUNTED]
    + ["notes", "overrides"]
)


COORD_PREFIX = "coord."


def points_csv(doc: dict[str, Any]) -> str:
    axes = list(dict.fromkeys(k for p in doc["points"] for k in p["coords"]))
    rows = []
    for p in doc["points"]:
        row = {k: p[k] for k in POINT_COLUMNS if k in p}
        row.update({f"runs_{s}": p["status_counts"].get(s, 0) for s in _COUNTED})
        row["notes"] = "; ".join(p["notes"])
        row["overrides"] = overrides_text(p["overrides"])
        for axis, value in p["coords"].items():
            # A list value (model.hidden: [512, 256]) as its JSON; a number or name as itself.
            row[COORD_PREFIX + axis] = json.dumps(value) if isinstance(value, list | dict) else value
        rows.append(row)
    return _csv([*POINT_COLUMNS, *(COORD_PREFIX + a for a in axes)], rows)


# runs.csv spreads these list timings over numbered columns, 1-based: epoch_1_s, epoch_2_s, ...
LIST_COLUMNS = {"epoch_s": "epoch_{}_s", "step_floor_epochs_s": "step_floor_epoch_{}_s"}
# and joins these lists of text into one cell, as points.csv joins notes
JOINED_COLUMNS = ("dirty_paths", "lock_differences")


def runs_csv(doc: dict[str, Any]) -> str:
    """One row per result file, in the JSON's order and with its keys."""
    widths = {k: max((len(r[k] or []) for r in doc["runs"]), default=0) for k in LIST_COLUMNS}
    columns: list[str] = []
    keys = doc["runs"][0] if doc["runs"] else run_record("", RunResult("skipped", {}), "", False)  # header alone
    for key in keys:
        if key in LIST_COLUMNS:
            columns += [LIST_COLUMNS[key].format(i) for i in range(1, widths[key] + 1)]
        else:
            columns.append(key)
    rows = []
    for r in doc["runs"]:
        row = {k: v for k, v in r.items() if k not in LIST_COLUMNS}
        row["overrides"] = overrides_text(r["overrides"])
        row.update({k: "; ".join(r[k]) for k in JOINED_COLUMNS})
        for key, name in LIST_COLUMNS.items():
            row.update({name.format(i): v for i, v in enumerate(r[key] or [], 1)})
        rows.append(row)
    return _csv(columns, rows)


def _csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    # The header as the cells are written: a coordinate's name (coord.<path>) comes from a record.
    csv.writer(buf, lineterminator="\n").writerow([_csv_value(c) for c in columns])
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in columns})
    return buf.getvalue()


def _csv_value(value: Any) -> str:
    """Empty for not measured; true/false as in the JSON; floats with every digit (repr round-trips).
    Text that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return (OWASP's list) and is
    not a number gets a leading ``'``, so a spreadsheet shows it as text instead of running it as a
    formula (a variant named ``=cmd|...``, or ``\t=cmd|...``, which some read past the tab). Control
    characters other than tabs and newlines are written as Python escapes them (``\x1b``), as on the pages."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    # A control character (ESC) written out, never one a terminal obeys; tabs and newlines are CSV's to quote.
    text = "\t".join(escaped_lines(part) for part in str(value).split("\t"))
    if text[:1] in FORMULA_START and not isinstance(value, int) and not _is_number(text):
        return "'" + text
    return text


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def parse_formats(text: str) -> list[str]:
    """``md,json`` -> ["md", "json"]; raises ValueError naming what is not allowed."""
    chosen = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise ValueError(f"--format {text}: {', '.join(unknown) or 'empty'} not allowed; allowed: {', '.join(FORMATS)}")
    return list(dict.fromkeys(chosen))


def write_exports(
    results_dir: Path, loaded: list[tuple[Path, RunResult]], out_dir: Path, formats: list[str], select: str | None
) -> list[writing.Wrote]:
    """report.json and/or points.csv + runs.csv in ``out_dir`` (``collect``); returns each file written,
    with the sha256 of its bytes."""
    if not {"json", "csv"} & set(formats):
        return []
    doc = collect(results_dir, loaded, select)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if "json" in formats:
        written.append(writing.write(out_dir / "report.json", to_json(doc)))
    if "csv" in formats:
        written.append(writing.write(out_dir / "points.csv", points_csv(doc)))
        written.append(writing.write(out_dir / "runs.csv", runs_csv(doc)))
    return written
