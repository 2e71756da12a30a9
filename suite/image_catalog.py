"""The image catalog and its lock: docker/images.yaml read and checked, base digests, build recipes.

No engine is needed here: ``plan_build`` resolves what one build sends (args, context, labels, tag)
and the hash of it, so a recipe can be compared with what an engine holds, and a typo in a name is
refused before any connection. Building and asking registries is ``suite.images``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DOCKER_DIR = Path(__file__).resolve().parents[1] / "docker"
CATALOG = DOCKER_DIR / "images.yaml"
LOCK = DOCKER_DIR / "images.lock"
IMAGE_KEYS = {
    "description",
    "gpu",
    "base",
    "tensorflow",
    "extra",
    "constraints",
    "cuda",
    "cudnn",
    "python",
    "dockerfile",
}
REQUIRED_KEYS = {"gpu", "base", "tensorflow", "constraints"}
LABEL_PREFIX = "suite."


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
    constraints: str  # path relative to docker/
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

    def get(self, name: str) -> ImageDef:
        if name not in self.images:
            raise UnknownImage(f"{CATALOG}: no image named {name!r}; known: {', '.join(sorted(self.images))}")
        return self.images[name]

    def default_for(self, gpu: bool) -> str:
        return self.defaults["gpu" if gpu else "cpu"]

    def tag(self, name: str) -> str:
        return f"{self.repository}:{name}"


def load_catalog(path: Path = CATALOG) -> Catalog:
    """images.yaml -> Catalog, with every error naming the file and the key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ImageError(f"{path}: cannot read the image catalog ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), dict) or not data["images"]:
        raise ImageError(f"{path}: expected a mapping with a non-empty 'images' mapping")
    unknown = set(data) - {"repository", "defaults", "images"}
    if unknown:
        raise ImageError(f"{path}: unknown top-level key(s) {sorted(unknown)}; allowed: repository, defaults, images")
    images = {name: _image_def(path, name, entry) for name, entry in data["images"].items()}
    defaults = data.get("defaults") or {}
    for kind in ("gpu", "cpu"):
        if defaults.get(kind) not in images:
            raise ImageError(f"{path}: defaults.{kind} must name one of the images ({', '.join(sorted(images))})")
    return Catalog(str(data.get("repository") or "suite-bench"), dict(defaults), images)


def _image_def(path: Path, name: str, entry: Any) -> ImageDef:
    where = f"{path}: images.{name}"
    if not isinstance(entry, dict):
        raise ImageError(f"{where}: expected a mapping")
    unknown = set(entry) - IMAGE_KEYS
    if unknown:
        raise ImageError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(IMAGE_KEYS))}")
    missing = REQUIRED_KEYS - set(entry)
    if missing:
        raise ImageError(f"{where}: missing key(s) {sorted(missing)}")
    if not isinstance(entry["gpu"], bool):
        raise ImageError(f"{where}.gpu: expected true or false, got {entry['gpu']!r}")
    if not (DOCKER_DIR / entry["constraints"]).is_file():
        raise ImageError(f"{where}.constraints: {DOCKER_DIR / entry['constraints']} does not exist")
    return ImageDef(name=name, **{k: (v if k == "gpu" or v is None else str(v)) for k, v in entry.items()})


def load_lock(path: Path = LOCK) -> dict[str, dict[str, str]]:
    """base tag -> {"digest": "sha256:...", "locked_at": ...}; empty when nothing was locked yet."""
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        what_to_do = "delete it, then run `python -m suite images lock`"
        raise ImageError(f"{path}: unreadable lock file ({exc}); {what_to_do}") from None
    return dict(data.get("bases") or {})


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
    files: dict[str, bytes]  # the whole build context: Dockerfile and the one constraints file
    labels: dict[str, str]
    context_hash: str


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
    ``debian_base``: the tag of the image's own base made from Debian packages (``suite.debian_base``,
    its requirements already installed) where the catalog's base cannot be pulled. That build is the
    real image, tagged ``NAME``: the same requirements and pins, on another base.
    """
    d = catalog.get(name)
    lock = load_lock() if lock is None else lock
    args = {
        "BASE_IMAGE": pinned_base(d.base, lock),
        "PYTHON": d.python,
        "TF_REQUIREMENT": d.tensorflow,
        "EXTRA_REQUIREMENTS": d.extra,
        "CONSTRAINTS": d.constraints,
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
    files = {
        "Dockerfile": (DOCKER_DIR / d.dockerfile).read_bytes(),
        d.constraints: (DOCKER_DIR / d.constraints).read_bytes(),
    }
    digest = hashlib.sha256()
    for key in sorted(files):
        digest.update(f"file {key} {hashlib.sha256(files[key]).hexdigest()}\n".encode())
    for key in sorted(args):
        digest.update(f"arg {key}={args[key]}\n".encode())
    context_hash = digest.hexdigest()
    tag = catalog.tag(name) if not base_override else f"{catalog.tag(name)}-x{context_hash[:10]}"
    base_ref = args["BASE_IMAGE"]
    labels = {
        "suite.image": name,
        "suite.context_hash": context_hash,
        "suite.base.ref": base_ref if base_override or debian_base else d.base,
        "suite.base.digest": base_ref.split("@", 1)[1] if "@" in base_ref else "",
        "suite.tensorflow": d.tensorflow,
        "suite.gpu": "true" if d.gpu else "false",
        "suite.cuda": d.cuda or "",
        "suite.python": d.python,
    }
    if not base_override:  # an override's base says itself how it was made (its own labels)
        labels["suite.base.source"] = "debian" if debian_base else "registry"
    return BuildPlan(name, tag, args, files, labels, context_hash)


def label_instruction(labels: Mapping[str, str]) -> str:
    """One Dockerfile ``LABEL`` instruction setting every label: one build step, not one per label.

    Values are double-quoted with backslash, quote and ``$`` escaped, so none is substituted.
    """
    quoted = (
        f'{key}="' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'
        for key, value in sorted(labels.items())
    )
    return "LABEL " + " ".join(quoted)


def write_lock(path: Path, lock: Mapping[str, Mapping[str, str]]) -> None:
    header = (
        "# Base-image digests for docker/images.yaml, written by `python -m suite images lock`.\n"
        "# Builds use BASE@DIGEST for every tag listed here. Commit this file.\n"
    )
    body = yaml.safe_dump({"bases": {k: dict(v) for k, v in sorted(lock.items())}}, sort_keys=True)
    tmp = path.with_suffix(".lock.tmp")
    tmp.write_text(header + body, encoding="utf-8")
    tmp.replace(path)
