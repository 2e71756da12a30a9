"""The Python the project declares is one its pinned packages install on, and setup refuses older ones."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#]+)")
# The pins that moved the floor to 3.11; each must be pinned and checked, not silently skipped.
MUST_CHECK = ("numpy", "matplotlib", "keras")


def _pins() -> dict[str, str]:
    pins = {}
    for path in sorted((REPO / "requirements").glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            match = PIN.match(line.strip())
            if match:
                pins[match.group(1).lower()] = match.group(2)
    return pins


def _project_floor() -> str:
    spec = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    match = re.fullmatch(r"\s*>=\s*(\d+(?:\.\d+)*)\s*", spec)
    assert match, f"requires-python {spec!r}: expected a plain '>=X.Y' floor"
    return match.group(1)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _allows(requires_python: str, python: str) -> bool:
    """Whether ``python`` satisfies a Requires-Python specifier (only its lower bounds without packaging)."""
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        floors = re.findall(r">=\s*(\d+(?:\.\d+)*)", requires_python)
        return all(_version(python) >= _version(f) for f in floors)
    return SpecifierSet(requires_python).contains(python)


def test_the_packages_that_need_311_are_pinned() -> None:
    assert set(MUST_CHECK) <= set(_pins())


@pytest.mark.parametrize("name", sorted(_pins()))
def test_project_floor_is_not_below_a_pinned_package(name: str) -> None:
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        if name in MUST_CHECK:
            raise
        pytest.skip(f"{name} is not installed here (another requirements file)")
    pinned = _pins()[name]
    if installed != pinned:
        pytest.skip(f"{name} {installed} is installed, not the pinned {pinned}: its metadata says nothing of the pin")
    requires = importlib.metadata.metadata(name)["Requires-Python"]
    if not requires:
        return
    floor = _project_floor()
    assert _allows(requires, floor), f"{name}=={pinned} requires Python {requires}; pyproject says >={floor}"


def test_ruff_targets_the_project_floor() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["ruff"]["target-version"] == "py" + _project_floor().replace(".", "")


def _fake_python(path: Path, version: str) -> Path:
    # Answers the two questions ensure_venv asks, as an interpreter of that version would.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'#!/bin/sh\ncase "$2" in\n  *version_info*) exit 1 ;;\n  *python_version*) echo {version} ;;\nesac\n',
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def _ensure_venv(venv: Path, python: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # The interpreter is checked before any lock is read: the (empty) locks folder is never reached.
    return subprocess.run(
        ["bash", "-c", '. requirements/ensure_venv.sh && ensure_venv "$1" dev', "_", str(venv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": python, "SUITE_LOCKS_DIR": str(tmp_path / "no-locks")},
    )


def test_setup_refuses_an_interpreter_older_than_311(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    proc = _ensure_venv(venv, str(_fake_python(tmp_path / "python3.10", "3.10.12")), tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Python 3.11+ is needed" in proc.stderr and "Python 3.10.12" in proc.stderr, proc.stderr
    assert not venv.exists(), "no venv is made with the wrong interpreter"


def test_setup_refuses_an_existing_venv_of_an_older_python(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _fake_python(venv / "bin" / "python", "3.10.12")
    proc = _ensure_venv(venv, "python3", tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Python 3.11+ is needed" in proc.stderr and f"Remove {venv}" in proc.stderr, proc.stderr


def test_setup_names_an_interpreter_that_does_not_run(tmp_path: Path) -> None:
    proc = _ensure_venv(tmp_path / "venv", str(tmp_path / "no-such-python"), tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Python 3.11+ is needed" in proc.stderr and "not runnable" in proc.stderr, proc.stderr
