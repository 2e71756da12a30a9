"""``python -m suite reproduce RESULT.json|DIR ...``: rerun the exact recorded points here and say
whether the published number came out again.

The inputs are result files (from any machine) or folders of them. They are grouped by point: the
same fingerprint (scenario, size, resolved config with its data identity) recorded on the same
machine. Each point's ``ok`` runs are the original sample. The rerun runs the point's recorded spec
as it stands in the file (config, data identity, ``--set`` overrides, timeout; never re-derived from
today's scenario files) as many times as there were original runs, through ``runner.run_plan`` like
``suite run`` (the same backends, peak calibration and result files, interleaved across points).

Before anything runs, what each result recorded of its making (``provenance``: the suite's revision
and whether its tree had changes, the environment's lock, the image recipe) and its data are set
against this machine now. An exact reproduction needs them equal; where they differ the command
refuses with one line per difference and what to do (``--anyway`` runs regardless and shows them
above the verdict).

The comparison is on the fit time, the figure the reports' speedups and ``compare`` divide: the
ratio rerun/original of geometric means with its 95% Welch interval on log times
(``stats.ratio``). The verdict:

- ``reproduced within X%``: the whole interval lies within +-tolerance of 1 (X is the interval's
  largest distance from 1, rounded up);
- ``differs``: the whole interval lies outside +-tolerance (it excludes 1 by more than the tolerance);
- ``inconclusive``: neither; the output estimates, from the observed spreads, how many reruns would
  settle it, or says that the original's own runs are too few or too spread for that;
- ``not reproduced``: a rerun did not end ``ok`` (or was skipped here).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from suite import backends, compare, datasets, hostinfo, image_catalog, plan, results, runner, stats
from suite.results import FIT_S, STEADY_EPOCH_S, TEST_ACCURACY, RunResult
from suite.views import ACCURACY_GATE

FORMAT = "keras-speed-suite/reproduce"
VERSION = 1

# The default tolerance. At the suite's full-size 5 repetitions per side and about 5% noise per run,
# the 95% interval of a ratio spans about +-7% (t(8 dof) 2.31 x sqrt(2 x 0.05^2 / 5)): a true
# match then lands within +-10%, while a shift of more than 10% (another driver, a throttled
# machine, a changed default) is what a reader of a published number cares about.
DEFAULT_TOLERANCE_PCT = 10.0
REPEATS_CAP = 50  # the most reruns an "inconclusive" verdict suggests; beyond, it says "more repetitions"

REPRODUCED, DIFFERS, INCONCLUSIVE, NOT_REPRODUCED = "reproduced", "differs", "inconclusive", "not reproduced"
HARDWARE_FACTS = ("GPU model", "GPU driver", "CPU", "CPU cores")


class ReproduceError(Exception):
    """Bad input: a file that is not a result, a point with nothing to compare with, a bad flag."""


class Refused(Exception):
    """The results do not fit this checkout or machine; the message lists why and what to do."""


# ------------------------------------------------------------------------------------------- inputs


@dataclass
class Original:
    """One point as the given files recorded it: its spec and its runs (newest attempt per repetition)."""

    machine: str
    fingerprint: str
    spec: dict[str, Any]
    runs: list[RunResult]
    files: list[Path]
    provenance: list[dict[str, Any] | None]  # per run in ``runs``, as recorded (None: not recorded)

    @property
    def ok_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.ok]

    @property
    def label(self) -> str:
        return f"{self.spec.get('scenario', '?')} [{self.spec.get('point_label', '?')}]"

    @property
    def backend(self) -> str:
        """The backend the newest ok run recorded."""
        newest = max(self.ok_runs, key=results.finished_at)
        return str(results.RUN_BACKEND.of(newest) or "local")


def load_inputs(paths: Iterable[Path]) -> list[tuple[Path, RunResult, dict[str, Any] | None]]:
    """Every result in the given files and folders (a folder: every result under it), each with its
    recorded ``provenance``; ReproduceError or ResultError naming the path that cannot be read."""
    seen: set[Path] = set()
    out = []
    for given in paths:
        if given.is_dir():
            found = results.load_folder(given)
            if not found:
                raise ReproduceError(f"{given}: a folder with no result files in it")
        elif given.is_file():
            found = [(given, results.load(given))]
        else:
            raise ReproduceError(f"{given}: no such file or folder")
        for path, result in found:
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            out.append((path, result, _provenance_of(path, result)))
    return out


def _provenance_of(path: Path, result: RunResult) -> dict[str, Any] | None:
    """The record's top-level ``provenance`` section (None when it has none)."""
    value = getattr(result, "provenance", None)
    if value is None:  # a RunResult without the field: the file itself says
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get("provenance")
        except (OSError, ValueError, AttributeError):
            value = None
    return value if isinstance(value, dict) and value else None


