"""Shared test fixtures: paths, the real MNIST digits, a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
MNIST_DIR = Path(os.environ.get("SUITE_MNIST_DIR", REPO.parent / "shared" / "data" / "mnist"))


@pytest.fixture
def mnist_dir() -> Path:
    if not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST test set not found in {MNIST_DIR} (set SUITE_MNIST_DIR)")
    return MNIST_DIR


def suite_cli(*args: str, cwd: Path = REPO, timeout: float = 900, env: dict | None = None):
    """Run `python -m suite ...` as a user would; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "suite", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def write_scenario(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path
