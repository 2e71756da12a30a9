"""The image catalog and build recipes, without an engine: names, pins, hashes, labels, lock."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import suite_cli
from docker_fixtures import engine_client, image_fixture  # noqa: F401 - fixtures
from test_locks import _package_index_reachable  # noqa: F401 - fixture: a network test names an unreachable index

from suite.environment import debian_base, image_catalog, images, images_lock

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
    args = set(re.findall(r"^ARG (\w+)", text, re.M))
    assert args == {"BASE_IMAGE", "PYTHON", "LOCK", "INSTALL"}
    assert set(image_catalog.plan_build(image_catalog.load_catalog(), "tf2.21-cpu", lock={}).buildargs) == args
    assert "--require-hashes -r /opt/suite/requirements.lock" in text
    assert len(list(DOCKER.glob("Dockerfile*"))) == 1


def test_every_image_names_a_lock_that_pins_its_requirements() -> None:
    """The lock installs what the catalog entry says (its labels claim it): each requirement at its version."""
    catalog = image_catalog.load_catalog()
    for d in catalog.images.values():
        assert d.lock == f"locks/{d.name}.txt"
        text = (DOCKER / d.lock).read_text()
        pins = dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+)", text, re.M))
        for requirement in [d.tensorflow, *d.extra.split()]:
            name, version = re.sub(r"\[.*\]", "", requirement).split("==")
            assert pins.get(name) == version, f"{d.lock}: {name} {pins.get(name)}, catalog {version}"
        assert all(f"{n}=={v} \\\n    --hash=sha256:" in text for n, v in pins.items()), "every pin carries hashes"


def test_recipe_hash_follows_args_and_override_never_takes_the_real_tag() -> None:
    catalog = image_catalog.load_catalog()
    real = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={})
    again = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={})
    assert real.tag == "suite-bench:tf2.21-cpu" and real.context_hash == again.context_hash
    assert real.labels["suite.context_hash"] == real.context_hash
    assert set(real.files) == {"Dockerfile", "locks/tf2.21-cpu.txt"}  # the lock is complete: no constraints
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


def _docker_dir(tmp_path: Path) -> Path:
    """A copy of docker/ (Dockerfile, catalog, constraints, locks) that a test may change."""
    root = tmp_path / "docker"
    shutil.copytree(DOCKER, root, ignore=shutil.ignore_patterns("images.lock", "README.md"))
    return root


def test_catalog_errors_name_the_file_and_key(tmp_path: Path) -> None:
    root = _docker_dir(tmp_path)
    bad = root / "images.yaml"
    entry = "base: b:1, tensorflow: t, constraints: constraints/tf-2.21.txt, lock: locks/tf2.21-cpu.txt"
    bad.write_text(f"defaults: {{gpu: a, cpu: a}}\nimages:\n  a: {{gpu: yes-please, {entry}}}\n")
    with pytest.raises(image_catalog.ImageError, match=r"images\.yaml: images\.a\.gpu"):
        image_catalog.load_catalog(bad)
    bad.write_text(f"images:\n  a: {{gpu: true, {entry}, colour: red}}\n")
    with pytest.raises(image_catalog.ImageError, match=r"images\.a: unknown key.*colour"):
        image_catalog.load_catalog(bad)
    bad.write_text(f"images:\n  a: {{gpu: true, {entry.replace('locks/tf2.21-cpu.txt', 'locks/none.txt')}}}\n")
    with pytest.raises(
        image_catalog.ImageError,
        match=r"images\.yaml: images\.a\.lock: .*locks/none\.txt does not exist \(requirements/lock\.sh writes it\)",
    ):
        image_catalog.load_catalog(bad)
    bad.write_text(f"images:\n  a: {{gpu: true, {entry.replace(', lock: locks/tf2.21-cpu.txt', '')}}}\n")
    with pytest.raises(
        image_catalog.ImageError,
        match=r"images\.a: missing key\(s\) \['lock'\]; lock: expected locks/a\.txt \(written by requirements/lock",
    ):
        image_catalog.load_catalog(bad)
    # requirements/lock.sh writes where `lock` says: never over the constraints file it compiles from.
    bad.write_text(f"images:\n  a: {{gpu: true, {entry.replace('locks/tf2.21-cpu.txt', 'constraints/tf-2.21.txt')}}}\n")
    with pytest.raises(
        image_catalog.ImageError,
        match=r"images\.a\.lock: 'constraints/tf-2\.21\.txt' is the constraints file; expected locks/a\.txt",
    ):
        image_catalog.load_catalog(bad)
    bad.write_text(f"images:\n  a: {{gpu: true, {entry.replace('locks/tf2.21-cpu.txt', 'locks')}}}\n")
    with pytest.raises(image_catalog.ImageError, match=r"images\.a\.lock: .*/locks is not a file \(a folder\)"):
        image_catalog.load_catalog(bad)
    bad.write_text(f"images:\n  a: {{gpu: true, {entry.replace('locks/tf2.21-cpu.txt', 'locks/a.lock')}}}\n")
    with pytest.raises(image_catalog.ImageError, match=r"images\.a\.lock: expected locks/a\.txt .*got 'locks/a\.lock'"):
        image_catalog.load_catalog(bad, locks_may_be_missing=True)
    new_lock = entry.replace("locks/tf2.21-cpu.txt", "locks/new.txt")
    bad.write_text(f"defaults: {{gpu: a, cpu: a}}\nimages:\n  a: {{gpu: true, {new_lock}}}\n")
    assert image_catalog.load_catalog(bad, locks_may_be_missing=True).get("a").lock == "locks/new.txt"
    bad.write_text(f"images:\n  a: {{gpu: true, {entry.replace('locks/tf2.21-cpu.txt', '../images.yaml')}}}\n")
    with pytest.raises(image_catalog.ImageError, match=r"images\.a\.lock: expected a file path relative to"):
        image_catalog.load_catalog(bad)
    bad.write_text(f'images:\n  a: {{gpu: true, {entry}, description: "two\\nlines"}}\n')
    with pytest.raises(image_catalog.ImageError, match=r"images\.a\.description: expected one line"):
        image_catalog.load_catalog(bad)


# -- what an image's labels say -------------------------------------------------------------------


def test_recipe_hash_is_the_same_on_every_base_route() -> None:
    catalog = image_catalog.load_catalog()
    recipe = image_catalog.recipe_hash(catalog, "tf2.21-cpu")
    assert re.fullmatch(r"[0-9a-f]{64}", recipe)
    registry = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={})
    locked = image_catalog.plan_build(
        catalog, "tf2.21-cpu", lock={"python:3.11-slim-bookworm": {"digest": "sha256:" + "a" * 64}}
    )
    debian = image_catalog.plan_build(
        catalog, "tf2.21-cpu", lock={}, debian_base=debian_base.recipe_for(catalog.get("tf2.21-cpu")).tag()
    )
    override = image_catalog.plan_build(
        catalog, "tf2.21-cpu", lock={}, base_override={"BASE_IMAGE": "x:1", "INSTALL": "0"}
    )
    plans = (registry, locked, debian, override)
    assert len({p.context_hash for p in plans}) == 4  # each sends another base reference
    assert {p.labels["suite.recipe_hash"] for p in plans} == {p.recipe_hash for p in plans} == {recipe}
    assert image_catalog.recipe_hash(catalog, "tf2.21-cuda12.5") != recipe
    lock = DOCKER / "locks" / "tf2.21-cpu.txt"
    assert registry.labels["suite.lock.file"] == "locks/tf2.21-cpu.txt"
    # The reference is sha256sum, not this project's code.
    sha256sum = subprocess.run(["sha256sum", str(lock)], capture_output=True, text=True, check=True).stdout.split()[0]
    assert registry.labels["suite.lock.sha256"] == sha256sum
    for key in ("created", "revision", "source"):  # they change every build: never in a plan, so never hashed
        assert all(f"org.opencontainers.image.{key}" not in p.labels for p in plans)
    assert registry.labels["org.opencontainers.image.title"] == "suite-bench:tf2.21-cpu"
    # OCI's base.name is fully qualified: the registry and namespace a bare Docker Hub name implies.
    assert registry.labels["org.opencontainers.image.base.name"] == "docker.io/library/python:3.11-slim-bookworm"
    assert registry.labels["suite.base.ref"] == "python:3.11-slim-bookworm"
    assert "org.opencontainers.image.base.digest" not in registry.labels  # not locked: learnt at build time
    assert locked.labels["org.opencontainers.image.base.digest"] == "sha256:" + "a" * 64
    assert debian.labels["org.opencontainers.image.base.name"] == debian.buildargs["BASE_IMAGE"]
    # A local base has no registry digest, so no OCI base.digest (suite.base.id names it at build time).
    assert "org.opencontainers.image.base.digest" not in debian.labels
    description = catalog.get("tf2.21-cpu").description
    assert description and registry.labels["org.opencontainers.image.description"] == description
    version = re.search(r'^version = "([^"]+)"', (DOCKER.parent / "pyproject.toml").read_text(), re.M).group(1)
    assert registry.labels["org.opencontainers.image.version"] == version


def test_qualified_reference_writes_out_docker_hubs_implied_names() -> None:
    q = image_catalog.qualified_reference
    assert q("python:3.11-slim-bookworm") == "docker.io/library/python:3.11-slim-bookworm"
    assert q("nvidia/cuda:12.5.1-runtime") == "docker.io/nvidia/cuda:12.5.1-runtime"
    assert q("ghcr.io/o/i:1") == "ghcr.io/o/i:1" and q("localhost:5000/i:1") == "localhost:5000/i:1"
    assert q("python@sha256:" + "a" * 64) == "docker.io/library/python@sha256:" + "a" * 64


def test_every_planned_label_is_in_the_context_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A built image is "up to date" while its context_hash matches the plan's: a label the hash left
    # out could change in the checkout and the image would keep the old one.
    root = _docker_dir(tmp_path)
    catalog_path = root / "images.yaml"
    text = catalog_path.read_text()

    def plan() -> image_catalog.BuildPlan:
        return image_catalog.plan_build(image_catalog.load_catalog(catalog_path), "tf2.21-cpu", lock={})

    first = plan()
    entry = catalog_path.read_text()
    description = image_catalog.load_catalog(catalog_path).get("tf2.21-cpu").description
    assert description and description in entry
    catalog_path.write_text(text.replace(description, description + " (changed)"))
    assert plan().labels["org.opencontainers.image.description"] != first.labels["org.opencontainers.image.description"]
    assert plan().context_hash != first.context_hash
    catalog_path.write_text(text)
    assert plan().context_hash == first.context_hash
    monkeypatch.setattr(image_catalog, "project_version", lambda: "99.0.0")
    assert plan().labels["org.opencontainers.image.version"] == "99.0.0"
    assert plan().context_hash != first.context_hash
    monkeypatch.undo()
    # Every label but the hash itself and the title (the tag, which holds the hash for an override) is
    # fed to the hash: gpu, cuda and the rest included.
    seen: set[str] = set()
    monkeypatch.setattr(image_catalog.hashlib, "sha256", _recording_sha256(seen))
    plan()
    monkeypatch.undo()
    for key in sorted(set(first.labels) - {"suite.context_hash", "org.opencontainers.image.title"}):
        assert f"label {key}={first.labels[key]}\n" in seen, key


def _recording_sha256(seen: set[str]):
    real = hashlib.sha256

    class Recording:
        def __init__(self, data: bytes = b"") -> None:
            self._h = real(data)

        def update(self, data: bytes) -> None:
            seen.add(data.decode(errors="replace"))
            self._h.update(data)

        def hexdigest(self) -> str:
            return self._h.hexdigest()

        def digest(self) -> bytes:
            return self._h.digest()

    return Recording


def test_recipe_hash_follows_the_lock_and_entry_not_the_constraints(tmp_path: Path) -> None:
    root = _docker_dir(tmp_path)
    catalog_path = root / "images.yaml"

    def hashes() -> tuple[str, str]:
        catalog = image_catalog.load_catalog(catalog_path)
        plan = image_catalog.plan_build(catalog, "tf2.21-cpu", lock={})
        return image_catalog.recipe_hash(catalog, "tf2.21-cpu"), plan.context_hash

    first = hashes()
    # The copy is the same recipe as the checkout's own.
    assert first[0] == image_catalog.recipe_hash(image_catalog.load_catalog(), "tf2.21-cpu")
    constraints = root / "constraints" / "tf-2.21.txt"
    constraints.write_text(constraints.read_text() + "\n# a compile input only\n")
    assert hashes() == first
    lock = root / "locks" / "tf2.21-cpu.txt"
    original = lock.read_bytes()
    lock.write_bytes(original + b"\n")  # one byte: another file, another recipe
    changed = hashes()
    assert changed[0] != first[0] and changed[1] != first[1]
    lock.write_bytes(original)
    assert hashes() == first
    entry = (
        "extra: keras==3.15.1 numpy==2.4.6\n    constraints: constraints/tf-2.21.txt\n    lock: locks/tf2.21-cpu.txt"
    )
    catalog_text = catalog_path.read_text()
    assert entry in catalog_text  # the tf2.21-cpu entry
    catalog_path.write_text(catalog_text.replace(entry, entry.replace("numpy==2.4.6", "numpy==2.4.5")))
    assert hashes()[0] != first[0]
    catalog_path.write_text(catalog_text)
    assert hashes() == first
    dockerfile = root / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\n")
    assert hashes()[0] != first[0]


def test_build_labels_say_when_and_from_which_revision(tmp_path: Path) -> None:
    repo = DOCKER.parent
    labels = images.build_labels(repo)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["org.opencontainers.image.created"])
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert labels["org.opencontainers.image.revision"] == head.stdout.strip()
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    assert labels["suite.source.dirty"] == ("true" if status.stdout.strip() else "false")
    # A checkout of its own: clean, then dirty, then with an origin carrying credentials.
    other = tmp_path / "checkout"
    other.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(other), *args], check=True, capture_output=True)

    git("init", "-q")
    (other / "f.txt").write_text("1\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    clean = images.build_labels(other)
    assert clean["suite.source.dirty"] == "false" and "org.opencontainers.image.source" not in clean
    (other / "f.txt").write_text("2\n")
    git("remote", "add", "origin", "https://someone:s3cret@git.example.com/team/suite.git")
    dirty = images.build_labels(other)
    assert dirty["suite.source.dirty"] == "true"
    assert dirty["org.opencontainers.image.source"] == "https://git.example.com/team/suite.git"
    outside = tmp_path / "not-a-checkout"
    outside.mkdir()
    assert set(images.build_labels(outside)) == {"org.opencontainers.image.created"}


def test_remote_urls_lose_their_credentials() -> None:
    assert images.without_credentials("https://x-access-token:abc@github.com/o/r.git") == "https://github.com/o/r.git"
    assert images.without_credentials("ssh://git@host.example:2222/o/r.git") == "ssh://host.example:2222/o/r.git"
    assert images.without_credentials("https://github.com/o/r") == "https://github.com/o/r"
    assert images.without_credentials("git@github.com:o/r.git") == "git@github.com:o/r.git"  # scp form: no password


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


def test_debian_recipe_follows_the_lock_files_bytes(tmp_path: Path) -> None:
    catalog = image_catalog.load_catalog()
    cpu = debian_base.recipe_for(catalog.get("tf2.21-cpu"))
    assert cpu.lock == DOCKER / "locks" / "tf2.21-cpu.txt" and cpu.lock_file == "locks/tf2.21-cpu.txt"
    assert cpu.lock_sha256() == hashlib.sha256(cpu.lock.read_bytes()).hexdigest()
    assert cpu.tag().startswith("suite-base:") and cpu.tag() == debian_base.recipe_for(catalog.get("tf2.21-cpu")).tag()
    gpu = debian_base.recipe_for(catalog.get("tf2.21-cuda12.5"))
    assert gpu.lock_file == "locks/tf2.21-cuda12.5.txt" and gpu.tag() != cpu.tag()
    lock = tmp_path / "l.txt"
    lock.write_bytes(cpu.lock.read_bytes())
    first = debian_base.recipe_from(lock, cpu.lock_file).tag()
    assert first == cpu.tag()  # the same bytes under the same name: the same base
    lock.write_bytes(cpu.lock.read_bytes() + b"# a comment is bytes too: the label names the file's sha256\n")
    assert debian_base.recipe_from(lock, cpu.lock_file).tag() != first


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
    assert _parse_labels(line) == {"b": 'say "hi" \\ $HOME', "a": ""}
    with pytest.raises(image_catalog.ImageError, match="one line"):
        image_catalog.label_instruction({"a": "two\nlines"})


def _parse_labels(instruction: str) -> dict[str, str]:
    """A LABEL instruction's key="value" pairs, unescaped as the classic builder does for these escapes."""
    pairs = re.findall(r'([\w.-]+)="((?:[^"\\]|\\.)*)"', instruction)
    return {key: re.sub(r"\\(.)", r"\1", value) for key, value in pairs}


