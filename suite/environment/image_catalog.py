"""The image catalog and its lock: docker/images.yaml read and checked, base digests, build recipes.

No engine is needed here: ``plan_build`` resolves what one build sends (args, context, labels, tag)
and the hash of it, so a recipe can be compared with what an engine holds, and a typo in a name is
refused before any connection. Building and asking registries is ``suite.environment.images``.

Two hashes name an image's recipe. ``recipe_hash`` covers what decides the image's Python packages
whichever way its base was obtained (the Dockerfile, the image's hash-locked requirements file, its
catalog entry), so an image built on a registry base and one built on a Debian-made base carry the
same value. ``context_hash`` covers exactly what one build sends (files and build args, the base
reference among them), and decides whether an image on the engine is up to date. Neither covers a
label that changes every build (build time, git revision): a rebuild is skipped while the recipe is
unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from suite import paths
from suite.environment.locks import lock_sha256

DOCKER_DIR = paths.DOCKER_DIR
CATALOG = DOCKER_DIR / "images.yaml"
LOCK = DOCKER_DIR / "images.lock"
IMAGE_KEYS = {
    "description",
    "gpu",
    "base",
    "tensorflow",
    "extra",
    "constraints",
    "lock",
    "cuda",
    "cudnn",
    "python",
    "dockerfile",
}
REQUIRED_KEYS = {"gpu", "base", "tensorflow", "constraints", "lock"}
FILE_KEYS = ("constraints", "lock", "dockerfile")  # paths relative to the catalog's folder
LABEL_PREFIX = "suite."
OCI_PREFIX = "org.opencontainers.image."
RECIPE_VERSION = "1"  # bump when recipe_hash covers other inputs


class ImageError(Exception):
    """A catalog, lock or build problem; the message says which file or image and what to do."""


class UnknownImage(ImageError):
    """A name that docker/images.yaml does not define: bad input, not an engine or build failure."""


@dataclass(frozen=True)
class ImageDef:
    name: str
    gpu: bool
    base: str  # pinned tag, e.g. python:3.11-slim-bookworm
    tensorflow: str  # pip requirement
    constraints: str  # path relative to docker/: the pins the lock is compiled with
    lock: str  # path relative to docker/: the complete, hash-locked requirements the image installs
    extra: str = ""
    description: str = ""
    cuda: str | None = None
    cudnn: str | None = None
    python: str = "python3"
    dockerfile: str = "Dockerfile"


@dataclass(frozen=True)
class Catalog:
    repository: str
    defaults: dict[str, str]  # "gpu" | "cpu" -> image name
    images: dict[str, ImageDef]
    root: Path = DOCKER_DIR  # the catalog's folder: the build context, and what file keys are relative to

    def get(self, name: str) -> ImageDef:
        if name not in self.images:
            raise UnknownImage(f"{CATALOG}: no image named {name!r}; known: {', '.join(sorted(self.images))}")
        return self.images[name]

    def default_for(self, gpu: bool) -> str:
        return self.defaults["gpu" if gpu else "cpu"]

    def tag(self, name: str) -> str:
        return f"{self.repository}:{name}"


def load_catalog(path: Path = CATALOG, *, locks_may_be_missing: bool = False) -> Catalog:
    """images.yaml -> Catalog, with every error naming the file and the key.

    ``locks_may_be_missing``: for requirements/lock.sh, which writes the lock files (a new image's does
    not exist yet); everything else about the ``lock`` key is checked all the same.
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ImageError(f"{path}: cannot read the image catalog ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), dict) or not data["images"]:
        raise ImageError(f"{path}: expected a mapping with a non-empty 'images' mapping")
    unknown = set(data) - {"repository", "defaults", "images"}
    if unknown:
        raise ImageError(f"{path}: unknown top-level key(s) {sorted(unknown)}; allowed: repository, defaults, images")
    images = {name: _image_def(path, name, entry, locks_may_be_missing) for name, entry in data["images"].items()}
    defaults = data.get("defaults") or {}
    for kind in ("gpu", "cpu"):
        if defaults.get(kind) not in images:
            raise ImageError(f"{path}: defaults.{kind} must name one of the images ({', '.join(sorted(images))})")
    return Catalog(str(data.get("repository") or "suite-bench"), dict(defaults), images, path.resolve().parent)


def _image_def(path: Path, name: str, entry: Any, locks_may_be_missing: bool = False) -> ImageDef:
    where = f"{path}: images.{name}"
    if not isinstance(entry, dict):
        raise ImageError(f"{where}: expected a mapping")
    unknown = set(entry) - IMAGE_KEYS
    if unknown:
        raise ImageError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(IMAGE_KEYS))}")
    missing = REQUIRED_KEYS - set(entry)
    if missing:
        hint = f"; lock: expected locks/{name}.txt (written by requirements/lock.sh)" if "lock" in missing else ""
        raise ImageError(f"{where}: missing key(s) {sorted(missing)}{hint}")
    if not isinstance(entry["gpu"], bool):
        raise ImageError(f"{where}.gpu: expected true or false, got {entry['gpu']!r}")
    root = path.resolve().parent
    for key in FILE_KEYS:
        if key not in entry:
            continue
        value = entry[key]
        if not isinstance(value, str) or not value or Path(value).is_absolute() or ".." in Path(value).parts:
            raise ImageError(f"{where}.{key}: expected a file path relative to {root}, got {value!r}")
        if (root / value).is_dir():
            raise ImageError(f"{where}.{key}: {root / value} is not a file (a folder)")
        if key == "lock" and not value.endswith(".txt"):
            raise ImageError(
                f"{where}.lock: expected locks/{name}.txt (written by requirements/lock.sh), got {value!r}"
            )
        if not (root / value).is_file() and not (key == "lock" and locks_may_be_missing):
            written = " (requirements/lock.sh writes it)" if key == "lock" else ""
            raise ImageError(f"{where}.{key}: {root / value} does not exist{written}")
    if Path(entry["lock"]) == Path(entry["constraints"]):
        raise ImageError(
            f"{where}.lock: {entry['lock']!r} is the constraints file; "
            f"expected locks/{name}.txt (written by requirements/lock.sh)"
        )
    for key in ("description", "tensorflow", "extra", "python", "base"):
        # Each becomes an image label or a build arg: one line of text.
        if entry.get(key) is not None and (not isinstance(entry[key], str) or "\n" in entry[key] or "\r" in entry[key]):
            raise ImageError(f"{where}.{key}: expected one line of text, got {entry[key]!r}")
    fields: dict[str, Any] = {k: (v if k == "gpu" or v is None else str(v)) for k, v in entry.items()}
    return ImageDef(name=name, **fields)


