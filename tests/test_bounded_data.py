"""`data fetch` on hostile input: a server that drips bytes, IDX files that inflate to gigabytes.

A download ends after a total deadline however steadily bytes arrive (``SUITE_FETCH_DEADLINE_S``),
and an IDX file is read no further than MNIST's own size, gzipped or not, so that a 2 MB .gz that
inflates to 2 GiB is refused by a CLI held to 1 GiB of address space. Each test runs the real CLI;
the timeouts only stop a hang.
"""

from __future__ import annotations

import gzip
import http.server
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import http_server, suite_cli, write_scenario

from suite.environment import datasets, mnist_fetch
from suite.worker import data as wdata

HANG_S = 30  # a hang is a failure; every run here takes seconds
DRIP_S = 0.5  # the slow server sends one byte this often
DEADLINE_S = 2  # the deadline the download tests allow
BODY = b"x" * 300_000  # what the slow server would send, given a day


class _Slow(http.server.BaseHTTPRequestHandler):
    """``/body.npz``: headers at once, then the body a byte at a time; ``/headers.npz``: the headers a
    byte at a time; ``/fast.npz``: all of it at once. Each wait is short, so no read times out."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/fast.npz":
            self._headers()
            self.wfile.write(BODY)
            return
        if self.path == "/body.npz":
            self._headers()
            self._drip(BODY)
        elif self.path == "/headers.npz":
            self._drip(b"HTTP/1.0 200 OK\r\nX-Slow: " + b"y" * 10_000 + b"\r\n\r\n")
        else:
            self.send_error(404)

    def _headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.flush()

    def _drip(self, data: bytes) -> None:
        for i in range(int(HANG_S / DRIP_S)):  # ends on its own after HANG_S, whoever listens
            try:
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            except OSError:
                return  # the client gave up: what the deadline is for
            time.sleep(DRIP_S)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    with http_server(_Slow) as url:
        yield url


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("path", ["/body.npz", "/headers.npz"])
def test_a_dripping_download_stops_at_the_deadline_and_leaves_nothing(
    slow_server: str, tmp_path: Path, path: str
) -> None:
    home = tmp_path / "keras"
    env = {"KERAS_HOME": str(home), mnist_fetch.DEADLINE_ENV: str(DEADLINE_S), datasets.SHA_ENV: "0" * 64}
    started = time.monotonic()
    proc = suite_cli("data", "fetch", "--url", slow_server + path, env=env, timeout=HANG_S)
    took = time.monotonic() - started
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: download of {slow_server}{path} stopped after {DEADLINE_S} s"), proc.stderr
    assert f"{mnist_fetch.DEADLINE_ENV}=SECONDS (default 600)" in proc.stderr and "nothing was cached" in proc.stderr
    assert took >= DEADLINE_S
    assert _left(home / "datasets") == [], "no .part file left behind"


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan"])
def test_a_deadline_that_is_not_a_positive_number_is_refused(slow_server: str, tmp_path: Path, value: str) -> None:
    home = tmp_path / "keras"
    env = {"KERAS_HOME": str(home), mnist_fetch.DEADLINE_ENV: value, datasets.SHA_ENV: "0" * 64}
    proc = suite_cli("data", "fetch", "--url", slow_server + "/fast.npz", env=env, timeout=HANG_S)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        f"error: ${mnist_fetch.DEADLINE_ENV} {value!r}: give the seconds a whole download may take, a number > 0"
    ), proc.stderr
    assert _left(home / "datasets") == []


# --------------------------------------------------------------------------- IDX files too big

ADDRESS_SPACE = 1 << 30  # the CLI's own needs (Python, NumPy, SciPy) are about 300 MiB of it
HEADER = bytes([0, 0, 0x08, 3]) + b"".join(d.to_bytes(4, "big") for d in (60000, 28, 28))


def _bomb(path: Path, inflated: int = 2 << 30) -> Path:
    """A gzip file of about 2 MB that inflates to ``inflated`` bytes: MNIST's header, then zeros
    (members of 64 MiB each, one compressed once and repeated)."""
    member = gzip.compress(bytes(64 << 20), 9)
    path.write_bytes(gzip.compress(HEADER) + member * (inflated // (64 << 20)))
    return path


def _sparse(path: Path, size: int = 4 << 30) -> Path:
    """A plain file of ``size`` bytes that takes no room on disk: MNIST's header, then a hole."""
    with path.open("wb") as fh:
        fh.write(HEADER)
        fh.truncate(size)
    return path


@pytest.mark.parametrize("kind", ["gzip bomb", "sparse plain file"])
def test_an_idx_file_bigger_than_mnist_is_refused_in_bounded_memory(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "idx"
    folder.mkdir()
    stem = "train-images-idx3-ubyte"
    big = _bomb(folder / f"{stem}.gz") if kind == "gzip bomb" else _sparse(folder / stem)
    assert big.stat().st_size < 3 << 20 or kind == "sparse plain file"
    home = tmp_path / "keras"
    proc = suite_cli(
        "data", "fetch", "--from", folder, env={"KERAS_HOME": str(home)}, memory=ADDRESS_SPACE, timeout=HANG_S
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr[-2000:]
    most = wdata.IDX_BYTES[stem]
    assert most == 47_040_016
    inflated = " once decompressed" if kind == "gzip bomb" else ""
    assert proc.stderr.startswith(
        f"error: --from {folder}: {big}: more than {most:,} bytes{inflated}; MNIST's {stem} is {most:,} bytes"
    ), proc.stderr
    assert _left(home / "datasets") == []


def test_a_gzip_bomb_in_a_data_dir_is_refused_by_check(tmp_path: Path) -> None:
    data_dir = tmp_path / "t10k"
    data_dir.mkdir()
    bomb = _bomb(data_dir / "t10k-images-idx3-ubyte.gz")
    (data_dir / "t10k-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 1, 7]))
    scenario = """\
name: tiny
question: Is a data_dir that inflates to gigabytes refused?
model: {hidden: [16]}
training: {epochs: 1, batch_size: 64}
data: {train_samples: 256, test_samples: 64, data_dir: DIR}
repeats: 1
"""
    path = write_scenario(tmp_path, "tiny", scenario.replace("DIR", str(data_dir)))
    proc = suite_cli(
        "check",
        path,
        "--backend",
        "local",
        env={"KERAS_HOME": str(tmp_path / "empty")},
        memory=ADDRESS_SPACE,
        timeout=HANG_S,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr[-2000:]
    most = wdata.IDX_BYTES["t10k-images-idx3-ubyte"]
    assert f"data.data_dir {data_dir}: {bomb}: more than {most:,} bytes once decompressed" in proc.stderr