class _Engine:
    """Just enough of docker-py's client for build_images: images the engine has, a pull, a build."""

    def __init__(self, pull_error: str | None) -> None:
        import docker

        self.errors = docker.errors
        self.pull_error = pull_error
        self.registry_error = pull_error
        self.have: dict[str, Any] = {}
        self.built: list[dict[str, Any]] = []
        self.stream: list[dict[str, Any]] = []  # events a build sends before its own
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

    def get_registry_data(self, ref: str) -> Any:
        if self.registry_error:
            raise self.errors.APIError(self.registry_error)
        return SimpleNamespace(id=getattr(self, "registry_digest", "sha256:" + "4" * 64))

    def build(self, **kwargs: Any) -> Any:
        self.built.append(kwargs)
        context = tarfile.open(fileobj=kwargs["fileobj"])
        dockerfile = context.extractfile("Dockerfile").read().decode()
        kwargs["context_files"] = sorted(context.getnames())
        labels = _parse_labels("LABEL " + dockerfile.rsplit("\nLABEL ", 1)[1])
        self.have[kwargs["tag"]] = SimpleNamespace(id="sha256:" + "2" * 64, attrs={}, labels=labels)
        return iter([*self.stream, {"stream": "built"}, {"aux": {"ID": "sha256:" + "2" * 64}}])


