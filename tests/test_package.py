"""The package as a user installs it: a wheel built from this tree, installed into a fresh venv and
run from a folder outside the clone, and the install's declared dependencies against the locks.

The wheel is built offline with the locked setuptools (``--no-build-isolation``) from a copy of the
tree, so the checkout gets no build folders; the fresh venv sees the locked venv's packages through a
``.pth`` file (the install takes ``--no-deps``), so nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, closed_url, copy_of_checkout

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))

MY_SCENARIO = """\
name: my_tiny_mlp
question: Is a 32-unit MLP fast on this CPU?
model:
  kind: mlp
  hidden: [32]
training:
  epochs: 1
data:
  dataset: mnist
  allow_synthetic: true
  train_samples: 1024
  test_samples: 256
repeats: 1
matrix:
  device: [cpu]
report:
  verdict: none
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Looked up, not imported: setuptools puts its vendored packages on sys.path when imported, and
    # this process's installed distributions must stay those of the lock.
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("the locked dev venv's setuptools builds the wheel offline; it is not installed")
    src = copy_of_checkout(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, src],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = dist.glob("keras_speed_suite-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed, the locked venv's packages beside it; its bin folder."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "locked-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return venv / "bin"


def _user_env() -> dict[str, str]:
    """The environment of a user's shell: nothing points into the clone."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def test_the_wheel_carries_the_code_its_data_the_command_and_the_license(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in (
        "suite/cli/__init__.py",
        "suite/worker/__main__.py",
        "suite/backends/docker.py",
        "suite/telemetry/__init__.py",
        "suite/_data/docker/images.yaml",
        "suite/_data/docker/images.lock",
        "suite/_data/docker/Dockerfile",
        "suite/_data/requirements/locks/run-py3.11.txt",
        "suite/_data/requirements/ensure_venv.sh",
    ):
        assert need in names, f"{need} missing from {wheel.name}"
    assert not [n for n in names if n.startswith(("tests/", "scenarios/", "reports/", "benchmarks/"))]
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert f"{info}/licenses/LICENSE" in names
    entry = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert re.search(r"^suite = suite\.cli:console$", entry, re.M), entry
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Requires-Dist: tensorflow>=2.16" in metadata
    assert "Provides-Extra: gpu" in metadata and "Provides-Extra: cluster" in metadata


def test_the_installed_command_runs_a_users_scenario_from_any_folder(installed: Path, tmp_path: Path) -> None:
    """`suite --version`, `check --smoke` on a file given by path, one smoke run on the local
    backend and its report, all from a folder outside the clone: results and pages land there."""
    work = tmp_path / "my-project"
    (work / "questions").mkdir(parents=True)
    (work / "questions" / "tiny.yaml").write_text(MY_SCENARIO, encoding="utf-8")
    suite = installed / "suite"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([suite, *args], cwd=work, env=_user_env(), capture_output=True, text=True, timeout=600)

    where = subprocess.run(
        [installed / "python", "-c", "import suite; print(suite.__file__)"],
        cwd=work,
        env=_user_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(installed.parent) in where and str(REPO) not in where, where

    version = run("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(f"keras-speed-suite {PYPROJECT['project']['version']} (installed package at ")

    check = run("check", "--smoke", "--backend", "local", "questions/tiny.yaml")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "my_tiny_mlp" in check.stdout and "run" in check.stdout

    done = run("run", "--smoke", "--backend", "local", "--machine", "laptop", "questions/tiny.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = (work / "reports" / "results" / "laptop" / "my_tiny_mlp").rglob("*.json")
    record = json.loads(result.read_text(encoding="utf-8"))
    assert record["status"] == "ok", record.get("error")
    suite_block = record["provenance"]["suite"]
    assert suite_block["version"] == PYPROJECT["project"]["version"] and suite_block["git_revision"] is None

    # The image catalog and recipes come from the package's own copy: the same recipe hash as here,
    # so an installed suite and a clone of the same version run in the same images.
    code = (
        "from suite.environment import image_catalog as c; "
        "print(c.CATALOG); print(c.recipe_hash(c.load_catalog(), 'tf2.21-cpu'))"
    )
    shown = subprocess.run(
        [installed / "python", "-c", code], cwd=work, env=_user_env(), capture_output=True, text=True, check=True
    ).stdout.split()
    from suite.environment import image_catalog

    assert shown == [
        str(Path(where).parent / "_data" / "docker" / "images.yaml"),
        image_catalog.recipe_hash(image_catalog.load_catalog(), "tf2.21-cpu"),
    ]
    listed = run("images", "list")
    assert listed.returncode == 0 and "suite-bench:tf2.21-cpu" in listed.stdout, listed.stdout + listed.stderr
    lock = run("images", "lock")
    assert lock.returncode == 2 and "run it from a clone" in lock.stderr, lock.stderr

    page = run("report")
    assert page.returncode == 0, page.stdout + page.stderr
    assert "Is a 32-unit MLP fast on this CPU?" in (work / "reports" / "my_tiny_mlp.md").read_text(encoding="utf-8")
    assert not (REPO / "reports" / "my_tiny_mlp.md").exists()


def _requirements(path: Path) -> dict[str, str]:
    """name -> pinned version of a requirements input file (requirements/*.txt), lower-cased names."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;]+)", line.strip())
        if m:
            pins[m.group(1).lower()] = m.group(3)
    return pins


@pytest.mark.parametrize(
    ("inputs", "group", "renamed", "left_out"),
    [
        (("host.txt", "worker-cpu.txt"), None, {"tensorflow-cpu": "tensorflow"}, {"pip"}),
        (("worker-gpu.txt",), "gpu", {}, {"keras", "numpy"}),
        (("cluster.txt",), "cluster", {}, set()),
        (("dev.txt",), "dev", {}, set()),
    ],
)
def test_declared_dependencies_are_the_locks_inputs_and_admit_the_locked_pins(
    inputs: tuple[str, ...], group: str | None, renamed: dict[str, str], left_out: set[str]
) -> None:
    """Each top-level input of a lock is declared (base or its extra) with a range the pin lies in,
    and nothing is declared that no lock has: `pip install .` and the locked path agree."""
    from packaging.requirements import Requirement

    project = PYPROJECT["project"]
    specs = project["dependencies"] if group is None else project["optional-dependencies"][group]
    declared = {Requirement(s).name.lower(): Requirement(s).specifier for s in specs}
    pins = {}
    for name in inputs:
        pins.update(_requirements(REPO / "requirements" / name))
    wanted = {renamed.get(n, n): v for n, v in pins.items() if n not in left_out}
    assert set(declared) == set(wanted), (sorted(declared), sorted(wanted))
    for name, version in wanted.items():
        assert declared[name].contains(version), f"{name}=={version} (locked) outside {declared[name]} (pyproject)"


def test_installed_ray_ships_the_package_with_its_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `--backend ray` hands Ray: the checkout from a clone, the package folder when installed
    (site-packages as a working folder would ship every installed package)."""
    from suite import paths
    from suite.backends.ray_cluster import head

    assert head.shipped_code(None)["working_dir"] == str(REPO)
    monkeypatch.setattr(paths, "CHECKOUT", None)
    assert head.shipped_code(None) == {"py_modules": [str(paths.PACKAGE_DIR)]}


def test_the_installed_package_runs_on_a_local_ray_instance(installed: Path, tmp_path: Path) -> None:
    """Installed, `--backend ray` ships the package (with its data) as Ray's py_modules, not
    site-packages as a working folder; the run comes back ok from a Ray task."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (the dev lock has it)")
    work = tmp_path / "proj"
    work.mkdir()
    (work / "tiny.yaml").write_text(MY_SCENARIO, encoding="utf-8")
    env = {**_user_env(), "SUITE_RAY_NODE_BACKEND": "local", "SUITE_MNIST_URL": closed_url()}
    proc = subprocess.run(
        [installed / "suite", "run", "--smoke", "--backend", "ray", "tiny.yaml"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = (work / "reports" / "results").rglob("*.json")
    record = json.loads(result.read_text(encoding="utf-8"))
    assert record["status"] == "ok" and record["run"]["ray"]["task_id"], record.get("message")