def group_points(loaded: list[tuple[Path, RunResult, dict[str, Any] | None]]) -> list[Original]:
    """Results grouped by fingerprint, in the order first given; ReproduceError for a point with no
    ``ok`` run to compare with (naming its files and their statuses), or recorded on several machines
    (their runs are not one sample)."""
    grouped: dict[str, list[tuple[Path, RunResult, dict[str, Any] | None]]] = {}
    for path, result, prov in loaded:
        if not result.fingerprint:
            raise ReproduceError(f"{path}: the result's spec has no fingerprint; it cannot be matched to a point")
        grouped.setdefault(result.fingerprint, []).append((path, result, prov))
    points = []
    for fingerprint, items in grouped.items():
        machines = sorted({str(results.RUN_MACHINE.of(r) or "?") for _, r, _ in items})
        if len(machines) > 1:
            raise ReproduceError(
                f"{items[0][1].spec.get('scenario')} [{items[0][1].spec.get('point_label')}] was recorded on "
                f"{len(machines)} machines ({', '.join(machines)}): their runs are not one sample; give one "
                "machine's files at a time"
            )
        by_result = {id(r): (p, prov) for p, r, prov in items}
        latest = results.latest_by_run([r for _, r, _ in items])
        runs = [latest[k] for k in sorted(latest, key=lambda k: k[1])]
        point = Original(
            machine=machines[0],
            fingerprint=fingerprint,
            spec=runs[0].spec,
            runs=runs,
            files=[by_result[id(r)][0] for r in runs],
            provenance=[by_result[id(r)][1] for r in runs],
        )
        if not point.ok_runs:
            statuses = ", ".join(f"{p} ({r.status})" for p, r in zip(point.files, point.runs, strict=True))
            raise ReproduceError(f"{point.label}: no ok run to compare with: {statuses}")
        if not [v for r in point.ok_runs if (v := FIT_S.of(r)) is not None]:
            files = ", ".join(str(p) for p, r in zip(point.files, point.runs, strict=True) if r.ok)
            raise ReproduceError(f"{files}: ok but no timing.fit_s recorded; nothing to compare with")
        points.append(point)
    return points


def spec_of(point: Original) -> plan.RunSpec:
    """The point's recorded spec as a RunSpec (repetition 0), the fingerprint kept as recorded."""
    known = {f.name for f in fields(plan.RunSpec)}
    data = {k: v for k, v in point.spec.items() if k in known}
    data["calibrate_peak"] = False  # the runner asks for a peak measurement where it needs one
    try:
        return plan.RunSpec.from_dict(data)
    except TypeError as exc:
        raise ReproduceError(f"{point.files[0]}: the spec cannot be run again ({exc})") from None


def rerun_specs(points: list[Original], repeats: int | None) -> list[plan.RunSpec]:
    """Every point's recorded spec, once per repetition (as many as its original ok runs, or
    ``repeats``), interleaved across points like a plan: every point once before any runs twice."""
    specs = []
    for point in points:
        base = spec_of(point)
        n = repeats if repeats is not None else len(point.ok_runs)
        specs += [plan.RunSpec(**{**base.__dict__, "repetition": i}) for i in range(n)]
    return plan.interleave(specs)


# ------------------------------------------------------------------------------------------ checks


def data_difference(spec: dict[str, Any]) -> str | None:
    """Whether this machine has the data the result trained on; None when it has (or the data was
    synthetic, which the worker makes the same way anywhere)."""
    data = dict((spec.get("config") or {}).get("data") or {})
    recorded = data.pop("identity", None) or {}
    if recorded.get("source") in (None, "synthetic"):
        return None
    try:
        here = datasets.identity_for(data)
    except datasets.wdata.DataUnavailable as exc:
        here = {"source": "missing", "note": str(exc)}
    if datasets.fingerprinted(here) == datasets.fingerprinted(recorded):
        return None
    said = _identity_text(recorded)
    have = _identity_text(here) if here.get("source") not in ("missing", "synthetic") else here.get("note", "")
    if data.get("data_dir"):
        how = f"place the same IDX files in data.data_dir {data['data_dir']}"
    else:
        how = f"fetch it: `{datasets.FETCH_COMMAND}` (without internet: `{datasets.FETCH_COMMAND} --from PATH`)"
    return f"data: result trained on {said}, here {have or here.get('source')}; {how}"


