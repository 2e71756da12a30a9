"""Shared test fixtures: paths, the real MNIST digits, a CLI runner."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import itertools
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
MNIST_DIR = Path(os.environ.get("SUITE_MNIST_DIR", REPO.parent / "shared" / "data" / "mnist"))


# What a user's own machine holds and no test may read: their Keras cache (MNIST there changes the
# data source, a run's mounts and its accuracy), their Keras backend, a mirror or a cluster they
# point the suite at. Each test session gets an empty Keras home and matplotlib folder of its own.
USER_STATE = (
    "KERAS_BACKEND",
    "SUITE_MNIST_URL",
    "SUITE_FETCH_DEADLINE_S",
    "RAY_ADDRESS",
    "SUITE_GPUS",
    "SUITE_CACHE_DIR",
)


@pytest.fixture(scope="session", autouse=True)
def hermetic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test, and every process it starts, sees a Keras home and caches of its own, none of the
    user's; yields the Keras home (empty: no MNIST)."""
    home = tmp_path_factory.mktemp("user")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERAS_HOME", str(home / "keras"))
        mp.setenv("MPLCONFIGDIR", str(home / "matplotlib"))
        mp.setenv("XDG_CACHE_HOME", str(home / "cache"))
        for name in USER_STATE:
            mp.delenv(name, raising=False)
        yield home / "keras"


@pytest.fixture
def mnist_dir() -> Path:
    if not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST test set not found in {MNIST_DIR} (set SUITE_MNIST_DIR)")
    return MNIST_DIR


def suite_cli(
    *args: object, cwd: Path = REPO, timeout: float = 900, env: dict | None = None, memory: int | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `python -m suite ...` as a user would; returns the CompletedProcess.

    ``memory``: bytes of address space the process may take (``RLIMIT_AS``), so that input meant to
    exhaust memory ends in a MemoryError instead; the CLI itself needs about 300 MiB of it."""
    extra = {"OPENBLAS_NUM_THREADS": "1"} if memory else {}  # BLAS reserves memory per thread

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(
        [sys.executable, "-m", "suite", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **extra, **(env or {})},
        preexec_fn=limit if memory else None,
    )


def copy_of_checkout(into: Path) -> Path:
    """This checkout's files as a clone would have them (tracked and new, not ignored: no .venv), in a
    folder of its own; ``into``. New files under reports/ (a smoke run's results and pages) are
    output, not code: left out."""
    from suite.record.code_identity import CODE_PATHSPEC, PATHSPEC_ENV

    def ls_files(*args: str) -> str:
        cmd = ["git", "ls-files", "-z", *args]
        env = {**os.environ, **PATHSPEC_ENV}
        return subprocess.run(cmd, cwd=REPO, capture_output=True, check=True, env=env).stdout.decode()

    listed = ls_files("--cached") + ls_files("--others", "--exclude-standard", "--", *CODE_PATHSPEC)
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into / rel)
    return into


@dataclass(frozen=True)
class QuickStart:
    tree: Path  # the copy the quick start ran in: results in reports/results/testbox, pages in reports/
    output: str  # what ./run_all.sh printed (stdout, then stderr)
    returncode: int
    revision: str  # the copy's git HEAD: the code every result must name


@pytest.fixture(scope="session")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> QuickStart:
    """``./run_all.sh --smoke --backend local --machine testbox`` once per test run, as a new user runs
    the README's quick start: in a copy of this tree that is a git repository of its own (as a clone
    is, so every result names the revision that ran), with this checkout's venv, and no MNIST
    anywhere (a fetch fails at once), so every CPU point trains on synthetic digits. The quick
    start's own test and the tests of what the smoke run of every shipped scenario yields share it:
    one real run of every scenario instead of one per test file."""

    def run(folder: Path) -> dict:
        return asdict(_quick_start(folder))

    return QuickStart(**once_per_run(tmp_path_factory, "quick-start", run, path_keys=("tree",)))


def _quick_start(folder: Path) -> QuickStart:
    tree = copy_of_checkout(folder)
    git = ["git", "-c", "user.name=suite tests", "-c", "user.email=tests@localhost", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout under test"]):
        subprocess.run([*git, *args], cwd=tree, check=True, capture_output=True)
    revision = subprocess.run([*git, "rev-parse", "HEAD"], cwd=tree, check=True, capture_output=True, text=True)
    venv = Path(os.environ.get("VIRTUAL_ENV") or REPO / ".venv")
    env = {**os.environ, "SUITE_VENV": str(venv), "SUITE_MNIST_URL": closed_url(), "PYTHONPATH": ""}
    proc = subprocess.run(
        ["./run_all.sh", "--smoke", "--backend", "local", "--machine", "testbox"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    return QuickStart(tree, proc.stdout + proc.stderr, proc.returncode, revision.stdout.strip())


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    make: Callable[[Path], dict],
    path_keys: tuple[str, ...] = (),
) -> dict:
    """``make(folder)`` once per test run, however many pytest-xdist workers ask: the first to ask
    makes it in a folder of the run's shared temporary root while the others wait on a lock, then
    read what it made (a dict of JSON values; the keys in ``path_keys`` hold paths)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's root, shared by its workers; alone, a session's own folder
    made = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.is_file():  # a folder of its own each try: one that raised leaves its folder behind
            folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
            value = {k: str(v) if k in path_keys else v for k, v in make(folder).items()}
            made.write_text(json.dumps(value), encoding="utf-8")
    value = json.loads(made.read_text(encoding="utf-8"))
    return {k: Path(v) if k in path_keys else v for k, v in value.items()}


def closed_url() -> str:
    """An address where nothing listens: a fetch of MNIST fails at once, and nothing is downloaded."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/mnist.npz"


@contextlib.contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 with ``handler``, for as long as the block runs; its URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def write_scenario(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- reading `check`'s output


def said(stdout: str, start: str) -> str:
    """The first line that starts with ``start``, with the lines it wraps onto (indented), as one line."""
    lines = stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(start))
    more = itertools.takewhile(lambda line: line.startswith("  "), lines[i + 1 :])
    return " ".join([lines[i], *(line.strip() for line in more)])


def check_rows(stdout: str) -> dict[str, dict[str, str]]:
    """``check``'s tables: point label -> {"scenario": its scenario, header: cell, ...}, for each
    point that runs or is done here (the skipped ones: ``check_skipped``)."""
    found: dict[str, dict[str, str]] = {}
    headers: list[str] = []
    scenario = ""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if heading := re.fullmatch(r"(\S+), \d+ points?:", line):
            scenario = heading.group(1)
        elif line.startswith("| point "):
            headers = cells
        elif line.startswith("| "):
            row = dict(zip(headers, cells, strict=True))
            found[row["point"]] = {"scenario": scenario, **row}
    return found


def check_skipped(stdout: str) -> dict[str, str]:
    """``check``'s skipped points: label (with "(1 of 3 ok on file)" where some are) -> the line of
    its reason ("3 GPU points (9 runs) skipped: needs 64 GPU(s); ...")."""
    found = {}
    for line in stdout.splitlines():
        if re.match(r"\d+ (\w+ )?points? (\(\d+ runs\) )?skipped: ", line):
            named = said(stdout, line).removeprefix(line).strip()
            found |= {label: line for label in named.split("; ")}
    return found


def check_points(stdout: str) -> list[str]:
    """Every point ``check`` plans, run, done or skipped: its label."""
    return [*check_rows(stdout), *(re.sub(r" \(\d+ of \d+ ok on file\)$", "", p) for p in check_skipped(stdout))]