PACKAGES = {"libc6": "2.36-9+deb12u13", "python3.11": "3.11.2-6+deb12u6", "ca-certificates": "20230311"}


def _fake_debian_base(monkeypatch: pytest.MonkeyPatch, engine: _Engine, seen: list[Any] | None = None) -> list[str]:
    """debian_base.ensure without debootstrap: the base appears on the fake engine with the labels a real one has."""
    made: list[str] = []

    def ensure(client: Any, recipe: debian_base.DebianRecipe, progress: Any, locked: Any = None) -> str:
        made.append(recipe.tag())
        if seen is not None:
            seen.append(locked)
        labels = debian_base.base_labels(recipe, PACKAGES)
        attrs = {"Created": "2026-12-01T02:08:28.926145773Z"}
        engine.have[recipe.tag()] = SimpleNamespace(id="sha256:" + "3" * 64, attrs=attrs, labels=labels)
        return recipe.tag()

    monkeypatch.setattr(debian_base, "ensure", ensure)
    return made


def test_a_build_step_s_stderr_is_said_without_the_engine_s_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker 20.10 sends what a RUN step writes to stderr wrapped in colour codes (events as this
    machine's engine sent them for ``RUN echo oops >&2; echo fine``): the console gets the text."""
    pytest.importorskip("docker")
    engine = _Engine(pull_error="no registry")
    engine.stream = [{"stream": "fine\n"}, {"stream": "\x1b[91moops\n\x1b[0m"}]
    _fake_debian_base(monkeypatch, engine)
    said: list[str] = []
    images.build_images(["tf2.21-cpu"], progress=said.append, client=engine)
    assert "fine" in said and "oops" in said, said
    assert not any("\x1b" in line or "[91m" in line for line in said), said
    # A build that then fails quotes the step's output, without the colour, in its error.
    engine.have.clear()
    engine.stream = [{"stream": "\x1b[91mERROR: No matching distribution\n\x1b[0m"}, {"error": "exit code 1"}]
    with pytest.raises(images.ImageError) as failed:
        images.build_images(["tf2.21-cpu"], progress=said.append, client=engine)
    assert "ERROR: No matching distribution" in str(failed.value) and "\x1b" not in str(failed.value)


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
    assert engine.built[0]["context_files"] == ["Dockerfile", "locks/tf2.21-cpu.txt"]
    labels = engine.have["suite-bench:tf2.21-cpu"].labels
    assert labels["suite.base.source"] == "debian"
    assert labels["org.opencontainers.image.base.name"] == made[0]
    # The base's local image ID is no registry digest: OCI's base.digest is left out, suite.base.id has it.
    assert "org.opencontainers.image.base.digest" not in labels
    assert labels["suite.base.id"] == "sha256:" + "3" * 64
    assert (
        labels["suite.recipe_hash"]
        == rows[0]["recipe_hash"]
        == image_catalog.recipe_hash(image_catalog.load_catalog(), "tf2.21-cpu")
    )
    assert labels["org.opencontainers.image.created"] and labels["org.opencontainers.image.revision"]
    # The second time the image is up to date: nothing is pulled, made or built, though the time
    # and (for all this build knows) the revision moved on.
    monkeypatch.setattr(images, "build_labels", lambda: {"org.opencontainers.image.created": "later"})
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
    packages = debian_base.parse_packages(labels["suite.debian.packages"])
    assert packages["python3.11"].startswith("3.11.") and "ca-certificates" in packages and "libc6" in packages
    assert labels["suite.pip.lock.file"] == "locks/tf2.21-cpu.txt"
    assert labels["suite.pip.lock.sha256"] == hashlib.sha256((DOCKER / "locks/tf2.21-cpu.txt").read_bytes()).hexdigest()


@pytest.mark.docker
def test_the_recorded_debian_packages_are_what_dpkg_says_inside(client: Any, test_image: str) -> None:
    """dpkg itself, run in the image, is the reference for the label (and so for images.lock's packages)."""
    labels = client.images.get(test_image).labels
    out = client.containers.run(
        test_image, ["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Status}\\n"], remove=True
    ).decode()
    installed = {
        name: version for name, version, status in (line.split() for line in out.splitlines()) if status == "installed"
    }
    assert installed and debian_base.parse_packages(labels["suite.debian.packages"]) == installed


@pytest.mark.docker
def test_a_built_image_carries_its_lock_and_the_oci_labels(client: Any, test_image: str) -> None:
    """The engine's own record of the image, and the lock file inside it, read by sha256sum in the image."""
    record = images.image_record(client.images.get(test_image))
    lock = DOCKER / "locks" / "tf2.21-cpu.txt"
    file_sha = subprocess.run(["sha256sum", str(lock)], capture_output=True, text=True, check=True).stdout.split()[0]
    assert record["lock_file"] == "locks/tf2.21-cpu.txt" and record["lock_sha256"] == file_sha
    assert record["recipe_hash"] == image_catalog.recipe_hash(image_catalog.load_catalog(), "tf2.21-cpu")
    inside = client.containers.run(
        test_image, ["sha256sum", "/opt/suite/requirements.lock"], remove=True, network_mode="none"
    ).decode()
    assert inside.split()[0] == file_sha
    oci = record["oci_labels"]
    prefix = "org.opencontainers.image."
    keys = ("created", "revision", "version", "title", "description", "base.name")
    assert {prefix + k for k in keys} <= set(oci)
    # A Debian-made base has a local image ID only, no registry digest: no OCI base.digest.
    assert oci[prefix + "title"] == test_image and prefix + "base.digest" not in oci
    assert record["base_id"] == client.images.get(oci[prefix + "base.name"]).id  # a local ID: the engine's own
    assert re.fullmatch(r"[0-9a-f]{40}", oci[prefix + "revision"])
    assert record["image_labels"]["suite.source.dirty"] in ("true", "false")


@pytest.mark.docker
def test_label_values_reach_the_engine_as_written(client: Any, test_image: str, tmp_path: Path) -> None:
    """The real builder is the reference for label_instruction's quoting: quotes, backslashes, $, spaces."""
    import io

    labels = {"suite.test.a": 'say "hi" \\ $HOME ${X} $(id)', "suite.test.b": "", "suite.test.c": "é and 'single'"}
    dockerfile = f"FROM {test_image}\n{image_catalog.label_instruction(labels)}\n".encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    context.seek(0)
    tag = "suite-test-labels:escape"
    events = list(client.api.build(fileobj=context, custom_context=True, tag=tag, rm=True, decode=True))
    assert not [e for e in events if "error" in e], events
    try:
        got = client.images.get(tag).labels
        assert {k: got.get(k) for k in labels} == labels
    finally:
        client.images.remove(tag, force=True)


def test_two_builders_of_one_debian_base_make_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("docker")
    import threading
    import time

    engine = _Engine(pull_error=None)
    made: list[str] = []

    def make(client: Any, recipe: debian_base.DebianRecipe, tag: str, progress: Any, locked: Any = None) -> None:
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


# -- docker/images.lock ---------------------------------------------------------------------------


def test_images_lock_round_trip_with_its_debian_section(tmp_path: Path) -> None:
    path = tmp_path / "images.lock"
    assert image_catalog.read_lock(path) == {"bases": {}, "debian_bases": {}}
    bases = {"python:3.11-slim-bookworm": {"digest": "sha256:" + "a" * 64, "locked_at": "2026-12-01T02:00:00+00:00"}}
    debian = {
        "tf2.21-cpu": {
            "base": "suite-base:0123456789abcdef",
            "image_id": "sha256:" + "b" * 64,
            "recipe": "c" * 64,
            "suite": "bookworm",
            "mirror": "http://deb.debian.org/debian",
            "packages": dict(PACKAGES),
            "pip_lock": {"file": "locks/tf2.21-cpu.txt", "sha256": "d" * 64},
        }
    }
    image_catalog.write_lock(path, bases, debian)
    assert image_catalog.read_lock(path) == {"bases": bases, "debian_bases": debian}
    assert image_catalog.load_lock(path) == bases
    assert path.read_text().startswith("# Written by `python -m suite images lock`")
    path.write_text("bases:\n  python:3.11: {digest: md5:abc}\n")
    with pytest.raises(image_catalog.ImageError, match=r"images\.lock: bases\.python:3\.11\.digest: expected sha256"):
        image_catalog.read_lock(path)
    path.write_text("colours: {}\n")
    with pytest.raises(image_catalog.ImageError, match=r"images\.lock: expected a mapping with the keys bases"):
        image_catalog.read_lock(path)
    # debian_bases entries are checked by type, naming the key, before any build compares versions.
    for bad, key in (
        ("packages: [libc6, bash]", r"debian_bases\.tf2\.21-cpu\.packages: expected a mapping of Debian package"),
        ("packages: {libc6: [2]}", r"debian_bases\.tf2\.21-cpu\.packages: expected a mapping"),
        ("image_id: [1]", r"debian_bases\.tf2\.21-cpu\.image_id: expected text"),
        ("pip_lock: locks/x.txt", r"debian_bases\.tf2\.21-cpu\.pip_lock: expected a mapping"),
        ("colour: red", r"debian_bases\.tf2\.21-cpu: unknown key\(s\) \['colour'\]"),
    ):
        path.write_text(f"debian_bases:\n  tf2.21-cpu: {{{bad}}}\n")
        with pytest.raises(image_catalog.ImageError, match=key):
            image_catalog.read_lock(path)


def test_locking_again_with_nothing_changed_leaves_the_file_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("docker")
    engine = _Engine(pull_error="no registry")
    _fake_debian_base(monkeypatch, engine)
    images.build_images(["tf2.21-cpu"], progress=lambda _: None, client=engine)
    engine.registry_error = None
    path = tmp_path / "images.lock"
    images_lock.lock_images(["tf2.21-cpu"], progress=lambda _: None, client=engine, path=path)
    first = path.read_bytes()
    stamps = re.findall(rb"locked_at: '([^']+)'", first)
    assert len(stamps) == 2, first
    # Another second: an entry rewritten would carry another locked_at.
    earlier = image_catalog.read_lock(path)
    for section in earlier.values():
        for entry in section.values():
            entry["locked_at"] = "2000-01-01T00:00:00+00:00"
    image_catalog.write_lock(path, earlier["bases"], earlier["debian_bases"])
    kept = path.read_bytes()
    images_lock.lock_images(["tf2.21-cpu"], progress=lambda _: None, client=engine, path=path)
    assert path.read_bytes() == kept
    # A changed entry (another digest) is stamped anew; the unchanged one keeps its stamp.
    engine.registry_digest = "sha256:" + "5" * 64
    images_lock.lock_images(["tf2.21-cpu"], progress=lambda _: None, client=engine, path=path)
    after = image_catalog.read_lock(path)
    assert after["bases"]["python:3.11-slim-bookworm"]["locked_at"] != "2000-01-01T00:00:00+00:00"
    assert after["debian_bases"]["tf2.21-cpu"]["locked_at"] == "2000-01-01T00:00:00+00:00"


def test_lock_records_the_debian_base_where_no_registry_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("docker")
    engine = _Engine(pull_error='Get "https://registry-1.docker.io/v2/": dial tcp: no such host')
    _fake_debian_base(monkeypatch, engine)
    images.build_images(["tf2.21-cpu"], progress=lambda _: None, client=engine)
    path = tmp_path / "images.lock"
    said: list[str] = []
    with pytest.raises(images.ImageError) as failed:
        images_lock.lock_images(["tf2.21-cpu", "tf2.21-cuda12.5"], progress=said.append, client=engine, path=path)
    message = str(failed.value)
    assert "registry digest of python:3.11-slim-bookworm: " in message and "no such host" in message
    assert "was written with what was recorded" in message and "Debian base of tf2.21-cpu" in message
    lock = image_catalog.read_lock(path)
    assert lock["bases"] == {}
    recipe = debian_base.recipe_for(image_catalog.load_catalog().get("tf2.21-cpu"))
    entry = lock["debian_bases"]["tf2.21-cpu"]
    assert entry["base"] == recipe.tag() and entry["image_id"] == "sha256:" + "3" * 64
    assert entry["made_at"] == "2026-12-01T02:08:28.926145773Z"
    assert entry["recipe"] == recipe.inputs_hash() and entry["suite"] == "bookworm" and entry["mirror"] == recipe.mirror
    assert entry["packages"] == PACKAGES
    assert entry["pip_lock"] == {"file": "locks/tf2.21-cpu.txt", "sha256": recipe.lock_sha256()}
    assert "tf2.21-cuda12.5" not in lock["debian_bases"]  # never built here: nothing to record
    assert any(s.startswith("not recorded: Debian base of tf2.21-cuda12.5") for s in said), said
    # Where the registry answers, both parts are written and nothing fails.
    engine.registry_error = None
    written = images_lock.lock_images(["tf2.21-cpu"], progress=said.append, client=engine, path=path)
    assert written["bases"]["python:3.11-slim-bookworm"]["digest"] == "sha256:" + "4" * 64
    assert image_catalog.read_lock(path) == written and written["debian_bases"]["tf2.21-cpu"]["packages"] == PACKAGES


def test_a_new_debian_base_is_told_the_packages_the_lock_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("docker")
    engine = _Engine(pull_error="no registry")
    seen: list[Any] = []
    _fake_debian_base(monkeypatch, engine, seen)
    recorded = {**PACKAGES, "libc6": "2.36-9+deb12u10"}
    lock = tmp_path / "images.lock"
    image_catalog.write_lock(lock, {}, {"tf2.21-cpu": {"packages": recorded}})
    monkeypatch.setattr(images, "read_lock", lambda: image_catalog.read_lock(lock))
    images.build_images(["tf2.21-cpu"], progress=lambda _: None, client=engine)
    assert seen == [recorded]


def test_making_a_base_says_which_packages_moved_since_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """debootstrap replaced by a root whose dpkg status lists today's versions; pip and the import by nothing."""
    imported: list[dict[str, str]] = []

    def debootstrap(recipe: Any, root: Path, progress: Any) -> None:
        status = root / "var/lib/dpkg/status"
        status.parent.mkdir(parents=True)
        status.write_text(
            "".join(f"Package: {n}\nStatus: install ok installed\nVersion: {v}\n\n" for n, v in PACKAGES.items())
        )

    monkeypatch.setattr(debian_base, "_debootstrap", debootstrap)
    monkeypatch.setattr(debian_base, "_pip_install", lambda recipe, root, progress: None)
    monkeypatch.setattr(debian_base, "_import", lambda client, root, tag, labels: imported.append(labels))
    recipe = debian_base.recipe_for(image_catalog.load_catalog().get("tf2.21-cpu"))
    said: list[str] = []
    recorded = {**PACKAGES, "libc6": "2.36-9+deb12u10"}
    debian_base._make(None, recipe, recipe.tag(), said.append, recorded)
    moved = [s for s in said if "differ from those docker/images.lock recorded" in s]
    assert len(moved) == 1 and moved[0].startswith("1 Debian package(s)"), said
    assert "libc6 2.36-9+deb12u10 -> 2.36-9+deb12u13" in moved[0] and "cannot pin versions" in moved[0]
    assert debian_base.parse_packages(imported[0]["suite.debian.packages"]) == PACKAGES  # today's, as labels
    said.clear()
    debian_base._make(None, recipe, recipe.tag(), said.append, dict(PACKAGES))
    assert "Debian packages: the versions docker/images.lock recorded" in said


def test_package_changes_name_each_package_that_moved() -> None:
    before = {"libc6": "2.36-9+deb12u10", "python3.11": "3.11.2-6+deb12u6", "gone": "1"}
    after = {"libc6": "2.36-9+deb12u13", "python3.11": "3.11.2-6+deb12u6", "new": "2"}
    assert debian_base.package_changes(before, after) == [
        "gone 1 gone",
        "libc6 2.36-9+deb12u10 -> 2.36-9+deb12u13",
        "new 2 added",
    ]
    assert debian_base.package_changes(before, before) == []
    label = debian_base.base_labels(debian_base.recipe_for(image_catalog.load_catalog().get("tf2.21-cpu")), after)
    assert debian_base.parse_packages(label["suite.debian.packages"]) == after


# -- installing a lock: real pip, the real package index ------------------------------------------


# python-dateutil 2.9.0.post0's wheel on the package index; it depends on six.
DATEUTIL_WHEEL_SHA256 = "a8b2bc7bffae282281c8140a97d3aa9c14da0b136dfe83f850eea9a5f7470427"


def _one_package_lock(tmp_path: Path, name: str = "six") -> tuple[Path, str]:
    """A lock of one small package, its entry copied from the image's lock (pin and hashes as A's uv wrote them)."""
    text = (DOCKER / "locks" / "tf2.21-cpu.txt").read_text()
    entry = re.search(rf"^{name}==\S+ \\\n(?:    --hash=sha256:[0-9a-f]{{64}}(?: \\)?\n)+", text, re.M)
    assert entry, f"{name} is not in the lock"
    lock = tmp_path / "one.txt"
    lock.write_text(entry.group(0))
    return lock, entry.group(0)


@pytest.mark.network
def test_the_debian_route_installs_with_require_hashes_and_refuses_a_wrong_hash(tmp_path: Path) -> None:
    lock, entry = _one_package_lock(tmp_path)
    root = tmp_path / "root"
    debian_base._pip_install(debian_base.recipe_from(lock, "one.txt"), root, lambda _: None)
    version = entry.split("==", 1)[1].split()[0]
    assert list((root / debian_base.SITE_PACKAGES).glob(f"six-{version}.dist-info"))
    digests = re.findall(r"sha256:([0-9a-f]{64})", entry)
    wrong = entry
    for digest in digests:  # every listed file's hash altered: pip must refuse whatever file it picks
        wrong = wrong.replace(digest, digest[:-1] + ("0" if digest[-1] != "0" else "1"))
    lock.write_text(wrong)
    with pytest.raises(debian_base.DebianBaseError, match=r"(?s)pip install failed.*DO NOT MATCH THE HASHES"):
        debian_base._pip_install(debian_base.recipe_from(lock, "one.txt"), tmp_path / "root2", lambda _: None)
    # A pin without any hash: only --require-hashes makes pip refuse it (hashes elsewhere would too).
    lock.write_text(f"six=={version}\n")
    with pytest.raises(debian_base.DebianBaseError, match=r"(?s)pip install failed.*Hashes are required"):
        debian_base._pip_install(debian_base.recipe_from(lock, "one.txt"), tmp_path / "root3", lambda _: None)
    # A lock that misses a dependency (python-dateutil needs six): refused, not installed incomplete.
    lock.write_text(f"python-dateutil==2.9.0.post0 \\\n    --hash=sha256:{DATEUTIL_WHEEL_SHA256}\n")
    with pytest.raises(debian_base.DebianBaseError, match=r"(?s)pip install failed.*--require-hashes mode.*six"):
        debian_base._pip_install(debian_base.recipe_from(lock, "one.txt"), tmp_path / "root4", lambda _: None)
    assert not list((tmp_path / "root4" / debian_base.SITE_PACKAGES).glob("dateutil"))


def test_the_dockerfile_installs_without_no_deps() -> None:
    # With --no-deps pip would install a lock that misses a dependency without a word.
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", "")
    install = next(line for line in text.splitlines() if "pip install" in line)
    assert "--require-hashes" in install and "--no-deps" not in install, install


def _dockerfile_lock_check() -> str:
    """The Dockerfile's check that the installed packages are the lock's, as the shell gets it."""
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", "")
    run = next(line for line in text.splitlines() if line.startswith("RUN "))
    return next(part for part in run.split(" && ") if "installed as locked" in part)


def test_the_dockerfiles_check_finds_a_package_that_differs_from_the_lock(tmp_path: Path) -> None:
    import importlib.metadata

    check = _dockerfile_lock_check()
    lock = tmp_path / "lock.txt"
    installed = importlib.metadata.version("PyYAML")
    good = f"pyyaml=={installed} \\\n    --hash=sha256:{'0' * 64}\n    # via x\n"
    lock.write_text(good)

    def run() -> subprocess.CompletedProcess:
        command = check.replace("/opt/suite/requirements.lock", str(lock))
        return subprocess.run(["sh", "-c", command], env={"PYTHON": sys.executable}, capture_output=True, text=True)

    ok = run()
    assert ok.returncode == 0 and "1 packages installed as locked" in ok.stdout, ok.stderr
    lock.write_text(good.replace(f"=={installed}", "==0.0.1") + "not-installed-anywhere==1.0\n")
    bad = run()
    assert bad.returncode != 0
    assert f"pyyaml 0.0.1 in the lock, {installed} installed" in bad.stderr, bad.stderr
    assert "not-installed-anywhere 1.0 in the lock, none installed" in bad.stderr, bad.stderr
