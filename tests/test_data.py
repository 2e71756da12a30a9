"""The worker's data: exactly what the host resolved, checked by SHA-256; synthetic only when told, and marked."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from suite.environment import datasets
from suite.worker import data

CFG = {"train_samples": None, "test_samples": None, "allow_synthetic": True, "data_dir": None, "shuffle_labels": False}


def _npz(path: Path, n_train: int = 6, n_test: int = 3) -> Path:
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        x_train=rng.integers(0, 256, (n_train, 28, 28), np.uint8),
        y_train=np.arange(n_train, dtype=np.uint8) % 10,
        x_test=rng.integers(0, 256, (n_test, 28, 28), np.uint8),
        y_test=np.arange(n_test, dtype=np.uint8) % 10,
    )
    return path


@pytest.fixture
def no_keras_download(monkeypatch: pytest.MonkeyPatch) -> None:
    """A keras whose download fails the test: the worker must never reach for it."""

    def refuse() -> None:
        raise AssertionError("the worker called keras.datasets.mnist.load_data()")

    fake = types.ModuleType("keras")
    fake.datasets = types.SimpleNamespace(mnist=types.SimpleNamespace(load_data=refuse))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "keras", fake)


def test_reads_the_file_it_was_told_and_checks_its_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _npz(tmp_path / "elsewhere" / "mnist.npz")
    monkeypatch.setenv(data.PATH_ENV, str(path))
    identity = {"source": "mnist.npz", "sha256": data.sha256_of(path)}
    ds = data.load({**CFG, "identity": identity}, seed=1)
    assert ds.source == "mnist.npz" and not ds.synthetic
    with np.load(path) as f:
        np.testing.assert_array_equal(ds.x_train, f["x_train"].reshape(6, 784).astype("float32") / 255.0)
        np.testing.assert_array_equal(ds.y_test, f["y_test"])
    assert identity["sha256"] in ds.detail


def test_a_file_that_differs_from_the_planned_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _npz(tmp_path / "mnist.npz")
    monkeypatch.setenv(data.PATH_ENV, str(path))
    planned = "0" * 64
    with pytest.raises(data.DataUnavailable) as err:
        data.load({**CFG, "identity": {"source": "mnist.npz", "sha256": planned}}, seed=1)
    text = str(err.value)
    assert data.sha256_of(path) in text and planned in text and "changed after planning" in text


def test_never_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_keras_download: None) -> None:
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # an empty cache
    monkeypatch.delenv(data.PATH_ENV, raising=False)
    told = {"source": "mnist.npz", "sha256": data.MNIST_NPZ_SHA256}
    with pytest.raises(data.DataUnavailable, match="no such file"):
        data.load({**CFG, "identity": told}, seed=1)
    note = "MNIST is not on this machine (no x); run `python -m suite data fetch`"
    with pytest.raises(data.DataUnavailable, match="data fetch"):
        data.load({**CFG, "allow_synthetic": False, "identity": {"source": "missing", "note": note}}, seed=1)


def test_a_spec_without_an_identity_is_refused() -> None:
    with pytest.raises(data.DataUnavailable, match="config.data.identity"):
        data.load(dict(CFG), seed=1)


def test_synthetic_is_marked_with_the_hosts_reason() -> None:
    cfg = {**CFG, "train_samples": 64, "test_samples": 16, "identity": {"source": "synthetic", "note": "no mnist.npz"}}
    ds = data.load(cfg, seed=1)
    assert ds.synthetic and ds.source == "synthetic"
    assert "no mnist.npz" in ds.detail and ds.x_train.shape == (64, 784) and ds.x_test.shape == (16, 784)


def test_idx_split_trains_and_tests_on_disjoint_digits(mnist_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data.PATH_ENV, raising=False)
    cfg = {**CFG, "data_dir": str(mnist_dir), "test_samples": 2000}
    identity = datasets.identity_for(cfg)
    assert identity["source"] == "idx" and len(identity["sha256"]) == 64
    ds = data.load({**cfg, "identity": identity}, seed=1)
    assert ds.source == "idx-t10k-split"
    assert ds.x_train.shape == (8000, 784) and ds.x_test.shape == (2000, 784)
    assert list(ds.y_train[:10]) == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9], "the published first labels"
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0


def test_idx_identity_is_the_content_gzipped_or_not(mnist_dir: Path, tmp_path: Path) -> None:
    import gzip

    plain = tmp_path / "plain"
    plain.mkdir()
    for gz in mnist_dir.glob("t10k-*.gz"):
        (plain / gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
    zipped, unzipped = (datasets.identity_for({**CFG, "data_dir": str(d)}) for d in (mnist_dir, plain))
    assert zipped["sha256"] == unzipped["sha256"]
    (plain / "t10k-labels-idx1-ubyte").write_bytes(b"\0\0\x08\x01\0\0\0\x01\x07")  # one label: other data
    assert datasets.identity_for({**CFG, "data_dir": str(plain)})["sha256"] != zipped["sha256"]


def test_data_dir_with_a_stale_identity_is_refused(mnist_dir: Path) -> None:
    cfg = {**CFG, "data_dir": str(mnist_dir), "identity": {"source": "synthetic", "note": "planned before"}}
    with pytest.raises(data.DataUnavailable, match="changed after planning"):
        data.load(cfg, seed=1)


def test_synthetic_looks_like_mnist_in_density() -> None:
    ds = data._synthetic(3, "test", 2000, 200)
    assert ds.synthetic and 0.08 < ds.x_train.mean() < 0.2, "ink density near MNIST's 0.13"
    assert set(np.unique(ds.y_train)) == set(range(10))


def test_shuffled_labels_control_permutes(mnist_dir: Path) -> None:
    cfg = {**CFG, "data_dir": str(mnist_dir), "test_samples": 2000}
    cfg["identity"] = datasets.identity_for(cfg)
    plain, shuffled = data.load(cfg, seed=1), data.load({**cfg, "shuffle_labels": True}, seed=1)
    assert sorted(plain.y_train) == sorted(shuffled.y_train)
    assert (plain.y_train != shuffled.y_train).mean() > 0.8
    assert "shuffled" in shuffled.detail


def test_the_worker_names_a_cut_off_gz_instead_of_crashing(mnist_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "t10k"
    folder.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (folder / name).write_bytes((mnist_dir / name).read_bytes()[:3000])
    with pytest.raises(data.DataUnavailable, match=r"t10k-images-idx3-ubyte\.gz: cut off"):
        data.read_idx_files(folder)
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(b"plain bytes, no gzip header")
    with pytest.raises(data.DataUnavailable, match=r"t10k-images-idx3-ubyte\.gz: not a valid gzip file"):
        data.read_idx_files(folder)


def test_an_npz_accepted_under_an_overridden_hash_keeps_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _npz(tmp_path / "keras" / "datasets" / "mnist.npz")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.delenv(data.PATH_ENV, raising=False)
    monkeypatch.setenv(datasets.SHA_ENV, data.sha256_of(path))
    identity = datasets.identity_for({**CFG, "allow_synthetic": False})
    assert identity["source"] == data.NPZ_OVERRIDE_SOURCE and datasets.SHA_ENV in identity["note"]
    assert datasets.fingerprinted(identity)["source"] == data.NPZ_OVERRIDE_SOURCE, "the fingerprint sees it"
    assert datasets.locate({"identity": identity}) == path
    ds = data.load({**CFG, "identity": identity}, seed=1)
    assert ds.source == data.NPZ_OVERRIDE_SOURCE and not ds.synthetic  # the result's data source, the report's line
    monkeypatch.setenv(datasets.SHA_ENV, data.MNIST_NPZ_SHA256)
    assert datasets.sha256_override() == "" and datasets.npz_source() == "mnist.npz"