LOCK_SECTIONS = ("bases", "debian_bases")


def read_lock(path: Path = LOCK) -> dict[str, dict[str, dict[str, Any]]]:
    """docker/images.lock: ``{"bases": {...}, "debian_bases": {...}}``, each empty when nothing was locked.

    ``bases``: base tag -> {"digest": "sha256:...", "locked_at": ...}, the registry's digests.
    ``debian_bases``: image name -> how its base was made from Debian packages on the engine (suite,
    mirror, the base's recipe hash and image ID, every package's version, the pip lock it holds).
    """
    if not path.is_file():
        return {section: {} for section in LOCK_SECTIONS}
    what_to_do = "delete it, then run `python -m suite images lock`"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ImageError(f"{path}: unreadable lock file ({exc}); {what_to_do}") from None
    if not isinstance(data, dict) or set(data) - set(LOCK_SECTIONS):
        raise ImageError(f"{path}: expected a mapping with the keys {', '.join(LOCK_SECTIONS)}; {what_to_do}")
    lock = {}
    for section in LOCK_SECTIONS:
        entries = data.get(section) or {}
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise ImageError(f"{path}: {section}: expected a mapping of mappings; {what_to_do}")
        lock[section] = {str(k): dict(v) for k, v in entries.items()}
    for base, entry in lock["bases"].items():
        if not str(entry.get("digest", "")).startswith("sha256:"):
            raise ImageError(f"{path}: bases.{base}.digest: expected sha256:..., got {entry.get('digest')!r}")
    for name, entry in lock["debian_bases"].items():
        _check_debian_entry(path, name, entry, what_to_do)
    return lock


# What `python -m suite images lock` writes for a Debian-made base (suite.environment.images.debian_record), by type.
DEBIAN_TEXT_KEYS = ("base", "image_id", "made_at", "recipe", "suite", "mirror", "locked_at")


