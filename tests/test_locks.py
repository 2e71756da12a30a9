"""The hash locks hold what their inputs ask for, real pip resolves those inputs to exactly them,
requirements/ensure_venv.sh installs nothing whose sha256 differs, and suite/environment/locks.py reports the truth.

The tests marked ``network`` ask the real package index (pip's configured one): about 3 minutes in
all on a 2-core machine that reaches it (measured: 188 s for the 15 of this module and
test_images.py; each lock resolution 5-15 s, pip reading metadata only, no 570 MB tensorflow wheel;
the two ensure_venv installs about 35 s each). Where the index cannot be reached they fail, saying
which index, rather than skip: CI reaches it. Deselect them offline with ``-m 'not network'``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import ssl
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from suite.environment import locks

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "requirements" / "locks"
DOCKER = REPO / "docker"
HOST_LOCKS = [(env, py) for env in sorted(locks.ENVIRONMENTS) for py in locks.LOCKED_PYTHONS]
# The tags a manylinux_2_28 x86_64 machine installs; pip matches the legacy names only when given
# (the CUDA wheels carry only manylinux2014, libclang only manylinux2010).
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
)
# six 1.16.0's wheel on the package index (11,053 bytes): a real file whose sha256 pip checks.
SIX_WHEEL_SHA256 = "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"
# python-dateutil 2.9.0.post0's wheel; it depends on six.
DATEUTIL_WHEEL_SHA256 = "a8b2bc7bffae282281c8140a97d3aa9c14da0b136dfe83f850eea9a5f7470427"


def package_index_problem() -> str | None:
    """Why pip's package index cannot be reached from here, or None when it answers.

    The index is the one pip uses (PIP_INDEX_URL, else pip's configuration, else PyPI), asked for a
    small project's page over HTTP with pip's certificate bundle (PIP_CERT) where one is set.
    """
    return _index_problem(os.environ.get("PIP_INDEX_URL", ""), os.environ.get("PIP_CERT", ""))


@functools.cache
def _index_problem(env_url: str, cert: str) -> str | None:
    url = env_url
    if not url:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        url = proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "https://pypi.org/simple"
    page = url.rstrip("/") + "/six/"
    context = ssl.create_default_context(cafile=cert or None)
    try:
        with urllib.request.urlopen(page, timeout=30, context=context) as response:
            response.read(1)
    except (OSError, ValueError) as exc:  # URLError, timeouts and refused connections are OSErrors
        return (
            f"the package index {url} cannot be reached from here ({page}: {exc}); the tests marked network "
            "need it (CI reaches it). Offline, deselect them with -m 'not network'."
        )
    return None


@pytest.fixture(autouse=True)
def _package_index_reachable(request: pytest.FixtureRequest) -> None:
    # A test marked network fails with one clear line when the index is unreachable, not with pip's
    # "no matching distribution" deep inside it.
    if request.node.get_closest_marker("network") is not None:
        problem = package_index_problem()
        if problem:
            pytest.fail(problem, pytrace=False)


def _images() -> dict[str, dict]:
    return yaml.safe_load((DOCKER / "images.yaml").read_text(encoding="utf-8"))["images"]


def _image_lock(name: str, entry: dict) -> Path:
    return DOCKER / entry.get("lock", f"locks/{name}.txt")


def _image_requirements(entry: dict) -> list[str]:
    return [entry["tensorflow"], *(entry.get("extra") or "").split()]


def _top_level(files: list[Path]) -> list[tuple[Requirement, Path]]:
    """The requirements a file names itself (not those of a -c constraints file it includes)."""
    found = []
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                found.append((Requirement(line), path))
    return found


def _environment(python: str) -> dict[str, str]:
    """PEP 508 marker values of a Linux x86_64 CPython of that version (what the locks are for)."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def _header(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines()[:5] if line.startswith("#")]


def _check_lock_file(path: Path, top_level: list[tuple[Requirement, str]], python: str) -> None:
    assert any("requirements/lock.sh" in line for line in _header(path)), f"{path}: header names no regenerate command"
    pins = locks.read_pins(path)  # raises on any entry not pinned with ==
    # Every entry carries at least one sha256 (pip's --require-hashes refuses the whole file otherwise).
    entries = re.split(r"\n(?=[A-Za-z0-9])", path.read_text(encoding="utf-8"))
    for entry in entries:
        if entry.startswith("#"):
            continue
        assert "--hash=sha256:" in entry, f"{path}: no sha256 for {entry.splitlines()[0]}"
    assert len([e for e in entries if not e.startswith("#")]) == len(pins)
    for requirement, source in top_level:
        if requirement.marker is not None and not requirement.marker.evaluate(_environment(python)):
            continue
        name = locks.normalize(requirement.name)
        assert name in pins, f"{path}: {requirement} (from {source}) is not in the lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{path}: {name} {pins[name]} in the lock does not satisfy {requirement} from {source}; "
            "run requirements/lock.sh"
        )


# --- (a) offline: every lock against its inputs ----------------------------------------------------


