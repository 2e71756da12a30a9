"""``python -m suite reproduce RESULT.json|DIR ...``: rerun the exact recorded points here and say
whether the published number came out again.

The inputs are result files (from any machine) or folders of them. They are grouped by point: the
same fingerprint (scenario, size, resolved config with its data identity) recorded on the same
machine by the same backend. Each point's ``ok`` runs are the original sample. The rerun runs the point's recorded spec
as it stands in the file (config, data identity, ``--set`` overrides, timeout; never re-derived from
today's scenario files) as many times as there were original runs, through ``runner.run_plan`` like
``suite run`` (the same backends, peak calibration and result files, interleaved across points).

Before anything runs, what each result recorded of its making (``provenance``: the suite's revision
and whether its tree had changes, the environment's lock, the image recipe) and its data are set
against this machine now. An exact reproduction needs them equal; where they differ the command
refuses with one line per difference and what to do (``--anyway`` runs regardless and shows them
above the verdict).

The comparison is on the fit time, the figure the reports' speedups and ``compare`` divide: the
ratio rerun/original of geometric means with Welch intervals on log times (``stats.ratio``). Every
line says it as the reports do (``stats.Ratio.text``), of the rerun against the original: "the
rerun is 1.10x slower than the original (95% CI 1.05-1.16)", a factor of 1 or more whose word
says which way. The verdict (``decision``) is taken on rerun/original itself:

- ``reproduced within X%``: the 90% interval lies within +-tolerance of 1: two one-sided tests at
  5% each, the conventional test of equivalence (X is that interval's largest distance from 1,
  rounded up);
- ``differs``: the whole 95% interval lies outside +-tolerance (it excludes 1 by more than the
  tolerance);
- ``inconclusive``: neither; the output estimates, from the observed spreads, how many reruns would
  settle it, or says that the original's own runs are too few or too spread for that;
- ``not reproduced``: a rerun did not end ``ok`` (or was skipped here), or ended ok below the
  accuracy gate every original run reached.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from suite import backends, paths
from suite.environment import datasets, host_facts, image_catalog, locks
from suite.record import code_identity, results
from suite.record.results import FIT_S, STEADY_EPOCH_S, TEST_ACCURACY, RunResult
from suite.report import compare, provenance_text, stats
from suite.report.points import ACCURACY_GATE
from suite.run import runner
from suite.spec import plan, select
from suite.spec.settings import MAX_REPEATS

FORMAT = "keras-speed-suite/reproduce"
VERSION = 2  # 2: gate misses moved from rerun.failures to rerun.below_gate; 90% bounds

# "reproduced" is decided as equivalence conventionally is: two one-sided tests at 5% each (TOST),
# that is the 90% interval of the ratio inside 1 +- tolerance. Each one-sided test keeps its 5%
# error: a rerun whose true ratio lies on a bound of the band (or beyond) is called reproduced
# at most 5% of the time. Asking the 95% interval to fit would test at 2.5% a side and call a
# perfect reproduction inconclusive far more often (benchmarks/reproduce_power.py measures both).
EQUIVALENCE_LEVEL = 0.90
# The default tolerance, +-10%: a shift of more than that (another driver, a throttled machine, a
# changed default) is what a reader of a published number cares about. Measured with
# benchmarks/reproduce_power.py (2000 seeded pairs per case, log-normal noise, equal runs per
# side): a perfect reproduction is called reproduced 100% of the time at 2% noise per run and 5
# runs a side, 75% at 5% noise and 5 runs (99% at 10 runs; 31% at 3), 7% at 10% noise and 5 runs
# (41% at 10); a true shift onto the bound, 1.10, is called reproduced 1-5% of the time, and a true
# 20% shift never more than 0.2%, called "differs" 66% of the time at 5% noise and 5 runs. A wider
# default would confirm more noisy reruns by promising less; the inconclusive verdict says instead
# how many reruns (--repeats) would settle it, and reruns default to the original's count so a
# reproduction costs what the original did.
DEFAULT_TOLERANCE_PCT = 10.0
REPEATS_CAP = 50  # the most reruns an "inconclusive" verdict suggests; beyond, it says "more repetitions"

REPRODUCED, DIFFERS, INCONCLUSIVE, NOT_REPRODUCED = "reproduced", "differs", "inconclusive", "not reproduced"
RERUN, ORIGINAL = "the rerun", "the original"
# Which way the JSON's ratio divides, in words, for whoever reads it without the docs.
RATIO_DIRECTION = (
    "rerun_over_original is the rerun's geometric mean fit time over the original's: above 1, the rerun is "
    "slower; text says it as the output does, a factor of 1 or more and the word faster or slower"
)
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
    superseded: list[Path] = field(default_factory=list)  # files of older attempts of a repetition, not taken

    @property
    def ok_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.ok]

    @property
    def label(self) -> str:
        return f"{self.spec.get('scenario', '?')} [{self.spec.get('point_label', '?')}]"

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


def all_points(loaded: list[tuple[Path, RunResult, dict[str, Any] | None]]) -> list[Original]:
    """``group_points`` without the check that each point has an ok run to compare with."""
    grouped: dict[str, list[tuple[Path, RunResult, dict[str, Any] | None]]] = {}
    for path, result, prov in loaded:
        if not result.fingerprint:
            raise ReproduceError(f"{path}: the result's spec has no fingerprint; it cannot be matched to a point")
        grouped.setdefault(result.fingerprint, []).append((path, result, prov))
    points = []
    for fingerprint, items in grouped.items():
        label = f"{items[0][1].spec.get('scenario')} [{items[0][1].spec.get('point_label')}]"
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
    from suite.record import provenance

    return Here(
        {
            "suite": code_identity.suite_identity(),
            "environment": provenance.venv_environment(sys.executable),
            "image": None,
        }
    )


def current_docker(backend: Any, spec: plan.RunSpec) -> Here:
    """The image this rerun would run in, as the engine has it, with the recipe an image of that
    name built from this checkout would carry today. An engine that does not answer is a problem
    of its own ("docker engine: ..."): no image can be looked at, so none can be blamed."""
    from suite.backends.base import Unavailable
    from suite.environment import images
    from suite.record import provenance

    catalog = image_catalog.load_catalog()
    name = spec.config.get("image") or catalog.default_for(plan.parse_device(spec.device)[0] == "gpu")
    today = image_catalog.recipe_hash(catalog, name) if name in catalog.images else None
    suite_now = code_identity.suite_identity()
    try:
        ref, image = backend.image_for(spec)
    except Unavailable as exc:
        image_block: dict[str, Any] | None = dict(
            name=name, id=None, digest=None, recipe_hash=today, context_hash=None
        )
        env, _ = provenance.image_provenance({})  # the environment block of a run that got no image
        problem = f"image: {exc}" if exc.status == "image_unavailable" else f"docker engine: {exc}"
        return Here({"suite": suite_now, "environment": env, "image": image_block}, [problem], name)
    env, image_block = provenance.image_provenance({"image": ref, **images.image_record(image)})
    problems = []
    built = (image_block or {}).get("recipe_hash")
    if today is not None and built != today:
        problems.append(
            f"image on the engine: {ref} carries recipe {provenance_text.short(built)}, this checkout's recipe for "
            f"{name} is {provenance_text.short(today)}; rebuild it: `python -m suite images build {name}`"
        )
    image_block = {**(image_block or {}), "recipe_hash": today if today is not None else built}
    return Here({"suite": suite_now, "environment": env, "image": image_block}, problems, name)


# Lines of ``describe_differences`` that do not stand in the way of an exact rerun: an image built
# again from the same recipe (on another machine, or from Debian packages where no registry
# answers) has another ID, yet the same Dockerfile, lock and catalog entry.
# "environment lock covered:" is a venv installed from another lock that holds every pin of the
# result's lock at its version (see ``lock_covered``).
COVERED = "environment lock covered:"
NOTE_PREFIXES = ("image ID:", COVERED)
_LOCK_NAME = re.compile(r"(?:^|/)(?P<env>[a-z][a-z0-9-]*)-py(?P<python>\d+\.\d+)\.txt$")


def lock_python(lock_file: str | None) -> str | None:
    """The Python (X.Y) a host lock is for, from its name (``requirements/locks/<env>-py<X.Y>.txt``);
    None for another name."""
    match = _LOCK_NAME.search(lock_file or "")
    return match.group("python") if match else None


def lock_environment(lock_file: str | None) -> str | None:
    """The environment (run, run-gpu, dev) a host lock is for, from its name; None for another name."""
    match = _LOCK_NAME.search(lock_file or "")
    return match.group("env") if match else None


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def lock_covered(recorded: dict[str, Any], here: dict[str, Any], python: str | None = None) -> str | None:
    """The note that accepts this venv for a result recorded from another lock, or None.

    A venv serves a result made from another lock when the result's venv matched its lock, that
    lock is in this checkout with the sha256 the result recorded, it is for this Python (X.Y), and
    every package it pins is installed here at its version. This is the case of a dev venv (the
    run lock plus test tools, at the same versions) rerunning a run-lock result: ./run_all.sh keeps
    a dev venv as it is, so asking for a run venv would not change what runs. Packages installed
    here beyond the lock are named in the note: the worker imports tensorflow, keras and numpy and
    what they import; the test tools (pytest, ruff) are never imported by it. jax, in the dev lock,
    is imported by TensorFlow itself where installed (tensorflow/lite/python/util.py, for its
    converter), yet no jax backend is started and nothing runs on it unless Keras runs on jax: the
    Keras backend is the spec's ``config.backend`` (in the fingerprint), which the worker sets as
    KERAS_BACKEND before Keras is imported.

    ``python``: this interpreter's X.Y (default: the running one's)."""

    if recorded.get("kind") != "venv" or here.get("kind") != "venv" or recorded.get("matches_lock") is False:
        return None
    lock_file, sha = recorded.get("lock_file"), recorded.get("lock_sha256")
    if not isinstance(lock_file, str) or not isinstance(sha, str):
        return None
    if (lock_file, sha) == (here.get("lock_file"), here.get("lock_sha256")):
        return None  # the same lock: nothing to cover
    if lock_python(lock_file) != (python or this_python()):
        return None
    path = paths.DATA_DIR / lock_file
    try:
        if locks.lock_sha256(path) != sha:
            return None
        pins = locks.read_pins(path)
    except (OSError, ValueError):
        return None
    have = locks.installed()
    if any(have.get(name) != version for name, version in pins.items()):
        return None
    extra = sorted(name for name in have if name not in pins and name not in locks.INSTALLER)
    also = f"; also installed here: {', '.join(extra)} (nothing the spec runs on)" if extra else ""
    return (
        f"{COVERED} result {provenance_text.lock_text(recorded)}, here {provenance_text.lock_text(here)}: "
        f"every one of the {len(pins)} packages {lock_file} pins is installed here at its version{also}"
    )


# The line of an image built on another base than the result's: other OS libraries and another
# Python build, so it refuses like a recipe that differs.
IMAGE_BASE = "image base:"
_OWN_LOCK_LINES = ("environment lock:", "installed packages here differ from the lock")
MIXED = "original runs:"  # the line that says a point's ok runs were made by different code or environments


def differences(point: Original, here: Here) -> tuple[list[str], list[str]]:
    """(differences, notes): every way the point's recorded making differs from this machine now,
    one line each; the notes (NOTE_PREFIXES) are shown but do not refuse the rerun."""
    lines = list(differences_in_files(point, here))
    notes = [line for line in lines if line.startswith(NOTE_PREFIXES)]
    return [line for line in lines if line not in notes], notes


def differences_in_files(point: Original, here: Here) -> dict[str, list[Path]]:
    """Each line of ``differences`` (notes included), in order, with the point's files it applies
    to: a provenance line to the ok runs that recorded that provenance, the rest to every file."""

    out: dict[str, list[Path]] = {}

    def add(line: str, files: list[Path]) -> None:
        out.setdefault(line, [])
        out[line] += [f for f in files if f not in out[line]]

    ok = [(f, p, r) for f, p, r in zip(point.files, point.provenance, point.runs, strict=True) if r.ok]
    missing = [f for f, p, _ in ok if p is None]
    if missing:
        add(
            "provenance: the result records none (made before results recorded their revision, lock and "
            "image); it cannot be matched to this checkout",
            missing,
        )
    groups: dict[str, tuple[dict[str, Any] | None, list[Path], list[RunResult]]] = {}
    for f, p, r in ok:
        group = groups.setdefault(json.dumps(p, sort_keys=True), (p, [], []))
        group[1].append(f)
        group[2].append(r)
    for recorded, files, _ in groups.values():
        if recorded is not None:
            lines = provenance_text.describe_differences(recorded, here.provenance)
            covered = lock_covered(recorded.get("environment") or {}, here.provenance.get("environment") or {})
            if covered:
                # This venv holds the result's lock exactly: the lock it was installed from, and how
                # it differs from that one, do not bear on the rerun.
                lines = [line for line in lines if not line.startswith(_OWN_LOCK_LINES)] + [covered]
            for line in lines:
                add(line, files)
    if len(groups) > 1:
        add(mixed_line([(p, runs) for p, _, runs in groups.values()]), [f for f, _, _ in ok])
    for extra in (*here.problems, data_difference(point.spec), fingerprint_difference(point)):
        if extra:
            add(extra, list(point.files))
    return out


def mixed_line(groups: list[tuple[dict[str, Any] | None, list[RunResult]]]) -> str:
    """The difference of a point whose ok runs recorded more than one provenance: which
    repetitions were made how, naming only what tells the groups apart."""

    def parts(p: dict[str, Any] | None) -> dict[str, str]:
        if p is None:
            return {"provenance": "none recorded"}
        image = p.get("image") or {}
        return {
            "suite": provenance_text.suite_text(p.get("suite")),
            "lock": provenance_text.lock_text(p.get("environment"))
            + ("" if (p.get("environment") or {}).get("matches_lock") is not False else ", installed packages differ"),
            "image": f"{image.get('name') or '?'} recipe {provenance_text.short(image.get('recipe_hash'))} "
            f"ID {provenance_text.short(image.get('id'))}"
            if image
            else "none",
        }

    described = [parts(p) for p, _ in groups]
    keys = [k for k in ("provenance", "suite", "lock", "image") if len({d.get(k) for d in described}) > 1]
    each = []
    for (_, runs), d in zip(groups, described, strict=True):
        reps = sorted(int(r.spec.get("repetition", 0)) for r in runs)
        what = ", ".join(f"{k} {d[k]}" if k != "provenance" else "no provenance" for k in keys if k in d)
        each.append(f"rep{'s' if len(reps) > 1 else ''} {', '.join(map(str, reps))}: {what or 'other details'}")
    return (
        f"{MIXED} made {len(groups)} different ways ({'; '.join(each)}): not one sample of one setup; "
        "--anyway pools them as one original"
    )


def _changes_text(suite: dict[str, Any]) -> str:
    """ "diff sha256 ab12cd34ef56; paths suite/x.py, suite/y.py" for a recorded dirty tree."""

    paths = [str(x) for x in suite.get("dirty_paths") or []]
    diff = provenance_text.short(suite.get("diff_sha256"))
    return f"diff sha256 {diff}; paths {files_text([Path(x) for x in paths])}"


def advice(
    lines: list[str],
    revisions: list[str],
    image_names: list[str],
    lock_files: list[str] | None = None,
    dirty: list[dict[str, Any]] | None = None,
    here_environment: dict[str, Any] | None = None,
    python: str | None = None,
) -> str:
    """What to do about the differences, in the order a reader does it.

    revisions: the results' git revisions; dirty: the "suite" blocks they recorded of trees with
    uncommitted changes (a ``git diff HEAD`` that is not recorded, only its sha256 and paths);
    lock_files: the locks the results' venvs were installed from; here_environment: the
    "environment" block of this venv; python: this interpreter's X.Y (default: the running one's)."""

    def has(*prefixes: str) -> bool:
        return any(line.startswith(prefixes) for line in lines)

    rev = " or ".join(revisions) if revisions else "<the result's git_revision>"
    changes = " or ".join(f"({_changes_text(b)})" for b in dirty or [])
    steps = []
    checkout = has("suite revision", "spec fingerprint") or (has("image recipe") and bool(image_names))
    if checkout:
        steps.append(f"check out the revision the result names: `git checkout {rev}`, then set up as the README says")
    if has("suite tree"):
        if changes:
            steps.append(
                f"apply the same uncommitted changes{' to it' if checkout else ''} {changes}; the diff itself is "
                "not recorded, only its sha256: ask the result's author for it"
            )
        else:
            steps.append(f"run from a clean tree at {rev}: this checkout has uncommitted changes the result's had not")
    if has("environment", "installed packages") and not image_names:
        steps.append(venv_advice(lock_files or [], here_environment or {}, python or this_python()))
    if image_names and any(
        line.startswith(("image", "environment", "installed packages")) and not line.startswith(IMAGE_BASE)
        for line in lines
    ):
        built = f"`python -m suite images build {' '.join(image_names)}`"
        if has("image recipe"):  # this checkout's recipe is the one that differs: building it cannot help
            steps.append(f"then build the image from that revision: {built}")
        else:
            steps.append(f"build the image from this checkout: {built}")
    if has(IMAGE_BASE):
        steps.append("build the image on the base the result names (see docker/README.md)")
    if has("docker engine:"):
        steps.append("start the Docker engine, or point --docker-host at one that answers")
    if has("data:"):
        steps.append(f"fetch the data: `{datasets.FETCH_COMMAND}`")
    if has("provenance:"):
        steps.append("a result without provenance names no revision to check out: only --anyway reruns it")
    if has(MIXED):
        steps.append("give only the runs made one way (or rerun the original so that all its runs are)")
    steps.append("or pass --anyway to run here regardless, with these differences shown above the verdict")
    return "; ".join(steps)


# The commands that set up the default venv (.venv) from each host environment's lock.
SETUP_COMMANDS = {"run": "./run_all.sh", "run-gpu": "SUITE_ENV=run-gpu ./run_all.sh", "dev": "./run_tests.sh"}


def venv_advice(lock_files: list[str], here: dict[str, Any], python: str) -> str:
    """How to get a venv installed from the results' lock(s), as commands that do it.

    requirements/ensure_venv.sh keeps a venv's Python (so another X.Y needs the venv removed and
    PYTHON set), keeps a dev venv when asked for run (so a run lock over a dev venv needs it
    removed), and recreates a venv holding any other environment by itself."""
    here_env = lock_environment(here.get("lock_file"))
    each = []
    for lock_file in lock_files:
        env, wanted = lock_environment(lock_file), lock_python(lock_file)
        if env not in SETUP_COMMANDS or wanted is None:
            each.append(f"install a venv from {lock_file}")
            continue
        other_python = wanted != python
        prefix = f"PYTHON=/path/to/python{wanted} " if other_python else ""
        remove = "rm -rf .venv && " if other_python or (env == "run" and here_env == "dev") else ""
        why = []
        if other_python:
            why.append(f"{lock_file} is for Python {wanted}, this is {python}")
        if remove and not other_python:
            why.append("./run_all.sh keeps a dev venv as it is")
        reason = f" ({'; '.join(why)})" if why else ""
        each.append(f"`{remove}{prefix}{SETUP_COMMANDS[env]}` sets up .venv from {lock_file}{reason}")
    if not each:
        return "run with a venv installed from the result's lock (./run_all.sh sets one up from the run lock)"
    return (
        "run with a venv installed from the result's lock: " + ", or ".join(each) + ", then rerun with .venv/bin/python"
    )


# ----------------------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Verdict:
    kind: str  # REPRODUCED, DIFFERS, INCONCLUSIVE, NOT_REPRODUCED
    text: str
    ratio: stats.Ratio | None = None  # with its 95% interval, the one "differs" is decided on
    repeats_needed: int | None = None
    equivalence: stats.Ratio | None = None  # the same ratio with its 90% interval, the one "reproduced" is decided on


def verdict(
    original: list[float],
    rerun: list[float],
    tolerance: float,
    failures: list[str] | None = None,
    below_gate: list[str] | None = None,
    runs: int | None = None,
) -> Verdict:
    """The verdict on one point from its original and rerun fit times (seconds).

    tolerance: a fraction (0.10 for +-10%). failures: one line per rerun that did not end ok;
    below_gate: one line per ok rerun below the accuracy gate every original run reached (its fit
    time is in ``rerun``); any of either makes the point not reproduced, whatever the other reruns
    measured. runs: how many reruns there were (default: the fit times given plus the failures).

    "reproduced" is two one-sided tests at 5% each (TOST): the 90% interval lies inside
    1 +- tolerance. "differs" needs the 95% interval wholly outside it. See EQUIVALENCE_LEVEL.
    """
    failures, below_gate = list(failures or []), list(below_gate or [])
    if failures or below_gate:
        n = runs if runs is not None else len(rerun) + len(failures)
        shown = stats.ratio(rerun, original) if rerun else None  # of the reruns that ran, for the table
        if failures and below_gate:
            what = (
                f"{len(failures) + len(below_gate)} of {n} reruns failed or fell below the accuracy gate "
                f"({len(failures)} did not run ok, {len(below_gate)} below the gate)"
            )
        elif failures:
            what = f"{len(failures)} of {n} reruns did not run ok"
        else:
            what = f"{len(below_gate)} of {n} reruns fell below the accuracy gate"
        return Verdict(NOT_REPRODUCED, f"not reproduced: {what} ({(failures + below_gate)[0]})", shown)
    if not rerun:
        return Verdict(NOT_REPRODUCED, "not reproduced: no rerun recorded a fit time")
    r = stats.ratio(rerun, original)
    eq = stats.ratio(rerun, original, EQUIVALENCE_LEVEL)
    pct = _pct(tolerance)
    if r.low is None or r.high is None or eq.low is None or eq.high is None:
        if len(original) < stats.MIN_RUNS_FOR_INTERVAL:
            return Verdict(
                INCONCLUSIVE,
                f"inconclusive: the original has {len(original)} run(s), and an interval needs "
                f"{stats.MIN_RUNS_FOR_INTERVAL} on each side; more reruns cannot make up for it: {said(r)}",
                r,
                equivalence=eq,
            )
        needed = repeats_needed(original, rerun, tolerance)
        how = (
            f"rerun with --repeats {needed}"
            if needed
            else f"rerun with --repeats {stats.MIN_RUNS_FOR_INTERVAL} or more"
        )
        return Verdict(INCONCLUSIVE, f"inconclusive: {said(r)}; {how}", r, needed, eq)
    low, high = 1.0 - tolerance, 1.0 + tolerance
    kind = decision(r.low, r.high, eq.low, eq.high, tolerance)
    if kind == REPRODUCED:
        # X: the largest distance from 1 of rerun/original's 90% interval, the time's shift at most.
        within = math.ceil(round(max(abs(eq.low - 1.0), abs(eq.high - 1.0)) * 100, 9))
        return Verdict(REPRODUCED, f"reproduced within {within}%: {said(eq)}", r, equivalence=eq)
    if kind == DIFFERS:
        return Verdict(DIFFERS, f"differs: {said(r)}, the whole interval outside +-{pct}", r, None, eq)
    # Undecided. Shown is the interval that would decide it: the 90% one where the ratio lies
    # inside the band (it could yet be called reproduced), the 95% one where it lies outside.
    inside = low <= r.value <= high
    shown = eq if inside else r
    shown_width = eq.high - eq.low if inside else r.high - r.low
    width = "is wider than" if shown_width > high - low else "straddles"
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
    return Verdict(INCONCLUSIVE, f"inconclusive: {said(shown)}: the interval {width} +-{pct}; {how}", r, needed, eq)


def said(r: stats.Ratio) -> str:
    """rerun/original in the one wording of ratios, of the rerun against the original:
    "the rerun is 1.10x slower than the original (95% CI 1.05-1.16)"."""
    return r.inverse().text(RERUN, ORIGINAL)


def decision(low95: float, high95: float, low90: float, high90: float, tolerance: float) -> str:
    """The rule on a ratio's intervals, apart from any wording: REPRODUCED when the 90% interval
    lies inside [1 - tolerance, 1 + tolerance] (two one-sided tests at 5%), DIFFERS when the 95%
    interval lies wholly outside it (its low bound above 1 + tolerance, or its high bound below
    1 - tolerance), else INCONCLUSIVE."""
    low, high = 1.0 - tolerance, 1.0 + tolerance
    if low <= low90 and high90 <= high:
        return REPRODUCED
    if low95 > high or high95 < low:
        return DIFFERS
    return INCONCLUSIVE


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


def _half_width(var_o: float, n: int, var_r: float, m: float, level: float = stats.LEVEL) -> float:
    """The Welch interval's half-width at ``level`` on log times for n original and m rerun runs."""
    return float(stats.welch_half_width(var_o, n, var_r, m, level))