def _identity_text(identity: dict[str, Any]) -> str:
    sha = identity.get("sha256")
    return f"{identity.get('source')} sha256 {sha[:12]}..." if sha else str(identity.get("source"))


def fingerprint_difference(point: Original) -> str | None:
    """The recorded spec hashed by this checkout's rule: another value means another suite hashed it
    (or the file was edited), and results would not line up with ``suite run``'s."""
    spec = plan.RunSpec(**{**spec_of(point).__dict__, "fingerprint": ""})
    now = plan.fingerprint_of(spec)
    if now == point.fingerprint:
        return None
    return (
        f"spec fingerprint: result {point.fingerprint[:12]}, this checkout hashes the same spec to {now[:12]} "
        "(another suite revision recorded it, or the file was edited)"
    )


@dataclass
class Here:
    """What this machine offers a point's rerun, to set against what the result recorded."""

    provenance: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # what would stop the rerun (an image missing)
    image_name: str | None = None


def current_local() -> Here:
    from suite import provenance

    return Here(
        {
            "suite": provenance.suite_identity(),
            "environment": provenance.venv_environment(sys.executable),
            "image": None,
        }
    )


def current_docker(backend: Any, spec: plan.RunSpec) -> Here:
    """The image this rerun would run in, as the engine has it, with the recipe an image of that
    name built from this checkout would carry today."""
    from suite import images, provenance
    from suite.backends.base import Unavailable

    catalog = image_catalog.load_catalog()
    name = spec.config.get("image") or catalog.default_for(plan.parse_device(spec.device)[0] == "gpu")
    today = image_catalog.recipe_hash(catalog, name) if name in catalog.images else None
    suite_now = provenance.suite_identity()
    try:
        ref, image = backend.image_for(spec)
    except Unavailable as exc:
        image_block = {"name": name, "id": None, "digest": None, "recipe_hash": today, "context_hash": None}
        env = {"kind": "image", "lock_file": None, "lock_sha256": None, "matches_lock": None, "lock_differences": []}
        return Here({"suite": suite_now, "environment": env, "image": image_block}, [f"image: {exc}"], name)
    env, image_block = provenance.image_provenance({"image": ref, **images.image_record(image)})
    problems = []
    built = (image_block or {}).get("recipe_hash")
    if today is not None and built != today:
        problems.append(
            f"image on the engine: {ref} carries recipe {_short(built)}, this checkout's recipe for {name} is "
            f"{_short(today)}; rebuild it: `python -m suite images build {name}`"
        )
    image_block = {**(image_block or {}), "recipe_hash": today if today is not None else built}
    return Here({"suite": suite_now, "environment": env, "image": image_block}, problems, name)


def _short(value: Any) -> str:
    return str(value)[:12] if value else "none"


# Lines of ``describe_differences`` that do not stand in the way of an exact rerun: an image built
# again from the same recipe (on another machine, or from Debian packages where no registry
# answers) has another ID, yet the same Dockerfile, lock and catalog entry.
NOTE_PREFIXES = ("image ID:",)


def differences(point: Original, here: Here) -> tuple[list[str], list[str]]:
    """(differences, notes): every way the point's recorded making differs from this machine now,
    one line each; the notes (NOTE_PREFIXES) are shown but do not refuse the rerun."""
    from suite import provenance

    lines: list[str] = []
    recorded = [p for r, p in zip(point.runs, point.provenance, strict=True) if r.ok]
    if any(p is None for p in recorded):
        lines.append(
            "provenance: the result records none (made before results recorded their revision, lock and "
            "image); it cannot be matched to this checkout"
        )
    distinct: dict[str, dict[str, Any]] = {}
    for p in recorded:
        if p is not None:
            distinct.setdefault(json.dumps(p, sort_keys=True), p)
    for p in distinct.values():
        lines += provenance.describe_differences(p, here.provenance)
    lines += here.problems
    for extra in (data_difference(point.spec), fingerprint_difference(point)):
        if extra:
            lines.append(extra)
    lines = list(dict.fromkeys(lines))
    notes = [line for line in lines if line.startswith(NOTE_PREFIXES)]
    return [line for line in lines if line not in notes], notes