@pytest.mark.parametrize(("env", "python"), HOST_LOCKS, ids=[f"{e}-py{p}" for e, p in HOST_LOCKS])
def test_host_lock_pins_its_top_level_requirements(env: str, python: str) -> None:
    path = LOCKS / f"{env}-py{python}.txt"
    assert path.is_file(), f"{path} is missing: run requirements/lock.sh"
    inputs = [REPO / f for f in locks.ENVIRONMENTS[env]]
    header = " ".join(_header(path))
    assert all(f in header for f in locks.ENVIRONMENTS[env]), f"{path}: header does not name its inputs: {header}"
    assert f"Python {python}" in header
    _check_lock_file(path, [(r, str(p)) for r, p in _top_level(inputs)], python)


def test_every_environment_has_a_lock_per_python_and_no_other_lock_lies_there() -> None:
    want = {f"{env}-py{py}.txt" for env, py in HOST_LOCKS}
    assert {p.name for p in LOCKS.glob("*.txt")} == want


@pytest.mark.parametrize(("wider", "narrower"), sorted(locks.EXTENDS.items()))
def test_a_wider_lock_holds_the_narrower_one_unchanged(wider: str, narrower: str) -> None:
    # ensure_venv lets a venv holding the wider environment serve the narrower one as it is (a dev
    # venv serves ./run_all.sh, a cluster venv a plain run); that is only right if so.
    for python in locks.LOCKED_PYTHONS:
        small = locks.read_pins(LOCKS / f"{narrower}-py{python}.txt")
        big = locks.read_pins(LOCKS / f"{wider}-py{python}.txt")
        assert {name: big.get(name) for name in small} == small
        assert "ray" in big and ("ray" in small) == (narrower == "cluster")


def test_the_constraints_file_of_the_gpu_worker_agrees_with_its_lock() -> None:
    # worker-gpu.txt installs the CUDA wheels the GPU images pin; its lock must carry those pins.
    constraints = locks.read_pins(DOCKER / "constraints" / "tf-2.21.txt")
    assert any(name.startswith("nvidia-") for name in constraints)
    for python in locks.LOCKED_PYTHONS:
        pins = locks.read_pins(LOCKS / f"run-gpu-py{python}.txt")
        assert {n: pins.get(n) for n in constraints if n.startswith("nvidia-")} == {
            n: v for n, v in constraints.items() if n.startswith("nvidia-")
        }


@pytest.mark.parametrize("name", sorted(_images()))
def test_image_lock_pins_its_requirements_and_constraints(name: str) -> None:
    entry = _images()[name]
    path = _image_lock(name, entry)
    assert path.is_file(), f"{path} (image {name} of docker/images.yaml) is missing: run requirements/lock.sh"
    header = " ".join(_header(path))
    assert f"image {name} " in header and "Python 3.11" in header, header
    requirements = [(Requirement(r), f"docker/images.yaml images.{name}") for r in _image_requirements(entry)]
    _check_lock_file(path, requirements, "3.11")
    # The constraints file carries the CUDA-wheel policy: every pin of it the lock holds is its pin.
    pins = locks.read_pins(path)
    constraints = locks.read_pins(DOCKER / entry["constraints"])
    differ = {n: (v, pins[n]) for n, v in constraints.items() if n in pins and pins[n] != v}
    assert not differ, f"{path}: (constraints, lock) differ: {differ}"
    if entry.get("gpu"):
        assert {n for n in constraints if n.startswith("nvidia-")} <= set(pins)


def _strip_first_hashes(text: str) -> str:
    """The lock with its first entry (absl-py) left without any --hash line."""
    head, _, rest = text.partition("absl-py==2.5.1 \\\n")
    body, _, tail = rest.partition("    # via")
    assert "--hash=sha256:" in body
    return head + "absl-py==2.5.1\n    # via" + tail


@pytest.mark.parametrize(
    ("doctor", "message"),
    [
        (
            lambda t: t.replace("tabulate==0.10.0 \\", "tabulate==0.9.0 \\"),
            "tabulate 0.9.0 in the lock does not satisfy",
        ),
        (lambda t: t.replace("tabulate==0.10.0 \\", "tabulate>=0.9 \\"), "is not a pinned requirement"),
        (lambda t: t.replace("Regenerate every lock with: requirements/lock.sh", ""), "header names no regenerate"),
        (_strip_first_hashes, "no sha256 for absl-py==2.5.1"),
    ],
    ids=["version", "range", "header", "hash"],
)
def test_the_offline_check_fails_on_a_doctored_lock(tmp_path: Path, doctor: Callable[[str], str], message: str) -> None:
    text = (LOCKS / "run-py3.11.txt").read_text(encoding="utf-8")
    doctored = tmp_path / "run-py3.11.txt"
    doctored.write_text(doctor(text), encoding="utf-8")
    assert doctored.read_text(encoding="utf-8") != text
    inputs = [REPO / f for f in locks.ENVIRONMENTS["run"]]
    with pytest.raises((AssertionError, ValueError), match=re.escape(message)):
        _check_lock_file(doctored, [(r, str(p)) for r, p in _top_level(inputs)], "3.11")


def test_locks_are_written_deterministically() -> None:
    # No timestamp, no temporary path: the bytes depend only on the inputs.
    for path in [*LOCKS.glob("*.txt"), *(DOCKER / "locks").glob("*.txt")]:
        text = path.read_text(encoding="utf-8")
        assert "/tmp" not in text and not re.search(r"\b20\d\d-\d\d-\d\d[T ]\d\d:", text), path