def _distance(diff: float, tolerance: float) -> tuple[float, float]:
    """How far the observed log ratio is from the nearest bound of the tolerance band, and the
    level of the interval that must clear it: inside the band the 90% one (to be called
    reproduced), outside the 95% one (to be called different)."""
    lo, hi = math.log(1 - tolerance), math.log(1 + tolerance)
    if lo <= diff <= hi:
        return min(diff - lo, hi - diff), EQUIVALENCE_LEVEL
    return (diff - hi if diff > hi else lo - diff), stats.LEVEL


def repeats_needed(original: list[float], rerun: list[float], tolerance: float) -> int | None:
    """The fewest reruns (at most REPEATS_CAP) whose deciding interval (90% where the ratio lies
    inside the band, 95% outside) would no longer cross a bound of the tolerance band, if the ratio
    and both spreads stayed as observed; None when no number would (the ratio sits on a bound, or
    the original's own runs leave the interval too wide) or the original has too few runs to
    estimate from."""
    parts = _log_parts(original, rerun)
    if parts is None or len(original) < stats.MIN_RUNS_FOR_INTERVAL:
        return None
    diff, var_o, var_r, n = parts
    d, level = _distance(diff, tolerance)
    if d <= 0:
        return None
    for m in range(stats.MIN_RUNS_FOR_INTERVAL, REPEATS_CAP + 1):
        if _half_width(var_o, n, var_r, m, level) < d:
            return m
    return None