def advice(lines: list[str], revisions: list[str], image_names: list[str], lock_files: list[str] | None = None) -> str:
    """What to do about the differences, in the order a reader does it."""

    def has(*prefixes: str) -> bool:
        return any(line.startswith(prefixes) for line in lines)

    steps = []
    if has("suite revision", "suite tree", "spec fingerprint"):
        rev = " or ".join(revisions) if revisions else "<the result's git_revision>"
        steps.append(f"check out the revision the result names: `git checkout {rev}`, then set up as the README says")
    if has("environment", "installed packages") and not image_names:
        locks = f" ({', '.join(lock_files)})" if lock_files else ""
        steps.append(
            f"run with a venv installed from the result's lock{locks}: ./run_all.sh sets one up from the run lock, "
            "SUITE_ENV=run-gpu ./run_all.sh from run-gpu, ./run_tests.sh from dev"
        )
    if has("image", "environment", "installed packages") and image_names:
        steps.append(f"rebuild the image from this checkout: `python -m suite images build {' '.join(image_names)}`")
    if has("data:"):
        steps.append(f"fetch the data: `{datasets.FETCH_COMMAND}`")
    if has("provenance:"):
        steps.append("a result without provenance names no revision to check out: only --anyway reruns it")
    steps.append("or pass --anyway to run here regardless, with these differences shown above the verdict")
    return "; ".join(steps)


# ----------------------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Verdict:
    kind: str  # REPRODUCED, DIFFERS, INCONCLUSIVE, NOT_REPRODUCED
    text: str
    ratio: stats.Ratio | None = None
    repeats_needed: int | None = None


def verdict(original: list[float], rerun: list[float], tolerance: float, failures: list[str] | None = None) -> Verdict:
    """The verdict on one point from its original and rerun fit times (seconds).

    tolerance: a fraction (0.10 for +-10%). failures: one line per rerun that did not end ok; any
    makes the point not reproduced, whatever the other reruns measured.
    """
    if failures:
        n = len(failures) + len(rerun)
        shown = stats.ratio(rerun, original) if rerun else None  # of the reruns that ran, for the table
        text = f"not reproduced: {len(failures)} of {n} reruns did not run ok ({failures[0]})"
        return Verdict(NOT_REPRODUCED, text, shown)
    if not rerun:
        return Verdict(NOT_REPRODUCED, "not reproduced: no rerun recorded a fit time")
    r = stats.ratio(rerun, original)
    pct = _pct(tolerance)
    if r.low is None or r.high is None:
        if len(original) < stats.MIN_RUNS_FOR_INTERVAL:
            return Verdict(
                INCONCLUSIVE,
                f"inconclusive: the original has {len(original)} run(s), and a 95% interval needs "
                f"{stats.MIN_RUNS_FOR_INTERVAL} on each side; more reruns cannot make up for it "
                f"(rerun/original {r.value:.2f}x)",
                r,
            )
        needed = repeats_needed(original, rerun, tolerance)
        how = (
            f"rerun with --repeats {needed}"
            if needed
            else f"rerun with --repeats {stats.MIN_RUNS_FOR_INTERVAL} or more"
        )
        return Verdict(
            INCONCLUSIVE,
            f"inconclusive: {len(rerun)} rerun(s) give no 95% interval ({stats.MIN_RUNS_FOR_INTERVAL} needed on "
            f"each side; rerun/original {r.value:.2f}x); {how}",
            r,
            needed,
        )
    low, high = 1.0 - tolerance, 1.0 + tolerance
    interval = f"95% interval {stats.bound(r.low)}-{stats.bound(r.high)}"
    if low <= r.low and r.high <= high:
        within = math.ceil(round(max(abs(r.low - 1.0), abs(r.high - 1.0)) * 100, 9))
        return Verdict(REPRODUCED, f"reproduced within {within}% (rerun/original {r.value:.2f}x, {interval})", r)
    if r.low > high or r.high < low:
        how = f"{r.value:.2f}x slower" if r.value > 1 else f"{1 / r.value:.2f}x faster"
        return Verdict(DIFFERS, f"differs: rerun {how} (rerun/original {r.value:.2f}x, {interval})", r)
    width = "is wider than" if r.high - r.low > high - low else "straddles"
    needed = repeats_needed(original, rerun, tolerance)
    if needed is not None:
        how = f"rerun with --repeats {needed} (an estimate from the spread observed)"
    elif _original_limits(original, rerun, tolerance):
        how = (
            f"the original's {len(original)} runs alone leave the interval too wide: more repetitions of the "
            "original are needed, not only of the rerun"
        )
    else:
        how = "rerun with more repetitions (the observed ratio sits too close to a bound to say how many)"
    return Verdict(
        INCONCLUSIVE,
        f"inconclusive: the {interval} (rerun/original {r.value:.2f}x) {width} +-{pct}; {how}",
        r,
        needed,
    )


