"""Hash-locked requirement files, and whether an interpreter holds what its lock says.

A lock (``requirements/locks/<env>-py<X.Y>.txt``, ``docker/locks/<image>.txt``, written by
``requirements/lock.sh``) pins every package of an environment, transitive ones included, with the
sha256 of its files. ``requirements/ensure_venv.sh`` installs a venv from one with
``pip install --require-hashes`` and records which in ``<venv>/.suite-lock.json``; a result quotes
that record, so a number can be traced to the exact packages that produced it. The record alone
says what was installed once; ``installed_differences`` says whether it still holds (a later
``pip install`` in the venv would otherwise go unnoticed).

Only the standard library is used: ensure_venv runs this module (``python -m suite.environment.locks``) in a
venv that may hold nothing else yet.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import sys
from pathlib import Path
from typing import Any

from suite import paths
from suite.safe import bounded

MAX_LOCK_BYTES = 16 * bounded.MiB  # a lock of a few hundred pinned packages and their hashes is under 1 MiB

LOCK_RECORD = ".suite-lock.json"
# The host environments (``requirements/environments.txt``, which the shell scripts read too): each
# one's top-level requirement files, and the environment it extends (its lock compiled under that one's).
ENVIRONMENTS_FILE = paths.REQUIREMENTS_DIR / "environments.txt"


def read_environments(path: Path = ENVIRONMENTS_FILE) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """({name: its requirement files}, {name: the environment it extends}) from ``path``."""
    inputs: dict[str, tuple[str, ...]] = {}
    extends: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        name, base, *files = fields
        inputs[name] = tuple(files)
        if base != "-":
            extends[name] = base
    return inputs, extends


ENVIRONMENTS, EXTENDS = read_environments()
LOCKED_PYTHONS = ("3.11", "3.12")
# What ``python -m venv`` puts into every venv to install the rest. The host locks pin it
# (requirements/host.txt): a venv is born with whatever pip its Python build bundles, and pip's
# behaviour differs by version. A lock that does not pin it (an image's) says nothing about it:
# then it is neither compared nor ever removed as extraneous.
INSTALLER = frozenset({"pip"})

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*(?P<version>[^\s;\\#]+)")


def normalize(name: str) -> str:
    """The PEP 503 form of a project name: 'PyYAML' and 'pyyaml', 'typing_extensions' and 'typing-extensions' agree."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_sha256(path: str | Path) -> str:
    """sha256 of the lock file's bytes: what ``.suite-lock.json`` and image labels record of a lock."""
    return hashlib.sha256(bounded.read_bytes(path, MAX_LOCK_BYTES)).hexdigest()


def read_pins(path: str | Path) -> dict[str, str]:
    """{normalized project name: version} of every requirement of a lock file.

    A lock names each package once, pinned with ``==``; anything else (a range, a bare name, an
    option such as ``-r``) means the file is no lock, and a ValueError names the file and line.
    Hash options and comments are skipped; an environment marker is ignored (the locks here are
    resolved for one platform and carry none).
    """
    path = Path(path)
    pins: dict[str, str] = {}
    continued = False
    for number, raw in enumerate(bounded.read_text(path, MAX_LOCK_BYTES).splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        was_continued, continued = continued, line.endswith("\\")
        if not line or was_continued or raw[:1].isspace():
            continue  # blank, comment, or the --hash lines that continue a requirement
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"{path}:{number}: {line!r} is not a pinned requirement (NAME==VERSION)")
        name = normalize(match.group("name"))
        if name in pins:
            raise ValueError(f"{path}:{number}: {name} is pinned twice")
        pins[name] = match.group("version")
    return pins


def venv_lock(prefix: str | None = None) -> dict[str, Any] | None:
    """The ``.suite-lock.json`` ensure_venv wrote into the venv at ``prefix`` (default: this interpreter's).

    None when there is none (a venv made by hand, a system Python, an image); a ValueError naming
    the file when it is not a JSON object.
    """
    path = Path(sys.prefix if prefix is None else prefix) / LOCK_RECORD
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a JSON object with environment, lock_file, lock_sha256, python")
    return record


