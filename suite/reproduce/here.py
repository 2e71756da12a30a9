"""What a recorded point ran on against what this machine offers now: the code, the environment
lock, the image, the data; each difference in words, with what to do about it."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite import paths
from suite.environment import datasets, image_catalog, locks
from suite.record import code_identity
from suite.record.results import RunResult
from suite.report import provenance_text
from suite.reproduce.originals import Original, files_text, spec_of
from suite.safe.markdown import escaped
from suite.spec import plan


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
        image_block: dict[str, Any] | None = dict(name=name, id=None, digest=None, recipe_hash=today, context_hash=None)
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
        if not path.resolve().is_relative_to(paths.DATA_DIR.resolve()):
            return None  # a result names the file: none outside the project is read
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
        f"{COVERED} result {provenance_text.lock_text(recorded, None)}, here {provenance_text.lock_text(here, None)}: "
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
        line = escaped(line)  # a record's value with a line break would add a line of its own
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
            "lock": provenance_text.lock_text(p.get("environment"), p.get("image"))
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
