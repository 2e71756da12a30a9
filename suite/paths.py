"""Where the suite's own files lie, and where a user's files are looked for.

The suite runs in one of two ways:

- **from a checkout** (``./run_all.sh``, ``python -m suite`` in the clone, or ``pip install -e .``):
  the package sits beside ``docker/``, ``requirements/`` and ``pyproject.toml``. Its data is read
  there, and the user's folders (``scenarios/``, ``reports/``) are the checkout's, wherever the
  command is started from, as they always were.
- **installed** (``pip install .`` or a wheel): the image recipes and locks travel inside the
  package as ``suite/_data/docker`` and ``suite/_data/requirements`` (the build puts them there,
  see ``setup.py``), and the user's folders are relative to the working directory.

Nothing else in the suite works out these places.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DISTRIBUTION = "keras-speed-suite"
CACHE_ENV = "SUITE_CACHE_DIR"


def _checkout(top: Path) -> Path | None:
    """``top`` when it is this package's checkout (or a copy of its folders): the image catalog lies
    there. Installed, ``top`` is site-packages, whose ``docker/`` is the Docker SDK."""
    if (top / "docker" / "images.yaml").is_file():
        return top
    return None


CHECKOUT: Path | None = _checkout(PACKAGE_DIR.parent)
"""The checkout this package runs from; None for an installed package."""

DATA_DIR: Path = CHECKOUT if CHECKOUT is not None else PACKAGE_DIR / "_data"
"""The folder that holds ``docker/`` and ``requirements/`` (the image catalog, the recipes, the locks)."""

DOCKER_DIR = DATA_DIR / "docker"
REQUIREMENTS_DIR = DATA_DIR / "requirements"
IMPORT_ROOT = PACKAGE_DIR.parent
"""The folder that holds the ``suite`` package: what another interpreter needs on its path to import it."""


def project_root() -> Path:
    """Where a user's relative paths start: the checkout, or (installed) the working directory
    (``.`` where that folder was deleted: a command then fails on the path it needs, not at start)."""
    if CHECKOUT is not None:
        return CHECKOUT
    try:
        return Path.cwd()
    except OSError:
        return Path(".")


def default_scenarios() -> Path:
    return project_root() / "scenarios"


def default_results() -> Path:
    return project_root() / "reports" / "results"


def default_reports() -> Path:
    return project_root() / "reports"


def version() -> str:
    """The suite's version: pyproject.toml's in a checkout, the installed distribution's otherwise;
    ``unknown`` where neither can be read."""
    import tomllib

    if CHECKOUT is not None:
        try:
            return str(tomllib.loads((CHECKOUT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])
        except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
            return "unknown"
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def cache_dir() -> Path | None:
    """Where this user's suite keeps what it can always make again (which result files it has
    checked, plots it has drawn): ``$SUITE_CACHE_DIR``, else ``$XDG_CACHE_HOME/keras-speed-suite``,
    else ``~/.cache/keras-speed-suite``; None (nothing is kept) where no home folder is known, or
    the package's code cannot be told by its bytes (``code_digest``). Not meant to lie inside a
    results folder, which may come from anyone (``checked_files`` keeps no list there)."""
    if code_digest() is None:
        return None
    if given := os.environ.get(CACHE_ENV):
        return Path(given).absolute()
    if base := os.environ.get("XDG_CACHE_HOME"):
        return Path(base).absolute() / DISTRIBUTION
    try:
        return Path.home() / ".cache" / DISTRIBUTION
    except (RuntimeError, KeyError):  # no HOME and no passwd entry (a container run as a bare uid)
        return None


@functools.cache
def code_digest() -> str | None:
    """sha256 of this package's Python files, names and bytes: what a cached verdict or drawing
    was made by, so any change to the code, the checks' helpers included, makes everything anew.
    None (nothing is cached) where a module's source cannot be read or there is none (a package
    installed as bytecode only): then what made a cached entry cannot be told apart."""
    digest, found = hashlib.sha256(), False
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if not path.is_file():  # a dangling link (an editor's lock file), a FIFO: not a module
            continue
        try:
            data = path.read_bytes()
        except OSError:
            return None
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + data + b"\0")
        found = True
    return digest.hexdigest() if found else None