def _pct(tolerance: float) -> str:
    return f"{tolerance * 100:g}%"


def _log_parts(original: list[float], rerun: list[float]) -> tuple[float, float, float, int] | None:
    """(difference of mean log times, original's and rerun's variance of log times, original n);
    the rerun's variance is the original's where it has a single run. None below 2 original runs."""
    lo, lr = np.log(np.asarray(original, float)), np.log(np.asarray(rerun, float))
    if len(lo) < 2:
        return None
    var_o = float(lo.var(ddof=1))
    var_r = float(lr.var(ddof=1)) if len(lr) >= 2 else var_o
    return float(lr.mean() - lo.mean()), var_o, var_r, len(lo)


def _half_width(var_o: float, n: int, var_r: float, m: float) -> float:
    """The Welch interval's half-width on log times for n original and m rerun runs (stats' formula)."""
    va, vb = var_o / n, var_r / m
    se2 = va + vb
    if se2 <= 0:
        return 0.0
    dof = se2**2 / (va**2 / (n - 1) + vb**2 / (m - 1))
    return float(sps.t.ppf(0.5 + stats.LEVEL / 2, dof) * math.sqrt(se2))


def _distance(diff: float, tolerance: float) -> float:
    """How far the observed log ratio is from the nearest bound of the tolerance band."""
    lo, hi = math.log(1 - tolerance), math.log(1 + tolerance)
    return min(diff - lo, hi - diff) if lo <= diff <= hi else (diff - hi if diff > hi else lo - diff)


def repeats_needed(original: list[float], rerun: list[float], tolerance: float) -> int | None:
    """The fewest reruns (at most REPEATS_CAP) whose 95% interval would no longer cross a bound of
    the tolerance band, if the ratio and both spreads stayed as observed; None when no number would
    (the ratio sits on a bound, or the original's own runs leave the interval too wide) or the
    original has too few runs to estimate from."""
    parts = _log_parts(original, rerun)
    if parts is None or len(original) < stats.MIN_RUNS_FOR_INTERVAL:
        return None
    diff, var_o, var_r, n = parts
    d = _distance(diff, tolerance)
    if d <= 0:
        return None
    for m in range(stats.MIN_RUNS_FOR_INTERVAL, REPEATS_CAP + 1):
        if _half_width(var_o, n, var_r, m) < d:
            return m
    return None


def _original_limits(original: list[float], rerun: list[float], tolerance: float) -> bool:
    """Whether even endless reruns would leave the interval crossing a bound: the original's spread decides."""
    parts = _log_parts(original, rerun)
    if parts is None:
        return True
    diff, var_o, var_r, n = parts
    d = _distance(diff, tolerance)
    return d > 0 and _half_width(var_o, n, var_r, 1e9) >= d


# ------------------------------------------------------------------------------------- comparison


def side(runs: list[RunResult]) -> dict[str, Any]:
    """One side of a point (original or rerun) as numbers: counts, fit and steady epoch summaries."""
    ok = [r for r in runs if r.ok]
    fit = [float(v) for r in ok if (v := FIT_S.of(r)) is not None]
    steady = [float(v) for r in ok if (v := STEADY_EPOCH_S.of(r)) is not None]
    fs, ss = stats.summarize(fit), stats.summarize(steady)
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "runs": len(runs),
        "runs_ok": len(ok),
        "statuses": statuses,
        "fit_s": fit,
        "fit_s_geomean": stats.geometric_mean(fit) if fit else None,
        "fit_s_min": fs.low if fs else None,
        "fit_s_max": fs.high if fs else None,
        "steady_epoch_s_median": ss.median if ss else None,
        "steady_epoch_s_min": ss.low if ss else None,
        "steady_epoch_s_max": ss.high if ss else None,
    }


