"""Fixtures and helpers the Docker tests share: the engine, the registry-free test image, small specs.

Test modules import the fixtures by their function names; pytest finds them by their fixture names.
Without an engine these tests skip with the reason; with SUITE_REQUIRE_DOCKER=1 they fail instead,
so CI cannot pass by skipping them where an engine exists.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import once_per_run

from suite.backends.docker import DockerBackend
from suite.spec import plan, scenario
from suite.spec.plan import RunSpec

REPO = Path(__file__).resolve().parents[1]
REQUIRED = os.environ.get("SUITE_REQUIRE_DOCKER") == "1"

SMALL_SCENARIO = """\
name: {name}
question: Does a run in a container give a result?
model:
  kind: mlp
  hidden: [64, 32]
  activation: relu
  dropout: 0.1
training:
  optimizer: adam
  loss: categorical_crossentropy
  batch_size: 128
  epochs: 2
data:
  dataset: mnist
  allow_synthetic: true
  train_samples: 1024
  test_samples: 256
repeats: 1
timeout_s: 600
matrix:
  model.hidden.0: {widths}
  device: [cpu]
smoke:
  training.epochs: 2
"""


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"SUITE_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", name="client")
def engine_client() -> Any:
    try:
        import docker  # noqa: F401

        from suite.environment import docker_engine

        engine_client, _ = docker_engine.connect(timeout=60)
        engine_client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no engine": skip or fail below
        _unavailable(f"no Docker engine answers ({type(exc).__name__}: {exc})")
    yield engine_client
    engine_client.close()


@pytest.fixture(scope="session", name="test_image")
def image_fixture(client: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """suite-bench:tf2.21-cpu-x<hash>, built once per test run (the other workers wait for it);
    later runs find it on the engine."""
    sys.path.insert(0, str(REPO / "tests"))
    import docker_base

    def build(_: Path) -> dict:
        try:
            return {"tag": docker_base.ensure_test_image(client, progress=lambda line: None)}
        except docker_base.BaseImageError as exc:
            _unavailable(f"cannot build the registry-free test image: {exc}")
        raise AssertionError("unreachable")

    return once_per_run(tmp_path_factory, "test-image", build)["tag"]


@pytest.fixture(name="backend")
def backend_factory(test_image: str, tmp_path: Path):
    made: list[DockerBackend] = []

    def make(**kwargs: Any) -> DockerBackend:
        b = DockerBackend(machine="test", results_dir=tmp_path, image=kwargs.pop("image", test_image), **kwargs)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def assert_no_container_left(client: Any, label: str) -> None:
    left = client.containers.list(ignore_removed=True, all=True, filters={"label": label})
    assert left == [], f"containers left behind with {label}: {[c.name for c in left]}"


def small_specs(tmp_path: Path, name: str = "docker_small", widths: str = "[64]") -> list[RunSpec]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SMALL_SCENARIO.format(name=name, widths=widths), encoding="utf-8")
    return plan.expand(scenario.load(path), smoke=True)


def with_config(spec: RunSpec, **changes: Any) -> RunSpec:
    config = plan.with_data({**spec.config, **changes})  # the data identity follows a changed data section
    changed = replace(spec, config=config, fingerprint="")
    return replace(changed, fingerprint=plan.fingerprint_of(changed))


def session_containers(client: Any, session: str) -> list[Any]:
    return client.containers.list(ignore_removed=True, all=True, filters={"label": f"suite.session={session}"})


def sigkill_once_running(client: Any, label: str, proc: Any, seconds: float = 120) -> str:
    """Wait until a container with ``label`` runs, SIGKILL the orchestrator ``proc``; its session."""
    import time

    deadline = time.monotonic() + seconds
    running: list[Any] = []
    while time.monotonic() < deadline and not running and proc.poll() is None:
        running = client.containers.list(ignore_removed=True, filters={"label": label, "status": "running"})
        time.sleep(0.2)
    assert running, "the run's container never ran"
    proc.kill()  # SIGKILL: no cleanup of any kind on the orchestrator's side
    proc.wait()
    return running[0].labels["suite.session"]