def _check_debian_entry(path: Path, name: str, entry: Mapping[str, Any], what_to_do: str) -> None:
    """A debian_bases entry as `images lock` writes it, or an ImageError naming the key: a hand-edited
    ``packages: [libc6, bash]`` would otherwise fail far from here, when a build compares versions."""
    where = f"{path}: debian_bases.{name}"
    for key in DEBIAN_TEXT_KEYS:
        if key in entry and not isinstance(entry[key], str):
            raise ImageError(f"{where}.{key}: expected text, got {entry[key]!r}; {what_to_do}")
    packages = entry.get("packages", {})
    if not isinstance(packages, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in packages.items()
    ):
        raise ImageError(
            f"{where}.packages: expected a mapping of Debian package name to version text "
            f"(e.g. libc6: 2.36-9+deb12u14), got {packages!r:.80}; {what_to_do}"
        )
    pip_lock = entry.get("pip_lock", {})
    if not isinstance(pip_lock, dict) or not all(isinstance(pip_lock.get(k, ""), str) for k in ("file", "sha256")):
        raise ImageError(
            f"{where}.pip_lock: expected a mapping with text file and sha256, got {pip_lock!r}; {what_to_do}"
        )
    unknown = set(entry) - {*DEBIAN_TEXT_KEYS, "packages", "pip_lock"}
    if unknown:
        allowed = ", ".join(sorted({*DEBIAN_TEXT_KEYS, "packages", "pip_lock"}))
        raise ImageError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {allowed}; {what_to_do}")


def load_lock(path: Path = LOCK) -> dict[str, dict[str, str]]:
    """base tag -> {"digest": "sha256:...", "locked_at": ...}; empty when nothing was locked yet."""
    return read_lock(path)["bases"]