def fact_differences(original: list[RunResult], rerun: list[RunResult]) -> tuple[list[str], list[str]]:
    """(hardware lines, other fact lines): the facts ``compare`` records, where the original's ok
    runs and the reruns that reached the worker say different things."""
    ran = [r for r in rerun if r.environment]
    if not ran:
        return [], []
    hardware, other = [], []
    for name, get in compare.FACTS:
        was = sorted({str(get(r)) for r in original if r.ok and r.environment})
        now = sorted({str(get(r)) for r in ran})
        if was and was != now:
            line = f"{name}: {', '.join(was)} (original) vs {', '.join(now)} (rerun)"
            (hardware if name in HARDWARE_FACTS else other).append(line)
    return hardware, other


def failure_lines(runs: list[RunResult], original: list[RunResult] | None = None) -> list[str]:
    """One line per rerun that did not end ok; and, where every original run reached the accuracy
    gate the reports hold verdicts to, per ok rerun below it (a fast broken run reproduces nothing)."""
    lines = [
        f"rep {r.spec.get('repetition')}: {r.status}" + (f": {r.message.splitlines()[0][:200]}" if r.message else "")
        for r in runs
        if not r.ok
    ]
    was = [a for r in original or [] if r.ok and (a := TEST_ACCURACY.of(r)) is not None]
    if was and min(was) >= ACCURACY_GATE:
        for r in runs:
            acc = TEST_ACCURACY.of(r)
            if r.ok and acc is not None and acc < ACCURACY_GATE:
                lines.append(
                    f"rep {r.spec.get('repetition')}: ok, but test accuracy {acc:.3f} is below the "
                    f"{ACCURACY_GATE:.2f} gate every original run reached ({min(was):.3f} or more)"
                )
    return lines


def compare_point(
    point: Original,
    reruns: list[RunResult],
    tolerance: float,
    diffs: tuple[list[str], list[str]],
    backend: str,
) -> dict[str, Any]:
    """One point's comparison as plain data (``--json``); ``render`` formats exactly this."""
    original, again = side(point.ok_runs), side(reruns)
    failures = failure_lines(reruns, point.runs)
    v = verdict(original["fit_s"], again["fit_s"], tolerance, failures)
    hardware, other = fact_differences(point.ok_runs, reruns)
    r = v.ratio
    return {
        "scenario": point.spec.get("scenario"),
        "point": point.spec.get("point_label"),
        "fingerprint": point.fingerprint,
        "machine": point.machine,
        "smoke": bool(point.spec.get("smoke")),
        "backend": backend,
        "original_files": [str(p) for p in point.files],
        "original": original,
        "rerun": {**again, "failures": failures, "files": []},
        "ratio": None
        if r is None
        else {"rerun_over_original": r.value, "ci_low": r.low, "ci_high": r.high, "runs": list(r.runs)},
        "verdict": {"kind": v.kind, "text": v.text, "repeats_needed": v.repeats_needed},
        "differences": diffs[0],
        "notes": diffs[1],
        "hardware_differs": hardware,
        "other_facts_differ": other,
    }