def installed() -> dict[str, str]:
    """{normalized name: version} of the distributions the running interpreter can import (its
    sys.path), less a package's own copies that it put on sys.path when imported: a folder inside
    site-packages (``ray/thirdparty_files`` holds psutil and colorama, ``setuptools/_vendor`` its
    own), whose distributions were installed as part of that package, not from any lock."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[p for p in sys.path if not _inside_site_packages(p)]):
        name = dist.metadata["Name"]
        if name:
            # The first on sys.path wins, as it does for an import.
            found.setdefault(normalize(name), dist.version)
    return found


def _inside_site_packages(entry: str) -> bool:
    """A folder inside site-packages that is not an installed egg (which a .pth file names there)."""
    inside = any(part in ("site-packages", "dist-packages") for part in Path(entry).parts[:-1])
    return inside and not entry.endswith(".egg")


def installed_differences(pins: dict[str, str]) -> list[str]:
    """How the running interpreter's installed distributions differ from ``pins`` (empty: they match).

    One line per package, sorted by name: "numpy 2.4.6 in the lock, 2.3.0 installed",
    "foo installed, not in the lock", "bar 1.0 in the lock, not installed". pip is compared when the
    lock pins it and left out when it does not (see INSTALLER).
    """
    pins = {normalize(name): version for name, version in pins.items()}
    have = {name: version for name, version in installed().items() if name in pins or name not in INSTALLER}
    lines = []
    for name in sorted(set(pins) | set(have)):
        if name not in have:
            lines.append(f"{name} {pins[name]} in the lock, not installed")
        elif name not in pins:
            lines.append(f"{name} installed, not in the lock")
        elif have[name] != pins[name]:
            lines.append(f"{name} {pins[name]} in the lock, {have[name]} installed")
    return lines


def extraneous(pins: dict[str, str]) -> list[str]:
    """Installed distributions the lock does not name (pip aside): what a sync with the lock removes."""
    locked = {normalize(name) for name in pins}
    return sorted(name for name in installed() if name not in locked and name not in INSTALLER)


def read_hashes(path: str | Path) -> dict[str, set[str]]:
    """{normalized project name: the sha256 digests its ``--hash`` options list} of a lock file."""
    path = Path(path)
    read_pins(path)  # the same checks: a file that is no lock says so
    hashes: dict[str, set[str]] = {}
    current: set[str] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        text = raw.split(" #", 1)[0].strip()
        if not raw[:1].isspace():
            match = _PIN.match(text)
            current = hashes.setdefault(normalize(match.group("name")), set()) if match else None
        for digest in re.findall(r"--hash=sha256:([0-9a-fA-F]{64})", text):
            if current is not None:
                current.add(digest.lower())
    return hashes


def unlocked_wheels(path: str | Path, folder: str | Path) -> list[str]:
    """The wheels in ``folder`` whose sha256 the lock does not list for their project (or whose project it
    does not name), one readable line each: empty when every file is one a locked install would take."""
    hashes = read_hashes(path)
    lines = []
    for wheel in sorted(Path(folder).glob("*.whl")):
        name = normalize(wheel.name.split("-", 1)[0])
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if name not in hashes:
            lines.append(f"{wheel.name}: {name} is not in {path}")
        elif digest not in hashes[name]:
            lines.append(
                f"{wheel.name}: sha256 {digest} is not among the {len(hashes[name])} hashes {path} lists for {name}"
            )
    return lines


def installer_requirements(path: str | Path) -> str:
    """The lock's own lines for its installer (``pip==X \\`` and its ``--hash`` lines), ready to be a
    requirements file of its own; empty when the lock does not pin it.

    ensure_venv installs these first, with ``--require-hashes --no-deps``, so that the pip the lock
    pins (not the one the venv was born with) installs the rest. Hashes cannot be given to pip on its
    command line, only in a file.
    """
    path = Path(path)
    pinned = {normalize(name) for name in read_pins(path)} & INSTALLER  # validates the whole file first
    requirements: list[list[str]] = []  # [requirement, --hash=..., ...] per pinned installer
    for raw in path.read_text(encoding="utf-8").splitlines():
        text = raw.split(" #", 1)[0].strip().rstrip("\\").strip()
        if not raw[:1].isspace():
            match = _PIN.match(text)
            if match and normalize(match.group("name")) in pinned:
                requirements.append([text])
                continue
            if text:
                requirements.append([])  # another package: its hash lines are not the installer's
        elif text.startswith("--hash") and requirements and requirements[-1]:
            requirements[-1].append(text)
    return "".join(" \\\n    ".join(parts) + "\n" for parts in requirements if parts)


def main(argv: list[str] | None = None) -> int:
    """``python -m suite.environment.locks extraneous LOCK`` prints one name a line; ``check LOCK`` prints the
    differences and exits 1 when there are any; ``installer LOCK`` prints the lock's pip requirement
    with its hashes, or nothing (all for requirements/ensure_venv.sh); ``check-wheels LOCK
    FOLDER`` exits 1, naming each, when a wheel there is not a file the lock hashes (for
    benchmarks/gpu_evidence.sh)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "check-wheels":
        try:
            wrong = unlocked_wheels(args[1], args[2])
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for line in wrong:
            print(f"error: {line}", file=sys.stderr)
        return 1 if wrong else 0
    if len(args) != 2 or args[0] not in ("extraneous", "check", "installer"):
        print(
            "usage: python -m suite.environment.locks {extraneous,check,installer} LOCK_FILE"
            " | check-wheels LOCK_FILE FOLDER",
            file=sys.stderr,
        )
        return 2
    try:
        pins = read_pins(args[1])
        if args[0] == "installer":
            sys.stdout.write(installer_requirements(args[1]))
            return 0
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args[0] == "extraneous":
        for name in extraneous(pins):
            print(name)
        return 0
    differences = installed_differences(pins)
    for line in differences:
        print(f"error: {sys.prefix} differs from {args[1]}: {line}", file=sys.stderr)
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