def recipe_hash(catalog: Catalog, name: str) -> str:
    """The ``suite.recipe_hash`` an image of that name built now from this checkout would carry.

    sha256 over the inputs that decide the image's contents whichever way its base was obtained:
    the Dockerfile's bytes, the image's lock file's bytes and its catalog entry (tensorflow, extra,
    python, base name). Not the base reference a build uses (a digest, or a Debian-made base's tag),
    and no label that changes every build, so a registry build and a Debian build share it.
    """
    d = catalog.get(name)
    parts = [
        f"recipe {RECIPE_VERSION}",
        f"dockerfile {hashlib.sha256((catalog.root / d.dockerfile).read_bytes()).hexdigest()}",
        f"lock {lock_sha256(catalog.root / d.lock)}",
        f"tensorflow {d.tensorflow}",
        f"extra {d.extra}",
        f"python {d.python}",
        f"base {d.base}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def project_version() -> str:
    """The suite's version (pyproject.toml, or the installed distribution's); ``unknown`` where it cannot be read."""
    return paths.version()


def pinned_base(base: str, lock: Mapping[str, Mapping[str, str]]) -> str:
    """``repo@sha256:...`` when the lock knows the tag, else the tag itself."""
    entry = lock.get(base)
    if not entry:
        return base
    return f"{repository_of(base)}@{entry['digest']}"


def repository_of(ref: str) -> str:
    """'host:5000/py:3.11' -> 'host:5000/py'; 'python@sha256:...' -> 'python' (a port is no tag)."""
    ref = ref.split("@", 1)[0]
    return ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref


@dataclass(frozen=True)
class BuildPlan:
    """Everything one build sends to the engine, and the hash of it."""

    name: str
    tag: str
    buildargs: dict[str, str]
    files: dict[str, bytes]  # the whole build context: the Dockerfile and the image's lock file
    labels: dict[str, str]  # every label that follows from the recipe (none that changes every build)
    context_hash: str
    recipe_hash: str = ""


def plan_build(
    catalog: Catalog,
    name: str,
    lock: Mapping[str, Mapping[str, str]] | None = None,
    base_override: Mapping[str, str] | None = None,
    debian_base: str | None = None,
) -> BuildPlan:
    """Resolve one image's build: args, context, labels, tag.

    ``base_override`` replaces build args (e.g. ``{"BASE_IMAGE": ..., "INSTALL": "0"}`` for a base
    built offline). Such a build is tagged ``NAME-x<hash>`` so it never stands in for the real one.
    ``debian_base``: the tag of the image's own base made from Debian packages (``suite.environment.debian_base``,
    its requirements already installed) where the catalog's base cannot be pulled. That build is the
    real image, tagged ``NAME``: the same requirements and pins, on another base.
    """
    d = catalog.get(name)
    lock = load_lock() if lock is None else lock
    args = {
        "BASE_IMAGE": pinned_base(d.base, lock),
        "PYTHON": d.python,
        "LOCK": d.lock,
        "INSTALL": "1",
    }
    unknown = set(base_override or {}) - set(args)
    if unknown:
        raise ImageError(f"unknown build arg(s) {sorted(unknown)}; allowed: {', '.join(sorted(args))}")
    args.update(base_override or {})
    if debian_base:
        if base_override:
            raise ImageError("a build takes either a base override or a Debian base, not both")
        args.update(BASE_IMAGE=debian_base, INSTALL="0")
    # The lock is complete (every package, pinned and hashed), so it is the whole context beside the
    # Dockerfile: the constraints it was compiled with are not needed to install it.
    files = {
        "Dockerfile": (catalog.root / d.dockerfile).read_bytes(),
        d.lock: (catalog.root / d.lock).read_bytes(),
    }
    recipe = recipe_hash(catalog, name)
    base_ref = args["BASE_IMAGE"]
    base_name = base_ref if base_override or debian_base else qualified_reference(d.base)
    base_digest = base_ref.split("@", 1)[1] if "@" in base_ref else ""
    labels = {
        "suite.image": name,
        "suite.recipe_hash": recipe,
        "suite.lock.file": d.lock,
        "suite.lock.sha256": lock_sha256(catalog.root / d.lock),
        "suite.base.ref": base_ref if base_override or debian_base else d.base,
        "suite.base.digest": base_digest,
        "suite.tensorflow": d.tensorflow,
        "suite.gpu": "true" if d.gpu else "false",
        "suite.cuda": d.cuda or "",
        "suite.python": d.python,
        OCI_PREFIX + "version": project_version(),
        OCI_PREFIX + "base.name": base_name,
    }
    if d.description:
        labels[OCI_PREFIX + "description"] = d.description
    if base_digest:  # OCI means the registry digest: a base known only by a local image ID has none
        labels[OCI_PREFIX + "base.digest"] = base_digest
    if not base_override:  # an override's base says itself how it was made (its own labels)
        labels["suite.base.source"] = "debian" if debian_base else "registry"
    digest = hashlib.sha256()
    for key in sorted(files):
        digest.update(f"file {key} {hashlib.sha256(files[key]).hexdigest()}\n".encode())
    for key in sorted(args):
        digest.update(f"arg {key}={args[key]}\n".encode())
    # Every label the plan sets is part of what the image is: a changed version, description, gpu or
    # cuda must make the built image stale, or it would keep saying the old one. (The labels of one
    # build alone, created/revision/source, are added at build time and are not in the plan.)
    for key in sorted(labels):
        digest.update(f"label {key}={labels[key]}\n".encode())
    context_hash = digest.hexdigest()
    tag = catalog.tag(name) if not base_override else f"{catalog.tag(name)}-x{context_hash[:10]}"
    labels["suite.context_hash"] = context_hash
    labels[OCI_PREFIX + "title"] = tag  # the tag: the name, and for an override the hash itself
    return BuildPlan(name, tag, args, files, labels, context_hash, recipe)


def qualified_reference(ref: str) -> str:
    """A registry image reference with its registry and namespace written out, as OCI's base.name asks:
    ``python:3.11-slim-bookworm`` is ``docker.io/library/python:3.11-slim-bookworm``."""
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ref  # already names its registry
    return f"docker.io/{ref}" if rest else f"docker.io/library/{ref}"


def label_instruction(labels: Mapping[str, str]) -> str:
    """One Dockerfile ``LABEL`` instruction setting every label: one build step, not one per label.

    Values are double-quoted with backslash, quote and ``$`` escaped, so none is substituted. A line
    break cannot be written in one and is refused.
    """
    for key, value in labels.items():
        if "\n" in value or "\r" in value or "\n" in key or "\r" in key:
            raise ImageError(f"label {key!r}: a label value is one line, got {value!r}")
    quoted = (
        f'{key}="' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'
        for key, value in sorted(labels.items())
    )
    return "LABEL " + " ".join(quoted)


def write_lock(
    path: Path,
    lock: Mapping[str, Mapping[str, str]],
    debian_bases: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Write docker/images.lock: the registry digests (``lock``) and the Debian-made bases' records."""
    header = (
        "# Written by `python -m suite images lock` for docker/images.yaml. Commit this file.\n"
        "# bases: registry digests; builds use BASE@DIGEST for every tag listed there.\n"
        "# debian_bases: per image, how its base was made from Debian packages where no registry answered\n"
        "# (debootstrap takes what the mirror has that day; a later build names the packages that moved).\n"
    )
    data = {
        "bases": {k: dict(v) for k, v in sorted(lock.items())},
        "debian_bases": {k: dict(v) for k, v in sorted((debian_bases or {}).items())},
    }
    body = yaml.safe_dump(data, sort_keys=True, width=1000)
    tmp = path.with_suffix(".lock.tmp")
    tmp.write_text(header + body, encoding="utf-8")
    tmp.replace(path)
