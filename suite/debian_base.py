"""Base images without a registry: a Debian root from the package index, imported into the engine.

Where the catalog's base (``python:3.11-slim-bookworm``) cannot be pulled, an image's base is made
from Debian packages instead: ``debootstrap`` a minimal bookworm root (its python3 is 3.11, the
catalog's Python), install the image's pip requirements into it with *this machine's* pip (the
build's containers may have no network at all), trim it, and ``docker import`` it. The Dockerfile is
then built on it with ``INSTALL=0``: the requirements are there, only its check runs.

The base is tagged ``suite-base:<hash of its recipe>`` (Debian suite, mirror, packages, pip
requirements, the constraints' pins, this machine's Python), so a second build finds it on the
engine and takes seconds. Its labels say how it was made: the Debian suite and mirror, the version
of every Debian package in the root, the pip requirements and the hash of the constraints. Images
built on it inherit these labels, and each result's image facts carry them.

Needs root (debootstrap) and the ``debootstrap`` and ``tar`` programs on the machine that builds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.image_catalog import DOCKER_DIR, ImageDef, ImageError, label_instruction

RECIPE_VERSION = "2"  # bump when the steps below change what ends up in the image
DEBIAN_SUITE = "bookworm"  # python3 is 3.11 there, like the catalog's bases
MIRROR_ENV = "SUITE_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("python3", "ca-certificates")
REPOSITORY = "suite-base"
PYTHON_VERSION = (3, 11)  # bookworm's python3
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"  # on Debian's python3 path, outside dpkg's files
# Trimmed after install: not needed to run Python, and a third of a minimal root.
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")
CHUNK = 1 << 20
LABEL_SOURCE = "suite.base.source"


class DebianBaseError(ImageError):
    """The base could not be made; the message says which step and why."""


@dataclass(frozen=True)
class DebianRecipe:
    """What goes into one registry-free base: Debian's part, then pip's."""

    requirements: tuple[str, ...]  # pip requirements, e.g. ("tensorflow-cpu==2.21.0", "keras==3.15.1")
    constraints: Path
    mirror: str = DEFAULT_MIRROR
    suite: str = DEBIAN_SUITE
    packages: tuple[str, ...] = DEBIAN_PACKAGES

    def pins(self) -> list[str]:
        """The constraints' pins without comments: a reworded comment installs the same bytes."""
        lines = (line.split("#", 1)[0].strip() for line in self.constraints.read_text(encoding="utf-8").splitlines())
        return [line for line in lines if line]

    def constraints_hash(self) -> str:
        return "sha256:" + hashlib.sha256("\n".join(self.pins()).encode()).hexdigest()

    def inputs_hash(self) -> str:
        """Hash of the recipe: same inputs, same tag, so the engine's copy is reused."""
        parts = [
            RECIPE_VERSION,
            self.suite,
            self.mirror,
            *self.packages,
            *self.requirements,
            *self.pins(),
            host_python_tag(),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def tag(self) -> str:
        return f"{REPOSITORY}:{self.inputs_hash()[:16]}"


def recipe_for(image: ImageDef) -> DebianRecipe:
    """The Debian base for one catalog image: its TensorFlow and extra requirements, its constraints."""
    requirements = tuple(image.tensorflow.split()) + tuple(image.extra.split())
    return recipe_from(requirements, DOCKER_DIR / image.constraints)


def recipe_from(requirements: tuple[str, ...], constraints: Path) -> DebianRecipe:
    """A recipe for these requirements; the mirror is ``$SUITE_DEBIAN_MIRROR`` when set."""
    return DebianRecipe(tuple(requirements), constraints, mirror=os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR)


def host_python_tag() -> str:
    return f"host-py{sys.version_info[0]}.{sys.version_info[1]}"


def ensure(client: Any, recipe: DebianRecipe, progress: Callable[[str], None] = print) -> str:
    """The tag of the recipe's base on the engine, made only when the engine does not have it.

    Two builders of the same base on this machine take turns (a lock file per tag): the second finds
    the first one's base instead of making it again.
    """
    tag = recipe.tag()
    if _on_engine(client, tag):
        progress(f"{tag}: Debian {recipe.suite} base already on the engine")
        return tag
    missing = [tool for tool in ("debootstrap", "tar") if shutil.which(tool) is None]
    if missing:
        raise DebianBaseError(
            f"cannot build {tag}: {', '.join(missing)} not installed (apt-get install -y debootstrap)"
        )
    if os.geteuid() != 0:
        raise DebianBaseError(f"cannot build {tag}: debootstrap needs root")
    lock_path = Path(tempfile.gettempdir(), f"{tag.replace(':', '-')}.lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _on_engine(client, tag):
            progress(f"{tag}: made meanwhile by another build")
            return tag
        _make(client, recipe, tag, progress)
    if not _on_engine(client, tag):
        raise DebianBaseError(f"importing {tag} produced no image")
    return tag


def _on_engine(client: Any, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _make(client: Any, recipe: DebianRecipe, tag: str, progress: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="suite-base-", dir=os.environ.get("SUITE_BASE_WORKDIR")) as work:
        root = Path(work, "root")
        with _timed("debootstrap", progress):
            _debootstrap(recipe, root, progress)
        packages = debian_packages(root)
        with _timed("pip install", progress):
            _pip_install(recipe, root, progress)
        for rel in TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        labels = base_labels(recipe, packages)
        progress(f"importing {root} into the engine as {tag}")
        with _timed("import", progress):
            _import(client, root, tag, labels)


def base_labels(recipe: DebianRecipe, packages: dict[str, str]) -> dict[str, str]:
    """How the base was made, as image labels (inherited by every image built on it)."""
    return {
        LABEL_SOURCE: "debian",
        "suite.debian.recipe": recipe.inputs_hash(),
        "suite.debian.suite": recipe.suite,
        "suite.debian.mirror": recipe.mirror,
        "suite.debian.packages": " ".join(f"{name}={version}" for name, version in sorted(packages.items())),
        "suite.pip.requirements": " ".join(recipe.requirements),
        "suite.pip.constraints": f"{recipe.constraints.name} {recipe.constraints_hash()}",
        "suite.pip.installed_by": f"host pip, Python {'.'.join(map(str, sys.version_info[:3]))}",
    }


def debian_packages(root: Path) -> dict[str, str]:
    """name -> version of every package dpkg lists as installed in the root (read from its status file)."""
    status = root / "var/lib/dpkg/status"
    try:
        text = status.read_text(encoding="utf-8")
    except OSError as exc:
        raise DebianBaseError(f"cannot read {status} ({exc})") from None
    found = {}
    for paragraph in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in paragraph.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            found[fields["Package"]] = fields.get("Version", "")
    if not found:
        raise DebianBaseError(f"{status} lists no installed package")
    return found


def _debootstrap(recipe: DebianRecipe, root: Path, progress: Callable[[str], None]) -> None:
    progress(f"debootstrap {recipe.suite} ({', '.join(recipe.packages)}) from {recipe.mirror} (a few minutes)")
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}", recipe.suite, str(root)]
    _run([*cmd, recipe.mirror], "debootstrap")


def _pip_install(recipe: DebianRecipe, root: Path, progress: Callable[[str], None]) -> None:
    """The host's pip installs into the root's site-packages: the root itself needs no pip."""
    progress(f"pip install {' '.join(recipe.requirements)} (constraints {recipe.constraints.name}) into the root")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--target",
        str(root / SITE_PACKAGES),
        "-c",
        str(recipe.constraints),
        *recipe.requirements,
    ]
    if sys.version_info[:2] != PYTHON_VERSION:
        # Another host Python: ask for wheels made for the root's interpreter instead.
        cmd += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--only-binary=:all:"]
        for platform in ("manylinux_2_28", "manylinux_2_17", "manylinux2014", "manylinux2010"):
            cmd += ["--platform", f"{platform}_x86_64"]
    _run(cmd, "pip install")


def _import(client: Any, root: Path, tag: str, labels: dict[str, str]) -> None:
    """``tar`` streams the root straight into the engine: no tarball the size of the image on disk."""
    repository, _, version = tag.partition(":")
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        'CMD ["python3"]',
        label_instruction(labels),
    ]
    proc = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(root), "-cf", "-", "."], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        client.api.import_image_from_data(_chunks(proc.stdout), repository=repository, tag=version, changes=changes)
    finally:
        proc.stdout.close()
        _, err = proc.communicate()
    if proc.returncode != 0:
        raise DebianBaseError(f"tar of {root} failed with exit code {proc.returncode}: {err.decode()[-2000:]}")


def _chunks(stream: Any) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        yield chunk


@contextmanager
def _timed(step: str, progress: Callable[[str], None]) -> Iterator[None]:
    start = time.monotonic()
    yield
    progress(f"{step}: done in {time.monotonic() - start:.0f} s")


def _run(cmd: list[str], step: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr)[-3000:]
        raise DebianBaseError(f"{step} failed with exit code {proc.returncode}:\n{out}")
