"""The Keras backend is a spec field: the same scenario runs on JAX (and PyTorch) where installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import suite_cli, write_scenario

from suite.record import results

pytestmark = pytest.mark.slow

TEXT = """\
name: backend_{backend}
question: Does the {backend} path run?
model: {{hidden: [64]}}
training: {{optimizer: adam, epochs: 2, steps_per_execution: {spe}}}
data: {{allow_synthetic: true, train_samples: 1024, test_samples: 256}}
backend: {backend}
repeats: 1
matrix:
  training.jit_compile: [false, true]
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_scenario_runs_on_another_keras_backend(tmp_path: Path, backend: str) -> None:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed here (requirements/dev.txt installs jax only)")
    spe = 1 if backend == "torch" else 4  # Keras: steps_per_execution is not supported with torch
    path = write_scenario(tmp_path, f"backend_{backend}", TEXT.format(backend=backend, spe=spe))
    proc = suite_cli(
        "run", path, "--backend", "local", "--results", tmp_path / "res", "--machine", "m", "--allow-synthetic"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [r for _, r in results.load_folder(tmp_path / "res")]
    assert len(runs) == 2 and all(r.ok for r in runs)
    for r in runs:
        assert r.environment["versions"]["keras_backend"] == backend
        assert r.environment["versions"][backend]
        assert r.run["settings"]["jit_compile"] == r.spec["config"]["training"]["jit_compile"]
        assert r.quality["test_accuracy"] > 0.8


def test_backend_not_installed_is_skipped_with_reason(tmp_path: Path) -> None:
    missing = next((b for b in ("torch", "jax") if importlib.util.find_spec(b) is None), None)
    if missing is None:
        pytest.skip("every Keras backend is installed here")
    path = write_scenario(tmp_path, "nobackend", TEXT.format(backend=missing, spe=1))
    proc = suite_cli(
        "run", path, "--backend", "local", "--results", tmp_path / "res", "--machine", "m", "--allow-synthetic"
    )
    assert proc.returncode == 0
    runs = [r for _, r in results.load_folder(tmp_path / "res")]
    assert all(r.status == "skipped" and f"Keras backend {missing!r} is not installed" in r.message for r in runs)
