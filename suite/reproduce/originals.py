"""The recorded points a reproduction starts from: result files read, grouped by point, selected,
and turned back into the specs that rerun them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from suite.record import results
from suite.record.results import FIT_S, RunResult
from suite.safe.markdown import one_line
from suite.spec import plan, select


class ReproduceError(Exception):
    """Bad input: a file that is not a result, a point with nothing to compare with, a bad flag."""


@dataclass
class Original:
    """One point as the given files recorded it: its spec and its runs (newest attempt per repetition)."""

    machine: str
    fingerprint: str
    spec: dict[str, Any]
    runs: list[RunResult]
    files: list[Path]
    provenance: list[dict[str, Any] | None]  # per run in ``runs``, as recorded (None: not recorded)
    superseded: list[Path] = field(default_factory=list)  # files of older attempts of a repetition, not taken

    @property
    def ok_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.ok]

    @property
    def label(self) -> str:
        return named(self.spec)

    @property
    def backend(self) -> str:
        """The backend the runs recorded (``group_points`` refuses a point recorded by several)."""
        return _backend_of(self.runs[0])


def load_inputs(paths: Iterable[Path]) -> list[tuple[Path, RunResult, dict[str, Any] | None]]:
    """Every result in the given files and folders (a folder: every result under it), each with its
    recorded ``provenance``; ReproduceError or ResultError naming the path that cannot be read."""
    seen: set[Path] = set()
    out = []
    for given in paths:
        if given.is_dir():
            found = _load_folder(given)
            if not found:
                raise ReproduceError(f"{given}: a folder with no result files in it")
        elif given.is_file():
            found = [(given, results.load(given))]
        elif given.exists():  # a FIFO, a device: never opened (a FIFO would wait for a writer)
            raise ReproduceError(
                f"{given}: not a regular file; reproduce takes result files (.json) and folders of them"
            )
        else:
            raise ReproduceError(f"{given}: no such file or folder")
        for path, result in found:
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            prov = result.provenance if isinstance(result.provenance, dict) and result.provenance else None
            out.append((path, result, prov))
    return out


def _load_folder(folder: Path) -> list[tuple[Path, RunResult]]:
    """``results.load_folder``, with advice that fits a folder given to this command: a file in it
    that is not a result stops the whole folder, so name the files instead or move that one out."""
    try:
        return results.load_folder(folder)
    except results.ResultError as exc:
        text = str(exc).removesuffix("; move it out of the results folder")
        raise ReproduceError(
            f"{text}; it is under {folder}, given as a folder of results: give the result files by name "
            "instead, or move it out of that folder"
        ) from None


def _backend_of(result: RunResult) -> str:
    return str(results.RUN_BACKEND.of(result) or "local")


def group_points(loaded: list[tuple[Path, RunResult, dict[str, Any] | None]]) -> list[Original]:
    """Results grouped by fingerprint, in the order first given; ReproduceError for a point with no
    ``ok`` run to compare with (naming its files and their statuses), or recorded on several
    machines or by several backends (the fingerprint does not hold the backend: a container run and
    a local run of one point are two samples of two things, not one).

    Per repetition the newest attempt is taken; the files of older attempts are the point's
    ``superseded``."""
    return take_points(all_points(loaded))[0]


def named(spec: dict[str, Any]) -> str:
    """A point as the console names it: 'scenario [point label]', on one line (a variant's name may
    hold a line break or a tab)."""
    return f"{spec.get('scenario', '?')} [{one_line(spec.get('point_label', '?'))}]"


def all_points(loaded: list[tuple[Path, RunResult, dict[str, Any] | None]]) -> list[Original]:
    """``group_points`` without the check that each point has an ok run to compare with."""
    grouped: dict[str, list[tuple[Path, RunResult, dict[str, Any] | None]]] = {}
    for path, result, prov in loaded:
        if not result.fingerprint:
            raise ReproduceError(f"{path}: the result's spec has no fingerprint; it cannot be matched to a point")
        grouped.setdefault(result.fingerprint, []).append((path, result, prov))
    points = []
    for fingerprint, items in grouped.items():
        label = named(items[0][1].spec)
        for what, of in (("machines", lambda r: str(results.RUN_MACHINE.of(r) or "?")), ("backends", _backend_of)):
            found: dict[str, list[Path]] = {}
            for path, r, _ in items:
                found.setdefault(of(r), []).append(path)
            if len(found) > 1:
                each = "; ".join(f"{k}: {files_text(v)}" for k, v in sorted(found.items()))
                raise ReproduceError(
                    f"{label} was recorded on {len(found)} {what} ({', '.join(sorted(found))}): their runs are "
                    f"not one sample; give one {what[:-1]}'s files at a time ({each})"
                )
        by_result = {id(r): (p, prov) for p, r, prov in items}
        latest = results.latest_by_run([r for _, r, _ in items])
        runs = [latest[k] for k in sorted(latest, key=lambda k: k[1])]
        kept = {id(r) for r in runs}
        points.append(
            Original(
                machine=str(results.RUN_MACHINE.of(items[0][1]) or "?"),
                fingerprint=fingerprint,
                spec=runs[0].spec,
                runs=runs,
                files=[by_result[id(r)][0] for r in runs],
                provenance=[by_result[id(r)][1] for r in runs],
                superseded=[p for p, r, _ in items if id(r) not in kept],
            )
        )
    return points


def select_points(points: list[Original], text: str | None) -> list[Original]:
    """The points ``-k text`` takes (``suite run -k``'s language, over the recorded point labels);
    all of them for None. SelectError for an unknown key or an expression that takes none."""
    if text is None:
        return points
    items = [
        select.item_of(str(p.spec.get("scenario")), p.spec.get("point") or {}, str(p.spec.get("point_label")))
        for p in points
    ]
    return [p for p, keep in zip(points, select.choose(items, text), strict=True) if keep]


def take_points(points: list[Original], named: set[Path] | None = None) -> tuple[list[Original], list[str]]:
    """(the points that can be compared, one line per point left out).

    A point needs an ok run with a fit time to compare with. Where it has none, a point any of
    whose files was given by name (``named``: resolved paths; None: every file counts as named) is
    bad input (ReproduceError naming its files and their statuses): that file was asked for. A
    point found only inside a given folder is left out with a line saying why: a machine's folder
    holds what it could not run too (every GPU point is ``skipped`` on a machine without one), and
    those points must not stop the others in it from being reproduced."""
    kept, left_out = [], []
    for point in points:
        why = _not_comparable(point)
        if why is None:
            kept.append(point)
        elif named is None or any(f.resolve() in named for f in point.files):
            raise ReproduceError(why)
        else:
            left_out.append(f"left out {why}")
    return kept, left_out


def _not_comparable(point: Original) -> str | None:
    """Why a point has nothing to compare a rerun with, naming its files; None when it has."""
    if not point.ok_runs:
        statuses = ", ".join(f"{p} ({r.status})" for p, r in zip(point.files, point.runs, strict=True))
        return f"{point.label}: no ok run to compare with: {statuses}"
    if not [v for r in point.ok_runs if (v := FIT_S.of(r)) is not None]:
        files = ", ".join(str(p) for p, r in zip(point.files, point.runs, strict=True) if r.ok)
        return f"{point.label}: {files}: ok but no timing.fit_s recorded; nothing to compare with"
    return None


FILES_SHOWN = 3  # a line naming files names this many, then "and N more"


def files_text(paths: list[Path]) -> str:
    """Files as a line shows them: all of a few, the first FILES_SHOWN and a count of many."""
    names = [str(p) for p in paths]
    if len(names) <= FILES_SHOWN + 1:
        return ", ".join(names)
    return ", ".join(names[:FILES_SHOWN]) + f" and {len(names) - FILES_SHOWN} more"


def superseded_text(points: list[Original]) -> str | None:
    """ "N of the given files were superseded by newer attempts: ..." or None when none was."""
    dropped = [f for p in points for f in p.superseded]
    if not dropped:
        return None
    given = len(dropped) + sum(len(p.files) for p in points)
    return (
        f"{len(dropped)} of the {given} given files were superseded by newer attempts of the same repetition "
        f"and are not compared: {files_text(dropped)}"
    )


def spec_of(point: Original) -> plan.RunSpec:
    """The point's recorded spec as a RunSpec (repetition 0), the fingerprint kept as recorded."""
    problems = config_problems(point.spec.get("config") or {}, f"{point.files[0]}: field spec.config")
    if problems:
        raise ReproduceError("\n".join(problems))
    known = {f.name for f in fields(plan.RunSpec)}
    data = {k: v for k, v in point.spec.items() if k in known}
    data["calibrate_peak"] = False  # the runner asks for a peak measurement where it needs one
    try:
        return plan.RunSpec.from_dict(data)
    except TypeError as exc:
        raise ReproduceError(f"{point.files[0]}: the spec cannot be run again ({exc})") from None


def config_problems(config: dict[str, Any], source: str) -> list[str]:
    """Why a recorded config must not run here: the scenario checker's rules (every value in its
    range, keys of their sections), as ``run`` and ``check`` apply them; a result from elsewhere
    may hold what no scenario file could (a million epochs, a timeout past the platform's clock)."""
    from suite.spec.settings import Checker, check_config, cross_checks

    ck = Checker(source, {})
    data = {k: v for k, v in (config.get("data") or {}).items() if k != "identity"}  # the host's fact
    check_config(ck, {**config, "data": data})
    if not ck.problems:
        try:
            cross_checks(ck, config, "the point")
        except (KeyError, TypeError):
            ck.fail("device", "the config lacks device, backend or training.input_pipeline")
    return ck.problems


def rerun_specs(points: list[Original], repeats: int | None) -> list[plan.RunSpec]:
    """Every point's recorded spec, once per repetition (as many as its original ok runs, or
    ``repeats``), interleaved across points like a plan: every point once before any runs twice."""
    specs = []
    for point in points:
        base = spec_of(point)
        n = repeats if repeats is not None else len(point.ok_runs)
        # The reruns are a fixed count: repeats: auto's rule, if the original ran under it, stays behind.
        report = {k: v for k, v in base.report.items() if k != "repeats"}
        specs += [plan.RunSpec(**{**base.__dict__, "repetition": i, "report": report}) for i in range(n)]
    return plan.interleave(specs)
