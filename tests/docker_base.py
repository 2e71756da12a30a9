"""A small base image for the Docker tests, built without any registry.

The test engine has no images and cannot pull, so the base is made from the Debian package index:
``debootstrap`` a minimal bookworm root (its python3 is 3.11, like the suite's), install the
worker's pinned packages (``requirements/worker-cpu.txt``) into it with the host's pip, and
``docker import`` the tree. The image is tagged by a hash of everything that goes into it, so a
second run finds the tag on the engine and reuses it in a second instead of minutes.

The project's own ``docker/Dockerfile`` is then built on top of this base (``tf2.21-cpu`` with
``INSTALL=0``: the requirements are already there, so the build needs no network).

Run directly to (re)build and print the tags: ``python tests/docker_base.py``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(REPO_ROOT))

RECIPE_VERSION = "1"  # bump when the steps below change what ends up in the image
DEBIAN_SUITE = "bookworm"  # python3 is 3.11 there
DEBIAN_MIRROR = os.environ.get("SUITE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBIAN_PACKAGES = ("python3", "ca-certificates")
REQUIREMENTS = REPO_ROOT / "requirements" / "worker-cpu.txt"
CONSTRAINTS = REPO_ROOT / "docker" / "constraints" / "tf-2.21.txt"  # the same pins as the tf2.21-cpu image
REPOSITORY = "suite-test-base"
TEST_VARIANT = "tf2.21-cpu"  # the images.yaml entry built on top; its pins match REQUIREMENTS
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"  # on Debian's python3 path
# Trimmed after install: not needed to run Python, and a third of a minimal root.
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")


class BaseImageError(Exception):
    """The base image could not be made; the message says which step and why."""


def requirement_lines() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def inputs_hash() -> str:
    """Hash of the recipe: same inputs, same tag, so the engine's copy is reused."""
    parts = [
        RECIPE_VERSION,
        DEBIAN_SUITE,
        DEBIAN_MIRROR,
        *DEBIAN_PACKAGES,
        *requirement_lines(),
        CONSTRAINTS.read_text(encoding="utf-8"),
        _host_python_tag(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def base_tag() -> str:
    return f"{REPOSITORY}:{inputs_hash()[:16]}"


def ensure_base_image(client, progress: Callable[[str], None] = print) -> str:
    """The tag of the registry-free base image, built only when the engine does not have it."""
    import docker

    tag = base_tag()
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    missing = [tool for tool in ("debootstrap", "tar") if shutil.which(tool) is None]
    if missing:
        raise BaseImageError(f"cannot build {tag}: {', '.join(missing)} not installed (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise BaseImageError(f"cannot build {tag}: debootstrap needs root")
    with tempfile.TemporaryDirectory(prefix="suite-base-", dir=os.environ.get("SUITE_BASE_WORKDIR")) as work:
        root, tarball = Path(work, "root"), Path(work, "root.tar")
        _debootstrap(root, progress)
        _pip_install(root, progress)
        for rel in TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        progress(f"packing {root} for docker import")
        _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tarball), "."], "tar")
        progress(f"importing as {tag}")
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(
            str(tarball),
            repository=repository,
            tag=version,
            changes=[
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV LANG=C.UTF-8",
                'CMD ["python3"]',
            ],
        )
    client.images.get(tag)  # raises if the import did not produce it
    return tag


def ensure_test_image(client, progress: Callable[[str], None] = print) -> str:
    """The project's Dockerfile built on the base above; returns the image tag the tests run."""
    from suite import images

    base = ensure_base_image(client, progress)
    built = images.build_images(
        [TEST_VARIANT], base_override={"BASE_IMAGE": base, "INSTALL": "0"}, progress=progress, client=client
    )
    return built[0]["tag"]


def _debootstrap(root: Path, progress: Callable[[str], None]) -> None:
    progress(f"debootstrap {DEBIAN_SUITE} from {DEBIAN_MIRROR} (a few minutes)")
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(DEBIAN_PACKAGES)}",
        DEBIAN_SUITE,
        str(root),
        DEBIAN_MIRROR,
    ]
    _run(cmd, "debootstrap")


def _pip_install(root: Path, progress: Callable[[str], None]) -> None:
    """The host's pip installs into the root's site-packages: the root itself needs no pip."""
    progress(f"pip install {' '.join(requirement_lines())} (constraints {CONSTRAINTS.name}) into the root")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--target",
        str(root / SITE_PACKAGES),
        "-r",
        str(REQUIREMENTS),
        "-c",
        str(CONSTRAINTS),
    ]
    if sys.version_info[:2] != (3, 11):
        # Another host Python: ask for wheels made for the root's interpreter instead.
        cmd += [
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--abi",
            "cp311",
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
        ]
    _run(cmd, "pip install")


def _host_python_tag() -> str:
    return f"host-py{sys.version_info[0]}.{sys.version_info[1]}"


def _run(cmd: list[str], step: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr)[-3000:]
        raise BaseImageError(f"{step} failed with exit code {proc.returncode}:\n{out}")


if __name__ == "__main__":
    import docker

    engine = docker.from_env()
    print(ensure_base_image(engine))
    print(ensure_test_image(engine))
