"""The image catalog and build recipes, without an engine: names, pins, hashes, labels, lock."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import suite_cli
from docker_fixtures import engine_client, image_fixture  # noqa: F401 - fixtures

from suite import debian_base, image_catalog, images

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


# -- building without a registry ------------------------------------------------------------------


def test_debian_route_is_the_real_image_with_its_own_recipe_hash() -> None:
    catalog = image_catalog.load_catalog()
    registry = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={})
    base = debian_base.recipe_for(catalog.get("tf2.21-cpu")).tag()
    debian = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={}, debian_base=base)
    assert debian.tag == registry.tag == "suite-bench:tf2.21-cpu"  # the real image, not a test stand-in
    assert debian.buildargs["BASE_IMAGE"] == base and debian.buildargs["INSTALL"] == "0"
    assert debian.context_hash != registry.context_hash
    assert debian.labels["suite.base.source"] == "debian" and registry.labels["suite.base.source"] == "registry"
    assert debian.labels["suite.base.ref"] == base and debian.labels["suite.base.digest"] == ""
    with pytest.raises(image_catalog.ImageError, match="either a base override or a Debian base"):
        image_catalog.plan_build(catalog, "tf2.21-cpu", lock={}, base_override={"INSTALL": "0"}, debian_base=base)


def test_debian_recipe_follows_requirements_and_pins_not_comments(tmp_path: Path) -> None:
    catalog = image_catalog.load_catalog()
    cpu = debian_base.recipe_for(catalog.get("tf2.21-cpu"))
    assert cpu.requirements == ("tensorflow-cpu==2.21.0", "keras==3.15.1", "numpy==2.4.6")
    assert cpu.tag().startswith("suite-base:") and cpu.tag() == debian_base.recipe_for(catalog.get("tf2.21-cpu")).tag()
    gpu = debian_base.recipe_for(catalog.get("tf2.21-cuda12.5"))
    assert gpu.requirements[0] == "tensorflow[and-cuda]==2.21.0" and gpu.tag() != cpu.tag()
    constraints = tmp_path / "c.txt"
    constraints.write_text("# one comment\nnumpy==2.4.6\n")
    first = debian_base.recipe_from(cpu.requirements, constraints).tag()
    constraints.write_text("# another comment\nnumpy==2.4.6  # why\n")
    assert debian_base.recipe_from(cpu.requirements, constraints).tag() == first
    constraints.write_text("numpy==2.4.5\n")
    assert debian_base.recipe_from(cpu.requirements, constraints).tag() != first


def test_debian_mirror_is_part_of_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    d = image_catalog.load_catalog().get("tf2.21-cpu")
    default = debian_base.recipe_for(d)
    monkeypatch.setenv(debian_base.MIRROR_ENV, "http://mirror.example/debian")
    mirrored = debian_base.recipe_for(d)
    assert mirrored.mirror == "http://mirror.example/debian" and mirrored.tag() != default.tag()


def test_debian_packages_are_read_from_the_roots_dpkg_status(tmp_path: Path) -> None:
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: python3.11\nStatus: install ok installed\nVersion: 3.11.2-6+deb12u6\nDescription: x\n multi\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9+deb12u13\n"
    )
    assert debian_base.debian_packages(tmp_path) == {"python3.11": "3.11.2-6+deb12u6", "libc6": "2.36-9+deb12u13"}
    status.write_text("")
    with pytest.raises(debian_base.DebianBaseError, match="lists no installed package"):
        debian_base.debian_packages(tmp_path)


def test_label_instruction_quotes_every_value() -> None:
    line = image_catalog.label_instruction({"b": 'say "hi" \\ $HOME', "a": ""})
    assert line == 'LABEL a="" b="say \\"hi\\" \\\\ \\$HOME"'


class _Engine:
    """Just enough of docker-py's client for build_images: images the engine has, a pull, a build."""

    def __init__(self, pull_error: str | None) -> None:
        import docker

        self.errors = docker.errors
        self.pull_error = pull_error
        self.have: dict[str, Any] = {}
        self.built: list[dict[str, Any]] = []
        self.api = self
        self.images = self

    def get(self, ref: str) -> Any:
        if ref not in self.have:
            raise self.errors.ImageNotFound(ref)
        return self.have[ref]

    def pull(self, ref: str, stream: bool, decode: bool) -> Any:
        if self.pull_error:
            raise self.errors.APIError(self.pull_error, explanation=self.pull_error)
        self.have[ref] = SimpleNamespace(id="sha256:" + "1" * 64, attrs={}, labels={})
        return iter([{"status": "done"}])

    def build(self, **kwargs: Any) -> Any:
        self.built.append(kwargs)
        context = tarfile.open(fileobj=kwargs["fileobj"]).extractfile("Dockerfile").read().decode()
        labels = dict(re.findall(r'(suite\.[\w.]+)="([^"]*)"', context.rsplit("\nLABEL ", 1)[1]))
        self.have[kwargs["tag"]] = SimpleNamespace(id="sha256:" + "2" * 64, attrs={}, labels=labels)
        return iter([{"stream": "built"}, {"aux": {"ID": "sha256:" + "2" * 64}}])


