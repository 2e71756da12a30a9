"""Base images without a registry: a Debian root from the package index, imported into the engine.

Where the catalog's base (``python:3.11-slim-bookworm``) cannot be pulled, an image's base is made
from Debian packages instead: ``debootstrap`` a minimal bookworm root (its python3 is 3.11, the
catalog's Python), install the image's hash-locked requirements (docker/locks/NAME.txt, with
``--require-hashes``) into it with *this machine's* pip (the build's containers may have no network
at all), trim it, and ``docker import`` it. The Dockerfile is then built on it with ``INSTALL=0``:
the packages are there, only its checks run.

The base is tagged ``suite-base:<hash of its recipe>`` (Debian suite, mirror, packages, the lock
file's name and sha256, this machine's Python), so a second build finds it on the engine and takes
seconds. Its labels say how it was made: the Debian suite and mirror, the version of every Debian
package in the root, the lock file and its sha256. Images built on it inherit these labels, and each
result's image facts carry them. debootstrap takes whatever versions the mirror has that day; it
cannot pin them. Where docker/images.lock recorded an earlier base's packages, a new base names the
packages that moved.

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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.environment.image_catalog import DOCKER_DIR, ImageDef, ImageError, label_instruction
from suite.environment.locks import lock_sha256

RECIPE_VERSION = "3"  # bump when the steps below change what ends up in the image
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
    """What goes into one registry-free base: Debian's part, then pip's (one hash-locked requirements file)."""

    lock: Path  # the lock file pip installs, e.g. docker/locks/tf2.21-cpu.txt
    lock_file: str  # its name as images.yaml gives it, relative to docker/: locks/tf2.21-cpu.txt
    mirror: str = DEFAULT_MIRROR
    suite: str = DEBIAN_SUITE
    packages: tuple[str, ...] = DEBIAN_PACKAGES

    def lock_sha256(self) -> str:
        """sha256 of the lock file's bytes: the same value as the image label ``suite.lock.sha256``."""
        return lock_sha256(self.lock)

    def inputs_hash(self) -> str:
        """Hash of the recipe: same inputs, same tag, so the engine's copy is reused."""
        parts = [
            RECIPE_VERSION,
            self.suite,
            self.mirror,
            *self.packages,
            f"lock {self.lock_file} {self.lock_sha256()}",
            host_python_tag(),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def tag(self) -> str:
        return f"{REPOSITORY}:{self.inputs_hash()[:16]}"


def recipe_for(image: ImageDef, root: Path = DOCKER_DIR) -> DebianRecipe:
    """The Debian base for one catalog image: its lock file (``root``: the catalog's folder)."""
    return recipe_from(root / image.lock, image.lock)


def recipe_from(lock: Path, lock_file: str) -> DebianRecipe:
    """A recipe installing this lock; the mirror is ``$SUITE_DEBIAN_MIRROR`` when set."""
    return DebianRecipe(lock, lock_file, mirror=os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR)


def host_python_tag() -> str:
    return f"host-py{sys.version_info[0]}.{sys.version_info[1]}"


def ensure(
    client: Any,
    recipe: DebianRecipe,
    progress: Callable[[str], None] = print,
    locked_packages: Mapping[str, str] | None = None,
) -> str:
    """The tag of the recipe's base on the engine, made only when the engine does not have it.

    Two builders of the same base on this machine take turns (a lock file per tag): the second finds
    the first one's base instead of making it again. ``locked_packages``: the Debian packages
    docker/images.lock recorded for this image's base; a new base says which of them moved.
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
        _make(client, recipe, tag, progress, locked_packages)
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


def _make(
    client: Any,
    recipe: DebianRecipe,
    tag: str,
    progress: Callable[[str], None],
    locked_packages: Mapping[str, str] | None = None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="suite-base-", dir=os.environ.get("SUITE_BASE_WORKDIR")) as work:
        root = Path(work, "root")
        with _timed("debootstrap", progress):
            _debootstrap(recipe, root, progress)
        packages = debian_packages(root)
        if locked_packages:
            moved = package_changes(locked_packages, packages)
            if moved:
                progress(
                    f"{len(moved)} Debian package(s) differ from those docker/images.lock recorded (debootstrap "
                    f"takes what {recipe.mirror} has today; it cannot pin versions): {'; '.join(moved)}"
                )
            else:
                progress("Debian packages: the versions docker/images.lock recorded")
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
        "suite.pip.lock.file": recipe.lock_file,
        "suite.pip.lock.sha256": recipe.lock_sha256(),
        "suite.pip.installed_by": f"host pip, Python {'.'.join(map(str, sys.version_info[:3]))}",
    }


def parse_packages(label: str) -> dict[str, str]:
    """The ``suite.debian.packages`` label (``name=version name=version ...``) back into a mapping."""
    return dict(item.split("=", 1) for item in label.split() if "=" in item)


def package_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Each package whose version differs, was added or is gone, one readable line each, sorted by name."""
    lines = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None:
            lines.append(f"{name} {new} added")
        elif new is None:
            lines.append(f"{name} {old} gone")
        else:
            lines.append(f"{name} {old} -> {new}")
    return lines


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
    """The host's pip installs the lock into the root's site-packages: the root itself needs no pip.

    ``--require-hashes``, as in the Dockerfile: every file must match a sha256 of the lock. Without
    ``--no-deps`` pip still resolves each package's dependencies, so a lock that misses one is refused
    (the dependency has no hash in it) rather than installed incomplete.
    """
    progress(f"pip install --require-hashes -r {recipe.lock_file} into the root")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--require-hashes",
        "--target",
        str(root / SITE_PACKAGES),
        "-r",
        str(recipe.lock),
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
    assert proc.stdout is not None  # stdout=PIPE
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