def _original_limits(original: list[float], rerun: list[float], tolerance: float) -> bool:
    """Whether even endless reruns would leave the interval crossing a bound: the original's spread decides."""
    parts = _log_parts(original, rerun)
    if parts is None:
        return True
    diff, var_o, var_r, n = parts
    d, level = _distance(diff, tolerance)
    return d > 0 and _half_width(var_o, n, var_r, 1e9, level) >= d


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
    hardware: list[str] = []
    other: list[str] = []
    for name, get in compare.FACTS:
        was = sorted({str(get(r)) for r in original if r.ok and r.environment})
        now = sorted({str(get(r)) for r in ran})
        if was and was != now:
            line = f"{name}: {', '.join(was)} (original) vs {', '.join(now)} (rerun)"
            (hardware if name in HARDWARE_FACTS else other).append(line)
    return hardware, other


def failure_lines(runs: list[RunResult]) -> list[str]:
    """One line per rerun that did not end ok (failed, timed out, skipped here)."""
    return [
        f"rep {r.spec.get('repetition')}: {r.status}" + (f": {r.message.splitlines()[0][:200]}" if r.message else "")
        for r in runs
        if not r.ok
    ]


def gate_lines(runs: list[RunResult], original: list[RunResult]) -> list[str]:
    """Where every original ok run reached the accuracy gate the reports hold verdicts to, one line
    per ok rerun below it: a fast broken run reproduces nothing. These runs ended ok (their fit
    times are in the rerun's sample); they are kept apart from the runs that failed."""
    was = [a for r in original if r.ok and (a := TEST_ACCURACY.of(r)) is not None]
    if not was or min(was) < ACCURACY_GATE:
        return []
    return [
        f"rep {r.spec.get('repetition')}: ok, but test accuracy {acc:.3f} is below the "
        f"{ACCURACY_GATE:.2f} gate every original run reached ({min(was):.3f} or more)"
        for r in runs
        if r.ok and (acc := TEST_ACCURACY.of(r)) is not None and acc < ACCURACY_GATE
    ]