def _fake_debian_base(monkeypatch: pytest.MonkeyPatch, engine: _Engine) -> list[str]:
    made: list[str] = []

    def ensure(client: Any, recipe: debian_base.DebianRecipe, progress: Any) -> str:
        made.append(recipe.tag())
        engine.have[recipe.tag()] = SimpleNamespace(id="sha256:" + "3" * 64, attrs={}, labels={})
        return recipe.tag()

    monkeypatch.setattr(debian_base, "ensure", ensure)
    return made


def test_a_base_the_engine_cannot_pull_is_made_from_debian_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("docker")
    engine = _Engine(pull_error='Get "https://registry-1.docker.io/v2/": dial tcp: no such host')
    made = _fake_debian_base(monkeypatch, engine)
    said: list[str] = []
    rows = images.build_images(["tf2.21-cpu"], progress=said.append, client=engine)
    assert rows[0]["base"] == "debian" and rows[0]["action"] == "built" and rows[0]["tag"] == "suite-bench:tf2.21-cpu"
    assert made and engine.built[0]["buildargs"]["BASE_IMAGE"] == made[0]
    assert engine.built[0]["buildargs"]["INSTALL"] == "0"
    assert any("cannot pull base image python:3.11-slim-bookworm" in s and "no such host" in s for s in said), said
    assert any("from Debian packages" in s for s in said), said
    assert engine.have["suite-bench:tf2.21-cpu"].labels["suite.base.source"] == "debian"
    # The second time the image is up to date: nothing is pulled, made or built.
    again = images.build_images(["tf2.21-cpu"], progress=said.append, client=engine)
    assert again[0]["action"] == "up to date" and again[0]["base"] == "debian" and len(engine.built) == 1
    # Asked for the registry's base only, the Debian-built image does not count, and the pull error is the error.
    with pytest.raises(images.ImageError, match="cannot pull base image"):
        images.build_images(["tf2.21-cpu"], progress=said.append, client=engine, from_debian=False)


def test_a_base_that_pulls_is_used_and_debian_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("docker")
    engine = _Engine(pull_error=None)
    made = _fake_debian_base(monkeypatch, engine)
    rows = images.build_images(["tf2.21-cpu"], progress=lambda _: None, client=engine)
    assert rows[0]["base"] == "registry" and made == []
    assert engine.built[0]["buildargs"]["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    assert engine.built[0]["buildargs"]["INSTALL"] == "1"
    rows = images.build_images(["tf2.21-cpu"], progress=lambda _: None, client=engine, from_debian=True)
    assert rows[0]["base"] == "debian" and rows[0]["action"] == "built" and len(made) == 1


@pytest.mark.docker
def test_an_image_on_a_debian_base_records_how_the_base_was_made(client: Any, test_image: str) -> None:
    record = images.image_record(client.images.get(test_image))
    labels = record["image_labels"]
    recipe = debian_base.recipe_for(image_catalog.load_catalog().get("tf2.21-cpu"))
    assert labels["suite.base.source"] == "debian" and record["base_ref"] == recipe.tag()
    assert labels["suite.debian.suite"] == "bookworm" and labels["suite.debian.mirror"] == recipe.mirror
    assert labels["suite.debian.recipe"] == recipe.inputs_hash()
    packages = dict(p.split("=", 1) for p in labels["suite.debian.packages"].split())
    assert packages["python3.11"].startswith("3.11.") and "ca-certificates" in packages and "libc6" in packages
    assert labels["suite.pip.requirements"] == "tensorflow-cpu==2.21.0 keras==3.15.1 numpy==2.4.6"
    assert labels["suite.pip.constraints"] == f"tf-2.21.txt {recipe.constraints_hash()}"


def test_two_builders_of_one_debian_base_make_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("docker")
    import threading
    import time

    engine = _Engine(pull_error=None)
    made: list[str] = []

    def make(client: Any, recipe: debian_base.DebianRecipe, tag: str, progress: Any) -> None:
        made.append(tag)
        time.sleep(0.3)  # the other builder arrives while this one works
        engine.have[tag] = SimpleNamespace(id="sha256:" + "3" * 64, attrs={}, labels={})

    monkeypatch.setattr(debian_base, "_make", make)
    monkeypatch.setattr(debian_base.os, "geteuid", lambda: 0)
    monkeypatch.setattr(debian_base.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    recipe = debian_base.recipe_for(image_catalog.load_catalog().get("tf2.21-cpu"))
    tags: list[str] = []
    builders = [
        threading.Thread(target=lambda: tags.append(debian_base.ensure(engine, recipe, lambda _: None)))
        for _ in range(2)
    ]
    for b in builders:
        b.start()
    for b in builders:
        b.join()
    assert tags == [recipe.tag()] * 2 and made == [recipe.tag()]


@pytest.mark.parametrize("name", ["tf2.21-cuda12.5", "tf2.17-cuda12.3"])
def test_constraints_header_regenerates_this_file_for_this_image(name: str) -> None:
    d = image_catalog.load_catalog().get(name)
    header = (DOCKER / d.constraints).read_text().split("\n\n# CUDA wheels")[0]
    command = " ".join(line.lstrip("# ").rstrip("\\ ") for line in header.splitlines() if line.startswith("#  "))
    assert command.startswith("pip install --dry-run --ignore-installed --report r.json"), command
    assert f"'{d.tensorflow}' {d.extra} -c docker/{d.constraints} " in command, command
    # pip matches the legacy manylinux names only when given: the CUDA wheels and libclang need them.
    for platform in ("manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux_2_17_x86_64"):
        assert f"--platform {platform}" in command, platform
