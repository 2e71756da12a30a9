"""`suite data fetch` over real HTTP, `--from` for machines without internet, and the data's identity in a plan.

The server is a real ``http.server`` on 127.0.0.1 that each test starts in a thread. Keras' real
mnist.npz (11 MB, sha256 731c5ac6...) cannot be had here: there is no internet on this machine.
The tests therefore serve a small file of their own and name its sha256 as the expected one
(``SUITE_MNIST_SHA256``); the code path, the hashing and the atomic rename are the real ones.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import check_rows, http_server, said, suite_cli, write_scenario
from docker_fixtures import SMALL_SCENARIO, backend_factory, engine_client, image_fixture  # noqa: F401 - fixtures

from suite import cli
from suite.environment import datasets, mnist_fetch
from suite.record import results
from suite.spec import plan, scenario
from suite.worker import data as wdata

PAYLOAD = os.urandom(300_000)  # stands in for mnist.npz: big enough to arrive in several reads
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).hits.append(self.path)
        if self.path == "/mnist.npz":
            self._send(PAYLOAD)
        elif self.path == "/corrupt.npz":
            self._send(PAYLOAD[:-1] + bytes([PAYLOAD[-1] ^ 0xFF]))  # one bit off: same size, other hash
        elif self.path == "/cut.npz":
            # Announces the whole file, sends half, then closes: a dropped connection mid-download.
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        elif self.path == "/stall.npz":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[:1000])
            self.wfile.flush()
            time.sleep(3)  # longer than the client's timeout
        else:
            self.send_error(404, "no such file")

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.hits = []
    with http_server(_Handler) as url:
        yield url


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Keras cache, and the test payload's sha256 as the expected one."""
    home = tmp_path / "keras"
    monkeypatch.setenv("KERAS_HOME", str(home))
    monkeypatch.setenv(datasets.SHA_ENV, PAYLOAD_SHA)
    return home / "datasets"


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_fetch_downloads_verifies_and_keeps_one_copy(server: str, cache: Path) -> None:
    path = mnist_fetch.fetch(f"{server}/mnist.npz", say=lambda _: None)
    assert path == cache / "mnist.npz" and path.read_bytes() == PAYLOAD
    assert _left(cache) == ["mnist.npz"], "no temporary file left beside it"
    mnist_fetch.fetch(f"{server}/mnist.npz", say=lambda _: None)
    assert _Handler.hits == ["/mnist.npz"], "a verified copy is not downloaded again"


def test_corrupt_download_is_refused_and_leaves_nothing(server: str, cache: Path) -> None:
    with pytest.raises(datasets.FetchError) as err:
        mnist_fetch.fetch(f"{server}/corrupt.npz", say=lambda _: None)
    assert f"expected {PAYLOAD_SHA}" in str(err.value) and "nothing was cached" in str(err.value)
    assert _left(cache) == []


def test_interrupted_download_is_refused_and_leaves_nothing(server: str, cache: Path) -> None:
    with pytest.raises(datasets.FetchError) as err:
        mnist_fetch.fetch(f"{server}/cut.npz", say=lambda _: None)
    assert "interrupted" in str(err.value) and str(len(PAYLOAD)) in str(err.value), err.value
    assert _left(cache) == []


def test_stalled_download_times_out(server: str, cache: Path) -> None:
    t = time.monotonic()
    with pytest.raises(datasets.FetchError, match="timed out"):
        mnist_fetch.fetch(f"{server}/stall.npz", timeout=0.5, say=lambda _: None)
    assert time.monotonic() - t < 2.5
    assert _left(cache) == []


def test_http_error_is_named(server: str, cache: Path) -> None:
    with pytest.raises(datasets.FetchError, match="HTTP 404"):
        mnist_fetch.fetch(f"{server}/nothing.npz", say=lambda _: None)
    assert _left(cache) == []


