"""`suite data fetch` on a machine whose Keras cache holds MNIST imported as IDX files (`--from`):
what ./run_all.sh runs before every run must keep that data, not download mnist.npz beside it
(runs take mnist.npz first: their data, and every fingerprint, would change)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import re
from pathlib import Path

import numpy as np
from conftest import http_server, suite_cli

from suite.environment import datasets, mnist_fetch
from suite.worker import data as wdata

PAYLOAD = os.urandom(50_000)  # stands in for mnist.npz (no internet here), accepted by its sha256


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD)

    def log_message(self, *args: object) -> None:
        pass


def _idx(shape: tuple[int, ...], values: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, len(shape)]) + b"".join(d.to_bytes(4, "big") for d in shape)
    return header + values.astype(np.uint8).tobytes()


def _idx_folder(folder: Path, mnist_dir: Path) -> Path:
    """MNIST's four files: the real t10k set, and a training set of its digits repeated 6 times."""
    folder.mkdir()
    x = wdata.parse_idx(gzip.decompress((mnist_dir / "t10k-images-idx3-ubyte.gz").read_bytes()), "x")
    y = wdata.parse_idx(gzip.decompress((mnist_dir / "t10k-labels-idx1-ubyte.gz").read_bytes()), "y")
    (folder / "train-images-idx3-ubyte").write_bytes(_idx((60000, 28, 28), np.tile(x, (6, 1, 1))))
    (folder / "train-labels-idx1-ubyte").write_bytes(_idx((60000,), np.tile(y, 6)))
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (folder / name).write_bytes((mnist_dir / name).read_bytes())
    return folder


def test_fetch_keeps_imported_idx_data_and_downloads_only_when_asked(mnist_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "keras"
    _Handler.hits = []
    with http_server(_Handler) as server:
        env = {
            "KERAS_HOME": str(home),
            datasets.SHA_ENV: hashlib.sha256(PAYLOAD).hexdigest(),
            mnist_fetch.URL_ENV: f"{server}/mnist.npz",  # a mirror set for good in the user's shell
        }
        imported = suite_cli("data", "fetch", "--from", _idx_folder(tmp_path / "lecun", mnist_dir), env=env)
        assert imported.returncode == 0, imported.stderr

        again = suite_cli("data", "fetch", env=env)  # what ./run_all.sh runs each time

        assert again.returncode == 0, again.stderr
        assert _Handler.hits == [], "nothing downloaded: MNIST is there"
        assert not (home / "datasets" / "mnist.npz").exists()
        assert "MNIST imported as IDX files" in again.stdout and "nothing downloaded" in again.stdout
        shown = suite_cli("data", "show", env=env)
        assert re.search(r"^runs get: idx, sha256 [0-9a-f]{64}$", shown.stdout, re.M), shown.stdout

        asked = suite_cli("data", "fetch", "--url", f"{server}/mnist.npz", env=env)  # asked for by name: done

        assert asked.returncode == 0, asked.stderr
        assert _Handler.hits == ["/mnist.npz"]
        assert (home / "datasets" / "mnist.npz").read_bytes() == PAYLOAD