# --- (b) real pip against the package index ---------------------------------------------------------


def _pip_resolution(args: list[str], constraints: dict[str, str], python: str, tmp: Path) -> dict[str, str]:
    """{name: version} real pip installs for ``args`` under ``constraints`` on Linux x86_64 CPython ``python``.

    A dry run for another platform: nothing is installed. pip reads each candidate's metadata only
    (PEP 658 files where the index has them, else HTTP range requests into the wheel, fast-deps),
    so tensorflow's 570 MB wheel is not downloaded. Raises AssertionError with pip's words when it
    cannot resolve (a top-level pin that contradicts the lock does that).
    """
    pins = tmp / "lock-pins.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in sorted(constraints.items())), encoding="utf-8")
    report = tmp / "report.json"
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [
        *(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"),
        *("--use-feature=fast-deps", "--only-binary=:all:", "--python-version", python, *platforms),
        *("--target", str(tmp / "target"), "--report", str(report), "-c", str(pins), *args),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip could not resolve {args} under the lock:\n{proc.stderr[-3000:]}"
    installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {locks.normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def _compare(lock: dict[str, str], resolved: dict[str, str]) -> list[str]:
    return [
        f"{n}: lock {lock.get(n)}, pip {resolved.get(n)}"
        for n in sorted(set(lock) | set(resolved))
        if lock.get(n) != resolved.get(n)
    ]


@pytest.mark.network
@pytest.mark.parametrize(("env", "python"), HOST_LOCKS, ids=[f"{e}-py{p}" for e, p in HOST_LOCKS])
def test_pip_resolves_the_host_inputs_to_exactly_the_lock(env: str, python: str, tmp_path: Path) -> None:
    lock = locks.read_pins(LOCKS / f"{env}-py{python}.txt")
    args = [a for f in locks.ENVIRONMENTS[env] for a in ("-r", f)]
    assert _compare(lock, _pip_resolution(args, lock, python, tmp_path)) == []


@pytest.mark.network
@pytest.mark.parametrize("name", sorted(_images()))
def test_pip_resolves_the_image_requirements_to_exactly_the_lock(name: str, tmp_path: Path) -> None:
    entry = _images()[name]
    lock = locks.read_pins(_image_lock(name, entry))
    args = [*_image_requirements(entry), "-c", str(DOCKER / entry["constraints"])]
    assert _compare(lock, _pip_resolution(args, lock, "3.11", tmp_path)) == []


@pytest.mark.network
def test_the_pip_check_fails_when_a_top_level_pin_leaves_the_lock(tmp_path: Path) -> None:
    lock = locks.read_pins(LOCKS / "run-py3.11.txt")
    host = (REPO / "requirements" / "host.txt").read_text(encoding="utf-8")
    assert "tabulate==0.10.0" in host and lock["tabulate"] == "0.10.0"
    changed = tmp_path / "host.txt"
    changed.write_text(host.replace("tabulate==0.10.0", "tabulate==0.9.0"), encoding="utf-8")
    with pytest.raises(AssertionError, match="tabulate"):
        _pip_resolution(["-r", str(changed), "-r", "requirements/worker-cpu.txt"], lock, "3.11", tmp_path)


@pytest.mark.network
def test_the_pip_check_fails_when_the_lock_misses_or_adds_a_package(tmp_path: Path) -> None:
    lock = locks.read_pins(LOCKS / "run-py3.11.txt")
    args = ["-r", "requirements/host.txt", "-r", "requirements/worker-cpu.txt"]
    doctored = {n: v for n, v in lock.items() if n != "six"} | {"iniconfig": "2.3.1"}
    resolved = _pip_resolution(args, doctored, "3.11", tmp_path)
    assert _compare(doctored, resolved) == [
        "iniconfig: lock 2.3.1, pip None",
        f"six: lock None, pip {resolved['six']}",
    ]


# --- (c) ensure_venv installs only what the hashes allow -------------------------------------------


def _ensure_venv(venv: Path, env: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", '. requirements/ensure_venv.sh && ensure_venv "$1" "$2"', "_", str(venv), env],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable, **extra_env},
    )


def _python_xy() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def _one_wheel_lock(folder: Path, env: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{env}-py{_python_xy()}.txt"
    path.write_text(text, encoding="utf-8")
    return path


def _venv_pins(venv: Path) -> dict[str, str]:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return {locks.normalize(d["name"]): d["version"] for d in json.loads(proc.stdout)}


@pytest.mark.network
def test_ensure_venv_refuses_a_wrong_hash_and_installs_the_right_one(tmp_path: Path) -> None:
    folder, venv = tmp_path / "locks", tmp_path / "venv"
    wrong = SIX_WHEEL_SHA256[:-4] + "0000"
    _one_wheel_lock(folder, "run", f"six==1.16.0 \\\n    --hash=sha256:{wrong}\n")
    proc = _ensure_venv(venv, "run", {"SUITE_LOCKS_DIR": str(folder)})
    assert proc.returncode != 0
    assert "DO NOT MATCH THE HASHES" in proc.stderr and wrong in proc.stderr, proc.stderr
    assert not (venv / locks.LOCK_RECORD).exists() and not (venv / ".requirements.sha256").exists()
    assert "six" not in _venv_pins(venv)

    lock = _one_wheel_lock(folder, "run", f"# one wheel\nsix==1.16.0 \\\n    --hash=sha256:{SIX_WHEEL_SHA256}\n")
    proc = _ensure_venv(venv, "run", {"SUITE_LOCKS_DIR": str(folder)})
    assert proc.returncode == 0, proc.stderr
    # Exactly the lock: six, and pip to install it; what else the venv came with is removed.
    assert {n: v for n, v in _venv_pins(venv).items() if n != "pip"} == {"six": "1.16.0"}
    record = json.loads((venv / locks.LOCK_RECORD).read_text(encoding="utf-8"))
    assert record == {
        "environment": "run",
        "lock_file": str(lock),
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
        "python": platform.python_version(),
    }
    assert locks.venv_lock(str(venv)) == record

    # Unchanged lock: nothing to do. A changed lock (even a comment): installed and recorded again.
    again = _ensure_venv(venv, "run", {"SUITE_LOCKS_DIR": str(folder)})
    assert again.returncode == 0 and again.stderr == "", again.stderr
    lock.write_text(lock.read_text(encoding="utf-8") + "# changed\n", encoding="utf-8")
    changed = _ensure_venv(venv, "run", {"SUITE_LOCKS_DIR": str(folder)})
    assert changed.returncode == 0 and "setting up" in changed.stderr, changed.stderr
    assert locks.venv_lock(str(venv))["lock_sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()

    # A venv holding the dev lock serves run as it is (the dev lock holds the run lock); not the reverse.
    dev = _one_wheel_lock(folder, "dev", f"# dev\nsix==1.16.0 \\\n    --hash=sha256:{SIX_WHEEL_SHA256}\n")
    assert _ensure_venv(venv, "dev", {"SUITE_LOCKS_DIR": str(folder)}).returncode == 0
    as_run = _ensure_venv(venv, "run", {"SUITE_LOCKS_DIR": str(folder)})
    assert as_run.returncode == 0 and as_run.stderr == "", as_run.stderr
    assert locks.venv_lock(str(venv))["lock_file"] == str(dev)
    dev.unlink()
    assert "no lock for Python" in _ensure_venv(venv, "dev", {"SUITE_LOCKS_DIR": str(folder)}).stderr


@pytest.mark.network
def test_ensure_venv_refuses_a_lock_that_misses_a_dependency(tmp_path: Path) -> None:
    # No --no-deps: pip resolves the dependencies and demands a hash for each, so an incomplete lock stops.
    folder, venv = tmp_path / "locks", tmp_path / "venv"
    _one_wheel_lock(folder, "dev", f"python-dateutil==2.9.0.post0 \\\n    --hash=sha256:{DATEUTIL_WHEEL_SHA256}\n")
    proc = _ensure_venv(venv, "dev", {"SUITE_LOCKS_DIR": str(folder)})
    assert proc.returncode != 0
    # pip's words differ by version ("Hashes are required in --require-hashes mode ...", "In
    # --require-hashes mode, all requirements must have their versions pinned with =="); both name six.
    assert "--require-hashes mode" in proc.stderr and "six" in proc.stderr, proc.stderr
    assert not (venv / locks.LOCK_RECORD).exists()


def _wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> str:
    """Build a pure-Python wheel with the standard library (a zip with METADATA, WHEEL and RECORD);
    return its sha256, as a lock would hash it."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    contents = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in {**contents, f"{info}/RECORD": "\n".join(record) + "\n"}.items():
            z.writestr(path, text)
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def _local_index(folder: Path) -> dict[str, str]:
    # pip reads these as it reads its own options: wheels from this folder only, no package index.
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder)}


def _site_file(venv: Path, relative: str) -> Path:
    return venv / "lib" / f"python{_python_xy()}" / "site-packages" / relative


def test_check_wheels_accepts_the_locked_files_and_names_any_other(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    good = _wheel(wheels, "tiny_pkg", "1.0", {"tiny_pkg.py": "X = 1\n"})
    lock = tmp_path / "lock.txt"
    lock.write_text(f"tiny-pkg==1.0 \\\n    --hash=sha256:{'0' * 64} \\\n    --hash=sha256:{good}\n    # via x\n")
    assert locks.read_hashes(lock) == {"tiny-pkg": {"0" * 64, good}}
    cmd = [sys.executable, "-m", "suite.environment.locks", "check-wheels", str(lock), str(wheels)]
    ok = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    # Other bytes under the same name and version (as an index could serve), and a package the lock lacks.
    other = _wheel(tmp_path / "other", "tiny_pkg", "1.0", {"tiny_pkg.py": "X = 2\n"})
    (wheels / "tiny_pkg-1.0-py3-none-any.whl").write_bytes(
        (tmp_path / "other" / "tiny_pkg-1.0-py3-none-any.whl").read_bytes()
    )
    _wheel(wheels, "stray", "2.0", {"stray.py": ""})
    bad = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert f"tiny_pkg-1.0-py3-none-any.whl: sha256 {other} is not among the 2 hashes" in bad.stderr, bad.stderr
    assert "stray-2.0-py3-none-any.whl: stray is not in" in bad.stderr, bad.stderr


def test_ensure_venv_switching_environments_keeps_files_two_packages_share(tmp_path: Path) -> None:
    # As tensorflow-cpu (run) and tensorflow (run-gpu) both install tensorflow/...: uninstalling the one
    # the new lock does not name, after installing the other, would delete the files both wrote.
    wheels, folder, venv = tmp_path / "wheels", tmp_path / "locks", tmp_path / "venv"
    cpu = _wheel(wheels, "sharer_cpu", "1.0", {"sharedpkg/__init__.py": "KIND = 'cpu'\n"})
    gpu = _wheel(wheels, "sharer_gpu", "1.0", {"sharedpkg/__init__.py": "KIND = 'gpu'\n"})
    _one_wheel_lock(folder, "run", f"sharer-cpu==1.0 \\\n    --hash=sha256:{cpu}\n")
    _one_wheel_lock(folder, "run-gpu", f"sharer-gpu==1.0 \\\n    --hash=sha256:{gpu}\n")
    env = {"SUITE_LOCKS_DIR": str(folder), **_local_index(wheels)}
    shared = _site_file(venv, "sharedpkg/__init__.py")
    for name, kind in (("run", "cpu"), ("run-gpu", "gpu"), ("run", "cpu")):
        proc = _ensure_venv(venv, name, env)
        assert proc.returncode == 0, proc.stderr
        assert shared.is_file(), f"after switching to {name}: {shared} is gone\n{proc.stderr}"
        assert shared.read_text(encoding="utf-8") == f"KIND = '{kind}'\n"
        assert {n: v for n, v in _venv_pins(venv).items() if n != "pip"} == {f"sharer-{kind}": "1.0"}
    assert "recreating" in proc.stderr and "'run-gpu', 'run' is asked for" in proc.stderr, proc.stderr

    # Within one environment, a new lock that swaps one for the other: the old one goes before the install.
    _one_wheel_lock(folder, "run", f"sharer-gpu==1.0 \\\n    --hash=sha256:{gpu}\n")
    proc = _ensure_venv(venv, "run", env)
    assert proc.returncode == 0, proc.stderr
    assert "recreating" not in proc.stderr and "removing packages the lock does not name: sharer-cpu" in proc.stderr
    assert shared.is_file() and shared.read_text(encoding="utf-8") == "KIND = 'gpu'\n"


@pytest.mark.parametrize("made", ["without a record", "unlocked"])
def test_ensure_venv_recreates_a_venv_whose_files_no_locked_install_checked(tmp_path: Path, made: str) -> None:
    # pip skips a version that is already installed, hashes or not: the venv must start empty, or a
    # file the lock's hash never covered would stay under a record that says it came from the lock.
    wheels, doctored_wheels, folder, venv = tmp_path / "w", tmp_path / "d", tmp_path / "locks", tmp_path / "venv"
    good = _wheel(wheels, "tiny_pkg", "1.0", {"tiny_pkg.py": "SOURCE = 'the locked wheel'\n"})
    _wheel(doctored_wheels, "tiny_pkg", "1.0", {"tiny_pkg.py": "SOURCE = 'another wheel'\n"})
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(doctored_wheels),
            "tiny_pkg==1.0",
        ],
        check=True,
        timeout=300,
    )
    if made == "unlocked":  # what ensure_venv records under SUITE_UNLOCKED=1
        record = {"environment": "run", "lock_file": None, "lock_sha256": None, "python": platform.python_version()}
        (venv / locks.LOCK_RECORD).write_text(json.dumps(record), encoding="utf-8")
        (venv / ".requirements.sha256").write_text("unlocked 0\n", encoding="utf-8")
    _one_wheel_lock(folder, "run", f"tiny-pkg==1.0 \\\n    --hash=sha256:{good}\n")
    proc = _ensure_venv(venv, "run", {"SUITE_LOCKS_DIR": str(folder), **_local_index(wheels)})
    assert proc.returncode == 0, proc.stderr
    assert "recreating" in proc.stderr and "no record of a hash-checked install" in proc.stderr, proc.stderr
    assert _site_file(venv, "tiny_pkg.py").read_text(encoding="utf-8") == "SOURCE = 'the locked wheel'\n"
    assert locks.venv_lock(str(venv))["lock_sha256"] == locks.lock_sha256(folder / f"run-py{_python_xy()}.txt")


def test_ensure_venv_explains_a_missing_lock_under_the_callers_strict_mode(tmp_path: Path) -> None:
    # run_all.sh and run_tests.sh source it under `set -euo pipefail`; with no lock at all, listing the
    # locks that do exist fails, and that must not end the script before the message.
    empty = tmp_path / "locks"
    empty.mkdir()
    proc = subprocess.run(
        [
            "bash",
            "-c",
            'set -euo pipefail; . requirements/ensure_venv.sh; ensure_venv "$1" dev',
            "_",
            str(tmp_path / "v"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, "SUITE_LOCKS_DIR": str(empty)},
    )
    assert proc.returncode == 1, proc.stderr
    assert f"no lock for Python {_python_xy()}" in proc.stderr, proc.stderr
    assert "exist for Python: none" in proc.stderr and "SUITE_UNLOCKED=1" in proc.stderr, proc.stderr


def _off_linux_x86_64(tmp_path: Path) -> dict[str, str]:
    """An environment in which ensure_venv sees a Mac (a `uname` saying so first on PATH) and a
    locks folder holding a run lock of this Python (one real wheel)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text("#!/bin/sh\necho Darwin arm64\n", encoding="utf-8")
    (bin_dir / "uname").chmod(0o755)
    folder = tmp_path / "locks"
    _one_wheel_lock(folder, "run", f"six==1.16.0 \\\n    --hash=sha256:{SIX_WHEEL_SHA256}\n")
    return {"SUITE_LOCKS_DIR": str(folder), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_ensure_venv_refuses_a_locked_install_off_linux_x86_64(tmp_path: Path) -> None:
    # The locks' wheels are Linux x86_64 ones; elsewhere pip would build the hashed sdists from source.
    env = _off_linux_x86_64(tmp_path)
    proc = _ensure_venv(tmp_path / "venv", "run", env)
    assert proc.returncode == 1, proc.stderr
    assert "for Linux x86_64; this machine is 'Darwin arm64'" in proc.stderr, proc.stderr
    assert "SUITE_UNLOCKED=1" in proc.stderr and not (tmp_path / "venv").exists()


@pytest.mark.network
def test_suite_unlocked_is_the_way_off_linux_x86_64_even_where_a_lock_exists(tmp_path: Path) -> None:
    # The refusal above says to set SUITE_UNLOCKED=1: doing so must work, though a lock of this
    # Python exists. The real top-level files, resolved by real pip (dry run: nothing installed).
    env = {
        **_off_linux_x86_64(tmp_path),
        "SUITE_UNLOCKED": "1",
        "PIP_DRY_RUN": "1",
        "PIP_USE_FEATURE": "fast-deps",
    }
    venv = tmp_path / "venv"
    proc = _ensure_venv(venv, "run", env)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: SUITE_UNLOCKED=1 is set (the lock" in proc.stderr, proc.stderr
    assert locks.venv_lock(str(venv)) == {
        "environment": "run",
        "lock_file": None,
        "lock_sha256": None,
        "python": platform.python_version(),
    }


def _fake_python(path: Path, version: str) -> Path:
    # Passes the 3.11 floor and reports its version, as an interpreter of that version would.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'#!/bin/sh\ncase "$2" in\n  *version_info*) exit 0 ;;\n  *python_version*) echo {version} ;;\nesac\n',
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def test_ensure_venv_refuses_a_python_without_a_lock(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = _fake_python(tmp_path / "python3.13", "3.13.0")
    proc = _ensure_venv(venv, "dev", {"PYTHON": str(python)})
    assert proc.returncode == 1, proc.stderr
    assert "no lock for Python 3.13" in proc.stderr and "dev-py3.13.txt" in proc.stderr, proc.stderr
    assert "for Python: 3.11 3.12" in proc.stderr, proc.stderr
    assert "requirements/lock.sh" in proc.stderr and "SUITE_UNLOCKED=1" in proc.stderr, proc.stderr
    assert not venv.exists()


def test_ensure_venv_names_the_environments_it_knows(tmp_path: Path) -> None:
    proc = _ensure_venv(tmp_path / "venv", "gpu", {})
    assert proc.returncode == 2
    assert f"'gpu' is unknown; allowed: {', '.join(locks.ENVIRONMENTS)}" in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.network
def test_unlocked_install_warns_and_records_no_lock(tmp_path: Path) -> None:
    # The real top-level files, resolved by real pip; PIP_DRY_RUN keeps tensorflow off the disk and
    # fast-deps reads only the wheels' metadata.
    venv = tmp_path / "venv"
    env = {"SUITE_LOCKS_DIR": str(tmp_path / "none"), "SUITE_UNLOCKED": "1"}
    proc = _ensure_venv(venv, "run", {**env, "PIP_DRY_RUN": "1", "PIP_USE_FEATURE": "fast-deps"})
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: no lock for Python" in proc.stderr and "requirements/worker-cpu.txt" in proc.stderr
    record = locks.venv_lock(str(venv))
    assert record == {
        "environment": "run",
        "lock_file": None,
        "lock_sha256": None,
        "python": platform.python_version(),
    }
    assert (venv / ".requirements.sha256").read_text(encoding="utf-8").startswith("unlocked ")


# --- (d) suite/environment/locks.py ----------------------------------------------------------------------------


def test_an_unreachable_index_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 (discard) on this machine: nothing listens, the connection is refused at once.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    problem = package_index_problem()
    assert problem is not None
    assert problem.startswith("the package index http://127.0.0.1:9/simple cannot be reached from here"), problem
    assert "-m 'not network'" in problem


def test_read_pins_normalizes_names_and_skips_hashes_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "lock.txt"
    path.write_text(
        "# header\n\nPyYAML==6.0.4 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via -r x\n"
        "typing_extensions==4.16.0 ; python_version >= '3.11' \\\n    --hash=sha256:cc\n"
        "jax[cpu]==0.10.2  # a comment\n",
        encoding="utf-8",
    )
    assert locks.read_pins(path) == {"pyyaml": "6.0.4", "typing-extensions": "4.16.0", "jax": "0.10.2"}


@pytest.mark.parametrize("line", ["numpy>=2", "numpy", "-r other.txt", "numpy==2.4.6\nNumPy==2.4.5"])
def test_read_pins_refuses_what_is_no_lock(tmp_path: Path, line: str) -> None:
    path = tmp_path / "lock.txt"
    path.write_text(f"# header\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(path)) + r":\d+: "):
        locks.read_pins(path)


def test_read_pins_of_every_lock_matches_its_pinned_lines() -> None:
    for path in [*LOCKS.glob("*.txt"), *(DOCKER / "locks").glob("*.txt")]:
        text = path.read_text(encoding="utf-8")
        assert locks.read_pins(path) == {
            locks.normalize(n): v for n, v in re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+) \\$", text, re.M)
        }
        assert locks.lock_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_installed_agrees_with_pip_list() -> None:
    # pip's own view of this interpreter is the reference.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert locks.installed() == {locks.normalize(d["name"]): d["version"] for d in json.loads(proc.stdout)}


def test_installed_differences_of_this_venv_against_its_lock() -> None:
    record = locks.venv_lock()
    if record is None or not record.get("lock_file"):
        pytest.skip(f"{sys.prefix} was not installed from a lock (no {locks.LOCK_RECORD}): run ./run_tests.sh")
    lock = REPO / record["lock_file"]
    assert locks.lock_sha256(lock) == record["lock_sha256"], f"{lock} changed since {sys.prefix} was installed"
    pins = locks.read_pins(lock)
    assert locks.installed_differences(pins) == []
    numpy = pins["numpy"]
    doctored = {n: v for n, v in pins.items() if n != "six"} | {"numpy": "0.0.1", "Not_A.Package": "1.0"}
    assert locks.installed_differences(doctored) == [
        "not-a-package 1.0 in the lock, not installed",
        f"numpy 0.0.1 in the lock, {numpy} installed",
        "six installed, not in the lock",
    ]


def test_pip_is_compared_when_the_lock_pins_it_and_left_out_when_not() -> None:
    # What this interpreter has, as pip itself lists it, is the reference lock.
    have = locks.installed()
    assert "pip" in have
    assert locks.installed_differences(have) == []
    assert locks.installed_differences({**have, "pip": "0.0.1"}) == [f"pip 0.0.1 in the lock, {have['pip']} installed"]
    # A lock that does not pin the installer (an image's) says nothing about it: not "installed, not in the lock".
    without = {n: v for n, v in have.items() if n != "pip"}
    assert locks.installed_differences(without) == []
    assert "pip" not in locks.extraneous(without)


def test_every_host_lock_pins_pip_and_hands_it_to_ensure_venv_with_its_hashes(tmp_path: Path) -> None:
    for env, python in HOST_LOCKS:
        path = LOCKS / f"{env}-py{python}.txt"
        pin = locks.read_pins(path)["pip"]
        text = locks.installer_requirements(path)
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", text)
        assert text.startswith(f"pip=={pin} \\\n") and hashes, text
        # The same hashes as the lock's own lines for pip, and nothing of any other package.
        block = re.search(
            rf"^pip=={re.escape(pin)} \\\n((?:    --hash=sha256:[0-9a-f]{{64}}.*\n)+)", path.read_text(), re.M
        )
        assert block is not None and re.findall(r"sha256:([0-9a-f]{64})", block.group(1)) == hashes
        # pip itself reads it as one requirement with hashes (the form --require-hashes accepts).
        reqs = tmp_path / f"{env}-{python}.txt"
        reqs.write_text(text, encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--require-hashes", "-r", str(reqs)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "pinned with ==" not in proc.stderr and "Hashes are required" not in proc.stderr, proc.stderr
    # A lock without pip gives nothing to install first.
    assert locks.installer_requirements(DOCKER / "locks" / "tf2.21-cpu.txt") == ""


def test_venv_lock_reads_the_record_or_says_none(tmp_path: Path) -> None:
    assert locks.venv_lock(str(tmp_path)) is None
    (tmp_path / locks.LOCK_RECORD).write_text('{"environment": "dev"}', encoding="utf-8")
    assert locks.venv_lock(str(tmp_path)) == {"environment": "dev"}
    (tmp_path / locks.LOCK_RECORD).write_text("[1]", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / locks.LOCK_RECORD))):
        locks.venv_lock(str(tmp_path))


def test_lock_sh_reads_its_images_from_images_yaml() -> None:
    # No image name is written into the script: the list is docker/images.yaml's.
    script = (REPO / "requirements" / "lock.sh").read_text(encoding="utf-8")
    assert "docker/images.yaml" in script
    for name in _images():
        assert name not in script


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("    lock: locks/tf2.21-cpu.txt\n", "", "missing key(s) ['lock']; lock: expected locks/tf2.21-cpu.txt"),
        ("lock: locks/tf2.21-cpu.txt", "lock: constraints/tf-2.21.txt", "is the constraints file; expected"),
        ("lock: locks/tf2.21-cpu.txt", "lock: locks", "locks is not a file (a folder)"),
    ],
)
def test_lock_sh_checks_the_catalog_as_the_suite_does_before_writing(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    # A copy of the tree lock.sh reads, with one bad catalog entry: the suite's own catalog check stops
    # it (the same message `python -m suite images` gives), and no file is written.
    for folder in ("requirements", "suite", "docker"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    catalog = tmp_path / "docker" / "images.yaml"
    text = catalog.read_text(encoding="utf-8")
    assert old in text
    catalog.write_text(text.replace(old, new), encoding="utf-8")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.txt")}
    proc = subprocess.run(
        ["bash", str(tmp_path / "requirements" / "lock.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SUITE_VENV": str(Path(sys.prefix))},
    )
    assert proc.returncode != 0, proc.stderr
    assert "images.yaml: images.tf2.21-cpu" in proc.stderr and message in proc.stderr, proc.stderr
    assert "wrote" not in proc.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.txt")} == before


def test_the_environments_are_listed_once(tmp_path: Path) -> None:
    # requirements/environments.txt: ensure_venv and lock.sh read it as suite.environment.locks does,
    # and name no environment's input of their own (lock.sh reads uv's pin from dev.txt, no more).
    assert list(locks.ENVIRONMENTS) == ["run", "run-gpu", "cluster", "cluster-gpu", "dev"]
    assert locks.EXTENDS == {"cluster": "run", "cluster-gpu": "run-gpu", "dev": "cluster"}
    proc = _ensure_venv(tmp_path / "venv", "nonesuch", {})
    assert f"allowed: {', '.join(locks.ENVIRONMENTS)}" in proc.stderr, proc.stderr
    for script in ("ensure_venv.sh", "lock.sh"):
        text = (REPO / "requirements" / script).read_text(encoding="utf-8")
        inputs = {f for files in locks.ENVIRONMENTS.values() for f in files} - {"requirements/dev.txt"}
        assert not [f for f in sorted(inputs) if f in text], script


def _run_all(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A venv whose Python has no lock: ./run_all.sh stops in ensure_venv, which names the
    # environment it was asked for, before anything is installed or run.
    venv = tmp_path / "venv"
    _fake_python(venv / "bin" / "python", "3.13.0")
    return subprocess.run(
        ["./run_all.sh", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SUITE_VENV": str(venv), **env},
    )


@pytest.mark.parametrize(
    ("env", "chosen"),
    [
        ({}, "run"),
        ({"SUITE_ENV": "run-gpu"}, "run-gpu"),
        ({"SUITE_WORKER_REQUIREMENTS": "requirements/worker-gpu.txt"}, "run-gpu"),
        ({"SUITE_WORKER_REQUIREMENTS": "requirements/worker-cpu.txt"}, "run"),
    ],
)
def test_run_all_picks_the_environment(tmp_path: Path, env: dict[str, str], chosen: str) -> None:
    proc = _run_all(tmp_path, env)
    assert proc.returncode == 1, proc.stderr
    assert f"Locks of environment '{chosen}' exist for Python: 3.11 3.12" in proc.stderr, proc.stderr
    if "SUITE_WORKER_REQUIREMENTS" in env:
        assert f"is read as SUITE_ENV={chosen}" in proc.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SUITE_ENV": "gpu"}, "SUITE_ENV=gpu: allowed are run (CPU worker), run-gpu (CUDA wheels), cluster"),
        (
            {"SUITE_WORKER_REQUIREMENTS": "req.txt"},
            "allowed are requirements/worker-cpu.txt and requirements/worker-gpu",
        ),
        (
            {"SUITE_ENV": "run", "SUITE_WORKER_REQUIREMENTS": "requirements/worker-gpu.txt"},
            "SUITE_ENV=run and SUITE_WORKER_REQUIREMENTS=requirements/worker-gpu.txt disagree",
        ),
    ],
)
def test_run_all_refuses_an_unknown_environment(tmp_path: Path, env: dict[str, str], message: str) -> None:
    proc = _run_all(tmp_path, env)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_copies_a_package_puts_on_sys_path_are_not_installed_distributions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``import ray`` puts ray/thirdparty_files (psutil, colorama) on sys.path, setuptools its
    _vendor: distributions installed with that package, not beside it. A venv whose process imported
    one still matches its lock; a folder of distributions anywhere else on sys.path still counts."""

    def dist(folder: Path, name: str) -> Path:
        info = folder / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        return folder

    vendored = dist(tmp_path / "lib" / "site-packages" / "pkg" / "thirdparty_files", "vendoredthing")
    elsewhere = dist(tmp_path / "extra", "addedthing")
    egg = dist(tmp_path / "lib" / "site-packages" / "old-1.0-py3.11.egg", "eggthing")  # easy-install.pth names it
    monkeypatch.setattr(sys, "path", [str(vendored), str(elsewhere), str(egg), *sys.path])
    found = locks.installed()
    assert "vendoredthing" not in found and found.get("addedthing") == "1.0" and found.get("eggthing") == "1.0"