def collect(
    compared: list[dict[str, Any]],
    tolerance: float,
    results_dir: Path,
    anyway: bool,
    inputs: list[Path] | None = None,
) -> dict[str, Any]:
    """The whole comparison as plain data (``--json``, docs/reproduce.md)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "inputs": [str(p) for p in inputs or []],
        "tolerance": tolerance,
        "compared": "timing.fit_s",
        "interval": {"level": stats.LEVEL, "method": stats.METHOD, "min_runs": stats.MIN_RUNS_FOR_INTERVAL},
        "anyway": anyway,
        "results_dir": str(results_dir),
        "points": compared,
        "reproduced": all(p["verdict"]["kind"] == REPRODUCED for p in compared),
    }


def _range(lo: float | None, hi: float | None, mid: float | None, digits: int) -> str:
    if mid is None:
        return "-"
    return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def render(data: dict[str, Any]) -> str:
    """The comparison as text: shared differences first, then per point its table, facts and verdict."""
    from tabulate import tabulate

    points = data["points"]
    shared = [d for d in (points[0]["differences"] if points else []) if all(d in p["differences"] for p in points)]
    lines = []
    if shared:
        lines += ["Differences from the results (--anyway ran regardless):", *[f"  {d}" for d in shared], ""]
    for p in points:
        lines.append(
            f"{p['scenario']} [{p['point']}] (fingerprint {p['fingerprint'][:12]}, original on {p['machine']})"
        )
        rows = []
        for name in ("original", "rerun"):
            s = p[name]
            rows.append(
                [
                    name,
                    f"{s['runs_ok']}/{s['runs']} ok",
                    _range(s["fit_s_min"], s["fit_s_max"], s["fit_s_geomean"], 3),
                    _range(s["steady_epoch_s_min"], s["steady_epoch_s_max"], s["steady_epoch_s_median"], 4),
                ]
            )
        headers = ["", "runs", "fit time (s), geometric mean (min-max)", "steady epoch (s), median (min-max)"]
        lines += [tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)]
        if p["ratio"] is not None:
            q = p["ratio"]
            ratio = stats.Ratio(q["rerun_over_original"], q["ci_low"], q["ci_high"], tuple(q["runs"]))
            lines.append(f"rerun/original fit time: {ratio.text()}")
        lines += [f"  failed: {f}" for f in p["rerun"]["failures"]]
        lines += [f"  {d}" for d in p["differences"] if d not in shared]
        lines += [f"  {d}" for d in p["notes"]]
        lines += [f"hardware differs: {h}" for h in p["hardware_differs"]]
        if p["other_facts_differ"]:
            lines.append("other recorded facts differ: " + "; ".join(p["other_facts_differ"]))
        lines += [f"verdict: {p['verdict']['text']}", ""]
    done = sum(p["verdict"]["kind"] == REPRODUCED for p in points)
    lines.append(
        f"{done} of {len(points)} point(s) reproduced within +-{_pct(data['tolerance'])} "
        f"(fit time, rerun/original: {stats.METHOD})"
    )
    given = data.get("inputs") or []
    originals = given[0] if len(given) == 1 and Path(given[0]).is_dir() else "ORIGINAL_DIR"
    lines.append(
        f"reruns in {data['results_dir']}: `python -m suite report --results {data['results_dir']}`, or "
        f"`python -m suite compare {originals} {data['results_dir']}`"
    )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- the command


@dataclass
class Options:
    inputs: list[Path]
    backend: str | None  # None: each point's recorded backend
    docker_host: str | None
    results_dir: Path | None  # None: a new reproduce/<UTC timestamp>/ here
    repeats: int | None
    tolerance: float  # a fraction
    anyway: bool
    as_json: bool


def new_results_dir(base: Path, now: datetime | None = None) -> Path:
    """``base/reproduce/<UTC timestamp>``, made now; a suffix where that name is taken (never reused)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    parent = base / "reproduce"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 1000):
            folder = parent / (stamp if attempt == 1 else f"{stamp}-{attempt}")
            try:
                folder.mkdir()
                return folder
            except FileExistsError:
                continue
    except OSError as exc:
        raise ReproduceError(f"results folder {parent} cannot be created: {exc.strerror or exc}") from None
    raise ReproduceError(f"{parent}: no free folder name for {stamp}")


