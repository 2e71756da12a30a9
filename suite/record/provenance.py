"""Where a result came from: the suite's code, the packages that ran it, the image it ran in.

Every result record carries a ``provenance`` section (``suite.record.results`` documents it)::

    {"suite": {"version", "git_revision", "git_dirty", "dirty_paths", "diff_sha256"},
     "environment": {"kind": "venv" | "image", "lock_file", "lock_sha256", "matches_lock", "lock_differences"},
     "image": None | {"name", "id", "digest", "recipe_hash", "context_hash",
               "base_source", "base_name", "base_digest", "base_id"}}

The "suite" block comes from ``code_identity``; ``venv_environment`` reads the lock marker
``requirements/ensure_venv.sh`` leaves in a venv and checks the interpreter's installed
distributions against that lock; ``image_provenance`` reads what a Docker run recorded of its
image. ``suite.report.provenance_text`` says all this in words. Nothing here raises for a venv made
without a lock: that is a null and a sentence, never a failed run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from suite import paths
from suite.environment import locks

LOCK_MARKER = locks.LOCK_RECORD  # written into a venv by requirements/ensure_venv.sh after a locked install
NO_LOCK = "not installed from a lock"
# A section's key for the suite block at the end of a local run whose checkout changed while it ran
# (``RunSkeleton.stamp``); the "suite" block is the checkout at its launch.
CHANGED_DURING_RUN = "suite_changed_during_run"
SHORT = 12  # hex digits shown of a revision or a hash
ASK_TIMEOUT_S = 120  # another interpreter listing its distributions


# -- the environment of a local run ---------------------------------------------------------------


def venv_environment(python: str, *, in_subprocess: bool = False) -> dict[str, Any]:
    """The "environment" block for the interpreter that runs a local worker.

    The lock is the one the venv of ``python`` was installed from (its LOCK_MARKER); ``matches_lock``
    says whether that interpreter's installed distributions equal the lock's pins. For this
    process's own interpreter that is read here; for another one (``LocalBackend(python=...)``) the
    same function runs in it once, through ``python -c`` (the worker imports the suite from this
    checkout the same way), so the answer is always that interpreter's own and never this one's.
    ``in_subprocess``: ask that way even for this interpreter, whose own ``sys.path`` may hold what
    a worker's does not (a Ray task's process has Ray's vendored packages on it).
    """
    if _same_interpreter(python) and not in_subprocess:
        return environment_here()
    code = "import json; from suite.record import provenance; print(json.dumps(provenance.environment_here()))"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.IMPORT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        # In a folder of its own, removed after: whatever the interpreter writes where it stands (a
        # wrapper script may write files) stays out of the checkout.
        with tempfile.TemporaryDirectory(prefix="suite-ask-") as cwd:
            proc = subprocess.run(
                [python, "-c", code],
                capture_output=True,
                text=True,
                timeout=ASK_TIMEOUT_S,
                check=False,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
            )
        if proc.returncode != 0:
            raise RuntimeError((proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1])
        block = json.loads(proc.stdout.strip().splitlines()[-1])
        if not isinstance(block, dict):
            raise ValueError("not a JSON object")
        return block
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError, IndexError) as exc:
        return _environment("venv", None, None, None, [f"could not ask {python} for its packages: {exc}"])


def _same_interpreter(python: str) -> bool:
    """``python`` is this process's interpreter, by path (not resolving links: every venv's python
    links to one base interpreter, yet each venv has its own packages)."""
    found = shutil.which(python) or python
    return os.path.abspath(found) == os.path.abspath(sys.executable)


def environment_here() -> dict[str, Any]:
    """The "environment" block of the running interpreter: the lock of its venv (``sys.prefix``)."""
    prefix = sys.prefix
    try:
        marker = locks.venv_lock(prefix)
    except ValueError as exc:  # names the file
        return _environment("venv", None, None, None, [str(exc)])
    except OSError as exc:
        return _environment("venv", None, None, None, [f"{Path(prefix) / LOCK_MARKER}: unreadable ({exc})"])
    if marker is None:
        return _environment("venv", None, None, None, [f"{NO_LOCK} (no {LOCK_MARKER} in {prefix})"])
    lock_file, lock_sha = marker.get("lock_file"), marker.get("lock_sha256")
    if lock_file is None and lock_sha is None:  # what ensure_venv records under SUITE_UNLOCKED=1
        why = f"{NO_LOCK} (installed unlocked, SUITE_UNLOCKED=1: {Path(prefix) / LOCK_MARKER} names no lock)"
        return _environment("venv", None, None, None, [why])
    if not isinstance(lock_file, str) or not isinstance(lock_sha, str):
        why = f"{Path(prefix) / LOCK_MARKER}: keys lock_file and lock_sha256 must be strings"
        return _environment("venv", None, None, None, [why])
    path = Path(lock_file) if Path(lock_file).is_absolute() else paths.DATA_DIR / lock_file
    if not path.is_file() and not Path(lock_file).is_absolute():
        # The lock path is relative to the checkout the venv was made in, which holds the venv; this
        # code may be a copy elsewhere (a Ray node runs the job's shipped copy of the suite).
        path = Path(prefix).parent / lock_file
    try:
        now = locks.lock_sha256(path)
    except OSError as exc:
        return _environment("venv", lock_file, lock_sha, None, [f"{lock_file} cannot be read to compare ({exc})"])
    if now != lock_sha:
        why = (
            f"{lock_file} changed since this venv was installed from it (sha256 {lock_sha[:SHORT]} then, "
            f"{now[:SHORT]} now): the installed packages cannot be checked against the lock they came from"
        )
        return _environment("venv", lock_file, lock_sha, None, [why])
    try:
        pins = locks.read_pins(path)
    except (OSError, ValueError) as exc:
        return _environment("venv", lock_file, lock_sha, None, [f"{lock_file} cannot be read as a lock ({exc})"])
    differences = locks.installed_differences(pins)
    return _environment("venv", lock_file, lock_sha, not differences, differences)


def _environment(
    kind: str, lock_file: str | None, lock_sha256: str | None, matches: bool | None, differences: list[str]
) -> dict[str, Any]:
    return {
        "kind": kind,
        "lock_file": lock_file,
        "lock_sha256": lock_sha256,
        "matches_lock": matches,
        "lock_differences": list(differences),
    }


def got_no_image(environment: dict[str, Any] | None, image: dict[str, Any] | None) -> bool:
    """Whether ``environment`` and ``image`` (a provenance section's) are those of a run meant for an
    image that never got one (skipped, no engine, no such image: ``image_provenance``): its lock is
    not known, not absent. An image run without a lock says why in its differences."""
    return bool(
        environment
        and not image
        and environment.get("kind") == "image"
        and not (environment.get("lock_file") or environment.get("lock_sha256"))
        and not environment.get("lock_differences")
    )


def no_lock_reason(differences: list[str]) -> str:
    """Why an environment has no lock, without the words "not installed from a lock" a report's
    "not from a lock" already says: "no .suite-lock.json in /x/.venv"."""
    reasons = []
    for line in differences:
        rest = line.removeprefix(NO_LOCK).strip()
        reasons.append(rest[1:-1] if rest.startswith("(") and rest.endswith(")") else rest or line)
    return "; ".join(reasons)


# -- the image of a Docker run --------------------------------------------------------------------


def image_provenance(run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(environment, image) blocks from what a Docker run recorded of its image (``images.image_record``).

    The image's lock is given by its ``suite.lock.file`` label (relative to docker/; the block
    names it from the repository root, as a venv's lock is named) and ``suite.lock.sha256``.
    ``matches_lock`` is null: nothing is listed at run time. The image's packages were installed
    from its lock with ``--require-hashes`` when it was built, and the build checked every pin is
    installed at its version (docker/Dockerfile); the image ID names those bytes, which cannot
    change after. A run that never got an image (no engine, no such image, a skip) has image null.
    Images built before these labels existed have nulls where the labels are missing.
    """
    labels = run.get("image_labels") or {}

    def fact(key: str, label: str) -> str | None:
        value = run.get(key) or labels.get(label)
        return str(value) if value else None

    image_id = run.get("image_id")
    lock_label = fact("lock_file", "suite.lock.file")
    lock_file = f"docker/{lock_label}" if lock_label and not lock_label.startswith("docker/") else lock_label
    lock_sha = fact("lock_sha256", "suite.lock.sha256")
    if not image_id:
        return _environment("image", None, None, None, []), None
    differences = [] if lock_sha else ["image built without a lock: it has no suite.lock.sha256 label"]
    digests = [str(d) for d in run.get("repo_digests") or []]
    image = {
        "name": labels.get("suite.image") or run.get("image"),
        "id": str(image_id),
        "digest": digests[0] if digests else None,
        "recipe_hash": fact("recipe_hash", "suite.recipe_hash"),
        "context_hash": fact("context_hash", "suite.context_hash"),
        **base_of(run),
    }
    return _environment("image", lock_file, lock_sha, None, differences), image


BASE_KEYS = ("base_source", "base_name", "base_digest", "base_id")


def base_of(run: dict[str, Any]) -> dict[str, str | None]:
    """The image's base as its labels recorded it (``images.image_record``; ``image_catalog`` sets them).

    ``base_source``: "registry" (pulled by digest) or "debian" (made on the build machine from
    Debian packages, ``suite.environment.debian_base``); null for a base given as a build override or an image
    built before the label existed. ``base_name``: the OCI ``base.name`` label (the registry
    reference or the local tag), else ``suite.base.ref``. ``base_digest``: the registry digest, null
    for a base only the build machine had. ``base_id``: the base's image ID on the build machine.
    The same recipe (``recipe_hash``) built on two bases is two images: another base is other
    OS libraries and another Python build.
    """
    labels = run.get("image_labels") or {}
    oci = run.get("oci_labels") or {}

    def value(*candidates: Any) -> str | None:
        return next((str(c) for c in candidates if c), None)

    return {
        "base_source": value(labels.get("suite.base.source")),
        "base_name": value(
            oci.get("org.opencontainers.image.base.name"), run.get("base_ref"), labels.get("suite.base.ref")
        ),
        "base_digest": value(
            run.get("base_digest"), labels.get("suite.base.digest"), oci.get("org.opencontainers.image.base.digest")
        ),
        "base_id": value(run.get("base_id"), labels.get("suite.base.id")),
    }


def of_result(section: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """A result's provenance as reports read it: its own section; for a record made before results
    carried one, what its recorded image facts still say (a Docker run's image and lock labels),
    with the suite block and a venv's lock empty: not recorded."""
    if section:
        image = section.get("image")
        if image and not any(k in image for k in BASE_KEYS):  # recorded before the block named its base
            return {**section, "image": {**image, **base_of(run)}}
        return section
    if run.get("image_id"):
        environment, image = image_provenance(run)
        return provenance_of({}, environment, image)
    return provenance_of({}, {}, None)


def provenance_of(suite: dict[str, Any], environment: dict[str, Any], image: dict[str, Any] | None) -> dict[str, Any]:
    """The section a result record carries."""
    return {"suite": suite, "environment": environment, "image": image}