def compare_point(
    point: Original,
    reruns: list[RunResult],
    tolerance: float,
    diffs: tuple[list[str], list[str]],
    backend: str,
) -> dict[str, Any]:
    """One point's comparison as plain data (``--json``); ``render`` formats exactly this."""
    original, again = side(point.ok_runs), side(reruns)
    failures, below_gate = failure_lines(reruns), gate_lines(reruns, point.runs)
    v = verdict(original["fit_s"], again["fit_s"], tolerance, failures, below_gate, runs=len(reruns))
    eq = v.equivalence
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
        "superseded_files": [str(p) for p in point.superseded],
        "rerun": {**again, "failures": failures, "below_gate": below_gate, "files": []},
        "ratio": None
        if r is None
        else {
            "rerun_over_original": r.value,
            "direction": RATIO_DIRECTION,
            "text": said(r),
            "ci_low": r.low,
            "ci_high": r.high,
            "ci90_low": eq.low if eq is not None else None,
            "ci90_high": eq.high if eq is not None else None,
            "runs": list(r.runs),
        },
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
    left_out: list[str] | None = None,
) -> dict[str, Any]:
    """The whole comparison as plain data (``--json``, docs/reproduce.md); ``left_out``: one line per
    point of a given folder that had no ok run to compare with."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "inputs": [str(p) for p in inputs or []],
        "tolerance": tolerance,
        "compared": "timing.fit_s",
        "interval": {
            "level": stats.LEVEL,
            "equivalence_level": EQUIVALENCE_LEVEL,
            "method": stats.METHOD,
            "min_runs": stats.MIN_RUNS_FOR_INTERVAL,
        },
        "anyway": anyway,
        "results_dir": str(results_dir),
        "points": compared,
        "left_out": list(left_out or []),
        "reproduced": all(p["verdict"]["kind"] == REPRODUCED for p in compared),
    }


def _range(lo: float | None, hi: float | None, mid: float | None, digits: int) -> str:
    if mid is None:
        return "-"
    return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _located(line: str, point: dict[str, Any]) -> str:
    """A difference as a point shows it, naming its files where it applies to some of them only."""
    files = (point.get("difference_files") or {}).get(line) or []
    some = files and len(files) < len(point["original_files"])
    return f"  {line}" + (f" (in {files_text([Path(f) for f in files])})" if some else "")


def render(data: dict[str, Any]) -> str:
    """The comparison as text: shared differences first, then per point its table, facts and verdict."""
    from tabulate import tabulate

    points = data["points"]
    # Lines every point shares are said once, above them all; a single point's stay with it, where
    # each can name the files it applies to.
    shared = [
        d for d in (points[0]["differences"] if len(points) > 1 else []) if all(d in p["differences"] for p in points)
    ]
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
            lines.append(f"fit time: {q['text']}")
        lines += [f"  failed: {f}" for f in p["rerun"]["failures"]]
        lines += [f"  below the accuracy gate: {f}" for f in p["rerun"]["below_gate"]]
        own = [_located(d, p) for d in p["differences"] if d not in shared]
        if own:
            lines.append("differences from the original (--anyway ran regardless):")
        lines += own
        lines += [_located(d, p) for d in p["notes"]]
        lines += [f"hardware differs: {h}" for h in p["hardware_differs"]]
        if p["other_facts_differ"]:
            lines.append("other recorded facts differ: " + "; ".join(p["other_facts_differ"]))
        lines += [f"verdict: {p['verdict']['text']}", ""]
    done = sum(p["verdict"]["kind"] == REPRODUCED for p in points)
    lines.append(
        f"{done} of {len(points)} point(s) reproduced within +-{_pct(data['tolerance'])} "
        f"(fit time of the rerun against the original's: {stats.METHOD})"
    )
    if data.get("left_out"):
        lines.append(f"{len(data['left_out'])} point(s) of the given folders left out, no ok run to compare with:")
        lines += [f"  {line.removeprefix('left out ')}" for line in data["left_out"]]
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
    select: str | None = None  # -k EXPR: only the points it takes


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
    problem = results.unwritable(folder)
    if problem:
        raise ReproduceError(problem)


def _result_files(folder: Path) -> set[Path]:
    return set(folder.rglob("*.json")) if folder.is_dir() else set()


def reproduce(opts: Options, say: Callable[[str], None] = print) -> int:
    """The command: check, rerun, compare; returns the exit code (0 every point reproduced, 1 not).

    Raises ReproduceError (bad input) or Refused (differences, without ``--anyway``) before anything runs.
    """
    if opts.repeats is not None and not 1 <= opts.repeats <= MAX_REPEATS:
        raise ReproduceError(f"--repeats {opts.repeats}: allowed: an integer in [1, {MAX_REPEATS}]")
    if not 0 < opts.tolerance < 1:
        raise ReproduceError(f"--tolerance {opts.tolerance * 100:g}: must be above 0 and below 100 (percent)")
    loaded = load_inputs(opts.inputs)
    named = {p.resolve() for p in opts.inputs if not p.is_dir()}
    points, left_out = take_points(select_points(all_points(loaded), opts.select), named)
    for line in left_out:
        say(line)
    if not points:
        if left_out:
            raise ReproduceError("nothing to rerun: no point given has an ok run to compare with")
        raise ReproduceError("no result files given")
    for point in points:  # every recorded config is checked as run checks a scenario, before anything starts
        spec_of(point)
    dropped = superseded_text(points)
    if dropped:
        say(dropped)
    names = {p.fingerprint: opts.backend or p.backend for p in points}  # fingerprint -> backend asked
    machine = host_facts.machine_name()
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
        lines, notes, where = diffs[p.fingerprint]
        row = compare_point(p, [r for _, r in mine], opts.tolerance, (lines, notes), made[names[p.fingerprint]][0])
        row["difference_files"] = {d: [str(f) for f in where.get(d, [])] for d in [*lines, *notes]}
        row["rerun"]["files"] = [str(path) for path, _ in mine]
        compared.append(row)
    data = collect(compared, opts.tolerance, folder, opts.anyway, opts.inputs, left_out)
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
    try:
        return name, backends.make(name, options)
    except backends.BackendUnavailable as exc:
        if opts.backend is not None:
            raise  # asked for with --backend: the message names that flag rightly
        # The backend came from the results, not from a flag: say so, and how to get it or another.
        text = str(exc).removeprefix(f"--backend {name}: ")
        raise ReproduceError(
            f"the results were recorded by the {name} backend, and it cannot run here: {text} "
            "(another backend is not the setup the results recorded)"
        ) from None


def _check(
    points: list[Original], backend_of: dict[str, tuple[str, Any]], anyway: bool
) -> dict[str, tuple[list[str], list[str], dict[str, list[Path]]]]:
    """fingerprint -> (differences, notes, line -> files) of each point against what its rerun would
    get here; Refused, listing each difference with the files it applies to and what to do, where
    any differ and not ``anyway``."""
    diffs, heres = {}, []
    for p in points:
        chosen, backend = backend_of[p.fingerprint]
        try:
            here = current_docker(backend, spec_of(p)) if chosen == "docker" else current_local()
        except image_catalog.ImageError as exc:
            raise ReproduceError(str(exc)) from None
        heres.append(here)
        where = differences_in_files(p, here)
        notes = [line for line in where if line.startswith(NOTE_PREFIXES)]
        diffs[p.fingerprint] = ([line for line in where if line not in notes], notes, where)
    found = [
        f"  {p.label}: {d}\n    in {files_text(diffs[p.fingerprint][2].get(d, p.files))}"
        for p in points
        for d in diffs[p.fingerprint][0]
    ]
    if not found or anyway:
        return diffs
    dirty = {  # the modified trees the results were made from that this checkout's tree is not
        json.dumps(s, sort_keys=True): s
        for p, here in zip(points, heres, strict=True)
        for prov in p.provenance
        if prov and (s := prov.get("suite") or {}).get("git_dirty") and s != here.provenance.get("suite")
    }
    raise Refused(
        "the results do not fit this checkout and machine; nothing was run:\n"
        + "\n".join(dict.fromkeys(found))
        + "\nto reproduce exactly: "
        + advice(
            [d for p in points for d in diffs[p.fingerprint][0]],
            _recorded(points, "suite", "git_revision"),
            sorted({h.image_name for h in heres if h.image_name}),
            _recorded(points, "environment", "lock_file"),
            list(dirty.values()),
            heres[0].provenance.get("environment") if heres else None,
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