def _check_writable(folder: Path) -> None:
    """Refuse a results folder that cannot hold results before anything runs, not after the first run."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ReproduceError(f"results folder {folder} cannot be created or written: {exc.strerror or exc}") from None


def _result_files(folder: Path) -> set[Path]:
    return set(folder.rglob("*.json")) if folder.is_dir() else set()


def reproduce(opts: Options, say: Callable[[str], None] = print) -> int:
    """The command: check, rerun, compare; returns the exit code (0 every point reproduced, 1 not).

    Raises ReproduceError (bad input) or Refused (differences, without ``--anyway``) before anything runs.
    """
    if opts.repeats is not None and opts.repeats < 1:
        raise ReproduceError(f"--repeats {opts.repeats}: must be >= 1")
    if not 0 < opts.tolerance < 1:
        raise ReproduceError(f"--tolerance {opts.tolerance * 100:g}: must be above 0 and below 100 (percent)")
    points = group_points(load_inputs(opts.inputs))
    if not points:
        raise ReproduceError("no result files given")
    names = {p.fingerprint: opts.backend or p.backend for p in points}  # fingerprint -> backend asked
    machine = hostinfo.machine_name()
    made: dict[str, tuple[str, Any]] = {}  # backend asked -> (its name, the backend)
    try:
        for name in dict.fromkeys(names.values()):
            made[name] = _make_backend(name, opts, machine, say)
        diffs = _check(points, {p.fingerprint: made[names[p.fingerprint]] for p in points}, opts.anyway)
        folder = opts.results_dir if opts.results_dir is not None else new_results_dir(Path.cwd())
        machine_folder = runner.machine_dir(folder, machine)
        _check_writable(machine_folder)
        reruns = _rerun(points, opts, made, names, machine_folder, say)
    finally:
        for _, backend in made.values():
            backend.close()
    compared = []
    for p in points:
        mine = sorted(reruns.get(p.fingerprint, []), key=lambda item: int(item[1].spec.get("repetition", 0)))
        point = compare_point(
            p, [r for _, r in mine], opts.tolerance, diffs[p.fingerprint], made[names[p.fingerprint]][0]
        )
        point["rerun"]["files"] = [str(path) for path, _ in mine]
        compared.append(point)
    data = collect(compared, opts.tolerance, folder, opts.anyway, opts.inputs)
    if opts.as_json:
        print(json.dumps(data, indent=1, allow_nan=False))
    else:
        print()
        print(render(data), end="")
    return 0 if data["reproduced"] else 1


def _make_backend(name: str, opts: Options, machine: str, say: Callable[[str], None]) -> tuple[str, Any]:
    """(name, backend) for a backend asked by name, ``auto`` resolved; BackendUnavailable when it cannot work here."""
    options = backends.BackendOptions(
        machine=machine, results_dir=opts.results_dir or Path.cwd() / "reproduce", docker_host=opts.docker_host
    )
    if name == backends.AUTO:
        name, why = backends.choose(options)
        say(f"backend: {name} ({why})")
    return name, backends.make(name, options)


def _check(
    points: list[Original], backend_of: dict[str, tuple[str, Any]], anyway: bool
) -> dict[str, tuple[list[str], list[str]]]:
    """fingerprint -> (differences, notes) of each point against what its rerun would get here;
    Refused, listing them with what to do, where any differ and not ``anyway``."""
    diffs, heres = {}, []
    for p in points:
        chosen, backend = backend_of[p.fingerprint]
        try:
            here = current_docker(backend, spec_of(p)) if chosen == "docker" else current_local()
        except image_catalog.ImageError as exc:
            raise ReproduceError(str(exc)) from None
        heres.append(here)
        diffs[p.fingerprint] = differences(p, here)
    found = [f"  {p.label}: {d}" for p in points for d in diffs[p.fingerprint][0]]
    if not found or anyway:
        return diffs
    raise Refused(
        "the results do not fit this checkout and machine; nothing was run:\n"
        + "\n".join(dict.fromkeys(found))
        + "\nto reproduce exactly: "
        + advice(
            [d for p in points for d in diffs[p.fingerprint][0]],
            _recorded(points, "suite", "git_revision"),
            sorted({h.image_name for h in heres if h.image_name}),
            _recorded(points, "environment", "lock_file"),
        )
    )


def _recorded(points: list[Original], block: str, key: str) -> list[str]:
    """Every value the points' provenance records under ``block.key``, sorted."""
    return sorted({str(v) for p in points for prov in p.provenance if prov and (v := (prov.get(block) or {}).get(key))})


def _rerun(
    points: list[Original],
    opts: Options,
    made: dict[str, tuple[str, Any]],
    names: dict[str, str],
    machine_folder: Path,
    say: Callable[[str], None],
) -> dict[str, list[tuple[Path, RunResult]]]:
    """Run every point's reruns, backend by backend, into ``machine_folder``; fingerprint -> the
    (file, result) pairs this call saved (files there before are not counted)."""
    specs = rerun_specs(points, opts.repeats)
    reruns: dict[str, list[tuple[Path, RunResult]]] = {}
    folder, machine = machine_folder.parent, machine_folder.name
    with runner.hold_folder(machine_folder):
        before = _result_files(machine_folder)
        for name, (chosen, backend) in made.items():
            mine = [s for s in specs if names[s.fingerprint] == name]
            if not mine:
                continue
            say(f"{len(mine)} rerun(s) on backend {chosen}, results in {machine_folder}")
            live = not opts.as_json and sys.stdout.isatty()
            summary = runner.run_plan(mine, backend, folder, machine, fresh=True, say=say, live=live)
            for line in summary.lines():
                say(line)
        for path in sorted(_result_files(machine_folder) - before):
            if any(part[0] in "._" for part in path.relative_to(machine_folder).parts):
                continue
            result = results.load(path)
            reruns.setdefault(result.fingerprint, []).append((path, result))
    return reruns
