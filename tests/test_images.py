"""The image catalog and build recipes, without an engine: names, pins, hashes, labels, lock."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import suite_cli

from suite import image_catalog

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def test_catalog_names_the_required_variants() -> None:
    catalog = image_catalog.load_catalog()
    gpu21, gpu17, cpu21 = (catalog.get(n) for n in ("tf2.21-cuda12.5", "tf2.17-cuda12.3", "tf2.21-cpu"))
    assert gpu21.gpu and gpu21.tensorflow == "tensorflow[and-cuda]==2.21.0" and gpu21.cuda == "12.5"
    assert gpu17.gpu and gpu17.tensorflow == "tensorflow[and-cuda]==2.17.1" and gpu17.cuda == "12.3"
    assert not cpu21.gpu and cpu21.tensorflow == "tensorflow-cpu==2.21.0"
    assert catalog.default_for(True) == "tf2.21-cuda12.5" and catalog.default_for(False) == "tf2.21-cpu"
    for d in catalog.images.values():
        assert ":" in d.base and "latest" not in d.base, f"{d.name}: base must be pinned by tag"
        assert "tensorflow/tensorflow" not in d.base, "the official -gpu images lack cuDNN 9 (see docker/README.md)"


@pytest.mark.parametrize("name,cudnn", [("tf2.21-cuda12.5", "9.3.0.75"), ("tf2.17-cuda12.3", "8.9.7.29")])
def test_constraints_pin_every_cuda_wheel_exactly(name: str, cudnn: str) -> None:
    d = image_catalog.load_catalog().get(name)
    lines = [ln for ln in (DOCKER / d.constraints).read_text().splitlines() if ln and not ln.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9._-]+==[^=<>,;]+", ln) for ln in lines), "exact pins only"
    pins = dict(ln.split("==") for ln in lines)
    assert pins["nvidia-cudnn-cu12"] == cudnn
    nvidia = [p for p in pins if p.startswith("nvidia-")]
    assert len(nvidia) == 12  # every CUDA wheel tensorflow[and-cuda] pulls in
    assert "tensorflow" not in pins  # the requirement itself states the version


def test_one_dockerfile_parametrised_by_build_args() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    for arg in ("BASE_IMAGE", "PYTHON", "TF_REQUIREMENT", "EXTRA_REQUIREMENTS", "CONSTRAINTS", "INSTALL"):
        assert re.search(rf"^ARG {arg}\b", text, re.M), arg
    assert len(list(DOCKER.glob("Dockerfile*"))) == 1


def test_recipe_hash_follows_args_and_override_never_takes_the_real_tag() -> None:
    catalog = image_catalog.load_catalog()
    real = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={})
    again = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={})
    assert real.tag == "suite-bench:tf2.21-cpu" and real.context_hash == again.context_hash
    assert real.labels["suite.context_hash"] == real.context_hash
    assert set(real.files) == {"Dockerfile", "constraints/tf-2.21.txt"}
    custom = image_catalog.plan_build(
        catalog, "tf2.21-cpu", lock={}, base_override={"BASE_IMAGE": "x:1", "INSTALL": "0"}
    )
    assert custom.context_hash != real.context_hash
    assert custom.tag.startswith("suite-bench:tf2.21-cpu-x") and custom.tag != real.tag
    with pytest.raises(image_catalog.ImageError, match="unknown build arg"):
        image_catalog.plan_build(catalog, "tf2.21-cpu", lock={}, base_override={"NOPE": "1"})


def test_locked_digest_replaces_the_base_tag() -> None:
    catalog = image_catalog.load_catalog()
    digest = "sha256:" + "ab" * 32
    lock = {"python:3.11-slim-bookworm": {"digest": digest}}
    built = image_catalog.plan_build(catalog, "tf2.21-cuda12.5", lock=lock)
    assert built.buildargs["BASE_IMAGE"] == f"python@{digest}"
    assert built.labels["suite.base.digest"] == digest and built.labels["suite.base.ref"] == "python:3.11-slim-bookworm"
    assert image_catalog.pinned_base("registry.example:5000/py:3.11", {}) == "registry.example:5000/py:3.11"
    lock2 = {"registry.example:5000/py:3.11": {"digest": digest}}
    assert image_catalog.pinned_base("registry.example:5000/py:3.11", lock2) == f"registry.example:5000/py@{digest}"


def test_catalog_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "images.yaml"
    bad.write_text(
        "defaults: {gpu: a, cpu: a}\nimages:\n  a: {gpu: yes-please, base: b:1, tensorflow: t, "
        "constraints: constraints/tf-2.21.txt}\n"
    )
    with pytest.raises(image_catalog.ImageError, match=r"images\.yaml: images\.a\.gpu"):
        image_catalog.load_catalog(bad)
    bad.write_text(
        "images:\n  a: {gpu: true, base: b:1, tensorflow: t, constraints: constraints/tf-2.21.txt, colour: red}\n"
    )
    with pytest.raises(image_catalog.ImageError, match=r"images\.a: unknown key.*colour"):
        image_catalog.load_catalog(bad)


@pytest.mark.parametrize("action", ["build", "lock"])
def test_cli_unknown_image_is_bad_input_before_any_engine(action: str) -> None:
    # An address where nothing listens: the name must be refused before any connection is tried.
    proc = suite_cli("images", action, "NOSUCH", "--docker-host", "tcp://127.0.0.1:9", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "no Docker engine" not in proc.stderr, proc.stderr
    assert "no image named 'NOSUCH'" in proc.stderr
    assert all(name in proc.stderr for name in image_catalog.load_catalog().images), proc.stderr