def test_cli_fetch_by_url_variable_and_by_flag(server: str, cache: Path, tmp_path: Path) -> None:
    env = {"KERAS_HOME": str(cache.parent), datasets.SHA_ENV: PAYLOAD_SHA, mnist_fetch.URL_ENV: f"{server}/corrupt.npz"}
    bad = suite_cli("data", "fetch", env=env)
    assert bad.returncode == 1 and "nothing was cached" in bad.stderr and "Traceback" not in bad.stderr
    assert _left(cache) == []
    good = suite_cli("data", "fetch", "--url", f"{server}/mnist.npz", env=env)
    assert good.returncode == 0, good.stderr
    assert (cache / "mnist.npz").read_bytes() == PAYLOAD
    assert f"{datasets.SHA_ENV} override in effect" in good.stdout
    shown = suite_cli("data", "show", env=env)
    assert shown.returncode == 0 and f", sha256 {PAYLOAD_SHA}\n" in shown.stdout and "verified" in shown.stdout
    assert f"{datasets.SHA_ENV} override in effect" in shown.stdout
    assert f"runs get: {wdata.NPZ_OVERRIDE_SOURCE}, sha256 " in shown.stdout
    assert "runs get: mnist.npz" not in shown.stdout


def test_a_file_accepted_under_an_overridden_hash_is_not_called_mnist(tmp_path: Path) -> None:
    """SUITE_MNIST_SHA256 makes any file acceptable: its runs must say so, and not share MNIST's fingerprint."""
    (tmp_path / "keras" / "datasets").mkdir(parents=True)
    (tmp_path / "keras" / "datasets" / "mnist.npz").write_bytes(PAYLOAD)
    path = write_scenario(tmp_path, "tiny", SMALL.replace("SYN", "false"))
    env = {"KERAS_HOME": str(tmp_path / "keras"), datasets.SHA_ENV: PAYLOAD_SHA}
    proc = suite_cli("check", path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert check_rows(proc.stdout)["default"]["device"] == "cpu", "a label that does not name its device"
    data = said(proc.stdout, "data for ")  # one line, wrapped to the console's width
    assert f"source {wdata.NPZ_OVERRIDE_SOURCE}, sha256 {PAYLOAD_SHA}" in data, proc.stdout
    assert f"{datasets.SHA_ENV} override in effect" in data
    assert "source mnist.npz" not in proc.stdout


def test_url_errors_name_where_the_url_came_from(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(datasets.BadSource, match=r"^--url http://\[bad"):
        mnist_fetch.fetch("http://[bad", say=lambda _: None)
    monkeypatch.setenv(mnist_fetch.URL_ENV, "http://[bad")
    with pytest.raises(datasets.BadSource, match=rf"^\${mnist_fetch.URL_ENV} http://\[bad"):
        mnist_fetch.fetch(say=lambda _: None)
    monkeypatch.delenv(mnist_fetch.URL_ENV)
    monkeypatch.setattr(mnist_fetch, "MNIST_URL", "http://[bad")
    with pytest.raises(datasets.BadSource, match=r"^the default URL http://\[bad"):
        mnist_fetch.fetch(say=lambda _: None)


def test_only_http_and_https_urls_are_fetched(cache: Path, tmp_path: Path) -> None:
    local = tmp_path / "copy.npz"
    local.write_bytes(PAYLOAD)
    env = {"KERAS_HOME": str(cache.parent), datasets.SHA_ENV: PAYLOAD_SHA}
    for url in (local.as_uri(), "ftp://127.0.0.1/mnist.npz", str(local)):
        proc = suite_cli("data", "fetch", "--url", url, env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"--url {url}" in proc.stderr and "http:// or https://" in proc.stderr and "--from" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert _left(cache) == []


def test_stale_part_files_are_removed_and_fresh_ones_kept(server: str, cache: Path) -> None:
    cache.mkdir(parents=True)
    stale_file, stale_dir = cache / ".mnist.npz.abc.part", cache / ".mnist-idx.abc.part"
    fresh_file, fresh_dir = cache / ".mnist.npz.new.part", cache / ".mnist-idx.new.part"
    for f in (stale_file, fresh_file):
        f.write_bytes(b"half")
    for d in (stale_dir, fresh_dir):
        d.mkdir()
        (d / "train-images-idx3-ubyte").write_bytes(b"half")
    old = time.time() - 2 * mnist_fetch.STALE_PART_S
    for entry in (stale_file, stale_dir):
        os.utime(entry, (old, old))
    said: list[str] = []
    mnist_fetch.fetch(f"{server}/mnist.npz", say=said.append)
    assert _left(cache) == sorted([fresh_file.name, fresh_dir.name, "mnist.npz"])
    assert any(str(stale_dir) in line for line in said) and any(str(stale_file) in line for line in said)


def test_a_failed_store_keeps_the_previous_import(
    mnist_dir: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mnist_fetch.import_from(_full_idx_folder(tmp_path / "first", mnist_dir), say=lambda _: None)
    before = datasets.identity_for({"allow_synthetic": False})
    rename = Path.rename

    def failing(self: Path, target: Path) -> Path:
        if self.name.startswith(".mnist-idx.") and self.name.endswith(".part"):
            raise OSError(28, "No space left on device")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", failing)
    second = _full_idx_folder(tmp_path / "second", mnist_dir, n_train=60000)
    (second / "train-labels-idx1-ubyte").write_bytes(_idx((60000,), np.zeros(60000)))  # other data
    with pytest.raises(datasets.FetchError, match="No space left on device"):
        mnist_fetch.import_from(second, say=lambda _: None)
    assert _left(cache) == [wdata.IDX_FOLDER], "the previous import back in place, nothing else left"
    assert datasets.identity_for({"allow_synthetic": False})["sha256"] == before["sha256"]


# -- --from: machines without internet -------------------------------------------------------------


def test_from_the_test_set_alone_is_refused_with_what_is_missing(mnist_dir: Path, cache: Path) -> None:
    proc = suite_cli("data", "fetch", "--from", mnist_dir, env={"KERAS_HOME": str(cache.parent)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "train-images-idx3-ubyte" in proc.stderr and "train-labels-idx1-ubyte" in proc.stderr
    assert "data.data_dir" in proc.stderr and "Traceback" not in proc.stderr
    assert _left(cache) == []


def _idx(shape: tuple[int, ...], values: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, len(shape)]) + b"".join(d.to_bytes(4, "big") for d in shape)
    return header + values.astype(np.uint8).tobytes()


def _full_idx_folder(folder: Path, mnist_dir: Path, n_train: int = 60000) -> Path:
    """MNIST's four files: the real t10k set, and a training set of its digits repeated (shapes are what count)."""
    folder.mkdir()
    t10k_x = wdata.parse_idx(gzip.decompress((mnist_dir / "t10k-images-idx3-ubyte.gz").read_bytes()), "x")
    t10k_y = wdata.parse_idx(gzip.decompress((mnist_dir / "t10k-labels-idx1-ubyte.gz").read_bytes()), "y")
    reps = -(-n_train // len(t10k_x))
    train_x, train_y = np.tile(t10k_x, (reps, 1, 1))[:n_train], np.tile(t10k_y, reps)[:n_train]
    (folder / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(train_x.shape, train_x), 1))
    (folder / "train-labels-idx1-ubyte").write_bytes(_idx(train_y.shape, train_y))
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (folder / name).write_bytes((mnist_dir / name).read_bytes())
    return folder


def test_from_an_idx_folder_imports_it_under_its_own_identity(mnist_dir: Path, cache: Path, tmp_path: Path) -> None:
    folder = _full_idx_folder(tmp_path / "lecun", mnist_dir)
    stored = mnist_fetch.import_from(folder, say=lambda _: None)
    assert stored == cache / wdata.IDX_FOLDER and _left(cache) == [wdata.IDX_FOLDER]
    identity = datasets.identity_for({"allow_synthetic": False})
    assert identity["source"] == "idx", "not passed off as Keras' mnist.npz"
    assert identity["sha256"] == wdata.idx_digest(wdata.read_idx_files(folder))
    told = {"train_samples": 100, "test_samples": 50, "identity": identity}
    ds = wdata.load(told, seed=1)  # the worker, from the imported copy
    assert ds.source == "idx" and ds.x_train.shape == (100, 784) and list(ds.y_test[:4]) == [7, 2, 1, 0]


def test_fetch_keeps_imported_idx_data_and_downloads_only_when_asked(mnist_dir: Path, tmp_path: Path) -> None:
    """What ./run_all.sh runs before every run, on a machine whose Keras cache holds MNIST imported
    as IDX files (`--from`), must keep that data, not download mnist.npz beside it (runs take
    mnist.npz first: their data, and every fingerprint, would change)."""
    home = tmp_path / "keras"
    _Handler.hits = []
    with http_server(_Handler) as server:
        env = {
            "KERAS_HOME": str(home),
            datasets.SHA_ENV: PAYLOAD_SHA,
            mnist_fetch.URL_ENV: f"{server}/mnist.npz",  # a mirror set for good in the user's shell
        }
        imported = suite_cli("data", "fetch", "--from", _full_idx_folder(tmp_path / "lecun", mnist_dir), env=env)
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


def test_from_an_idx_folder_with_wrong_shapes_is_refused(mnist_dir: Path, cache: Path, tmp_path: Path) -> None:
    folder = _full_idx_folder(tmp_path / "short", mnist_dir, n_train=1000)
    with pytest.raises(datasets.BadSource, match=r"train-images-idx3-ubyte has shape \(1000, 28, 28\)"):
        mnist_fetch.import_from(folder, say=lambda _: None)
    assert _left(cache) == []


def test_from_an_npz_is_checked_by_sha256(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "copy.npz"
    src.write_bytes(PAYLOAD)
    assert mnist_fetch.import_from(src, say=lambda _: None).read_bytes() == PAYLOAD
    assert _left(cache) == ["mnist.npz"]
    monkeypatch.setenv(datasets.SHA_ENV, wdata.MNIST_NPZ_SHA256)  # the real expectation: this file is not it
    (cache / "mnist.npz").unlink()
    with pytest.raises(datasets.BadSource, match=f"sha256 {PAYLOAD_SHA}, expected {wdata.MNIST_NPZ_SHA256}"):
        mnist_fetch.import_from(src, say=lambda _: None)
    assert _left(cache) == []


def test_from_a_folder_of_files_that_are_not_idx_is_refused_naming_it(cache: Path, tmp_path: Path) -> None:
    folder = tmp_path / "not-idx"
    folder.mkdir()
    for stem in datasets.SHAPES:
        (folder / stem).write_bytes(b"PK\x03\x04" + bytes(64))  # a zip's magic, not IDX's
    proc = suite_cli("data", "fetch", "--from", folder, env={"KERAS_HOME": str(cache.parent)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--from {folder}" in proc.stderr and "not an IDX file" in proc.stderr
    assert "Traceback" not in proc.stderr and _left(cache) == []


def test_from_a_folder_with_a_cut_off_gz_is_refused_naming_it(mnist_dir: Path, cache: Path, tmp_path: Path) -> None:
    folder = _full_idx_folder(tmp_path / "cut", mnist_dir)
    gz = folder / "t10k-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:5000])
    proc = suite_cli("data", "fetch", "--from", folder, env={"KERAS_HOME": str(cache.parent)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(gz) in proc.stderr and "cut off" in proc.stderr and "Traceback" not in proc.stderr
    assert _left(cache) == []


def test_a_cut_off_gz_in_a_data_dir_is_refused_by_check_naming_it(mnist_dir: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "t10k"
    data_dir.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (data_dir / name).write_bytes((mnist_dir / name).read_bytes())
    gz = data_dir / "t10k-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:5000])
    text = SMALL.replace("SYN", "false").replace("test_samples: 64}", f"test_samples: 64, data_dir: {data_dir}}}")
    path = write_scenario(tmp_path, "tiny", text)
    for command in (["check", path], ["run", path, "--backend", "local", "--results", tmp_path / "res"]):
        proc = suite_cli(*command, env={"KERAS_HOME": str(tmp_path / "empty")})
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"data.data_dir {data_dir}" in proc.stderr and str(gz) in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "res").exists(), "nothing ran"


def test_a_damaged_imported_copy_is_not_used_and_says_why(mnist_dir: Path, cache: Path, tmp_path: Path) -> None:
    mnist_fetch.import_from(_full_idx_folder(tmp_path / "lecun", mnist_dir), say=lambda _: None)
    stored = cache / wdata.IDX_FOLDER / "t10k-labels-idx1-ubyte"
    os.remove(stored)
    (stored.parent / (stored.name + ".gz")).write_bytes(b"not gzip at all")
    identity = datasets.identity_for({"allow_synthetic": False})
    assert identity["source"] == "missing" and "t10k-labels-idx1-ubyte.gz" in identity["note"], identity
    assert any("unreadable" in line for line in datasets.describe())


# -- the identity in the plan ----------------------------------------------------------------------

SMALL = """\
name: tiny
question: Does a tiny run refuse synthetic data at full size?
model: {hidden: [16]}
training: {epochs: 1, batch_size: 64}
data: {allow_synthetic: SYN, train_samples: 256, test_samples: 64}
repeats: 1
measure: {step_overhead: false}
"""


def _specs(path: Path) -> list[plan.RunSpec]:
    return plan.expand(scenario.load(path))


def test_identity_changes_the_fingerprint_and_host_paths_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_scenario(tmp_path, "tiny", SMALL.replace("SYN", "true"))
    monkeypatch.setenv(datasets.SHA_ENV, PAYLOAD_SHA)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty"))
    synthetic = _specs(path)[0]
    assert synthetic.config["data"]["identity"]["source"] == "synthetic"
    homes = []
    for name in ("a", "b"):
        home = tmp_path / name
        (home / "datasets").mkdir(parents=True)
        (home / "datasets" / "mnist.npz").write_bytes(PAYLOAD)
        monkeypatch.setenv("KERAS_HOME", str(home))
        homes.append(_specs(path)[0])
    assert homes[0].config["data"]["identity"]["sha256"] == PAYLOAD_SHA
    assert homes[0].config["data"]["identity"]["note"] != homes[1].config["data"]["identity"]["note"]
    assert homes[0].fingerprint == homes[1].fingerprint, "the same data in another folder is the same run"
    assert synthetic.fingerprint != homes[0].fingerprint, "a synthetic result is not done for a real-data run"


def test_full_size_run_on_synthetic_data_is_refused_up_front(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny", SMALL.replace("SYN", "true"))
    env = {"KERAS_HOME": str(tmp_path / "empty")}
    res = tmp_path / "res"
    proc = suite_cli("run", path, "--backend", "local", "--results", res, "--machine", "m", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "python -m suite data fetch" in proc.stderr and "--allow-synthetic" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(res.rglob("*.json")), "nothing ran"

    ok = suite_cli("run", path, "--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    ((_, result),) = results.load_folder(res)
    assert result.quality["synthetic"] is True and result.quality["data_source"] == "synthetic"
    assert result.spec["config"]["data"]["identity"]["source"] == "synthetic"


def test_no_data_and_no_synthetic_allowed_is_refused_even_in_smoke(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny", SMALL.replace("SYN", "false"))
    proc = suite_cli("check", path, env={"KERAS_HOME": str(tmp_path / "empty")})
    assert proc.returncode == 0, "check prints the plan"
    for extra in ([], ["--smoke"], ["--allow-synthetic"]):
        run = suite_cli(
            "run", path, "--backend", "local", "--results", tmp_path / "res", *extra, env={"KERAS_HOME": str(tmp_path)}
        )
        assert run.returncode == 2, run.stdout + run.stderr
        assert "does not allow synthetic" in run.stderr and "python -m suite data fetch" in run.stderr


def test_fleet_passes_allow_synthetic_to_each_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from suite.run import fleet

    path = write_scenario(tmp_path, "tiny", SMALL.replace("SYN", "true"))
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text('hosts:\n  one: {docker: "tcp://127.0.0.1:9"}\n', encoding="utf-8")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty"))
    seen: list[list[str]] = []
    monkeypatch.setattr(fleet, "run_fleet", lambda hosts, run_args, *a, **k: seen.append(run_args) or 0)
    argv = ["run", str(path), "--hosts", str(hosts), "--results", str(tmp_path / "res")]
    assert cli.main(argv) == 2, "full size on synthetic data: refused before any host starts"
    assert seen == []
    assert cli.main([*argv, "--allow-synthetic"]) == 0
    assert "--allow-synthetic" in seen[0]
    run = fleet.child_commands(fleet.Host("one", "tcp://127.0.0.1:9"), seen[0], tmp_path / "res")[-1]
    assert "--allow-synthetic" in run


@pytest.mark.docker
@pytest.mark.slow
def test_container_reads_the_cached_file_read_only_and_checks_it(
    backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "keras"
    rng = np.random.default_rng(5)
    images = lambda n: rng.integers(0, 256, (n, 28, 28), np.uint8)  # noqa: E731
    labels = lambda n: rng.integers(0, 10, n).astype(np.uint8)  # noqa: E731
    npz = home / "datasets" / "mnist.npz"
    npz.parent.mkdir(parents=True)
    np.savez(npz, x_train=images(1100), y_train=labels(1100), x_test=images(300), y_test=labels(300))
    monkeypatch.setenv("KERAS_HOME", str(home))
    monkeypatch.setenv(datasets.SHA_ENV, wdata.sha256_of(npz))  # this small file stands in for Keras' one
    path = tmp_path / "docker_data.yaml"
    path.write_text(SMALL_SCENARIO.format(name=f"docker_data_{os.getpid()}", widths="[16]"), encoding="utf-8")
    (spec,) = plan.expand(scenario.load(path), smoke=True)
    assert spec.config["data"]["identity"]["source"] == wdata.NPZ_OVERRIDE_SOURCE, "not Keras' file: not mnist.npz"

    docker_backend = backend(keras_home=home)
    result = docker_backend.run(spec)
    assert result.status == "ok", (result.message, result.log_tail)
    assert result.quality["data_source"] == wdata.NPZ_OVERRIDE_SOURCE and result.quality["synthetic"] is False
    (placed,) = result.run["data_volumes"]
    mounts = {m["target"]: m for m in result.run["isolation"]["mounts"]}
    assert mounts[placed["target"]]["read_only"] is True

    # The cache changes after planning: the container gets the new file and refuses it.
    np.savez(npz, x_train=images(1100), y_train=labels(1100), x_test=images(300), y_test=labels(300))
    changed = backend(keras_home=home).run(spec)
    assert changed.status == "error" and "changed after planning" in changed.message, changed.message


@pytest.mark.parametrize(
    "dims, words",
    [
        ([1] * 65, "of 65 dimensions"),  # numpy makes no array of more than 64
        ([2**31, 2**31, 4], "header says"),  # their product, 2**64, is 0 in numpy's integers: an empty body fit it
    ],
    ids=["65-dimensions", "product-wraps-to-0"],
)
def test_from_a_folder_whose_idx_header_no_array_can_take_is_refused_naming_it(
    cache: Path, tmp_path: Path, dims: list[int], words: str
) -> None:
    folder = tmp_path / "odd-idx"
    folder.mkdir()
    header = (0x0800 | len(dims)).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    for stem in datasets.SHAPES:
        (folder / stem).write_bytes(header + (b"\0" if len(dims) == 65 else b""))
    proc = suite_cli("data", "fetch", "--from", folder, env={"KERAS_HOME": str(cache.parent)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--from {folder}" in proc.stderr and words in proc.stderr and "Traceback" not in proc.stderr
    assert _left(cache) == []
